/* Transport conformance: the contracts of transport.h, checked through the
 * table alone (hetccl_transport_get), on NPROCS forked ranks with every pair
 * connected (common/ranks.h is their bootstrap). What a transport decides
 * for itself comes from its section (conformance.h).
 *
 * First, with no connection: can_connect says yes on one host (across
 * hosts, as the section says); the closing slots take NULL. Every context:
 * ctx_create writes no more than HETCCL_TRANSPORT_ADDR_BYTES; connect fills
 * exactly the endpoints asked for (all ranks, or two of them), or none when
 * it fails; the context is destroyed after its endpoints.
 *
 * Phases, every rank with every other, all messages queued at once:
 *   sizes 0, 1, 7, 64, 4096, piece-1, piece, piece+1, 1 MiB+3, 64 MiB
 *     (piece: the transport's staging unit): copy (sends marked pull_ok),
 *     summing consume (pieces whole multiples of 8 bytes but the last, inside
 *     the buffer), copy again (sequence numbers carry on), receives with tag
 *     0; no byte past the end; requests complete in posting order per
 *     direction with progress == bytes; no call blocks (CALL_BOUND_S)
 *   2000 small messages both ways at once; an 8-byte ping-pong per pair
 *   an endpoint with nothing to do says idle; pull_min is what it was
 *   perf (pairs (0,1), (2,3)...): 8 B half round trip, 16 MiB one way and
 *     both ways at once
 *   errors, each on a fresh context:
 *     a wrong tag is ncclInvalidUsage, recorded in args.mismatch, and the
 *       endpoint stays failed; a wrong size is ncclInvalidUsage, not recorded
 *     a peer that closes is ncclRemoteError within NOTICE_S, with no note
 *     peers that give up (ep_fail) in the middle of a 64 MiB send: the
 *       receiver fails with the note's answer (ncclInvalidUsage for a usage
 *       error, else ncclRemoteError) within NOTICE_S, after part of the
 *       message, and keeps the first note (code, origin, text)
 *     connect while the peers never do: ncclTimeout within NOTICE_S of a
 *       300 ms timeout; with the abort flag set, ncclInternalError within
 *       1 s; no endpoint left
 *     a peer that exits before connect (3 ranks or more): the section's
 *       answer, in time
 *     a peer that exits in the middle of a 64 MiB message (once the
 *       receiver holds a sixteenth): ncclRemoteError within NOTICE_S
 *
 * usage: conformance shm|socket|ib NPROCS [perf|denycma] [--big BYTES]
 *        [--limit SECONDS]
 * (knobs from the environment; `perf` runs the figures alone; `denycma`,
 * shm only: odd ranks may not process_vm_readv; --big: the largest message,
 * 64 MiB, at least 16 MiB; --limit: each rank's alarm(), 110 s). Exit status
 * 0 on success, 77 when the transport cannot run here. */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "../common/transport_check.h"

/* Bounds on noticing a closed or dead peer, or giving up on an absent one:
 * the result codes already tell prompt notice from running into drive()'s
 * bound or a 20 s connect timeout; the time bound only keeps it prompt,
 * loose enough for a loaded 2-core machine (2.1 s was seen there). */
#define NOTICE_S 5.0
/* No isend/irecv/progress call may take this long: none may wait. */
#define CALL_BOUND_S 2.0

enum { AREA_MAIN, AREA_TAG, AREA_SIZE, AREA_NOTES, AREA_ABSENT, AREA_GONE, AREA_DEAD };

static const hetccl_transport_t *T;
static const conf_section_t *X;
static conf_opts_t O;
static hetccl_fail_note_t peer_note; /* args.peer_note of every context */
static hetccl_tag_mismatch_t mismatch; /* args.mismatch of every context */

/* --- calls, timed ------------------------------------------------------------- */

static void call_took(double t0, const char *what, int peer) {
  double dt = tc_now_s() - t0;
  if (dt > CALL_BOUND_S) FAIL("%s on the endpoint to rank %d took %.2f s", what, peer, dt);
}

static ncclResult_t post(hetccl_ep_t **eps, int peer, int recv, hetccl_req_t *r) {
  double t0 = tc_now_s();
  ncclResult_t res = recv ? T->irecv(eps[peer], r) : T->isend(eps[peer], r);
  call_took(t0, recv ? "irecv" : "isend", peer);
  return res;
}

/* Requests of one phase, in posting order, with their endpoint and direction. */
typedef struct batch {
  int n, cap;
  hetccl_req_t *reqs; /* never moves: the transport links posted requests */
  uint8_t *group;     /* peer * 2 + recv */
} batch_t;

