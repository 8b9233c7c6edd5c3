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
#include "comm/backend.h"
#include "exec/group.h"
#include "hier/hier_forms.h"
#include "util/check.h"

/* A send or receive to a rank of this rank's island, which a vendor serves. */
int hetccl_hier_p2p_inside(ncclComm_t comm, const hetccl_op_t *op) {
  const hetccl_hier_map_t *m = comm->hier.map;
  return comm->hier.island && comm->hier.island->forward.vendor && op->peer >= 0 &&
         op->peer < comm->nranks && m->of[op->peer] == m->of[comm->rank];
}

/* A send or receive of this rank's, on this communicator: placed as the
 * user's would be (to its island where the peer is there and a vendor
 * serves it, else the engine), without validating it again. */
static ncclResult_t p2p_here(form_t *f, hetccl_op_kind_t kind, void *buf, size_t count, int peer) {
  hetccl_op_t p = hetccl_hier_p2p_op(f, kind, buf, count, peer);
  p.fn = kind == HETCCL_OP_Send ? "ncclSend" : "ncclRecv";
  if (hetccl_hier_p2p_inside(f->comm, &p))
    return hetccl_hier_p2p(f, kind, buf, count, f->map->index[peer]);
  f->where = ACROSS_LEADERS; /* for the message: between islands */
  return hetccl_comm_submit(f->comm, &p);
}

/* Every pair as a send and a receive in one group, so that the pairs of a
 * vendor island take its links; the rank's own block copied. */
ncclResult_t hetccl_hier_all_to_all(form_t *f) {
  if (form_skip(f, 0)) return ncclSuccess;
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count;
  void *self_in = form_at(op->sendbuf, (size_t)c->rank * n, f->elem);
  void *self_out = form_at(op->recvbuf, (size_t)c->rank * n, f->elem);
  if (self_in != self_out) HETCCL_CHECK(hetccl_hier_copy(f, self_out, self_in, n * f->elem));
  ncclResult_t res = hetccl_group_open();
  for (int q = 0; q < c->nranks && res == ncclSuccess; q++) {
    if (q == c->rank) continue;
    res = p2p_here(f, HETCCL_OP_Send, form_at(op->sendbuf, (size_t)q * n, f->elem), n, q);
    if (res == ncclSuccess)
      res = p2p_here(f, HETCCL_OP_Recv, form_at(op->recvbuf, (size_t)q * n, f->elem), n, q);
  }
  ncclResult_t end = hetccl_group_close();
  return res != ncclSuccess ? res : end;
}

/* Gather (to_root) or Scatter: the root's pairs as sends and receives in
 * one group, as AlltoAll's; the root's own block copied. */
ncclResult_t hetccl_hier_gather_scatter(form_t *f, int to_root) {
  if (form_skip(f, 0)) return ncclSuccess;
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count;
  hetccl_op_kind_t there = to_root ? HETCCL_OP_Recv : HETCCL_OP_Send;
  if (c->rank != op->root) {
    void *buf = to_root ? (void *)op->sendbuf : op->recvbuf;
    return p2p_here(f, to_root ? HETCCL_OP_Send : HETCCL_OP_Recv, buf, n, op->root);
  }
  void *blocks = to_root ? op->recvbuf : (void *)op->sendbuf;
  void *mine = form_at(blocks, (size_t)c->rank * n, f->elem);
  void *own = to_root ? (void *)op->sendbuf : op->recvbuf;
  if (mine != own) {
    size_t bytes = n * f->elem;
    HETCCL_CHECK(to_root ? hetccl_hier_copy(f, mine, own, bytes)
                         : hetccl_hier_copy(f, own, mine, bytes));
  }
  ncclResult_t res = hetccl_group_open();
  for (int q = 0; q < c->nranks && res == ncclSuccess; q++)
    if (q != c->rank) res = p2p_here(f, there, form_at(blocks, (size_t)q * n, f->elem), n, q);
  ncclResult_t end = hetccl_group_close();
  return res != ncclSuccess ? res : end;
}
