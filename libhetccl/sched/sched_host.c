/* The host executor (sched.h): a schedule run on the calling thread over
 * the engine's point-to-point plane.
 *
 * A sweep walks the steps from the first unfinished one, in index order:
 * a posted message that the transport finished is done; a step whose
 * `after` steps are done, and whose pair's earlier message has been
 * posted, starts (a message is posted, a local step runs at once). When a
 * sweep starts nothing, the thread waits in the engine until any posted
 * message finishes (hetccl_engine_wait_any: the engine's spinning,
 * yielding, timeout and abort), then sweeps again.
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

static int step_ready(const hetccl_sched_t *s, const hetccl_step_t *t) {
  for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++)
    if (t->after[k] != HETCCL_STEP_NONE && s->steps[t->after[k]].state != STEP_DONE) return 0;
  return t->same_pair == HETCCL_STEP_NONE || s->steps[t->same_pair].state != STEP_WAITING;
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

ncclResult_t hetccl_sched_run_host(hetccl_sched_t *s, uint64_t tag) {
  if (s->failed) return ncclInternalError; /* its builder's overflow, logged there */
  hetccl_engine_t *e = s->e;
  if (!e) {
    WARN("schedule: built for the data plane, given to the host executor");
    return ncclInternalError;
  }
  HETCCL_CHECK(fuse_transients(s));
  hetccl_step_t *steps = s->steps;
  int n = s->nsteps, first = 0;
  s->msg = (hetccl_msg_t){tag, s->pull_ok && !pulling_deadlocks(s)};
  for (int i = 0; i < n; i++) steps[i].state = STEP_WAITING;
  while (first < n) {
    int moved = 0, nposted = 0;
    for (int i = first; i < n; i++) {
      hetccl_step_t *t = &steps[i];
      if (t->state == STEP_POSTED && t->req.done) {
        hetccl_req_t *q = &t->req; /* returns at once; records its trace event */
        HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
        t->state = STEP_DONE;
        moved = 1;
      } else if (t->state == STEP_WAITING && step_ready(s, t)) {
        HETCCL_CHECK(step_start(s, t));
        moved = 1;
      }
      if (t->state == STEP_POSTED) s->posted[nposted++] = &t->req;
    }
    while (first < n && steps[first].state == STEP_DONE) first++;
    if (!moved && first < n) {
      if (!nposted) {
        WARN("schedule: step %d of %d can never start (its builder ordered it after a step "
             "that does not finish)", first, n);
        return ncclInternalError;
      }
      HETCCL_CHECK(hetccl_engine_wait_any(e, s->posted, nposted));
    }
  }
  return ncclSuccess;
}