static void batch_init(batch_t *b, int cap) {
  b->n = 0;
  b->cap = cap;
  b->reqs = calloc((size_t)cap, sizeof(*b->reqs));
  b->group = calloc((size_t)cap, 1);
  if (!b->reqs || !b->group) FAIL("out of memory for %d requests", cap);
}

static void batch_free(batch_t *b) {
  free(b->reqs);
  free(b->group);
}

static hetccl_req_t *batch_post(batch_t *b, hetccl_ep_t **eps, int peer, int recv,
                                hetccl_req_t init) {
  if (b->n == b->cap) FAIL("batch of %d requests is full", b->cap);
  hetccl_req_t *r = &b->reqs[b->n];
  *r = init;
  if (r->consume && !r->consume_ctx) r->consume_ctx = r; /* sum_consume checks the bounds */
  b->group[b->n++] = (uint8_t)(peer * 2 + recv);
  CHK(post(eps, peer, recv, r));
  return r;
}

/* Completion in posting order: per endpoint and direction, no request is
 * done while an earlier one is not. */
static void check_order(const batch_t *b) {
  uint32_t waiting = 0; /* groups with a request not done yet */
  for (int i = 0; i < b->n; i++) {
    uint32_t bit = 1u << b->group[i];
    if (!b->reqs[i].done) waiting |= bit;
    else if (waiting & bit)
      FAIL("request %d (%s rank %d) is done before an earlier one", i,
           b->group[i] & 1 ? "from" : "to", b->group[i] / 2);
  }
}

/* Progress every endpoint until every request of b is done; returns the
 * first error. A request done must have moved all its bytes. */
static ncclResult_t drive(hetccl_ep_t **eps, batch_t *b, double secs) {
  double deadline = tc_now_s() + secs;
  unsigned idle_polls = 0;
  for (unsigned it = 0;; it++) {
    int all_idle = 1, done = 1;
    for (int p = 0; p < tc_nranks; p++) {
      if (eps[p] == NULL) continue;
      int idle;
      double t0 = tc_now_s();
      ncclResult_t res = T->progress(eps[p], &idle);
      call_took(t0, "progress", p);
      if (res != ncclSuccess) return res;
      all_idle &= idle;
    }
    if (b->n <= 512 || (it & 63) == 0) check_order(b);
    for (int i = 0; i < b->n && done; i++) done = b->reqs[i].done;
    if (done) break;
    if ((it & 1023) == 0 && tc_now_s() > deadline) FAIL("drive: timed out after %.0f s", secs);
    /* Spin a while (latency), then share the cores (more ranks than cores). */
    idle_polls = all_idle ? idle_polls + 1 : 0;
    if (idle_polls > 2000) sched_yield();
  }
  for (int i = 0; i < b->n; i++)
    if (b->reqs[i].progress != b->reqs[i].bytes)
      FAIL("request %d is done with progress %zu of %zu bytes", i, b->reqs[i].progress,
           b->reqs[i].bytes);
  return ncclSuccess;
}

/* One request on its own, posted already. */
static ncclResult_t drive_posted(hetccl_ep_t **eps, int peer, int recv, hetccl_req_t *r,
                                 double secs) {
  uint8_t group = (uint8_t)(peer * 2 + recv);
  batch_t b = {.n = 1, .cap = 1, .reqs = r, .group = &group};
  return drive(eps, &b, secs);
}

/* Post one request and drive it: the first error of either. */
static ncclResult_t drive_one(hetccl_ep_t **eps, int peer, int recv, hetccl_req_t *r,
                              double secs) {
  ncclResult_t res = post(eps, peer, recv, r);
  return res != ncclSuccess ? res : drive_posted(eps, peer, recv, r, secs);
}

/* --- contexts ------------------------------------------------------------------ */

static hetccl_transport_args_t conn_args(int area, int timeout_ms, volatile int *abort_flag) {
  return (hetccl_transport_args_t){.rank = tc_rank, .nranks = tc_nranks,
                                   .comm_id = 0x5e5e000000000000ull + (uint64_t)area,
                                   .secret = 42, .timeout_ms = timeout_ms,
                                   .abort_flag = abort_flag, .ifname = "",
                                   .peer_note = &peer_note, .mismatch = &mismatch};
}

/* ctx_create, publish the blob (ctx_create writes no more than it may). */
static void conn_create(conf_conn_t *c, int area, int timeout_ms, volatile int *abort_flag) {
  uint8_t blob[HETCCL_TRANSPORT_ADDR_BYTES + 64];
  memset(c, 0, sizeof(*c));
  memset(blob, 0xa5, sizeof(blob));
  c->area = area;
  c->args = conn_args(area, timeout_ms, abort_flag);
  CHK(T->ctx_create(&c->args, &c->ctx, blob));
  for (size_t i = HETCCL_TRANSPORT_ADDR_BYTES; i < sizeof(blob); i++)
    if (blob[i] != 0xa5) FAIL("ctx_create wrote byte %zu of its address blob", i);
  tc_publish(area, blob);
}

