/* What the hierarchical forms share (hier/hier_ops.c has the table of
 * forms and the running; hier/hier_rails.c the forms
 * across every rank of the islands at once; hier/hier_pairs.c the ones
 * made of point-to-point pairs). Internal to those three files.
 *
 * Thread: the API caller's (hier/hier.h). */
#ifndef HETCCL_HIER_HIER_FORMS_H
#define HETCCL_HIER_HIER_FORMS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/op.h"
#include "hier/hier.h"

/* Where a phase runs (and the one that failed ran, for the message). */
typedef enum { IN_ISLAND, ACROSS_LEADERS, ACROSS_RAIL } where_t;

/* A form's phases fall in numbered slots, the same on every rank (the
 * table's columns: 0 inside first, 1 across, 2 and 3 inside last), a rank
 * skipping the slots it has no part in. `want` runs one slot (a group's
 * forms move in step, hier_ops.c) or, at -1, all. */
#define HIER_SLOTS 4
#define ALL_SLOTS (-1)

typedef struct form {
  ncclComm_t comm;
  const hetccl_op_t *op;
  hetccl_form_how_t how; /* the route's choice (backend/route.h): leaders, rails or pairs */
  const hetccl_hier_map_t *map;
  int mine;    /* this rank's island */
  size_t elem; /* bytes per element */
  int want;    /* the slot to run, or ALL_SLOTS */
  void *scratch; /* partial results: this form's own part (in step with others), or NULL:
                    the map's block */
  where_t where;
  unsigned checked; /* bit `where`: that communicator found usable in this launch */
  int step;    /* phases traced so far (trace/trace.h) */
} form_t;

static inline int form_skip(const form_t *f, int slot) {
  return f->want != ALL_SLOTS && f->want != slot;
}

static inline void *form_at(const void *buf, size_t elems, size_t elem) {
  return (char *)buf + elems * elem;
}

/* --- hier_ops.c ----------------------------------------------------------------- */

/* One phase in `slot`: op as `kind` on the communicator `where` names,
 * count elements. */
ncclResult_t hetccl_hier_phase(form_t *f, int slot, where_t where, hetccl_op_kind_t kind,
                               const void *send, void *recv, size_t count, int root);
/* f's operation made a send or a receive of `count` elements at buf, with
 * `peer`. */
hetccl_op_t hetccl_hier_p2p_op(const form_t *f, hetccl_op_kind_t kind, void *buf, size_t count,
                               int peer);
/* A send or receive inside the island, peer in its numbering (its caller
 * checks the slot). */
ncclResult_t hetccl_hier_p2p(form_t *f, hetccl_op_kind_t kind, void *buf, size_t count,
                             int peer);
/* A slot's sends or receives inside the island, run in one group, traced
 * as one phase of `count` elements (t0 from HETCCL_TRACE_BEGIN()). */
void hetccl_hier_traced_p2p(form_t *f, hetccl_op_kind_t kind, size_t count, uint64_t t0);
/* Where a form keeps what no user buffer has room for: its own part of
 * the block in step with others, else the map's block. */
ncclResult_t hetccl_hier_partials(form_t *f, size_t bytes, void **out);
/* The leaders' forms of `count` elements from element `first` on (the
 * rails' forms send their tails through them); broadcast: the root's
 * island's phase only where `inside`. */
ncclResult_t hetccl_hier_all_reduce_leaders(form_t *f, size_t first, size_t count);
ncclResult_t hetccl_hier_broadcast_leaders(form_t *f, size_t first, size_t count, int inside);
/* Reduce through the leaders; a leader other than the root keeps its
 * partial result at `partial` (NULL: the form's partials). */
ncclResult_t hetccl_hier_reduce_leaders(form_t *f, size_t first, size_t count, void *partial);

/* --- hier_rails.c --------------------------------------------------------------- */

/* AllReduce, Broadcast and Reduce: on the rails where the route chose
 * them (f->how; hetccl_hier_sliced_on_rails, hier.h), else through the
 * leaders. */
ncclResult_t hetccl_hier_all_reduce(form_t *f);
ncclResult_t hetccl_hier_broadcast(form_t *f);
ncclResult_t hetccl_hier_reduce(form_t *f);
/* The partials a rank other than the root keeps in the rails' Reduce. */
size_t hetccl_hier_reduce_rails_partials(ncclComm_t comm, const hetccl_op_t *op);
/* AllGather and ReduceScatter on the rails (where the route chose them:
 * hetccl_hier_on_rails, hier.h). */
ncclResult_t hetccl_hier_all_gather_rails(form_t *f);
ncclResult_t hetccl_hier_reduce_scatter_rails(form_t *f);
/* One local copy of `bytes` in stream order (on op's stream where op's
 * buffers are device memory, at once on host memory). */
ncclResult_t hetccl_hier_copy(form_t *f, void *dst, const void *src, size_t bytes);

/* --- hier_pairs.c --------------------------------------------------------------- */

ncclResult_t hetccl_hier_all_to_all(form_t *f);
/* Gather (to_root) or Scatter. */
ncclResult_t hetccl_hier_gather_scatter(form_t *f, int to_root);

#endif
