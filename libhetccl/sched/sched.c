/* Building schedules (sched.h): steps appended into the builder's memory,
 * each numbered, each knowing the previous step of its pair and direction.
 *
 * Thread: whichever thread drives the engine. */
#include "sched/sched.h"

#include <string.h>

#include "trace/trace.h"
#include "util/log.h"

void hetccl_sched_reduce_traced(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                                size_t count) {
  uint64_t t0 = HETCCL_TRACE_BEGIN();
  hetccl_reduce(op, dst, a, b, count);
  if (!t0) return;
  /* The pairwise operator: a PreMulSum or an average sums (its scaling is
   * applied once, apart). */
  hetccl_trace_ev_t ev = {.kind = HETCCL_TRACE_REDUCE, .name = "reduce",
                          .op = hetccl_redop_name((ncclRedOp_t)op->kind),
                          .dtype = hetccl_dtype_name(op->dtype),
                          .bytes = count * hetccl_dtype_size(op->dtype), .rank = HETCCL_TRACE_NONE,
                          .peer = HETCCL_TRACE_NONE, .root = HETCCL_TRACE_NONE,
                          .step = HETCCL_TRACE_NONE, .seq = HETCCL_TRACE_NO_SEQ};
  hetccl_trace_record(t0, &ev);
}

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

/* Per step, besides the step itself and a request pointer: inflight,
 * pending, dep_off (one more), ready, and up to MAX_AFTER + 1 dependents. */
#define EXEC_INTS_PER_STEP (4 + HETCCL_STEP_MAX_AFTER + 1)

size_t hetccl_sched_bytes(int max_steps, int nranks) {
  return round16((size_t)max_steps * sizeof(hetccl_step_t)) +
         round16((size_t)max_steps * sizeof(hetccl_req_t *)) +
         round16(2 * (size_t)nranks * sizeof(int32_t)) +
         round16(((size_t)max_steps * EXEC_INTS_PER_STEP + 1) * sizeof(int32_t));
}

void hetccl_sched_init_ranks(hetccl_sched_t *s, void *mem, int max_steps, int rank, int nranks,
                             const hetccl_redop_t *op) {
  memset(s, 0, sizeof(*s));
  s->rank = rank;
  s->nranks = nranks;
  s->op = op;
  s->esize = op ? hetccl_dtype_size(op->dtype) : 1;
  s->cap = mem ? max_steps : 0;
  if (!mem) return; /* counting: every append is refused, and counted */
  s->steps = mem;
  char *next = (char *)mem + round16((size_t)max_steps * sizeof(hetccl_step_t));
  s->posted = (hetccl_req_t **)next;
  s->last_send = (int32_t *)(next + round16((size_t)max_steps * sizeof(hetccl_req_t *)));
  s->last_recv = s->last_send + nranks;
  for (int p = 0; p < 2 * nranks; p++) s->last_send[p] = HETCCL_STEP_NONE;
  size_t m = (size_t)max_steps;
  s->inflight = (int32_t *)((char *)s->last_send + round16(2 * (size_t)nranks * sizeof(int32_t)));
  s->pending = s->inflight + m;
  s->ready = s->pending + m;
  s->dep_off = s->ready + m;                 /* m + 1 */
  s->deps = s->dep_off + m + 1;              /* (MAX_AFTER + 1) * m */
}

void hetccl_sched_init(hetccl_sched_t *s, void *mem, int max_steps, hetccl_engine_t *e,
                       const hetccl_redop_t *op) {
  hetccl_sched_init_ranks(s, mem, max_steps, hetccl_engine_rank(e), hetccl_engine_nranks(e), op);
  s->e = e;
}

/* The common part of every append: a numbered step, or NONE past cap. */
static hetccl_step_t *append(hetccl_sched_t *s, hetccl_step_kind_t kind, int a0, int a1, int a2,
                             int *index) {
  *index = HETCCL_STEP_NONE;
  s->wanted++;
  if (s->nsteps == s->cap) {
    if (!s->failed && s->steps)
      WARN("schedule: more than the %d steps its builder sized it for", s->cap);
    s->failed = 1;
    return NULL;
  }
  *index = s->nsteps;
  hetccl_step_t *t = &s->steps[s->nsteps++];
  memset(t, 0, sizeof(*t));
  t->kind = (uint8_t)kind;
  t->peer = -1;
  t->after[0] = a0;
  t->after[1] = a1;
  t->after[2] = a2;
  t->same_pair = HETCCL_STEP_NONE;
  t->op = s->op;
  return t;
}

