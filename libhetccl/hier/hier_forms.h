/* What the hierarchical forms' builders share (hier/hier_ops.c has the
 * table of forms and their running; hier/hier_rails.c the forms
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
#include "hier/plan.h"

/* What a form's builder reads: the call, the map, and the plan it
 * appends its phases to (hier/plan.h; a builder submits nothing). */
typedef struct form {
  ncclComm_t comm;
  const hetccl_op_t *op;
  hetccl_form_how_t how; /* the route's choice (backend/route.h): leaders, rails or pairs */
  const hetccl_hier_map_t *map;
  int mine;    /* this rank's island */
  size_t elem; /* bytes per element */
  void *scratch; /* partial results: this form's own part (in step with others), or NULL:
                    the map's block */
  hetccl_hier_plan_t *plan;
} form_t;

static inline void *form_at(const void *buf, size_t elems, size_t elem) {
  return (char *)buf + elems * elem;
}

/* --- hier_ops.c ----------------------------------------------------------------- */

/* Append one phase in `slot`: op as `kind` on the communicator `where`
 * names, count elements. */
void hetccl_hier_phase(form_t *f, int slot, where_t where, hetccl_op_kind_t kind,
                       const void *send, void *recv, size_t count, int root);
/* Append a send or receive inside the island, peer in its numbering. */
void hetccl_hier_p2p(form_t *f, int slot, hetccl_op_kind_t kind, void *buf, size_t count,
                     int peer);
/* Where a form keeps what no user buffer has room for: its own part of
 * the block in step with others, else the map's block (at build time:
 * the block is the same whenever the phases that use it run). */
ncclResult_t hetccl_hier_partials(form_t *f, size_t bytes, void **out);
/* The leaders' forms of `count` elements from element `first` on (the
 * rails' forms send their tails through them); broadcast: the root's
 * island's phase only where `inside`. */
void hetccl_hier_all_reduce_leaders(form_t *f, size_t first, size_t count);
void hetccl_hier_broadcast_leaders(form_t *f, size_t first, size_t count, int inside);
/* Reduce through the leaders; a leader other than the root keeps its
 * partial result at `partial` (NULL: the form's partials). */
ncclResult_t hetccl_hier_reduce_leaders(form_t *f, size_t first, size_t count, void *partial);

/* --- hier_rails.c --------------------------------------------------------------- */

/* The builders of AllReduce, Broadcast and Reduce: on the rails where the
 * route chose them (f->how; hetccl_hier_sliced_on_rails, hier.h), else
 * through the leaders. */
ncclResult_t hetccl_hier_all_reduce(form_t *f);
ncclResult_t hetccl_hier_broadcast(form_t *f);
ncclResult_t hetccl_hier_reduce(form_t *f);
/* The partials a rank other than the root keeps in the rails' Reduce. */
size_t hetccl_hier_reduce_rails_partials(ncclComm_t comm, const hetccl_op_t *op);
/* AllGather and ReduceScatter on the rails (where the route chose them:
 * hetccl_hier_on_rails, hier.h). */
ncclResult_t hetccl_hier_all_gather_rails(form_t *f);
ncclResult_t hetccl_hier_reduce_scatter_rails(form_t *f);

/* --- hier_pairs.c --------------------------------------------------------------- */

/* The builders of AlltoAll, Gather and Scatter. */
ncclResult_t hetccl_hier_all_to_all(form_t *f);
ncclResult_t hetccl_hier_gather(form_t *f);
ncclResult_t hetccl_hier_scatter(form_t *f);

#endif
