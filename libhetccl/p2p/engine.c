/* The host engine's point-to-point plane (engine.h).
 *
 * Thread: whichever thread drives the communicator (the API caller for a
 * blocking host call, or the proxy thread); one at a time, so no locks.
 * Never waits without a bound: every loop checks the abort flag and the
 * communicator timeout. Peers connected on first use: connect.c. */
#include "p2p/engine_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace/trace.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

ncclResult_t hetccl_engine_create(const hetccl_engine_args_t *a, hetccl_engine_t **out) {
  hetccl_engine_t *e = calloc(1, sizeof(*e));
  if (!e) {
    WARN("engine: out of memory");
    return ncclSystemError;
  }
  e->rank = a->rank;
  e->nranks = a->nranks;
  e->user_ranks = a->user_ranks;
  e->eps = calloc(a->nranks, sizeof(*e->eps));
  e->tp = calloc(a->nranks, sizeof(*e->tp));
  e->active = calloc(a->nranks, sizeof(int));
  if (!e->eps || !e->tp || !e->active) {
    WARN("engine: out of memory for %d peers", a->nranks);
    free(e->eps); free(e->tp); free(e->active); free(e);
    return ncclSystemError;
  }
  for (int p = 0; p < a->nranks; p++) {
    e->eps[p] = a->eps ? a->eps[p] : NULL;
    e->tp[p] = a->transports ? a->transports[p] : NULL;
    if (e->eps[p]) e->active[e->nactive++] = p;
  }
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) e->ctxs[t] = a->ctxs ? a->ctxs[t] : NULL;
  e->nconnected = e->nactive;
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) e->ctxs[t] = a->ctxs ? a->ctxs[t] : NULL;
  ncclResult_t res = hetccl_engine_conn_init(e, a);
  if (res != ncclSuccess) {
    free(e->eps); free(e->tp); free(e->active); free(e);
    return res;
  }
  /* The same on every rank whenever the knobs are: a peer not connected
   * yet counts with what its context promises (ctx_pull_min). */
  e->pull_min = a->nranks > 1 ? 0 : SIZE_MAX;
  for (int p = 0; p < a->nranks; p++) {
    if (!e->tp[p]) continue;
    size_t m = e->eps[p] ? (e->tp[p]->pull_min ? e->tp[p]->pull_min(e->eps[p]) : SIZE_MAX)
               : hetccl_engine_conn_lazy(e, p) ? e->tp[p]->ctx_pull_min(e->ctxs[hetccl_engine_tid(e, p)])
                                               : SIZE_MAX;
    if (m > e->pull_min) e->pull_min = m;
  }
  e->timeout_ms = a->timeout_ms;
  e->abort_flag = a->abort_flag;
  e->comm_error = a->comm_error;
  e->describe_tag = a->describe_tag;
  e->peer_note = a->peer_note;
  e->mismatch = a->mismatch;
  e->spin = a->spin;
  e->nap_us = (int)hetccl_knob_int(HETCCL_KNOB_IDLE_NAP);
  e->yield_ns = (int64_t)a->idle_yield_us * 1000;
  e->pipeline_chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_PIPELINE_CHUNK) & ~(size_t)63;
  if (e->pipeline_chunk < 64) e->pipeline_chunk = 64;
  e->small_bytes = (size_t)hetccl_knob_int(HETCCL_KNOB_SMALL_BYTES);
  *out = e;
  return ncclSuccess;
}

void hetccl_engine_destroy(hetccl_engine_t *e) {
  if (!e) return;
  for (int p = 0; p < e->nranks; p++)
    if (e->eps[p]) e->tp[p]->ep_close(e->eps[p]);
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (e->ctxs[t]) hetccl_transport_get((hetccl_transport_id_t)t)->ctx_destroy(e->ctxs[t]);
  hetccl_engine_conn_free(e);
  free(e->eps);
  free(e->tp);
  free(e->active);
  free(e->scratch);
  free(e->trace_lane_end);
  free(e);
}