/* A message step: it also follows the previous one of its pair. */
static hetccl_step_t *message(hetccl_sched_t *s, hetccl_step_kind_t kind, int peer, int a0,
                              int a1, int *index) {
  hetccl_step_t *t = append(s, kind, a0, a1, HETCCL_STEP_NONE, index);
  if (!t) return NULL;
  int32_t *last = kind == HETCCL_STEP_SEND ? s->last_send : s->last_recv;
  t->peer = peer;
  t->same_pair = last[peer];
  last[peer] = *index;
  return t;
}

int hetccl_sched_send(hetccl_sched_t *s, int peer, const void *src, size_t bytes, int a0, int a1) {
  int i;
  hetccl_step_t *t = message(s, HETCCL_STEP_SEND, peer, a0, a1, &i);
  if (t) t->src = src, t->bytes = bytes;
  return i;
}

void hetccl_sched_also_after(hetccl_sched_t *s, int step, int a) {
  if (step == HETCCL_STEP_NONE || a == HETCCL_STEP_NONE) return;
  int32_t *after = s->steps[step].after;
  for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++) {
    if (after[k] == a) return;
    if (after[k] == HETCCL_STEP_NONE) {
      after[k] = a;
      return;
    }
  }
  WARN("schedule: step %d waits for more than %d steps", step, HETCCL_STEP_MAX_AFTER);
  s->failed = 1;
}

int hetccl_sched_recv(hetccl_sched_t *s, int peer, void *dst, size_t bytes, int a0, int a1) {
  int i;
  hetccl_step_t *t = message(s, HETCCL_STEP_RECV, peer, a0, a1, &i);
  if (t) t->dst = dst, t->bytes = bytes;
  return i;
}

int hetccl_sched_recv_reduce(hetccl_sched_t *s, int peer, void *dst, const void *in,
                             int flags, size_t bytes, int a0, int a1) {
  int i;
  hetccl_step_t *t = message(s, HETCCL_STEP_RECV_REDUCE, peer, a0, a1, &i);
  if (t) t->dst = dst, t->src = in, t->flags = (uint8_t)flags, t->bytes = bytes;
  return i;
}

int hetccl_sched_reduce(hetccl_sched_t *s, void *dst, const void *a, const void *b, size_t bytes,
                        int a0, int a1, int a2) {
  int i;
  hetccl_step_t *t = append(s, HETCCL_STEP_REDUCE, a0, a1, a2, &i);
  if (t) t->dst = dst, t->src = a, t->src2 = b, t->bytes = bytes;
  return i;
}

int hetccl_sched_copy(hetccl_sched_t *s, void *dst, const void *src, size_t bytes, int a0, int a1) {
  int i;
  hetccl_step_t *t = append(s, HETCCL_STEP_COPY, a0, a1, HETCCL_STEP_NONE, &i);
  if (t) t->dst = dst, t->src = src, t->bytes = bytes;
  return i;
}

int hetccl_sched_prepare(hetccl_sched_t *s, void *dst, const void *src, size_t bytes, int a0,
                         int a1) {
  int i;
  hetccl_step_t *t = append(s, HETCCL_STEP_PREPARE, a0, a1, HETCCL_STEP_NONE, &i);
  if (t) t->dst = dst, t->src = src, t->bytes = bytes;
  return i;
}

int hetccl_sched_finish(hetccl_sched_t *s, void *dst, size_t bytes, int a0, int a1) {
  int i;
  hetccl_step_t *t = append(s, HETCCL_STEP_FINISH, a0, a1, HETCCL_STEP_NONE, &i);
  if (t) t->dst = dst, t->bytes = bytes;
  return i;
}
