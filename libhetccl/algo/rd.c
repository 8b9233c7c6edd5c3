/* Latency-bound collectives for small messages: AllReduce by direct
 * exchange (one round, every peer) or recursive doubling (log2 n rounds,
 * non-powers of two folded onto the largest power of two below), and
 * direct AllGather and ReduceScatter.
 *
 * Whole buffers move in one message each; contributions are staged in
 * scratch (cheap at these sizes) so that in-place calls need no care. Every
 * combination is ordered by rank, never by arrival, so that all ranks
 * compute bitwise identical AllReduce results.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

/* Direct: everyone sends its (scaled) contribution to everyone, then each
 * rank reduces the n contributions in rank order. */
ncclResult_t hetccl_direct_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  char *mem = hetccl_engine_scratch(e, stride * (size_t)n);
  if (!mem) return ncclSystemError;
  const char *mine = c->sendbuf;
  if (c->op.premul || c->sendbuf == c->recvbuf) { /* stage: the result overwrites it */
    hetccl_reduce_prepare(&c->op, mem + (size_t)r * stride, c->sendbuf, c->count);
    mine = mem + (size_t)r * stride;
  }
  HETCCL_CHECK(hetccl_algo_pairwise(e, mine, 0, mem, stride, bytes, 0));
#define CONTRIB(i) ((i) == r ? mine : mem + (size_t)(i) * stride)
  algo_reduce(&c->op, c->recvbuf, CONTRIB(0), CONTRIB(1), c->count);
  for (int i = 2; i < n; i++) algo_reduce(&c->op, c->recvbuf, c->recvbuf, CONTRIB(i), c->count);
#undef CONTRIB
  hetccl_reduce_finish(&c->op, c->recvbuf, c->count);
  return ncclSuccess;
}

/* Combine the partner's value into ours, lower rank on the left. */
static void combine_ordered(const hetccl_coll_t *c, void *cur, const void *other, int other_lower) {
  if (other_lower)
    algo_reduce(&c->op, cur, other, cur, c->count);
  else
    algo_reduce(&c->op, cur, cur, other, c->count);
}

/* Recursive doubling over m = 2^k ranks. With n = m + rem, ranks below
 * 2*rem pair up first: the even one hands its contribution to the odd one
 * (which stands for both) and gets the result back at the end. */
ncclResult_t hetccl_rd_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  char *cur = hetccl_engine_scratch(e, 2 * stride);
  if (!cur) return ncclSystemError;
  char *tmp = cur + stride;
  int m = 1;
  while (m * 2 <= n) m *= 2;
  int rem = n - m, vr;
  hetccl_reduce_prepare(&c->op, cur, c->sendbuf, c->count);
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      HETCCL_CHECK(hetccl_engine_sendrecv(e, r + 1, cur, bytes, -1, NULL, 0, NULL, NULL));
      return hetccl_engine_sendrecv(e, -1, NULL, 0, r + 1, c->recvbuf, bytes, NULL, NULL);
    }
    HETCCL_CHECK(hetccl_engine_sendrecv(e, -1, NULL, 0, r - 1, tmp, bytes, NULL, NULL));
    combine_ordered(c, cur, tmp, 1);
    vr = r / 2;
  } else {
    vr = r - rem;
  }
  for (int mask = 1; mask < m; mask <<= 1) {
    int vp = vr ^ mask, partner = vp < rem ? 2 * vp + 1 : vp + rem;
    HETCCL_CHECK(hetccl_engine_sendrecv(e, partner, cur, bytes, partner, tmp, bytes, NULL, NULL));
    combine_ordered(c, cur, tmp, partner < r);
  }
  hetccl_reduce_finish(&c->op, cur, c->count);
  algo_copy(c->recvbuf, cur, bytes);
  if (r < 2 * rem) return hetccl_engine_sendrecv(e, r - 1, cur, bytes, -1, NULL, 0, NULL, NULL);
  return ncclSuccess;
}

/* AllGather: every rank sends its block to every other rank. */
ncclResult_t hetccl_direct_allgather(hetccl_engine_t *e, const hetccl_coll_t *c) {
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  return hetccl_algo_pairwise(e, c->sendbuf, 0, c->recvbuf, bytes, bytes, 1);
}

/* ReduceScatter: block b of every rank goes to rank b, which reduces the n
 * contributions in rank order. Scratch: n received blocks, then (premul
 * only) this rank's scaled send buffer. */
ncclResult_t hetccl_direct_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  size_t staged = c->op.premul ? bytes * (size_t)n : 0;
  char *mem = hetccl_engine_scratch(e, stride * (size_t)n + staged);
  if (!mem) return ncclSystemError;
  const char *in = c->sendbuf;
  if (staged) {
    hetccl_reduce_prepare(&c->op, mem + stride * (size_t)n, in, c->count * (size_t)n);
    in = mem + stride * (size_t)n;
  }
  /* Our own block is staged too: in place, recvbuf is that block. */
  HETCCL_CHECK(hetccl_algo_pairwise(e, in, bytes, mem, stride, bytes, 1));
  algo_reduce(&c->op, c->recvbuf, mem, mem + stride, c->count);
  for (int i = 2; i < n; i++)
    algo_reduce(&c->op, c->recvbuf, c->recvbuf, mem + (size_t)i * stride, c->count);
  hetccl_reduce_finish(&c->op, c->recvbuf, c->count);
  return ncclSuccess;
}
