/* Hierarchical forms made of point-to-point pairs: a send or receive
 * between two ranks of one island that a vendor serves goes to the
 * island's communicator (its links, NVLink say, where the engine would
 * cross host memory); AlltoAll, Gather and Scatter run as their pairs'
 * sends and receives in one group, each dispatched as a user's would be
 * (docs/islands.md, "Point-to-point inside an island").
 *
 *   call           pairs inside a vendor island   other pairs     own block
 *   Send, Recv     the island's communicator      the engine      -
 *   AlltoAll       the same, in one group         the same        copied
 *   Gather,        the root's, in one group                       copied at
 *   Scatter                                                       the root
 *
 * Both ranks of a pair decide from the map alone, whatever their buffers
 * (host buffers are staged for the vendor, hier/hier_host.c), so a send
 * and its receive always meet on one communicator.
 *
 * Thread: the API caller's. */
#include "hier/hier_forms.h"

/* A send or receive to a rank of this rank's island, which a vendor serves. */
int hetccl_hier_p2p_inside(ncclComm_t comm, const hetccl_op_t *op) {
  const hetccl_hier_map_t *m = comm->hier.map;
  return comm->hier.island && comm->hier.island->forward.vendor && op->peer >= 0 &&
         op->peer < comm->nranks && m->of[op->peer] == m->of[comm->rank];
}

/* A send or receive of this rank's, on this communicator: placed as the
 * user's would be (to its island where the peer is there and a vendor
 * serves it, else between islands on the communicator itself: the
 * engine), which the map alone decides. */
static void p2p_here(form_t *f, hetccl_op_kind_t kind, void *buf, size_t count, int peer) {
  hetccl_op_t p = *f->op;
  p.peer = peer;
  if (hetccl_hier_p2p_inside(f->comm, &p))
    hetccl_hier_p2p(f, 0, kind, buf, count, f->map->index[peer]);
  else
    hetccl_hier_plan_p2p(f->plan, 0, BETWEEN_ISLANDS, kind, buf, count, peer);
}

/* Every pair as a send and a receive in one group, so that the pairs of a
 * vendor island take its links; the rank's own block copied. */
ncclResult_t hetccl_hier_all_to_all(form_t *f) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count;
  void *self_in = form_at(op->sendbuf, (size_t)c->rank * n, f->elem);
  void *self_out = form_at(op->recvbuf, (size_t)c->rank * n, f->elem);
  if (self_in != self_out) hetccl_hier_plan_copy(f->plan, 0, self_out, self_in, n * f->elem);
  hetccl_hier_plan_group(f->plan, HIER_QUIET);
  for (int q = 0; q < c->nranks; q++) {
    if (q == c->rank) continue;
    p2p_here(f, HETCCL_OP_Send, form_at(op->sendbuf, (size_t)q * n, f->elem), n, q);
    p2p_here(f, HETCCL_OP_Recv, form_at(op->recvbuf, (size_t)q * n, f->elem), n, q);
  }
  hetccl_hier_plan_ungroup(f->plan);
  return ncclSuccess;
}

/* Gather (to_root) or Scatter: the root's pairs as sends and receives in
 * one group, as AlltoAll's; the root's own block copied. */
static void gather_scatter(form_t *f, int to_root) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count;
  hetccl_op_kind_t there = to_root ? HETCCL_OP_Recv : HETCCL_OP_Send;
  if (c->rank != op->root) {
    void *buf = to_root ? (void *)op->sendbuf : op->recvbuf;
    p2p_here(f, to_root ? HETCCL_OP_Send : HETCCL_OP_Recv, buf, n, op->root);
    return;
  }
  void *blocks = to_root ? op->recvbuf : (void *)op->sendbuf;
  void *mine = form_at(blocks, (size_t)c->rank * n, f->elem);
  void *own = to_root ? (void *)op->sendbuf : op->recvbuf;
  if (mine != own) {
    size_t bytes = n * f->elem;
    if (to_root) hetccl_hier_plan_copy(f->plan, 0, mine, own, bytes);
    else hetccl_hier_plan_copy(f->plan, 0, own, mine, bytes);
  }
  hetccl_hier_plan_group(f->plan, HIER_QUIET);
  for (int q = 0; q < c->nranks; q++)
    if (q != c->rank) p2p_here(f, there, form_at(blocks, (size_t)q * n, f->elem), n, q);
  hetccl_hier_plan_ungroup(f->plan);
}

ncclResult_t hetccl_hier_gather(form_t *f) {
  gather_scatter(f, 1);
  return ncclSuccess;
}

ncclResult_t hetccl_hier_scatter(form_t *f) {
  gather_scatter(f, 0);
  return ncclSuccess;
}
