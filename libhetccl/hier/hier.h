/* hier/: the hierarchical forms of the collectives on a communicator that
 * spans several islands, one of them with several ranks: its internal
 * communicators and their map (this file, hier.c), the forms' builders
 * (hier_ops.c, hier_rails.c, hier_pairs.c), which append phases to a
 * plan, and the one runner of plans (plan.h, plan.c), host buffers where
 * a vendor serves the island (hier_host.c). It runs on the API thread;
 * the runner submits the phases to the internal communicators through
 * their backends (hetccl_comm_submit: placed, not validated again) and
 * the engine's groups (exec/group.h). It never
 * reaches a transport or a vendor's library but through those, and never
 * includes backend/ or entry/.
 *
 * Hierarchical communicators.
 *
 * A communicator that spans several islands runs on hetccl's engine. Where
 * an island holds several ranks (two GPUs of one host behind NCCL, say,
 * with a host rank beside them), sending every byte of those ranks through
 * the engine wastes the vendor's links. So at init such a communicator also
 * splits itself twice (hetccl_hier_setup):
 *
 *   island   the ranks of this rank's island (none where it is alone in
 *            it). All CUDA ranks with one NCCL
 *            (or HIP ranks with one RCCL) make it a forwarded communicator:
 *            the vendor serves it. Otherwise (host ranks, HETCCL_VENDOR=0)
 *            the engine does.
 *   leaders  the first rank of every island, an engine communicator across
 *            the islands; NULL on the other ranks.
 *   rail     where every island holds as many ranks, k (and HETCCL_HIER_RAILS):
 *            the ranks of this rank's index j in every island, one per
 *            island, an engine communicator across the islands numbered
 *            as the leaders number them. Rail 0 is the leaders, so a
 *            leader's `rail` stays NULL (hier_rail gives `leaders`).
 *            k rails cross at once, each carrying 1/k of an AllReduce,
 *            where the leaders alone would carry all of it through one
 *            rank's link (one GPU's, one NIC's).
 *
 * The collectives then run in phases on these two (hier/hier_ops.c has
 * the table of forms); HETCCL_HIER=0 turns it off.
 *
 * Islands: ranks that present the same forced island (HETCCL_ISLANDS),
 * device kind and vendor library version. The leader of an island is its
 * lowest rank; the island communicator keeps the parent's rank order.
 *
 * Threads: setup runs where init runs; the calls on the API thread. */
#ifndef HETCCL_HIER_HIER_H
#define HETCCL_HIER_HIER_H

#include "comm/comm.h"
#include "comm/op.h"
#include "exec/form.h"

/* Where the islands lie, the same on every rank. Island i (numbered as
 * the leaders communicator numbers its ranks: by leader, in rank order)
 * holds size[i] ranks, the lowest being first[i], its leader; of[r] is
 * rank r's island and index[r] its place there. contiguous: every island's ranks are consecutive
 * (first[i] .. first[i] + size[i] - 1); equal: every island holds as many
 * ranks as the others. The forms that need room for partial results keep
 * one scratch block between calls (hetccl_hier_scratch); blocks it
 * outgrew are kept until the communicator goes (retired). */
typedef struct hetccl_hier_stage hetccl_hier_stage_t;

typedef struct hetccl_hier_map {
  int islands;
  int *first, *size, *of;
  int *index; /* index[r]: r's rank in its island communicator (which keeps the parent's order) */
  int contiguous, equal;
  int rails; /* every rank has a rail (hier_rail): equal islands of 2 ranks or more */
  /* The rails' AllGather and ReduceScatter copy between the user's
   * buffers and the scratch on the stream: an event of the device runtime
   * recorded after the last of a call's uses of the scratch, which the
   * next call's first copy waits for (scratch_used: it was recorded). */
  void *scratch_done;
  int scratch_used;
  void *scratch;
  size_t scratch_bytes;
  int scratch_on_device;
  struct hetccl_hier_retired *retired;
  hetccl_hier_stage_t *stages; /* host buffers' staging pairs (hier/hier_host.c) */
  struct hetccl_hier_phase *plan; /* an eager call's plan (hier/plan.h), made at the first */
  int plan_cap;
} hetccl_hier_map_t;

/* After the engine is up: make comm->hier (island, leaders, rail, map)
 * where the islands call for them (collective over comm; the same choice
 * on every rank). */
ncclResult_t hetccl_hier_setup(ncclComm_t comm);

/* This rank's rail (the leaders on a leader), or NULL where there are none. */
static inline ncclComm_t hetccl_hier_rail(ncclComm_t comm) {
  return comm->hier.rail                            ? comm->hier.rail
         : comm->hier.map && comm->hier.map->rails ? comm->hier.leaders
                                                   : NULL;
}

