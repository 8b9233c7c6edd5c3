/* Latency-bound collectives for small messages, as schedules
 * (sched/sched.h): AllReduce by direct exchange (one round, every peer) or
 * recursive doubling (log2 n rounds, non-powers of two folded onto the
 * largest power of two below), and direct AllGather and ReduceScatter.
 *
 * Whole buffers move in one message each; contributions are staged in
 * scratch (cheap at these sizes) so that in-place calls need no care. Every
 * combination is ordered by rank, never by arrival, so that all ranks
 * compute bitwise identical AllReduce results; a reduction starts as soon
 * as the contribution it needs has arrived and the one before it is done.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

/* The rank-ordered reduction of n contributions into dst, finished:
 * contribution i is at mem + i * stride (this rank's, r, at mine), ready
 * once step ready_at[i] is done (HETCCL_STEP_NONE: at once). */
static void reduce_in_order(hetccl_sched_t *s, void *dst, const char *mine, int r,
                            const char *mem, size_t stride, size_t bytes, const int *ready_at,
                            int n) {
#define CONTRIB(i) ((i) == r ? mine : mem + (size_t)(i) * stride)
  int prev = hetccl_sched_reduce(s, dst, CONTRIB(0), CONTRIB(1), bytes, ready_at[0], ready_at[1],
                                 HETCCL_STEP_NONE);
  for (int i = 2; i < n; i++)
    prev = hetccl_sched_reduce(s, dst, dst, CONTRIB(i), bytes, prev, ready_at[i],
                               HETCCL_STEP_NONE);
#undef CONTRIB
  hetccl_sched_finish(s, dst, bytes, prev, HETCCL_STEP_NONE);
}

/* Direct: everyone sends its (scaled) contribution to everyone, then each
 * rank reduces the n contributions in rank order. Scratch: n slots for
 * contributions, then the receive indices. */
ncclResult_t hetccl_direct_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  char *mem;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, algo_pairwise_steps(n) + n + 2,
                                        stride * (size_t)n + (size_t)n * sizeof(int),
                                        (void **)&mem);
  if (!s) return ncclSystemError;
  int *ready_at = (int *)(mem + stride * (size_t)n);
  const char *mine = c->sendbuf;
  int staged = HETCCL_STEP_NONE;
  if (c->op.premul || c->sendbuf == c->recvbuf) { /* stage: the result overwrites it */
    mine = mem + (size_t)r * stride;
    staged = hetccl_sched_prepare(s, (void *)mine, c->sendbuf, bytes, HETCCL_STEP_NONE,
                                  HETCCL_STEP_NONE);
  }
  hetccl_algo_sched_pairwise(s, mine, 0, mem, stride, bytes, 0, staged, ready_at);
  ready_at[r] = staged;
  reduce_in_order(s, c->recvbuf, mine, r, mem, stride, bytes, ready_at, n);
  return hetccl_sched_run_host(s, c->tag);
}

/* Recursive doubling over m = 2^k ranks. With n = m + rem, ranks below
 * 2*rem pair up first: the even one hands its contribution to the odd one
 * (which stands for both) and gets the result back at the end. Each round
 * exchanges the whole current value with the partner and combines the
 * two, the lower rank's on the left. */
ncclResult_t hetccl_rd_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  int m = 1, rounds = 0;
  while (m * 2 <= n) m *= 2, rounds++;
  int rem = n - m, vr;
  char *cur;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, 3 * rounds + 6, 2 * stride, (void **)&cur);
  if (!s) return ncclSystemError;
  char *tmp = cur + stride;
  int prev = hetccl_sched_prepare(s, cur, c->sendbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
  if (r < 2 * rem && r % 2 == 0) {
    int sent = hetccl_sched_send(s, r + 1, cur, bytes, prev, HETCCL_STEP_NONE);
    hetccl_sched_recv(s, r + 1, c->recvbuf, bytes, sent, HETCCL_STEP_NONE);
    return hetccl_sched_run_host(s, c->tag);
  }
  if (r < 2 * rem) {
    prev = hetccl_sched_recv_reduce(s, r - 1, cur, cur, HETCCL_STEP_IN_RIGHT, bytes, prev,
                                    HETCCL_STEP_NONE);
    vr = r / 2;
  } else {
    vr = r - rem;
  }
  for (int mask = 1; mask < m; mask <<= 1) {
    int vp = vr ^ mask, partner = vp < rem ? 2 * vp + 1 : vp + rem;
    int sent = hetccl_sched_send(s, partner, cur, bytes, prev, HETCCL_STEP_NONE);
    int got = hetccl_sched_recv(s, partner, tmp, bytes, prev, HETCCL_STEP_NONE);
    /* cur changes only once its send is done */
    prev = partner < r ? hetccl_sched_reduce(s, cur, tmp, cur, bytes, sent, got, HETCCL_STEP_NONE)
                       : hetccl_sched_reduce(s, cur, cur, tmp, bytes, sent, got, HETCCL_STEP_NONE);
  }
  prev = hetccl_sched_finish(s, cur, bytes, prev, HETCCL_STEP_NONE);
  prev = hetccl_sched_copy(s, c->recvbuf, cur, bytes, prev, HETCCL_STEP_NONE);
  if (r < 2 * rem) hetccl_sched_send(s, r - 1, cur, bytes, prev, HETCCL_STEP_NONE);
  return hetccl_sched_run_host(s, c->tag);
}

/* AllGather: every rank sends its block to every other rank. */
ncclResult_t hetccl_direct_allgather(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  hetccl_sched_t *s = hetccl_algo_sched(e, NULL, algo_pairwise_steps(n), 0, NULL);
  if (!s) return ncclSystemError;
  s->pull_ok = 1; /* plain receives: peers may read our block in place */
  hetccl_algo_sched_pairwise(s, c->sendbuf, 0, c->recvbuf, bytes, bytes, 1, HETCCL_STEP_NONE,
                             NULL);
  return hetccl_sched_run_host(s, c->tag);
}

/* ReduceScatter: block b of every rank goes to rank b, which reduces the n
 * contributions in rank order. Scratch: n received blocks (our own staged
 * too: in place, recvbuf is that block), the receive indices, then
 * (premul only) this rank's scaled send buffer. */
ncclResult_t hetccl_direct_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  size_t idx = algo_round_up((size_t)n * sizeof(int), 64);
  size_t staged = c->op.premul ? bytes * (size_t)n : 0;
  char *mem;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, algo_pairwise_steps(n) + n + 3,
                                        stride * (size_t)n + idx + staged, (void **)&mem);
  if (!s) return ncclSystemError;
  int *ready_at = (int *)(mem + stride * (size_t)n);
  const char *in = c->sendbuf;
  int prep = HETCCL_STEP_NONE;
  if (staged) {
    in = mem + stride * (size_t)n + idx;
    prep = hetccl_sched_prepare(s, (void *)in, c->sendbuf, bytes * (size_t)n, HETCCL_STEP_NONE,
                                HETCCL_STEP_NONE);
  }
  hetccl_algo_sched_pairwise(s, in, bytes, mem, stride, bytes, 1, prep, ready_at);
  reduce_in_order(s, c->recvbuf, mem + (size_t)r * stride, r, mem, stride, bytes, ready_at, n);
  return hetccl_sched_run_host(s, c->tag);
}
