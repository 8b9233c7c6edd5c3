/* Personalized exchanges: AlltoAll (pairwise: step k sends to rank + k and
 * receives from rank - k), Gather and Scatter (the root talks to every
 * other rank in turn). A bounded window of steps is in flight, so the
 * transports see several messages at once but memory for requests stays
 * fixed.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

ncclResult_t hetccl_pairwise_alltoall(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  const char *in = c->sendbuf;
  char *out = c->recvbuf;
  if (in == out) { /* in place: blocks we receive would overwrite blocks still to send */
    char *copy = hetccl_engine_scratch(e, bytes * (size_t)n);
    if (!copy) return ncclSystemError;
    memcpy(copy, in, bytes * (size_t)n);
    in = copy;
  }
  return hetccl_algo_pairwise(e, in, bytes, out, bytes, bytes, 1);
}

/* In place when sendbuf == recvbuf + root * bytes at the root. */
ncclResult_t hetccl_linear_gather(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e), root = c->root;
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  if (r != root) return hetccl_engine_sendrecv(e, root, c->sendbuf, bytes, -1, NULL, 0, NULL, NULL);
  char *out = c->recvbuf;
  algo_copy(out + (size_t)r * bytes, c->sendbuf, bytes);
  algo_window_t w;
  hetccl_algo_window_init(&w);
  for (int k = 1; k < n; k++) {
    int from = algo_mod(r + k, n);
    HETCCL_CHECK(hetccl_algo_window_step(e, &w, -1, NULL, 0, from, out + (size_t)from * bytes,
                                         bytes));
  }
  return hetccl_algo_window_drain(e, &w);
}

/* In place when recvbuf == sendbuf + root * bytes at the root. */
ncclResult_t hetccl_linear_scatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e), root = c->root;
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  if (r != root) return hetccl_engine_sendrecv(e, -1, NULL, 0, root, c->recvbuf, bytes, NULL, NULL);
  const char *in = c->sendbuf;
  algo_copy(c->recvbuf, in + (size_t)r * bytes, bytes);
  algo_window_t w;
  hetccl_algo_window_init(&w);
  for (int k = 1; k < n; k++) {
    int to = algo_mod(r + k, n);
    HETCCL_CHECK(hetccl_algo_window_step(e, &w, to, in + (size_t)to * bytes, bytes, -1, NULL, 0));
  }
  return hetccl_algo_window_drain(e, &w);
}