static void conn_peers(uint8_t *use, uint8_t *addrs, hetccl_peer_locality_t *loc, int area,
                       unsigned members) {
  for (int p = 0; p < tc_nranks; p++) {
    use[p] = p != tc_rank && (members >> p & 1);
    memcpy(addrs + p * HETCCL_TRANSPORT_ADDR_BYTES, tc_blob(area, p), HETCCL_TRANSPORT_ADDR_BYTES);
    loc[p] = (hetccl_peer_locality_t){.host_hash = 1, .pid = tc_pid(p)};
  }
}

static void conn_close(conf_conn_t *c) {
  for (int p = 0; p < tc_nranks; p++) T->ep_close(c->eps[p]);
  T->ctx_destroy(c->ctx); /* a context outlives its endpoints */
  memset(c, 0, sizeof(*c));
}

/* Connect the ranks in `members` (a bit mask) pairwise on c, published
 * everywhere. Returns connect's result; ranks outside `members` only close. */
static ncclResult_t conn_connect(conf_conn_t *c, unsigned members) {
  int area = c->area;
  if (!(members >> tc_rank & 1)) {
    conn_close(c);
    return ncclSuccess;
  }
  uint8_t use[TC_MAX_RANKS], addrs[TC_MAX_RANKS * HETCCL_TRANSPORT_ADDR_BYTES];
  hetccl_peer_locality_t loc[TC_MAX_RANKS];
  conn_peers(use, addrs, loc, area, members);
  ncclResult_t res = T->connect(c->ctx, use, addrs, loc, c->eps);
  if (res != ncclSuccess) {
    for (int p = 0; p < tc_nranks; p++)
      if (c->eps[p]) FAIL("failed connect left an endpoint for rank %d", p);
    conn_close(c);
    return res;
  }
  for (int p = 0; p < tc_nranks; p++)
    if ((use[p] != 0) != (c->eps[p] != NULL)) FAIL("connect: endpoint for rank %d", p);
  return ncclSuccess;
}

/* A context of their own for the ranks in `members`, connected. */
static ncclResult_t conn_try(conf_conn_t *c, int area, unsigned members, int timeout_ms) {
  conn_create(c, area, timeout_ms, NULL);
  tc_barrier();
  if (X->before_connect && area == AREA_MAIN) X->before_connect(c);
  return conn_connect(c, members);
}

static void conn_open(conf_conn_t *c, int area) { CHK(conn_try(c, area, ~0u, 20000)); }

/* --- traffic ------------------------------------------------------------------- */

#define NSIZES 10
static size_t sizes[NSIZES];

static void exchange(hetccl_ep_t **eps, uint8_t **sbuf, int use_consume, int any_tag) {
  batch_t b;
  batch_init(&b, 2 * tc_nranks * NSIZES);
  uint8_t *rbuf[TC_MAX_RANKS][NSIZES] = {{0}};
  for (int p = 0; p < tc_nranks; p++) {
    if (p == tc_rank) continue;
    for (int k = 0; k < NSIZES; k++) {
      uint8_t *d = rbuf[p][k] = malloc(sizes[k] + 1);
      if (!d) FAIL("out of memory");
      for (size_t i = 0; i < sizes[k]; i++) d[i] = use_consume ? prefill(i) : 0xee;
      d[sizes[k]] = 0x5a;
      batch_post(&b, eps, p, 1, (hetccl_req_t){.buf = d, .bytes = sizes[k],
                                              .tag = any_tag ? 0 : 1000 + (uint64_t)k,
                                              .consume = use_consume ? sum_consume : NULL});
    }
    for (int k = 0; k < NSIZES; k++)
      batch_post(&b, eps, p, 0, (hetccl_req_t){.buf = sbuf[k], .bytes = sizes[k],
                                              .tag = 1000 + (uint64_t)k, .pull_ok = !use_consume});
  }
  CHK(drive(eps, &b, 60));
  if (consume_bad) FAIL("consume got a piece that breaks the 8-byte rule or the bounds");
  for (int p = 0; p < tc_nranks; p++) {
    if (p == tc_rank) continue;
    for (int k = 0; k < NSIZES; k++) {
      uint8_t *d = rbuf[p][k];
      for (size_t i = 0; i < sizes[k]; i++) {
        uint8_t want = content(p, sizes[k], i);
        if (use_consume) want = (uint8_t)(want + prefill(i));
        if (d[i] != want)
          FAIL("%s: size %zu from rank %d: byte %zu is %u, expected %u",
               use_consume ? "consume" : "copy", sizes[k], p, i, d[i], want);
      }
      if (d[sizes[k]] != 0x5a) FAIL("size %zu from rank %d: wrote past the end", sizes[k], p);
      free(d);
    }
  }
  batch_free(&b);
}

