/* hier/plan.h: a hierarchical form as data. A form's builder (hier_ops.c,
 * hier_rails.c, hier_pairs.c) appends its phases to a plan and submits
 * nothing; one runner (plan.c) runs a plan: all of it (a call outside a
 * group), or one slot of it (a group's kept forms move in step, slot k
 * of every one of them before slot k + 1: hier_ops.c).
 *
 * A plan is an array of phases, run in the order they were appended:
 *
 *   field   what
 *   slot    0 .. HIER_SLOTS - 1, the same on every rank (the forms'
 *           tables' columns: 0 inside first, 1 across, 2 and 3 inside last)
 *   where   the communicator it runs on: IN_ISLAND, ACROSS_LEADERS,
 *           ACROSS_RAIL (the sub-communicators hier.c split at init), or
 *           BETWEEN_ISLANDS (the communicator itself: a pair of the pairs'
 *           forms whose ranks are in two islands, placed as a user's send
 *           would be); a local step runs on the caller's stream, whatever
 *           `where` says
 *   kind    a collective on `where` (AllReduce, Broadcast, Reduce,
 *           AllGather, ReduceScatter), a Send or Recv (inside the island,
 *           or between islands), or a local step on the caller's stream:
 *           HIER_COPY (recv = send, `count` bytes), HIER_BLOCKS (every
 *           rank's block between the user's buffer and index-major chunks
 *           of scratch, hier_rails.c; flags HIER_GATHER, HIER_FIRST,
 *           HIER_LAST)
 *   send    its input (a Send's buffer; HIER_BLOCKS: the blocks)
 *   recv    its output (a Recv's buffer; HIER_BLOCKS: the chunks, NULL:
 *           only the wait and the record)
 *   count   elements (bytes for a local step: a block's for HIER_BLOCKS)
 *   root    a collective's root in `where`'s numbering (HETCCL_NO_ROOT:
 *           none); a Send's or Recv's peer (the island's numbering, or
 *           the communicator's between islands)
 *   group   0: alone; n > 0: runs in one group (hetccl_group_open, close)
 *           with the phases beside it that carry the same n, all of one
 *           slot. A group is traced as one phase inside the island: the
 *           kind of its first phase, the counts of the phases of that kind
 *           summed; not traced with HIER_QUIET (the pairs' groups).
 *
 * Every rank builds from the call's arguments, the map and the
 * communicators made at init, never from a result of an earlier phase,
 * so two ranks build matching plans and a plan may be built before any
 * of it runs. What depends on the moment it runs (a sub-communicator
 * failing since, the scratch's event of the previous rails form, the
 * tracing switch, the group depth) the runner reads when it runs.
 *
 * The runner does, per phase, what a form did as it ran: the usability
 * check of each sub-communicator at its first phase in each run
 * (hetccl_comm_usable), hetccl_comm_submit, the groups, the trace
 * events (a step count per run), and on a failure the message naming
 * where it failed, the communicator failed with its siblings
 * (hetccl_hier_fail). A run stops at the first failure (a group first
 * closes).
 *
 * Memory: a plan's phases live in an array its owner provides, of
 * hetccl_hier_plan_cap phases (from the map: 2 x nranks + 8 for the pairs'
 * forms, islands + the island's size + 8 for the others); an eager call
 * uses one kept in the communicator's map (allocated at its first
 * call), a kept form one allocated with it. An append past the capacity
 * marks the plan, and the runner refuses it (ncclInternalError, saying
 * so): building never allocates.
 *
 * Thread: the API caller's (hier/hier.h). */
#ifndef HETCCL_HIER_PLAN_H
#define HETCCL_HIER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/op.h"

/* Where a phase runs (and where a failure happened, for the message). */
typedef enum { IN_ISLAND, ACROSS_LEADERS, ACROSS_RAIL, BETWEEN_ISLANDS } where_t;

