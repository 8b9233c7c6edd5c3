/* The host executor (sched.h): a schedule run on the calling thread over
 * the engine's point-to-point plane.
 *
 * Each step counts the dependencies it still waits for: its `after`
 * steps (met when done) and its pair's earlier message (met when posted);
 * each step lists the steps that depend on it, so finishing or posting
 * one touches only those. Steps whose count reaches zero start, lowest
 * index first (a message is posted, a local step runs at once); then the
 * messages in flight are looked at, and one the transport has finished is
 * done. When nothing can start and nothing has finished, the thread waits
 * in the engine until any message in flight finishes
 * (hetccl_engine_wait_any: the engine's spinning, yielding, timeout and
 * abort). The work is linear in the steps and their dependencies, plus the
 * messages in flight at each look (builders keep that number bounded:
 * windows per peer), so a schedule of many thousand pieces runs as fast
 * per piece as one of a few.
 *
 * Receives that reduce do so as the bytes land, through the transport's
 * consume hook, in the transport's pieces (dst = in (op) incoming).
 *
 * Transient results (HETCCL_STEP_FORWARD, sched.h) are fused where that
 * needs no memory, before the run: a transient PREPARE under an operator
 * that does not scale is a copy the next step need not read, so that step
 * reads its source instead (a SEND's src, a RECV_REDUCE's in) and the
 * PREPARE does nothing; a scaling one that a RECV_REDUCE reduces with is
 * done by that receive, on each piece as it lands (HETCCL_STEP_SCALE_IN:
 * dst = scaled in, then dst (op)= incoming, as the host's own algorithms
 * do); a transient result the next step sends is sent from where it was
 * written. A transient that stays without a buffer (a PreMulSum scaling
 * sent on that the builder gave no place) refuses the schedule.
 *
 * Thread: whichever thread drives the engine. */
#include <string.h>

#include "sched/sched.h"
#include "trace/trace.h"
#include "util/check.h"
#include "util/log.h"

enum { STEP_WAITING, STEP_POSTED, STEP_DONE };

/* The consume hook of a RECV_REDUCE step (ctx: the step). */
static void consume_reduce(void *ctx, void *dst, const void *src, size_t bytes) {
  const hetccl_step_t *t = ctx;
  size_t count = bytes / hetccl_dtype_size(t->op->dtype);
  const char *in = (const char *)t->src + ((char *)dst - (char *)t->dst);
  if (!count) return;
  if (t->flags & HETCCL_STEP_SCALE_IN) { /* this rank's data, scaled once, here */
    hetccl_reduce_prepare(t->op, dst, in, count);
    in = dst;
  }
  if (t->flags & HETCCL_STEP_IN_RIGHT)
    hetccl_sched_reduce_traced(t->op, dst, src, in, count);
  else
    hetccl_sched_reduce_traced(t->op, dst, in, src, count);
}

/* A step that does nothing once its transient result is fused away. */
#define STEP_FUSED 0xff

/* The fusing above, on every transient step i and the step after it. */
static ncclResult_t fuse_transients(hetccl_sched_t *s) {
  int scales = s->op && s->op->premul;
  for (int i = 0; i < s->nsteps; i++) {
    hetccl_step_t *t = &s->steps[i], *next = i + 1 < s->nsteps ? &s->steps[i + 1] : NULL;
    if (!(t->flags & HETCCL_STEP_FORWARD) || !t->bytes) continue;
    const void *result = t->dst;
    if (t->kind == HETCCL_STEP_PREPARE && !scales) {
      result = t->src;
      t->kind = STEP_FUSED;
    } else if (t->kind == HETCCL_STEP_PREPARE && next && next->kind == HETCCL_STEP_RECV_REDUCE &&
               !next->src) {
      next->src = t->src;
      next->flags |= HETCCL_STEP_SCALE_IN;
      t->kind = STEP_FUSED;
      continue;
    }
    if (!result) {
      WARN("schedule: step %d's result has no buffer (its builder left it to an executor "
           "that fuses it into the next step)", i);
      return ncclInternalError;
    }
    if (next && next->kind == HETCCL_STEP_SEND && !next->src) next->src = result;
    else if (next && next->kind == HETCCL_STEP_RECV_REDUCE && !next->src) next->src = result;
  }
  return ncclSuccess;
}