/* 2000 small messages of varying size to every peer and from every peer,
 * all posted before any progress: both directions at once. */
static void many_small(hetccl_ep_t **eps) {
  enum { N = 2000 };
  batch_t b;
  batch_init(&b, 2 * tc_nranks * N);
  uint8_t *rbuf = calloc((size_t)tc_nranks * N, 256), sbuf[256];
  if (!rbuf) FAIL("out of memory");
  for (int i = 0; i < 256; i++) sbuf[i] = (uint8_t)(tc_rank * 17 + i);
  for (int p = 0; p < tc_nranks; p++) {
    if (p == tc_rank) continue;
    for (int i = 0; i < N; i++) {
      size_t n = 1 + (size_t)(i * 37) % 255;
      batch_post(&b, eps, p, 1, (hetccl_req_t){.buf = rbuf + ((size_t)p * N + i) * 256,
                                              .bytes = n, .tag = 77 + (uint64_t)i});
      batch_post(&b, eps, p, 0, (hetccl_req_t){.buf = sbuf, .bytes = n, .tag = 77 + (uint64_t)i});
    }
  }
  CHK(drive(eps, &b, 60));
  for (int p = 0; p < tc_nranks; p++) {
    if (p == tc_rank) continue;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < 1 + (i * 37) % 255; j++)
        if (rbuf[((size_t)p * N + i) * 256 + j] != (uint8_t)(p * 17 + j))
          FAIL("small message %d from rank %d: byte %d wrong", i, p, j);
  }
  free(rbuf);
  batch_free(&b);
}

/* 8-byte ping-pong between a and b; returns the half round trip in us. */
static double pingpong(hetccl_ep_t **eps, int a, int b, int iters) {
  uint64_t sv = 0, rv = 0;
  int peer = tc_rank == a ? b : a;
  double t0 = 0;
  for (int it = -iters / 10; it < iters; it++) {
    if (it == 0) t0 = tc_now_s();
    hetccl_req_t s = {.buf = &sv, .bytes = 8, .tag = 9};
    hetccl_req_t r = {.buf = &rv, .bytes = 8, .tag = 9};
    CHK(post(eps, peer, 1, &r));
    if (tc_rank == a) {
      sv = (uint64_t)it;
      CHK(post(eps, peer, 0, &s));
      CHK(drive_posted(eps, peer, 1, &r, 30));
      if (rv != (uint64_t)it + 1)
        FAIL("ping-pong: got %llu, expected %d", (unsigned long long)rv, it + 1);
    } else {
      CHK(drive_posted(eps, peer, 1, &r, 30));
      sv = rv + 1;
      CHK(post(eps, peer, 0, &s));
    }
    CHK(drive_posted(eps, peer, 0, &s, 30));
  }
  return (tc_now_s() - t0) / iters / 2 * 1e6;
}

/* `bytes` from the even to the odd rank of each pair (0,1), (2,3)... (one
 * way) or both ways at once; GB/s per direction on the receiver's clock.
 * All pairs run at once: with 4 ranks on 2 cores, that is the
 * oversubscribed case. */
static double bandwidth(hetccl_ep_t **eps, uint8_t *sbuf, uint8_t *rbuf, int both, size_t bytes) {
  const int iters = bytes >= (4u << 20) ? 20 : 200, warm = 3;
  double t0 = 0;
  int peer = tc_rank ^ 1;
  for (int it = 0; it < warm + iters; it++) {
    if (it == warm) t0 = tc_now_s();
    batch_t b;
    hetccl_req_t reqs[2];
    uint8_t group[2];
    b = (batch_t){.n = 0, .cap = 2, .reqs = reqs, .group = group};
    if (both || (tc_rank & 1))
      batch_post(&b, eps, peer, 1, (hetccl_req_t){.buf = rbuf, .bytes = bytes, .tag = 3});
    if (both || !(tc_rank & 1))
      batch_post(&b, eps, peer, 0, (hetccl_req_t){.buf = sbuf, .bytes = bytes, .tag = 3,
                                                 .pull_ok = 1});
    CHK(drive(eps, &b, 30));
  }
  return bytes * (double)iters / (tc_now_s() - t0) / 1e9;
}