int hetccl_engine_rank(const hetccl_engine_t *e) { return e->rank; }
int hetccl_engine_nranks(const hetccl_engine_t *e) { return e->nranks; }
size_t hetccl_engine_pipeline_chunk(const hetccl_engine_t *e) { return e->pipeline_chunk; }
size_t hetccl_engine_small_bytes(const hetccl_engine_t *e) { return e->small_bytes; }
size_t hetccl_engine_pull_min(const hetccl_engine_t *e) { return e->pull_min; }
int hetccl_engine_connected(const hetccl_engine_t *e) { return e->nconnected; }


/* The first error fails the engine for good. Its connections are closed
 * at once, so that peers blocked on this rank learn it now instead of
 * waiting out HETCCL_TIMEOUT, and each is left a note saying why: the
 * note this rank got from a peer if that is why it fails (relayed as is,
 * so every rank hears of the first cause), else its own last message with
 * note_code (res, or ncclRemoteError where res says nothing to a peer). */
static ncclResult_t engine_fail_text(hetccl_engine_t *e, ncclResult_t res, ncclResult_t note_code,
                                     const char *text) {
  if (e->failed != ncclSuccess) return e->failed;
  e->failed = res;
  if (e->comm_error) __sync_bool_compare_and_swap(e->comm_error, ncclSuccess, res);
  hetccl_fail_note_t note;
  if (e->peer_note && e->peer_note->code != 0) {
    note = *e->peer_note;
  } else {
    memset(&note, 0, sizeof(note));
    note.code = note_code;
    note.origin = e->rank;
    snprintf(note.text, sizeof(note.text), "%s", text ? text : hetccl_last_error());
  }
  for (int p = 0; p < e->nranks; p++) {
    if (!e->eps[p]) continue;
    if (e->tp[p]->ep_fail) e->tp[p]->ep_fail(e->eps[p], &note);
    else e->tp[p]->ep_close(e->eps[p]);
    e->eps[p] = NULL;
  }
  e->nactive = 0;
  hetccl_engine_conn_fail(e, &note);
  return res;
}

static ncclResult_t engine_fail_as(hetccl_engine_t *e, ncclResult_t res, ncclResult_t note_code) {
  return engine_fail_text(e, res, note_code, NULL);
}

static ncclResult_t engine_fail(hetccl_engine_t *e, ncclResult_t res) {
  return engine_fail_as(e, res, res);
}

ncclResult_t hetccl_engine_fail(hetccl_engine_t *e, ncclResult_t res, const char *why) {
  return engine_fail_text(e, res, res == ncclInvalidUsage ? ncclRemoteError : res, why);
}

/* Rank r of this engine's communicator as the user numbers it. */
static int user_rank(const hetccl_engine_t *e, int r) {
  return hetccl_user_rank(e->user_ranks, r);
}

/* A receive met a message of another operation: say which ranks called
 * what, from the signatures (args->describe_tag). Both ranks order the
 * pair the same way, in the user's numbering. */
static void mismatch_explain(const hetccl_engine_t *e) {
  const hetccl_tag_mismatch_t *m = e->mismatch;
  if (!m || !m->seen) return; /* a size mismatch: the transport said it */
  char theirs[128], mine[128];
  e->describe_tag(m->theirs, theirs, sizeof(theirs));
  e->describe_tag(m->mine, mine, sizeof(mine));
  int me = user_rank(e, e->rank), peer = user_rank(e, m->peer);
  WARN("ranks %d and %d called different operations: rank %d sent %s, rank %d expected %s",
       me < peer ? me : peer, me < peer ? peer : me, peer, theirs, me, mine);
}

/* Every failure of a transport call goes through here. */
static ncclResult_t engine_fail_call(hetccl_engine_t *e, ncclResult_t res) {
  if (res == ncclInvalidUsage && !(e->peer_note && e->peer_note->code)) mismatch_explain(e);
  return engine_fail(e, res);
}

/* *queue = 1: the peer's endpoint is not ready (connections on first use):
 * the request waits in the engine. */
static ncclResult_t peer_check(hetccl_engine_t *e, int peer, const char *what, int *queue) {
  *queue = 0;
  if (e->failed != ncclSuccess) return e->failed;
  if (peer >= 0 && peer < e->nranks && hetccl_engine_conn_lazy(e, peer) &&
      e->peers[peer].state != HETCCL_PEER_READY) {
    *queue = 1;
    return ncclSuccess;
  }
  if (peer < 0 || peer >= e->nranks || !e->eps[peer]) {
    /* Out of range is an algorithm's bug, and names no rank to look up. */
    int named = peer < 0 || peer >= e->nranks ? peer : user_rank(e, peer);
    WARN("engine: %s rank %d: no connection (rank %d of %d)", what, named, user_rank(e, e->rank),
         e->nranks);
    return ncclInternalError;
  }
  return ncclSuccess;
}

