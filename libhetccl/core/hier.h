/* Hierarchical communicators.
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
 *
 * An AllReduce with a built-in operator other than ncclAvg then runs as
 * three calls on the caller's stream: Reduce to the leader inside each
 * island, AllReduce among the leaders, Broadcast from the leader inside
 * each island. On device buffers, stream order chains the three (the
 * leaders' engine phase is staged in stream order, core/devpath.h); on
 * host buffers each call returns complete, the internal communicators
 * being blocking. Other collectives, and AllReduce inside a group, run
 * over every rank on the engine as before, so every rank must call alike
 * (NCCL's rule already). HETCCL_HIER=0 turns it off.
 *
 * Islands: ranks that present the same forced island (HETCCL_ISLANDS),
 * device kind and vendor library version. The leader of an island is its
 * lowest rank; the island communicator keeps the parent's rank order.
 *
 * Threads: setup runs where init runs; the calls on the API thread. */
#ifndef HETCCL_CORE_HIER_H
#define HETCCL_CORE_HIER_H

#include "core/comm.h"
#include "core/dispatch.h"

/* After the engine is up: make comm->island and comm->leaders where the
 * islands call for them (collective over comm; the same choice on every
 * rank). */
ncclResult_t hetccl_hier_setup(ncclComm_t comm);

/* Whether an AllReduce with these arguments runs hierarchically (the same
 * answer on every rank for the same call, outside groups). */
int hetccl_hier_allreduce_applies(ncclComm_t comm, size_t count, ncclRedOp_t op);

/* Whether op (validated, on a communicator run by hetccl) has a
 * hierarchical form here, and running it: the phases in stream order on
 * the island and leaders communicators. A failing phase fails comm and its
 * siblings (hetccl_hier_fail) and says where it failed in the message. */
int hetccl_hier_applies(ncclComm_t comm, const hetccl_op_t *op);
ncclResult_t hetccl_hier_run(ncclComm_t comm, const hetccl_op_t *op);

/* The island and leader communicators' teardown, with the parent's. */
void hetccl_hier_finalize(ncclComm_t comm);
void hetccl_hier_set_abort(ncclComm_t comm);
void hetccl_hier_release(ncclComm_t comm, int abort);

/* A phase failed on this rank with `why`: fail the engines of its island,
 * leaders and own communicators, so that their peers learn it promptly. */
void hetccl_hier_fail(ncclComm_t comm, ncclResult_t res, const char *why);

/* The first error of an internal communicator, ncclSuccess if none. */
ncclResult_t hetccl_hier_error(ncclComm_t comm);

#endif