static void perf(hetccl_ep_t **eps, uint8_t *big) {
  const size_t bytes = 16u << 20;
  uint8_t *rbuf = calloc(1, bytes);
  if (!rbuf) FAIL("out of memory");
  int pairs = tc_nranks / 2, in_pair = tc_rank < 2 * pairs;
  double lat = 0, one = 0, two = 0;
  char knobs[160];
  X->describe(knobs, sizeof(knobs));
  tc_barrier();
  if (tc_rank <= 1) lat = pingpong(eps, 0, 1, 20000);
  tc_barrier();
  if (in_pair) one = bandwidth(eps, big, rbuf, 0, bytes);
  tc_barrier();
  if (in_pair) two = bandwidth(eps, big, rbuf, 1, bytes);
  for (size_t b = 64u << 10; O.perf_only && b <= (4u << 20); b *= 4) { /* the curve */
    tc_barrier();
    double x = 0, y = 0;
    if (in_pair) x = bandwidth(eps, big, rbuf, 0, b);
    tc_barrier();
    if (in_pair) y = bandwidth(eps, big, rbuf, 1, b);
    if (tc_rank == 1)
      printf("%s %8zu B: one way %.2f GB/s, both ways %.2f GB/s per direction\n", T->name, b,
             x, y);
  }
  if (tc_rank == 1) {
    printf("%s np=%d %s: 8 B half round trip %.3f us; 16 MiB one way %.2f GB/s; both ways "
           "%.2f GB/s per direction (%d pair%s at once)\n", T->name, tc_nranks, knobs, lat, one,
           two, pairs, pairs > 1 ? "s" : "");
    fflush(stdout);
  }
  tc_barrier();
  free(rbuf);
}

/* After every request of every rank is done: an endpoint with nothing to
 * do soon says so (a transport may still settle its own bookkeeping). */
static void check_idle(hetccl_ep_t **eps) {
  for (int p = 0; p < tc_nranks; p++) {
    if (eps[p] == NULL) continue;
    double until = tc_now_s() + NOTICE_S;
    for (int idle = 0; !idle;) {
      CHK(T->progress(eps[p], &idle));
      if (idle) break;
      if (tc_now_s() > until) FAIL("the endpoint to rank %d never says idle with nothing to do", p);
      usleep(100);
    }
  }
}

/* --- errors -------------------------------------------------------------------- */

/* A frame that does not fit: rank 0 sends 100 bytes with tag 5 on a fresh
 * context, rank 1 posts a receive of `bytes` with `tag`. Rank 1 gets the
 * receive's result, the others ncclSuccess; args.mismatch starts empty. */
static ncclResult_t misfit(conf_conn_t *c, int area, size_t bytes, uint64_t tag) {
  char buf[100] = {0};
  conn_open(c, area);
  memset(&mismatch, 0, sizeof(mismatch));
  if (tc_rank == 0) {
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 5};
    CHK(drive_one(c->eps, 1, 0, &r, 10));
  }
  if (tc_rank != 1) return ncclSuccess;
  hetccl_req_t r = {.buf = buf, .bytes = bytes, .tag = tag};
  return drive_one(c->eps, 0, 1, &r, 10);
}

/* Frames that do not fit the posted receive; a peer that closes. */
static void errors_mismatch(void) {
  conf_conn_t c;
  char buf[100] = {0};
  /* A receive that expects another tag. */
  ncclResult_t res = misfit(&c, AREA_TAG, sizeof(buf), 6);
  if (tc_rank == 1) {
    if (res != ncclInvalidUsage) FAIL("tag mismatch gave %d, expected ncclInvalidUsage", res);
    if (!mismatch.seen || mismatch.peer != 0 || mismatch.theirs != 5 || mismatch.mine != 6)
      FAIL("the tag mismatch was recorded as seen %d, rank %d, theirs %llu, mine %llu",
           mismatch.seen, mismatch.peer, (unsigned long long)mismatch.theirs,
           (unsigned long long)mismatch.mine);
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 6};
    if (T->irecv(c.eps[0], &r) != ncclInvalidUsage) FAIL("failed endpoint did not stay failed");
  }
  tc_barrier();
  /* A peer that closes its end while we wait on it: no note. */
  if (tc_rank == 1) {
    T->ep_close(c.eps[0]);
    c.eps[0] = NULL;
  }
  tc_barrier();
  if (tc_rank == 0) {
    memset(&peer_note, 0, sizeof(peer_note));
    double t0 = tc_now_s();
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 0};
    res = drive_one(c.eps, 1, 1, &r, 10);
    double dt = tc_now_s() - t0;
    if (res != ncclRemoteError) FAIL("closed peer gave %d, expected ncclRemoteError", res);
    if (dt > NOTICE_S) FAIL("closed peer took %.2f s to notice", dt);
    if (peer_note.code != 0) FAIL("a peer that closed without a note left one: %s", peer_note.text);
  }
  tc_barrier();
  conn_close(&c);

  /* A receive that expects another size (same tag): not a tag mismatch. */
  res = misfit(&c, AREA_SIZE, sizeof(buf) / 2, 5);
  if (tc_rank == 1) {
    if (res != ncclInvalidUsage) FAIL("size mismatch gave %d, expected ncclInvalidUsage", res);
    if (mismatch.seen) FAIL("a size mismatch was recorded as a tag mismatch");
  }
  tc_barrier();
  conn_close(&c);
}