/* Slots of a form's phases; ALL_SLOTS runs every one. */
#define HIER_SLOTS 4
#define ALL_SLOTS (-1)

/* The local steps, numbered after the operations. */
enum { HIER_COPY = HETCCL_OP_KIND_COUNT, HIER_BLOCKS };

/* Flags: HIER_BLOCKS's direction and scratch event, a group's trace. */
enum {
  HIER_GATHER = 1, /* into the chunks (else out of them) */
  HIER_FIRST = 2,  /* wait for the previous rails form's last use of the scratch */
  HIER_LAST = 4,   /* record this one's */
  HIER_QUIET = 8,  /* a group not traced as a phase */
};

typedef struct hetccl_hier_phase {
  uint8_t slot;
  uint8_t where; /* where_t */
  uint8_t kind;  /* hetccl_op_kind_t, HIER_COPY or HIER_BLOCKS */
  uint8_t flags;
  int32_t group;
  int32_t root; /* or the peer */
  const void *send;
  void *recv;
  size_t count;
} hetccl_hier_phase_t;

typedef struct hetccl_hier_plan {
  hetccl_hier_phase_t *phases;
  int n, cap;
  int group;  /* the group appended phases join (0: none) */
  int groups; /* groups begun so far */
  int group_flags; /* the group's: HIER_QUIET or 0 */
  int over;   /* an append did not fit: the runner refuses the plan */
} hetccl_hier_plan_t;

/* Phases a form of `kind` may need on comm's rank (hetccl_hier_plan_cap),
 * or any form (hetccl_hier_plan_cap_any). */
int hetccl_hier_plan_cap(ncclComm_t comm, hetccl_op_kind_t kind);
int hetccl_hier_plan_cap_any(ncclComm_t comm);

/* An empty plan over `cap` phases at `phases`. */
void hetccl_hier_plan_init(hetccl_hier_plan_t *p, hetccl_hier_phase_t *phases, int cap);

/* --- building (the forms' builders) ------------------------------------------------ */

/* A collective `kind` on `where`, count elements. */
void hetccl_hier_plan_collective(hetccl_hier_plan_t *p, int slot, where_t where,
                                 hetccl_op_kind_t kind, const void *send, void *recv,
                                 size_t count, int root);
/* A Send or Recv of count elements at buf with peer, inside the island
 * (IN_ISLAND: the island's numbering) or between islands. */
void hetccl_hier_plan_p2p(hetccl_hier_plan_t *p, int slot, where_t where, hetccl_op_kind_t kind,
                          void *buf, size_t count, int peer);
/* A local copy of `bytes`. */
void hetccl_hier_plan_copy(hetccl_hier_plan_t *p, int slot, void *dst, const void *src,
                           size_t bytes);
/* Every rank's block (`bytes` each) between blocks and chunks (flags). */
void hetccl_hier_plan_blocks(hetccl_hier_plan_t *p, int slot, void *chunks, void *blocks,
                             size_t bytes, int flags);
/* The phases appended until hetccl_hier_plan_ungroup run in one group
 * (flags: HIER_QUIET, or 0). */
void hetccl_hier_plan_group(hetccl_hier_plan_t *p, int flags);
void hetccl_hier_plan_ungroup(hetccl_hier_plan_t *p);

/* --- running ----------------------------------------------------------------------- */

/* Run plan's phases of `want` (a slot, or ALL_SLOTS) for op (the call the
 * plan was built from) on comm. A failure other than "in progress" fails
 * comm and its siblings, the message naming where it happened. */
ncclResult_t hetccl_hier_plan_run(ncclComm_t comm, const hetccl_op_t *op,
                                  const hetccl_hier_plan_t *plan, int want);
/* That failure path, for a failure met while building (res failed). */
void hetccl_hier_plan_failed(ncclComm_t comm, const hetccl_op_t *op, where_t where,
                             ncclResult_t res);

#endif