static ncclResult_t step_start(hetccl_sched_t *s, hetccl_step_t *t) {
  hetccl_engine_t *e = s->e;
  size_t count = t->op ? t->bytes / s->esize : 0;
  switch (t->kind) {
    case HETCCL_STEP_SEND:
      t->state = STEP_POSTED;
      return hetccl_engine_isend(e, t->peer, t->src, t->bytes, s->msg, &t->req);
    case HETCCL_STEP_RECV:
      t->state = STEP_POSTED;
      return hetccl_engine_irecv(e, t->peer, t->dst, t->bytes, s->msg.tag, NULL, NULL, &t->req);
    case HETCCL_STEP_RECV_REDUCE:
      t->state = STEP_POSTED;
      return hetccl_engine_irecv(e, t->peer, t->dst, t->bytes, s->msg.tag, consume_reduce, t,
                                 &t->req);
    case HETCCL_STEP_REDUCE:
      if (count) hetccl_sched_reduce_traced(t->op, t->dst, t->src, t->src2, count);
      break;
    case HETCCL_STEP_COPY:
      if (t->bytes && t->dst != t->src) memmove(t->dst, t->src, t->bytes);
      break;
    case HETCCL_STEP_PREPARE:
      if (count) hetccl_reduce_prepare(t->op, t->dst, t->src, count);
      break;
    case HETCCL_STEP_FINISH:
      if (count) hetccl_reduce_finish(t->op, t->dst, count);
      break;
    case STEP_FUSED:
      break;
    default:
      WARN("schedule: step of unknown kind %d", (int)t->kind);
      return ncclInternalError;
  }
  t->state = STEP_DONE;
  return ncclSuccess;
}

/* Step i's place among the messages of its peer and direction (1: the
 * first), through the builder's same_pair links. */
static int pair_ordinal(const hetccl_sched_t *s, int i) {
  int k = 0;
  for (; i != HETCCL_STEP_NONE; i = s->steps[i].same_pair) k++;
  return k;
}

/* Would pulling make two ranks wait for each other? A pulled send is done
 * only once its peer has read it. If the i-th receive from p waits for the
 * j-th send to p with j >= i, then on p, whose schedule mirrors this one,
 * the receive that reads that send is posted only after p's i-th receive
 * has started, which waits the same way for a send that this rank's
 * i-th receive reads: neither starts. An in-place AlltoAll and a two-rank
 * AllReduce overwrite what they sent (j == i); recursive halving-doubling
 * waits for an earlier round's send (j < i), which its peer has read
 * before. Builders name these waits directly (sched.h). */
static int pulling_deadlocks(const hetccl_sched_t *s) {
  for (int i = 0; i < s->nsteps; i++) {
    const hetccl_step_t *t = &s->steps[i];
    if (t->kind != HETCCL_STEP_RECV && t->kind != HETCCL_STEP_RECV_REDUCE) continue;
    for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++) {
      int a = t->after[k];
      if (a != HETCCL_STEP_NONE && s->steps[a].kind == HETCCL_STEP_SEND &&
          s->steps[a].peer == t->peer && pair_ordinal(s, a) >= pair_ordinal(s, i))
        return 1;
    }
  }
  return 0;
}

/* --- dependencies --------------------------------------------------------------- */

/* A dependent as stored: the step, and whether posting (not finishing)
 * its source meets it. */
#define DEP(step, on_start) (2 * (step) + (on_start))

/* Counts every step's dependencies and lists, per step, the steps that
 * depend on it (dep_off[i] .. dep_off[i + 1] in deps). */
