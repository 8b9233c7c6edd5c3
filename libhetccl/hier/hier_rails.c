/* The rails: hierarchical forms in which every rank of the islands
 * crosses at once (hier/hier.h: rail j holds the ranks of index j in every
 * island, one per island; rail 0 is the leaders). Where every island holds
 * k ranks and the message is large enough, each rank's link carries 1/k of
 * what crosses, where through the leaders one rank's link carries all of
 * it (docs/islands.md, "Rails"). R is the root, I its island.
 *
 *   collective (from)       inside, first          across (slot 1)        inside, last
 *   AllReduce               ReduceScatter: slice j AllReduce of slice j   AllGather of the
 *   (HIER_RAILS_MIN)        to index j             on rail j              slices
 *   Broadcast               I: Broadcast from R    Broadcast of slice j   others: AllGather
 *   (HIER_RAILS_MIN)        (the whole buffer)     on rail j from I       of the slices
 *   Reduce                  ReduceScatter: slice j Reduce of slice j on   I: each sends R its
 *   (HIER_RAILS_MIN)        to index j             rail j to I            slice (grouped)
 *   AllGather                                      AllGather on rail j    AllGather of the
 *   (HIER_RAILS_MIN_GATHER)                        of index j's slices    rails' gathers,
 *                                                                         then copies out
 *   ReduceScatter           copies in (chunk j),   ReduceScatter on
 *   (HIER_RAILS_MIN_GATHER) then ReduceScatter:    rail j
 *                           chunk j to index j
 *
 * AllReduce, Broadcast and Reduce send a count's last count % k elements (no
 * ReduceScatter takes uneven slices) through the leaders' form, its
 * phases in the same slots. Below HETCCL_HIER_RAILS_MIN (4 MiB) the
 * leaders' form runs: on 4 x H100 it took 117 us at 1 MiB where the rails
 * took 180-250 (twice the programs to launch across), and the rails gained
 * from 16 MiB.
 *
 * AllGather and ReduceScatter reach the ranks of index j of every island,
 * which no island's block of the buffer holds together, so their blocks
 * are copied into scratch (one copy per rank, on the stream; device memory
 * moves them at its own speed) and, for AllGather, back out: these forms
 * apply to interleaved islands too. Their threshold is the whole buffer's
 * bytes, HETCCL_HIER_RAILS_MIN_GATHER (16 MiB: on 4 x H100 the rails lost
 * at 4 MiB, 10-15 GB/s against the leaders' 16-20, and won from 16 MiB).
 *
 * Thread: the API caller's. */
#include "hier/hier_forms.h"
#include "util/check.h"
#include "util/knobs.h"

/* Whether AllReduce, Broadcast or Reduce takes its rails' form: the
 * islands have rails, each slice holds an element, and the message is
 * large enough (the same answer on every rank; the route's condition,
 * backend/route.h, which hands the forms below its answer in f->how). */
int hetccl_hier_sliced_on_rails(ncclComm_t comm, const hetccl_op_t *op) {
  const hetccl_hier_map_t *m = comm->hier.map;
  if (!m->rails || op->count / (size_t)m->size[m->of[comm->rank]] == 0) return 0;
  return op->count * hetccl_dtype_size(op->dtype) >=
         (size_t)hetccl_knob_int(HETCCL_KNOB_HIER_RAILS_MIN);
}

/* On the rails: island rank j reduces slice j of its island's inputs
 * (in place where the user's call is: NCCL's in-place ReduceScatter
 * writes slice `rank` of its input), rail j all-reduces it across the
 * islands, and the island gathers the slices in place. */
ncclResult_t hetccl_hier_all_reduce(form_t *f) {
  const hetccl_op_t *op = f->op;
  size_t k = (size_t)f->map->size[f->mine], slice = op->count / k;
  if (f->how != HETCCL_HOW_RAILS) {
    hetccl_hier_all_reduce_leaders(f, 0, op->count);
    return ncclSuccess;
  }
  ncclComm_t c = f->comm;
  size_t j = (size_t)f->map->index[c->rank], body = slice * k;
  void *mine = form_at(op->recvbuf, j * slice, f->elem);
  hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, op->sendbuf, mine, slice,
                    HETCCL_NO_ROOT);
  hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_AllReduce, mine, mine, slice, HETCCL_NO_ROOT);
  hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, mine, op->recvbuf, slice,
                    HETCCL_NO_ROOT);
  if (body < op->count) hetccl_hier_all_reduce_leaders(f, body, op->count - body);
  return ncclSuccess;
}

/* On the rails: the root's island broadcasts the whole buffer inside
 * (its links are the fast ones), rail j carries slice j from the root's
 * island to every other at once, and each other island gathers the
 * slices in place; the last count % k elements through the leaders. */
ncclResult_t hetccl_hier_broadcast(form_t *f) {
  const hetccl_op_t *op = f->op;
  size_t k = (size_t)f->map->size[f->mine], slice = op->count / k;
  if (f->how != HETCCL_HOW_RAILS) {
    hetccl_hier_broadcast_leaders(f, 0, op->count, 1);
    return ncclSuccess;
  }
  int from = f->map->of[op->root];
  size_t j = (size_t)f->map->index[f->comm->rank], body = slice * k;
  void *mine = form_at(op->recvbuf, j * slice, f->elem);
  if (f->mine == from) {
    const void *send = op->kind == HETCCL_OP_Bcast ? op->recvbuf : op->sendbuf;
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Broadcast, send, op->recvbuf, op->count,
                      f->map->index[op->root]);
  }
  hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_Broadcast, mine, mine, slice, from);
  if (f->mine != from)
    hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, mine, op->recvbuf, slice,
                      HETCCL_NO_ROOT);
  if (body < op->count) hetccl_hier_broadcast_leaders(f, body, op->count - body, 0);
  return ncclSuccess;
}

