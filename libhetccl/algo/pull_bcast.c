/* Broadcast by reads: every rank reads the whole message straight from the
 * root's buffer.
 *
 * Contract: algo.h's. Meant for ranks that read each other's memory
 * (engine.h: pull_min); correct over any transport (there, the root sends
 * n - 1 copies).
 *
 * Each receiving rank makes one copy, all at once, with no pipeline to
 * fill and no step per piece; readers that run together find the root's
 * lines in the shared cache. A chain through the transport's slots copies
 * each byte twice per hop and waits for the pipeline to fill over n - 1
 * hops (docs/host-engine.md). Out of place, the root copies its buffer
 * into its receive buffer while the others read.
 *
 * The root does not idle meanwhile: while it waits on its sends, the shm
 * transport lets it write pieces of each message straight into its
 * reader's buffer from the back while the reader reads from the front
 * (shm_ring.c: two cores on one message), so at n = 2 the message moves
 * on two cores, and with few readers the root's core adds to theirs.
 * Nothing to split here: the transport balances the pieces as they go,
 * and a transport that does not share (single copy off, socket) simply
 * carries the n - 1 sends.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

ncclResult_t hetccl_pull_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  if (r != c->root)
    return hetccl_engine_sendrecv(e, algo_msg(c, 1), -1, NULL, 0, c->root, c->recvbuf, bytes, NULL,
                                  NULL);
  hetccl_req_t *reqs = hetccl_engine_scratch(e, (size_t)n * sizeof(hetccl_req_t));
  if (!reqs) return ncclSystemError;
  for (int k = 1; k < n; k++)
    HETCCL_CHECK(hetccl_engine_isend(e, algo_mod(r + k, n), c->sendbuf, bytes, algo_msg(c, 1),
                                     &reqs[k - 1]));
  algo_copy(c->recvbuf, c->sendbuf, bytes);
  for (int k = 1; k < n; k++) {
    hetccl_req_t *q = &reqs[k - 1];
    HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
  }
  return ncclSuccess;
}