static void link_steps(hetccl_sched_t *s) {
  int n = s->nsteps;
  int32_t *off = s->dep_off;
  memset(off, 0, ((size_t)n + 1) * sizeof(*off));
  for (int i = 0; i < n; i++) {
    const hetccl_step_t *t = &s->steps[i];
    s->pending[i] = 0;
    for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++)
      if (t->after[k] != HETCCL_STEP_NONE) off[t->after[k]]++, s->pending[i]++;
    if (t->same_pair != HETCCL_STEP_NONE) off[t->same_pair]++, s->pending[i]++;
  }
  for (int i = 1; i <= n; i++) off[i] += off[i - 1]; /* off[i]: the end of i's list */
  for (int i = n - 1; i >= 0; i--) { /* filled from the back: off[i] ends at its start */
    const hetccl_step_t *t = &s->steps[i];
    for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++)
      if (t->after[k] != HETCCL_STEP_NONE) s->deps[--off[t->after[k]]] = DEP(i, 0);
    if (t->same_pair != HETCCL_STEP_NONE) s->deps[--off[t->same_pair]] = DEP(i, 1);
  }
}

/* The ready steps: a min-heap of indices. */
static void ready_push(hetccl_sched_t *s, int *nready, int32_t i) {
  int32_t *h = s->ready;
  int k = (*nready)++;
  while (k > 0 && h[(k - 1) / 2] > i) {
    h[k] = h[(k - 1) / 2];
    k = (k - 1) / 2;
  }
  h[k] = i;
}

static int32_t ready_pop(hetccl_sched_t *s, int *nready) {
  int32_t *h = s->ready, top = h[0], last = h[--*nready];
  int k = 0, n = *nready;
  for (;;) {
    int c = 2 * k + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] < h[c]) c++;
    if (h[c] >= last) break;
    h[k] = h[c];
    k = c;
  }
  if (n) h[k] = last;
  return top;
}

/* Step i was posted (on_start) or finished: its dependents that this
 * meets, one count each; those with none left become ready. */
static void meet(hetccl_sched_t *s, int i, int on_start, int *nready) {
  for (int32_t d = s->dep_off[i]; d < s->dep_off[i + 1]; d++) {
    int32_t v = s->deps[d];
    if ((v & 1) != on_start) continue;
    if (--s->pending[v >> 1] == 0) ready_push(s, nready, v >> 1);
  }
}

ncclResult_t hetccl_sched_run_host(hetccl_sched_t *s, uint64_t tag) {
  if (s->failed) return ncclInternalError; /* its builder's overflow, logged there */
  hetccl_engine_t *e = s->e;
  if (!e) {
    WARN("schedule: built for the data plane, given to the host executor");
    return ncclInternalError;
  }
  HETCCL_CHECK(fuse_transients(s));
  hetccl_step_t *steps = s->steps;
  int n = s->nsteps, ndone = 0, nready = 0, ninflight = 0;
  s->msg = (hetccl_msg_t){tag, s->pull_ok && !pulling_deadlocks(s)};
  link_steps(s);
  for (int i = 0; i < n; i++) {
    steps[i].state = STEP_WAITING;
    if (!s->pending[i]) s->ready[nready++] = i; /* ascending: already a heap */
  }
  while (ndone < n) {
    while (nready) {
      int i = ready_pop(s, &nready);
      HETCCL_CHECK(step_start(s, &steps[i]));
      meet(s, i, 1, &nready);
      if (steps[i].state == STEP_POSTED) {
        s->inflight[ninflight++] = i;
      } else {
        ndone++;
        meet(s, i, 0, &nready);
      }
    }
    int finished = 0;
    for (int k = 0; k < ninflight;) {
      int i = s->inflight[k];
      if (!steps[i].req.done) {
        k++;
        continue;
      }
      hetccl_req_t *q = &steps[i].req; /* returns at once; records its trace event */
      HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
      steps[i].state = STEP_DONE;
      s->inflight[k] = s->inflight[--ninflight];
      ndone++;
      finished = 1;
      meet(s, i, 0, &nready);
    }
    if (finished || nready || ndone == n) continue;
    if (!ninflight) {
      int first = 0;
      while (first < n && steps[first].state == STEP_DONE) first++;
      WARN("schedule: step %d of %d can never start (its builder ordered it after a step "
           "that does not finish)", first, n);
      return ncclInternalError;
    }
    for (int k = 0; k < ninflight; k++) s->posted[k] = &steps[s->inflight[k]].req;
    HETCCL_CHECK(hetccl_engine_wait_any(e, s->posted, ninflight));
  }
  return ncclSuccess;
}