/* --- the trace (trace/trace.h) ---------------------------------------------------- */

/* A message's start. Empty ones (the signature ring) are left out. */
static void trace_posted(hetccl_req_t *req, int peer, int is_send) {
  if (!req->bytes) return;
  req->trace_t0 = hetccl_trace_now();
  req->trace_peer = peer;
  req->trace_send = is_send;
}

/* The messages among reqs that are done and not reported yet: one event
 * each, on its lane, starting no earlier than the lane's previous one
 * ended. */
static void trace_done(hetccl_engine_t *e, hetccl_req_t **reqs, int n) {
  uint64_t now = 0;
  for (int i = 0; i < n; i++) {
    hetccl_req_t *r = reqs[i];
    if (!r || !r->trace_t0 || !r->done) continue;
    if (!e->trace_lane_end) e->trace_lane_end = calloc(2 * (size_t)e->nranks, sizeof(uint64_t));
    if (!now) now = hetccl_trace_now();
    uint64_t t0 = r->trace_t0, *lane = NULL;
    if (e->trace_lane_end) {
      lane = &e->trace_lane_end[2 * r->trace_peer + !r->trace_send];
      if (*lane > t0) t0 = *lane;
      *lane = now;
    }
    hetccl_trace_ev_t ev = {.kind = r->trace_send ? HETCCL_TRACE_SEND : HETCCL_TRACE_RECV,
                            .name = r->trace_send ? "send" : "recv", .bytes = r->bytes,
                            .rank = HETCCL_TRACE_NONE, .peer = user_rank(e, r->trace_peer),
                            .root = HETCCL_TRACE_NONE, .step = HETCCL_TRACE_NONE,
                            .seq = HETCCL_TRACE_NO_SEQ};
    hetccl_trace_record_span(t0, now, &ev);
    r->trace_t0 = 0;
  }
}

/* --- posting and waiting ------------------------------------------------------------ */

static ncclResult_t isend(hetccl_engine_t *e, int peer, const void *buf, size_t bytes,
                          hetccl_msg_t m, int device_src, hetccl_req_t *req) {
  int queue;
  HETCCL_CHECK(peer_check(e, peer, "send to", &queue));
  memset(req, 0, sizeof(*req));
  req->buf = (void *)buf;
  req->bytes = bytes;
  req->tag = m.tag;
  req->pull_ok = m.pull_ok && !device_src;
  req->device_src = device_src;
  if (HETCCL_TRACE_ON()) trace_posted(req, peer, 1);
  ncclResult_t res = queue ? hetccl_engine_conn_queue(e, peer, req, 1)
                           : e->tp[peer]->isend(e->eps[peer], req);
  return res == ncclSuccess ? res : engine_fail_call(e, res);
}

ncclResult_t hetccl_engine_isend(hetccl_engine_t *e, int peer, const void *buf, size_t bytes,
                                 hetccl_msg_t m, hetccl_req_t *req) {
  return isend(e, peer, buf, bytes, m, 0, req);
}

ncclResult_t hetccl_engine_isend_device(hetccl_engine_t *e, int peer, const void *buf,
                                        size_t bytes, hetccl_msg_t m, hetccl_req_t *req) {
  return isend(e, peer, buf, bytes, m, 1, req);
}

int hetccl_engine_reaches(const hetccl_engine_t *e, int peer, const void *buf, size_t bytes,
                          int recv) {
  if (peer < 0 || peer >= e->nranks || peer == e->rank || !e->tp[peer] ||
      !e->tp[peer]->ctx_reaches)
    return 0;
  const hetccl_tctx_t *ctx = e->ctxs[hetccl_engine_tid(e, peer)];
  return ctx && e->tp[peer]->ctx_reaches(ctx, buf, bytes, recv);
}

