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
 * A schedule (sched/sched.h): the root's sends, then its own copy, which
 * the executor runs once the sends are posted.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

ncclResult_t hetccl_pull_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  hetccl_sched_t *s = hetccl_algo_sched(e, NULL, n, 0, NULL);
  if (!s) return ncclSystemError;
  if (r != c->root) {
    hetccl_sched_recv(s, c->root, c->recvbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
  } else {
    for (int k = 1; k < n; k++) /* nearest first; all posted before the own copy */
      hetccl_sched_send(s, algo_mod(r + k, n), c->sendbuf, bytes, HETCCL_STEP_NONE,
                        HETCCL_STEP_NONE);
    hetccl_sched_copy(s, c->recvbuf, c->sendbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
  }
  s->pull_ok = 1; /* plain receives: the readers read the root's buffer in place */
  return hetccl_sched_run_host(s, c->tag);
}