/* What a rank's failure note says: odd ranks a usage error, even ones not. */
static ncclResult_t note_code(int rank) { return rank & 1 ? ncclInvalidUsage : ncclSystemError; }

/* Every rank but 0 gives up (ep_fail) part-way through a large send to rank
 * 0: the data stops mid-message, the note says why. Not pull_ok: a message
 * the receiver pulls from the sender's buffer has no middle to fail in. */
static void errors_notes(void) {
  conf_conn_t c;
  const size_t big = O.big;
  uint8_t *data = calloc(1, big);
  if (!data) FAIL("out of memory");
  conn_open(&c, AREA_NOTES);
  memset(&peer_note, 0, sizeof(peer_note));
  if (tc_rank > 0) {
    hetccl_req_t r = {.buf = data, .bytes = big, .tag = 9};
    CHK(post(c.eps, 0, 0, &r));
    /* push what the transport takes for 50 ms: the peer does not read yet */
    for (double until = tc_now_s() + 0.05; tc_now_s() < until;) {
      int idle;
      CHK(T->progress(c.eps[0], &idle));
    }
    if (r.done) FAIL("%zu bytes left before the receiver posted its receive", big);
    hetccl_fail_note_t note = {.code = note_code(tc_rank), .origin = tc_rank};
    snprintf(note.text, sizeof(note.text), "rank %d gave up for a test", tc_rank);
    if (T->ep_fail) T->ep_fail(c.eps[0], &note);
    else T->ep_close(c.eps[0]); /* optional slot: the peer learns only that we left */
    c.eps[0] = NULL;
  }
  tc_barrier();
  for (int p = 1; tc_rank == 0 && p < tc_nranks; p++) {
    hetccl_ep_t *one[TC_MAX_RANKS] = {0}; /* the others' failures wait their turn */
    one[p] = c.eps[p];
    hetccl_req_t r = {.buf = data, .bytes = big, .tag = 9};
    ncclResult_t want = T->ep_fail && note_code(p) == ncclInvalidUsage ? ncclInvalidUsage
                                                                       : ncclRemoteError;
    double t0 = tc_now_s();
    ncclResult_t res = drive_one(one, p, 1, &r, 10);
    double dt = tc_now_s() - t0;
    if (res != want) FAIL("rank %d's note of %d gave %d, expected %d", p, note_code(p), res, want);
    if (dt > NOTICE_S) FAIL("rank %d's note took %.2f s to notice", p, dt);
    if (r.progress == 0 || r.progress >= big)
      FAIL("rank %d's failed send moved %zu of %zu bytes: not a mid-message failure", p,
           r.progress, big);
    char first[HETCCL_FAIL_TEXT];
    snprintf(first, sizeof(first), "rank 1 gave up for a test");
    if (T->ep_fail && (peer_note.code != (int32_t)note_code(1) || peer_note.origin != 1 ||
                       strcmp(peer_note.text, first) != 0))
      FAIL("the first note is kept as code %d origin %d '%s'", peer_note.code, peer_note.origin,
           peer_note.text);
    printf("note: rank 0 got rank %d's note after %zu of %zu bytes (%.3f s)\n", p, r.progress,
           big, dt);
    fflush(stdout);
    T->ep_close(c.eps[p]);
    c.eps[p] = NULL;
  }
  tc_barrier();
  conn_close(&c);
  free(data);
}

/* A peer that never connects: a bounded wait, and the abort flag. The
 * highest rank waits: it is the one that accepts on every transport. */