static ncclResult_t irecv(hetccl_engine_t *e, int peer, void *buf, size_t bytes, uint64_t tag,
                          hetccl_consume_fn consume, void *consume_ctx, int device_dst,
                          hetccl_req_t *req) {
  int queue;
  HETCCL_CHECK(peer_check(e, peer, "receive from", &queue));
  memset(req, 0, sizeof(*req));
  req->buf = buf;
  req->bytes = bytes;
  req->tag = tag;
  req->consume = consume;
  req->consume_ctx = consume_ctx;
  req->device_dst = device_dst;
  if (HETCCL_TRACE_ON()) trace_posted(req, peer, 0);
  ncclResult_t res = queue ? hetccl_engine_conn_queue(e, peer, req, 0)
                           : e->tp[peer]->irecv(e->eps[peer], req);
  return res == ncclSuccess ? res : engine_fail_call(e, res);
}

ncclResult_t hetccl_engine_irecv(hetccl_engine_t *e, int peer, void *buf, size_t bytes,
                                 uint64_t tag, hetccl_consume_fn consume, void *consume_ctx,
                                 hetccl_req_t *req) {
  return irecv(e, peer, buf, bytes, tag, consume, consume_ctx, 0, req);
}

ncclResult_t hetccl_engine_irecv_device(hetccl_engine_t *e, int peer, void *buf, size_t bytes,
                                        uint64_t tag, hetccl_req_t *req) {
  return irecv(e, peer, buf, bytes, tag, NULL, NULL, 1, req);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t now_ms(void) { return now_ns() / 1000000; }

/* One sweep over every connected peer: requests on any endpoint may be the
 * ones a peer needs moved before it can serve ours. */
static ncclResult_t progress_all(hetccl_engine_t *e, int *idle_out) {
  int idle_all = 1;
  if (e->nconnecting) HETCCL_CHECK(hetccl_engine_conn_progress(e, &idle_all));
  for (int i = 0; i < e->nactive; i++) {
    int p = e->active[i], idle = 1;
    ncclResult_t res = e->tp[p]->progress(e->eps[p], &idle);
    if (res != ncclSuccess) return res;
    idle_all &= idle;
  }
  *idle_out = idle_all;
  return ncclSuccess;
}

/* An idle wait past its HETCCL_SPIN polls gives the CPU back: first by
 * yielding (a peer on this CPU runs at once) for HETCCL_IDLE_YIELD, then, still
 * idle, by sleeping, 8 us and doubling up to HETCCL_IDLE_NAP (0: yield for
 * ever). Sleeping matters where the CPUs are shared in a way this rank
 * cannot see (virtual machines on fewer cores, a NIC emulated in the
 * kernel), and where the rank's own compute threads want the core: a
 * thread that only yields still holds its CPU whenever no other thread of
 * its own system is runnable there. Yielding first keeps waits shorter
 * than that (the owner's idle_yield_us: comm/transports.c) at the latency
 * they had; a longer one pays at most one nap, plus the kernel's timer
 * slack. */
enum { IDLE_NAP_FIRST_US = 8 };

typedef struct {
  int64_t since_ns; /* when the wait became idle; -1: it is not */
  int naps;
} idle_state_t;

static void idle_rest(const hetccl_engine_t *e, idle_state_t *st) {
  if (e->nap_us <= 0) {
    sched_yield();
    return;
  }
  int64_t t = now_ns();
  if (st->since_ns < 0) st->since_ns = t;
  if (t - st->since_ns < e->yield_ns) {
    sched_yield();
    return;
  }
  int64_t us = IDLE_NAP_FIRST_US;
  for (int k = st->naps++; k > 0 && us < e->nap_us; k--) us <<= 1;
  if (us > e->nap_us) us = e->nap_us;
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

ncclResult_t hetccl_engine_progress(hetccl_engine_t *e, int *idle) {
  *idle = 1;
  if (e->failed != ncclSuccess) return e->failed;
  if (__atomic_load_n(e->abort_flag, __ATOMIC_ACQUIRE)) {
    WARN("engine: rank %d: operation aborted (ncclCommAbort)", user_rank(e, e->rank));
    return engine_fail_as(e, ncclInvalidUsage, ncclRemoteError);
  }
  ncclResult_t res = progress_all(e, idle);
  return res == ncclSuccess ? res : engine_fail_call(e, res);
}

/* Wait until every request (any: at least one) among reqs is done. */
static ncclResult_t wait_reqs(hetccl_engine_t *e, hetccl_req_t **reqs, int n, int any) {
  if (e->failed != ncclSuccess) return e->failed;
  int first = 0; /* requests before `first` are done */
  int64_t idle_polls = 0, deadline = -1;
  idle_state_t rest = {-1, 0};
  for (;;) {
    if (HETCCL_TRACE_ON()) trace_done(e, reqs, n);
    int pending = 0, finished = 0;
    if (any) {
      for (int i = 0; i < n; i++)
        if (reqs[i]) {
          if (reqs[i]->done) finished = 1;
          else pending = 1;
        }
      if (finished || !pending) return ncclSuccess;
    } else {
      while (first < n && (!reqs[first] || reqs[first]->done)) first++;
      for (int i = first; i < n && !pending; i++) pending = reqs[i] && !reqs[i]->done;
      if (!pending) return ncclSuccess;
    }
    int idle;
    ncclResult_t res = hetccl_engine_progress(e, &idle);
    if (res != ncclSuccess) return res;
    if (!idle) {
      idle_polls = 0;
      deadline = -1;
      rest = (idle_state_t){-1, 0};
      continue;
    }
    if (++idle_polls < e->spin) continue;
    idle_rest(e, &rest);
    if ((idle_polls & 255) == 0) {
      int64_t t = now_ms();
      if (deadline < 0) {
        deadline = t + e->timeout_ms;
      } else if (t > deadline) {
        WARN("engine: rank %d: no progress for %d ms waiting on peers (HETCCL_TIMEOUT)",
             user_rank(e, e->rank), e->timeout_ms);
        return engine_fail(e, ncclTimeout);
      }
    }
  }
}

ncclResult_t hetccl_engine_wait(hetccl_engine_t *e, hetccl_req_t **reqs, int n) {
  return wait_reqs(e, reqs, n, 0);
}

ncclResult_t hetccl_engine_wait_any(hetccl_engine_t *e, hetccl_req_t **reqs, int n) {
  return wait_reqs(e, reqs, n, 1);
}

ncclResult_t hetccl_engine_sendrecv(hetccl_engine_t *e, hetccl_msg_t m, int to, const void *sbuf,
                                    size_t sbytes, int from, void *rbuf, size_t rbytes,
                                    hetccl_consume_fn consume, void *consume_ctx) {
  hetccl_req_t sreq, rreq;
  hetccl_req_t *reqs[2] = {NULL, NULL};
  if (from >= 0) {
    HETCCL_CHECK(hetccl_engine_irecv(e, from, rbuf, rbytes, m.tag, consume, consume_ctx, &rreq));
    reqs[0] = &rreq;
  }
  if (to >= 0) {
    HETCCL_CHECK(hetccl_engine_isend(e, to, sbuf, sbytes, m, &sreq));
    reqs[1] = &sreq;
  }
  return hetccl_engine_wait(e, reqs, 2);
}

ncclResult_t hetccl_engine_token_post(hetccl_engine_t *e, uint64_t tag) {
  e->tok_posted = 0;
  if (!tag || e->nranks < 2) return ncclSuccess;
  int right = (e->rank + 1) % e->nranks, left = (e->rank + e->nranks - 1) % e->nranks;
  HETCCL_CHECK(hetccl_engine_irecv(e, left, NULL, 0, tag, NULL, NULL, &e->tok_recv));
  e->tok_posted = 1;
  return hetccl_engine_isend(e, right, NULL, 0, (hetccl_msg_t){tag, 0}, &e->tok_send);
}

ncclResult_t hetccl_engine_token_wait(hetccl_engine_t *e) {
  if (!e->tok_posted) return ncclSuccess;
  hetccl_req_t *reqs[2] = {&e->tok_recv, &e->tok_send};
  ncclResult_t res = hetccl_engine_wait(e, reqs, 2);
  e->tok_posted = 0;
  return res;
}

void *hetccl_engine_scratch(hetccl_engine_t *e, size_t bytes) {
  if (bytes <= e->scratch_bytes) return e->scratch;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
    WARN("engine: cannot allocate %zu bytes of scratch", bytes);
    return NULL;
  }
  free(e->scratch);
  e->scratch = p;
  e->scratch_bytes = bytes;
  return p;
}
