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
#include <string.h>

#include "exec/group.h"
#include "exec/trace_points.h"
#include "hier/hier_forms.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

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
  if (f->how != HETCCL_HOW_RAILS) return hetccl_hier_all_reduce_leaders(f, 0, op->count);
  ncclComm_t c = f->comm;
  size_t j = (size_t)f->map->index[c->rank], body = slice * k;
  void *mine = form_at(op->recvbuf, j * slice, f->elem);
  HETCCL_CHECK(hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, op->sendbuf, mine,
                                 slice, HETCCL_NO_ROOT));
  HETCCL_CHECK(hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_AllReduce, mine, mine, slice,
                                 HETCCL_NO_ROOT));
  HETCCL_CHECK(hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, mine, op->recvbuf, slice,
                                 HETCCL_NO_ROOT));
  return body < op->count ? hetccl_hier_all_reduce_leaders(f, body, op->count - body) : ncclSuccess;
}

/* On the rails: the root's island broadcasts the whole buffer inside
 * (its links are the fast ones), rail j carries slice j from the root's
 * island to every other at once, and each other island gathers the
 * slices in place; the last count % k elements through the leaders. */
ncclResult_t hetccl_hier_broadcast(form_t *f) {
  const hetccl_op_t *op = f->op;
  size_t k = (size_t)f->map->size[f->mine], slice = op->count / k;
  if (f->how != HETCCL_HOW_RAILS) return hetccl_hier_broadcast_leaders(f, 0, op->count, 1);
  int from = f->map->of[op->root];
  size_t j = (size_t)f->map->index[f->comm->rank], body = slice * k;
  void *mine = form_at(op->recvbuf, j * slice, f->elem);
  if (f->mine == from) {
    const void *send = op->kind == HETCCL_OP_Bcast ? op->recvbuf : op->sendbuf;
    HETCCL_CHECK(hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Broadcast, send, op->recvbuf,
                                   op->count, f->map->index[op->root]));
  }
  HETCCL_CHECK(hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_Broadcast, mine, mine, slice, from));
  if (f->mine != from)
    HETCCL_CHECK(hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, mine, op->recvbuf, slice,
                                   HETCCL_NO_ROOT));
  if (body == op->count) return ncclSuccess;
  return hetccl_hier_broadcast_leaders(f, body, op->count - body, 0);
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
  HETCCL_CHECK(hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, op->sendbuf, mine,
                                 slice, HETCCL_NO_ROOT));
  HETCCL_CHECK(hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_Reduce, mine, mine, slice, to));
  if (f->mine == to && !form_skip(f, 2)) {
    /* One phase in the trace: the sends and receives run at the group's end. */
    uint64_t t0 = HETCCL_TRACE_BEGIN();
    int r = f->map->index[op->root];
    ncclResult_t res = hetccl_group_open();
    for (size_t t = 0; root && t < k && res == ncclSuccess; t++)
      if (t != j)
        res = hetccl_hier_p2p(f, HETCCL_OP_Recv, form_at(op->recvbuf, t * slice, f->elem), slice,
                              (int)t);
    if (!root && res == ncclSuccess) res = hetccl_hier_p2p(f, HETCCL_OP_Send, mine, slice, r);
    ncclResult_t end = hetccl_group_close();
    HETCCL_CHECK(res != ncclSuccess ? res : end);
    if (t0) hetccl_hier_traced_p2p(f, root ? HETCCL_OP_Recv : HETCCL_OP_Send,
                                   root ? (k - 1) * slice : slice, t0);
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

/* The local copies of a rails form, between the user's buffers and
 * scratch: where either is device memory, on op's stream with the rank's
 * device current (one thread may drive ranks of several devices); on host
 * memory, at once (host phases finish before they return). copies_begin
 * gives the runtime that copies (NULL: the CPU) with the device made
 * current, copies_end restores the caller's. */
static ncclResult_t copies_begin(form_t *f, const hetccl_runtime_t **rt, int *saved) {
  ncclComm_t comm = f->comm;
  int a, b;
  *rt = NULL;
  *saved = -1;
  HETCCL_CHECK(hetccl_hier_on_device(comm, f->op->sendbuf, &a));
  HETCCL_CHECK(hetccl_hier_on_device(comm, f->op->recvbuf, &b));
  if (!a && !b) return ncclSuccess;
  *rt = hetccl_runtime_get(comm->ptr_kind);
  ncclResult_t res = (*rt)->current_device(saved, NULL, 0);
  if (res == ncclSuccess && *saved != comm->dev) res = (*rt)->set_device(comm->dev);
  return res;
}

static ncclResult_t copies_end(form_t *f, const hetccl_runtime_t *rt, int saved,
                               ncclResult_t res) {
  if (rt && saved >= 0 && saved != f->comm->dev) (void)rt->set_device(saved);
  if (res != ncclSuccess) /* the runtime logged why */
    hetccl_last_error_prefix("%s: rank %d: a local copy of the rails' form failed", f->op->fn,
                             f->comm->rank);
  return res;
}

static ncclResult_t copy(const form_t *f, const hetccl_runtime_t *rt, void *dst, const void *src,
                         size_t bytes) {
  if (rt) return rt->memcpy_async(dst, src, bytes, f->op->stream);
  memmove(dst, src, bytes);
  return ncclSuccess;
}

/* Every rank's block of `blocks` (count elements each) to or from
 * `chunks` in index-major order (chunk j holds, island by island, the
 * block of index j's rank); gather: into the chunks, else out of them.
 * On device memory, after the previous rails form's last use of the
 * scratch (first: its event; the scratch is the communicator's, and a
 * call on another stream may still read it), and recording this one's
 * (last). chunks NULL: no copy, only the wait and the record. */
static ncclResult_t copy_blocks(form_t *f, void *chunks, void *blocks, size_t count, int gather,
                                int first, int last) {
  hetccl_hier_map_t *m = f->comm->hier.map;
  const hetccl_runtime_t *rt;
  int saved;
  ncclResult_t res = copies_begin(f, &rt, &saved);
  if (rt && res == ncclSuccess && !m->scratch_done) res = rt->event_create(&m->scratch_done);
  if (rt && res == ncclSuccess && first && m->scratch_used)
    res = rt->stream_wait_event(f->op->stream, m->scratch_done);
  for (int r = 0; chunks && r < f->comm->nranks && res == ncclSuccess; r++) {
    size_t at = (size_t)m->index[r] * (size_t)m->islands + (size_t)m->of[r];
    void *chunk = form_at(chunks, at * count, f->elem);
    void *block = form_at(blocks, (size_t)r * count, f->elem);
    res = gather ? copy(f, rt, chunk, block, count * f->elem)
                 : copy(f, rt, block, chunk, count * f->elem);
  }
  if (rt && res == ncclSuccess && last) {
    res = rt->event_record(m->scratch_done, f->op->stream);
    if (res == ncclSuccess) m->scratch_used = 1;
  }
  return copies_end(f, rt, saved, res);
}

/* One local copy of `bytes`, in stream order (as copy_blocks). */
ncclResult_t hetccl_hier_copy(form_t *f, void *dst, const void *src, size_t bytes) {
  const hetccl_runtime_t *rt;
  int saved;
  ncclResult_t res = copies_begin(f, &rt, &saved);
  if (res == ncclSuccess) res = copy(f, rt, dst, src, bytes);
  return copies_end(f, rt, saved, res);
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
  if (!form_skip(f, 0)) HETCCL_CHECK(copy_blocks(f, s, (void *)op->sendbuf, n, 1, 1, 0));
  HETCCL_CHECK(hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_ReduceScatter, s, mine, chunk,
                                 HETCCL_NO_ROOT));
  HETCCL_CHECK(hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_ReduceScatter, mine, op->recvbuf, n,
                                 HETCCL_NO_ROOT));
  /* The scratch is free once the rail's phase has read it. */
  return form_skip(f, 1) ? ncclSuccess : copy_blocks(f, NULL, NULL, n, 1, 0, 1);
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
  if (!form_skip(f, 1)) HETCCL_CHECK(copy_blocks(f, NULL, NULL, n, 0, 1, 0)); /* scratch free? */
  HETCCL_CHECK(hetccl_hier_phase(f, 1, ACROSS_RAIL, HETCCL_OP_AllGather, op->sendbuf, s, n,
                                 HETCCL_NO_ROOT));
  HETCCL_CHECK(hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_AllGather, s, s + rail_bytes,
                                 islands * n, HETCCL_NO_ROOT));
  return form_skip(f, 3) ? ncclSuccess : copy_blocks(f, s + rail_bytes, op->recvbuf, n, 0, 0, 1);
}