/* At least `bytes` of scratch, of the kind of memory `like` is (device
 * memory on comm's device, or host memory), kept in comm's map. Growing
 * at least doubles it and keeps the old block until the communicator is
 * destroyed: a phase on a stream may still read it, and freeing device
 * memory waits for the whole device, where a thread that drives several
 * ranks would wait for work that needs its next call. The phases that use
 * it run in the island communicator's and the leaders' order, which NCCL
 * and the engine keep per communicator, so two calls never overlap on it;
 * the collectives of one group, which run in step (hier_ops.c), each get
 * a part of the block of their own. */
ncclResult_t hetccl_hier_scratch(ncclComm_t comm, size_t bytes, const void *like, void **out);
/* Whether ptr is device memory (1) or host memory (0) to comm's runtime
 * (host memory where the rank has none, or ptr is NULL); scratch like it
 * is of the same kind. */
ncclResult_t hetccl_hier_on_device(ncclComm_t comm, const void *ptr, int *device);

/* Areas carved out of one block start at multiples of this. */
#define HETCCL_HIER_ALIGN 256
static inline size_t hetccl_hier_align(size_t n) {
  return (n + HETCCL_HIER_ALIGN - 1) / HETCCL_HIER_ALIGN * HETCCL_HIER_ALIGN;
}
void hetccl_hier_map_free(ncclComm_t comm, hetccl_hier_map_t *m);

/* A device block of `bytes` on comm's device, allocated with that device
 * current (one thread may drive ranks of several devices); bytes 0 frees
 * *ptr. */
ncclResult_t hetccl_hier_device_block(ncclComm_t comm, void **ptr, size_t bytes);

/* Host buffers where a vendor serves the island (hier/hier_host.c has the
 * contract). begin: where op names host memory on this rank, stage its
 * inputs on op->stream and point op at device blocks (*stage set; NULL:
 * nothing to stage). return: after the form is launched, queue the
 * result's copy back. finish: wait for the stream and hand the result to
 * the user's buffer (blocking). free: the pool, with the map. */
ncclResult_t hetccl_hier_host_begin(ncclComm_t comm, hetccl_op_t *op,
                                    hetccl_hier_stage_t **stage);
ncclResult_t hetccl_hier_host_return(ncclComm_t comm, hetccl_hier_stage_t *stage);
ncclResult_t hetccl_hier_host_finish(ncclComm_t comm, hetccl_hier_stage_t *stage);
void hetccl_hier_host_free(ncclComm_t comm, hetccl_hier_map_t *m);

/* The conditions the route reads (backend/route.h), each the same answer
 * on every rank for the same call. sliced_on_rails: AllReduce, Broadcast
 * or Reduce takes its rails' form (hier_rails.c); on_rails: AllGather or
 * ReduceScatter does (hier_rails.c); p2p_inside: a send or receive to a
 * rank of this rank's island, which a vendor serves (hier_pairs.c). */
int hetccl_hier_sliced_on_rails(ncclComm_t comm, const hetccl_op_t *op);
int hetccl_hier_on_rails(ncclComm_t comm, const hetccl_op_t *op);
int hetccl_hier_p2p_inside(ncclComm_t comm, const hetccl_op_t *op);

/* Running op (validated, on a communicator run by hetccl) in the
 * hierarchical form the route gave it (how: HETCCL_HOW_LEADERS, _RAILS or
 * _PAIRS; exec/form.h): the phases in stream order on the island and
 * leaders communicators (hier/hier_ops.c). A failing phase fails comm and
 * its siblings (hetccl_hier_fail) and says where it failed in the message. */
ncclResult_t hetccl_hier_run(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_how_t how);

/* Inside a group: keep op (copied) for the outermost group end, which
 * runs the kept operations once the group's other work and the vendor's
 * group are launched, in step (slot by slot, each slot one group:
 * hier/hier_ops.c), or drops them (drop: the group failed or was only
 * simulated). Returns the first failure. Kept in the calling thread's
 * group (exec/group.h, hetccl_group_t's `hier`). */
ncclResult_t hetccl_hier_defer(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_how_t how);
ncclResult_t hetccl_hier_run_deferred(int drop);

/* The island and leader communicators' teardown, with the parent's. */
void hetccl_hier_finalize(ncclComm_t comm);
void hetccl_hier_set_abort(ncclComm_t comm);
void hetccl_hier_release(ncclComm_t comm, int abort);

/* A phase failed on this rank with `why`: fail the engines of its island,
 * leaders, rail and own communicators, so that their peers learn it promptly. */
void hetccl_hier_fail(ncclComm_t comm, ncclResult_t res, const char *why);

/* The first error of an internal communicator, ncclSuccess if none. */
ncclResult_t hetccl_hier_error(ncclComm_t comm);

#endif