/* A rank other than the root keeps its slice (and, for the tail's
 * leaders' form, the tail's partial result) in its partials. */
size_t hetccl_hier_reduce_rails_partials(ncclComm_t comm, const hetccl_op_t *op) {
  size_t k = (size_t)comm->hier.map->size[comm->hier.map->of[comm->rank]];
  size_t elem = hetccl_dtype_size(op->dtype), slice = op->count / k;
  return hetccl_hier_align(slice * elem) + (op->count - slice * k) * elem;
}

/* On the rails: island rank j reduces slice j of its island's inputs (as
 * AllReduce's), rail j reduces it across the islands to the rank of
 * index j in the root's island, and those send the root their slices;
 * the last count % k elements through the leaders. */
ncclResult_t hetccl_hier_reduce(form_t *f) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  if (f->how != HETCCL_HOW_RAILS) return hetccl_hier_reduce_leaders(f, 0, op->count, NULL);
  size_t k = (size_t)f->map->size[f->mine], slice = op->count / k, body = slice * k;
  size_t j = (size_t)f->map->index[c->rank];
  int to = f->map->of[op->root], root = c->rank == op->root;
  char *s = NULL;
  void *mine;
  if (root) {
    mine = form_at(op->recvbuf, j * slice, f->elem);
  } else {
    HETCCL_CHECK(hetccl_hier_partials(f, hetccl_hier_reduce_rails_partials(c, op), (void **)&s));
    mine = s;
  }
  hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, op->sendbuf, mine, slice,
                    HETCCL_NO_ROOT);
  hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_Reduce, mine, mine, slice, to);
  if (f->mine == to) {
    /* One group, one phase in the trace: the root's receives of k - 1
     * slices, or a send of this rank's. */
    hetccl_hier_plan_group(f->plan, 0);
    for (size_t t = 0; root && t < k; t++)
      if (t != j)
        hetccl_hier_p2p(f, 2, HETCCL_OP_Recv, form_at(op->recvbuf, t * slice, f->elem), slice,
                        (int)t);
    if (!root) hetccl_hier_p2p(f, 2, HETCCL_OP_Send, mine, slice, f->map->index[op->root]);
    hetccl_hier_plan_ungroup(f->plan);
  }
  if (body == op->count) return ncclSuccess;
  void *partial = s ? s + hetccl_hier_align(slice * f->elem) : NULL;
  return hetccl_hier_reduce_leaders(f, body, op->count - body, partial);
}

/* Whether AllGather or ReduceScatter (count per rank) takes its rails'
 * form: the same answer on every rank (the route's condition). */
int hetccl_hier_on_rails(ncclComm_t comm, const hetccl_op_t *op) {
  size_t bytes = op->count * (size_t)comm->nranks * hetccl_dtype_size(op->dtype);
  return comm->hier.map->rails &&
         bytes >= (size_t)hetccl_knob_int(HETCCL_KNOB_HIER_RAILS_MIN_GATHER);
}

/* Rank j of each island reduce-scatters, inside its island, the chunks
 * its island's inputs hold in index-major order (a copy into scratch), so
 * that it gets its island's sum of the blocks of index j's ranks; rail j
 * then reduce-scatters those across the islands: each rank its block. */
ncclResult_t hetccl_hier_reduce_scatter_rails(form_t *f) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count, chunk = (size_t)f->map->islands * n;
  void *s;
  HETCCL_CHECK(hetccl_hier_partials(f, (size_t)c->nranks * n * f->elem, &s));
  void *mine = form_at(s, (size_t)f->map->index[c->rank] * chunk, f->elem);
  size_t block = n * f->elem;
  hetccl_hier_plan_blocks(f->plan, 0, s, (void *)op->sendbuf, block, HIER_GATHER | HIER_FIRST);
  hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, s, mine, chunk, HETCCL_NO_ROOT);
  hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_ReduceScatter, mine, op->recvbuf, n,
                    HETCCL_NO_ROOT);
  /* The scratch is free once the rail's phase has read it. */
  hetccl_hier_plan_blocks(f->plan, 1, NULL, NULL, block, HIER_GATHER | HIER_LAST);
  return ncclSuccess;
}

/* Rail j gathers index j's slices across the islands, each island gathers
 * its rails' gathers (index-major), and each slice is copied to its
 * rank's place in the receive buffer. */
ncclResult_t hetccl_hier_all_gather_rails(form_t *f) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  size_t n = op->count, islands = (size_t)f->map->islands;
  size_t rail_bytes = hetccl_hier_align(islands * n * f->elem);
  char *s;
  HETCCL_CHECK(hetccl_hier_partials(f, rail_bytes + (size_t)c->nranks * n * f->elem, (void **)&s));
  size_t block = n * f->elem;
  hetccl_hier_plan_blocks(f->plan, 1, NULL, NULL, block, HIER_FIRST); /* scratch free? */
  hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_AllGather, op->sendbuf, s, n, HETCCL_NO_ROOT);
  hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, s, s + rail_bytes, islands * n,
                    HETCCL_NO_ROOT);
  hetccl_hier_plan_blocks(f->plan, 3, s + rail_bytes, op->recvbuf, block, HIER_LAST);
  return ncclSuccess;
}