static void errors_absent(void) {
  volatile int abort_flag = 0;
  conf_conn_t c;
  conn_create(&c, AREA_ABSENT, 300, &abort_flag);
  tc_barrier();
  if (tc_rank == tc_nranks - 1) {
    uint8_t use[TC_MAX_RANKS], addrs[TC_MAX_RANKS * HETCCL_TRANSPORT_ADDR_BYTES];
    hetccl_peer_locality_t loc[TC_MAX_RANKS];
    conn_peers(use, addrs, loc, AREA_ABSENT, ~0u);
    double t0 = tc_now_s();
    ncclResult_t res = T->connect(c.ctx, use, addrs, loc, c.eps);
    double dt = tc_now_s() - t0;
    if (res != ncclTimeout || dt > NOTICE_S)
      FAIL("connect to absent peers gave %d after %.2f s, expected ncclTimeout", res, dt);
    abort_flag = 1;
    t0 = tc_now_s();
    res = T->connect(c.ctx, use, addrs, loc, c.eps);
    dt = tc_now_s() - t0;
    if (res != ncclInternalError || dt > 1.0)
      FAIL("aborted connect gave %d after %.2f s, expected ncclInternalError", res, dt);
    for (int p = 0; p < tc_nranks; p++)
      if (c.eps[p]) FAIL("failed connect left an endpoint for rank %d", p);
  }
  tc_barrier();
  conn_close(&c);
}

/* A peer that exits before it connects (rank 2, when there is one). */
static void errors_gone(void) {
  if (tc_nranks < 3) return;
  conf_conn_t c;
  if (tc_rank == 2) {
    conn_create(&c, AREA_GONE, 20000, NULL);
    tc_barrier();
    _exit(0); /* leaves its context behind, as a crash would */
  }
  double t0 = tc_now_s();
  conn_create(&c, AREA_GONE, X->gone_timeout_ms, NULL);
  tc_barrier();
  tc_wait_exit(2, NOTICE_S);
  ncclResult_t res = conn_connect(&c, ~0u);
  double dt = tc_now_s() - t0;
  double bound = NOTICE_S + (X->gone_before_connect == ncclTimeout ? X->gone_timeout_ms / 1e3 : 0);
  if (res != X->gone_before_connect)
    FAIL("peer gone before connect gave %d, expected %d", res, X->gone_before_connect);
  if (dt > bound) FAIL("peer gone before connect took %.2f s to notice", dt);
  tc_alive = tc_nranks - 1;
}

/* A peer that exits in the middle of a large message (rank 1 to rank 0):
 * the sender dies once the receiver holds a sixteenth of it (told through
 * a shared word, so that no transport needs to count a send's bytes). */
static void errors_dead(void) {
  conf_conn_t c;
  const size_t bytes = O.big;
  uint8_t *big = malloc(bytes);
  if (!big) FAIL("out of memory");
  memset(big, 1, bytes); /* before the barrier: both sides start at once */
  _Atomic uint64_t *got = tc_word(0);
  CHK(conn_try(&c, AREA_DEAD, 3u, 20000));
  tc_barrier();
  if (tc_rank == 0 && tc_nranks >= 3 && X->after_peer_gone) X->after_peer_gone(AREA_GONE, 2);
  if (tc_rank > 1) {
    free(big);
    return;
  }
  hetccl_req_t r = {.buf = big, .bytes = bytes, .tag = 8, .pull_ok = 1};
  double t0 = tc_now_s();
  if (tc_rank == 1) {
    CHK(post(c.eps, 0, 0, &r));
    while (atomic_load(got) < bytes / 16) { /* a pulled send moves nothing here */
      int idle;
      if (!r.done) CHK(T->progress(c.eps[0], &idle));
      if (tc_now_s() - t0 > 10) FAIL("the receiver got %llu bytes in 10 s",
                                     (unsigned long long)atomic_load(got));
    }
    if (r.done) FAIL("the whole message left before its sender could die");
    _exit(0);
  }
  ncclResult_t res = post(c.eps, 1, 1, &r); /* the receive may see the exit at once */
  while (res == ncclSuccess && !r.done) {
    int idle;
    double t = tc_now_s();
    res = T->progress(c.eps[1], &idle);
    call_took(t, "progress", 1);
    atomic_store(got, r.progress);
    if (tc_now_s() - t0 > 10) FAIL("dead peer: no answer in 10 s");
  }
  double dt = tc_now_s() - t0;
  if (res != ncclRemoteError)
    FAIL("dead peer gave %d, expected ncclRemoteError (%zu bytes in, done %d, %.3f s)", res,
         r.progress, r.done, dt);
  if (dt > NOTICE_S) FAIL("dead peer took %.2f s to notice", dt);
  char knobs[160];
  X->describe(knobs, sizeof(knobs));
  printf("%s np=%d %s: peer exit mid-message noticed after %.3f s (%zu of %zu bytes in)\n",
         T->name, tc_nranks, knobs, dt, r.progress, bytes);
  fflush(stdout);
  conn_close(&c);
  free(big);
}

/* --- the run ------------------------------------------------------------------- */

/* Slots that need no connection: can_connect is a pure function of the
 * localities, and the closing slots take NULL. */
static void check_table(void) {
  hetccl_peer_locality_t me = {.host_hash = 1, .pid = tc_pid(0)};
  hetccl_peer_locality_t here = {.host_hash = 1, .pid = tc_pid(1)};
  hetccl_peer_locality_t there = {.host_hash = 2, .pid = tc_pid(1)};
  if (!T->can_connect(&me, &here)) FAIL("can_connect refuses a peer on the same host");
  if (!T->can_connect(&me, &there) != !X->crosses_hosts)
    FAIL("can_connect says %d for a peer on another host", T->can_connect(&me, &there));
  hetccl_fail_note_t note = {.code = ncclSystemError};
  T->ep_close(NULL);
  T->ctx_destroy(NULL);
  if (T->ep_fail) T->ep_fail(NULL, &note);
}

static int rank_main(void *arg) {
  (void)arg;
  if (X->rank_start) X->rank_start(&O);
  check_table();
  size_t piece = X->piece_bytes();
  size_t init[NSIZES] = {0, 1, 7, 64, 4096, piece - 1, piece, piece + 1, (1u << 20) + 3, O.big};
  memcpy(sizes, init, sizeof(sizes));
  conf_conn_t c;
  conn_open(&c, AREA_MAIN);
  tc_barrier();
  if (X->after_connect) X->after_connect(&c, &O);
  size_t pull[TC_MAX_RANKS];
  for (int p = 0; p < tc_nranks; p++)
    pull[p] = T->pull_min && c.eps[p] ? T->pull_min(c.eps[p]) : SIZE_MAX;

  uint8_t *sbuf[NSIZES];
  for (int k = 0; k < NSIZES; k++) {
    if (!(sbuf[k] = malloc(sizes[k] + 1))) FAIL("out of memory");
    for (size_t i = 0; i < sizes[k]; i++) sbuf[k][i] = content(tc_rank, sizes[k], i);
  }
  if (!O.perf_only) {
    exchange(c.eps, sbuf, 0, 0);
    exchange(c.eps, sbuf, 1, 0);
    exchange(c.eps, sbuf, 0, 1);
    many_small(c.eps);
    for (int p = 0; p < tc_nranks; p++) { /* ping-pong with each in turn */
      for (int q = p + 1; q < tc_nranks; q++) {
        tc_barrier();
        if (tc_rank == p || tc_rank == q) pingpong(c.eps, p, q, 2000);
      }
    }
    tc_barrier();
    check_idle(c.eps);
    for (int p = 0; p < tc_nranks; p++)
      if (T->pull_min && c.eps[p] && T->pull_min(c.eps[p]) != pull[p])
        FAIL("pull_min for rank %d went from %zu to %zu", p, pull[p], T->pull_min(c.eps[p]));
  }
  perf(c.eps, sbuf[NSIZES - 1]);
  conn_close(&c);
  if (!O.perf_only) {
    errors_mismatch();
    errors_notes();
    errors_absent();
    errors_gone();
    errors_dead();
  }
  for (int k = 0; k < NSIZES; k++) free(sbuf[k]);
  return 0;
}

static const conf_section_t *const sections[] = {&conf_shm, &conf_socket, &conf_ib};

static int usage(const char *argv0) {
  fprintf(stderr, "usage: %s shm|socket|ib NPROCS (2..%d) [perf|denycma] [--big BYTES (>= 16 MiB)] [--limit SECONDS]\n",
          argv0, TC_MAX_RANKS);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage(argv[0]);
  const char *name = argv[1];
  int nranks = atoi(argv[2]);
  O.big = 64u << 20;
  int limit_s = 110;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "perf")) O.perf_only = 1;
    else if (!strcmp(argv[i], "denycma")) O.deny_cma = 1;
    else if (!strcmp(argv[i], "--big") && i + 1 < argc) O.big = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit_s = atoi(argv[++i]);
    else return usage(argv[0]);
  }
  for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
    if (!strcmp(sections[i]->name, name)) X = sections[i];
  for (int id = 0; id < HETCCL_TRANSPORT_COUNT; id++) {
    const hetccl_transport_t *t = hetccl_transport_get((hetccl_transport_id_t)id);
    if (t && !strcmp(t->name, name)) T = t;
  }
  if (nranks < 2 || nranks > TC_MAX_RANKS || O.big < (16u << 20) || limit_s < 1 || X == NULL ||
      (O.deny_cma && strcmp(name, "shm") != 0))
    return usage(argv[0]);
  if (T == NULL) {
    fprintf(stderr, "transport %s is not registered (a required slot is NULL?)\n", name);
    return 1;
  }
  if (X->available && !X->available()) return 77;
  int bad = tc_run(nranks, (unsigned)limit_s, rank_main, NULL);
  printf("%s transport conformance, %d processes: %s\n", name, nranks, bad ? "FAIL" : "ok");
  return bad;
}
