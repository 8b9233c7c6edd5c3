/* The route: which form an operation takes (exec/form.h), from one table.
 *
 * A call takes the first row that serves its operation and whose
 * conditions all hold; the row gives the form, its detail (how) and the
 * reason that is said (exec/form.h: once per operation and form at INFO,
 * on every call at TRACE). The rows, in order (backend/route.c):
 *
 *   form          how                 operations            when
 *   forwarded     the vendor library  all                   the communicator's backend is
 *                                                           the vendor's (chosen at init)
 *   hierarchical  on the rails        AllReduce, Reduce     hierarchical, count > 0, the
 *                                                           reduction composes, sliced rails
 *                 on the rails        Broadcast, Bcast      hierarchical, count > 0, sliced
 *                                                           rails
 *                 through the leaders AllReduce, Reduce     hierarchical, count > 0, the
 *                                                           reduction composes
 *                 through the leaders Broadcast, Bcast      hierarchical, count > 0
 *                 on the rails        AllGather             hierarchical, count > 0, rails
 *                 on the rails        ReduceScatter         ... and the reduction composes
 *                 through the leaders AllGather             hierarchical, count > 0,
 *                                                           contiguous islands
 *                 through the leaders ReduceScatter         ... and the reduction composes
 *                 as pairs            AlltoAll, Gather,     hierarchical, count > 0
 *                                     Scatter
 *                 as pairs            Send, Recv            hierarchical, the peer inside
 *                                                           this rank's vendor island
 *   data plane                        all                   the task: the plane takes it
 *   staged                            all                   the task: device buffers
 *   host engine                       all                   the task (host buffers)
 *
 * Conditions, each read from what already decides it:
 *   vendor's backend    comm/init.c chose it once at init (one island with
 *                       one vendor library, comm/islands.h); the route reads
 *                       the table the communicator holds (comm/backend.h).
 *   hierarchical        hetccl_hier_setup made the island, leaders and map
 *                       at init (hier/hier.h; HETCCL_HIER=0 turns it off).
 *   the reduction composes  ncclSum .. ncclMin: an average of averages,
 *                       or a PreMulSum applied per phase, would be wrong.
 *   sliced rails        hetccl_hier_sliced_on_rails: equal islands with
 *                       rails (HETCCL_HIER_RAILS), a slice per rank, at
 *                       least HETCCL_HIER_RAILS_MIN bytes.
 *   rails               hetccl_hier_on_rails: equal islands with rails, at
 *                       least HETCCL_HIER_RAILS_MIN_GATHER bytes in all.
 *   contiguous islands  every island's ranks consecutive (its slice of the
 *                       buffer is one block).
 *   the peer inside     hetccl_hier_p2p_inside.
 *   the plane takes it  hetccl_dataplane_takes (exec/dataplane.h: the
 *                       plane was made at init; reducing collectives only
 *                       where every rank reduces on its device).
 *   device buffers      the task's buffers as exec/enqueue.c classified
 *                       them: staged, or reached by the NIC directly.
 *
 * Every rank decides alike from the same arguments, the map and the
 * knobs, which NCCL's rule (the same call on every rank) already needs.
 *
 * Two steps on the engine: the rows above the data plane's need only the
 * call; the last three need the engine's task (its buffers classified),
 * which is made only where no earlier row fits. A call without a task
 * that reaches them is answered HETCCL_ROUTE_NEEDS_TASK: make the task
 * (exec/enqueue.h) and ask again with it.
 *
 * The forwarded row costs a forwarded call one compare (the table its
 * communicator holds) and the check that logging is on: the table is not
 * walked (hetccl_route below).
 *
 * Thread: the API caller's; the table is constant, the said flags relaxed
 * atomics (exec/form.c). */
#ifndef HETCCL_BACKEND_ROUTE_H
#define HETCCL_BACKEND_ROUTE_H

#include "comm/backend.h"
#include "exec/form.h"
#include "exec/task.h"

/* A call without a task reached the rows that need the engine's task. */
#define HETCCL_ROUTE_NEEDS_TASK HETCCL_FORM_COUNT

typedef struct hetccl_route {
  hetccl_form_t form; /* or HETCCL_ROUTE_NEEDS_TASK */
  hetccl_form_how_t how;
} hetccl_route_t;

/* The table's answer for op on an engine communicator, said where it is a
 * form. t NULL: the rows the call alone decides; t, op's task, made after
 * that walk answered HETCCL_ROUTE_NEEDS_TASK: the task's rows only, so
 * the call's conditions (the rails predicates) are not read twice. */
hetccl_route_t hetccl_route_walk(ncclComm_t comm, const hetccl_op_t *op, const hetccl_task_t *t);

/* Say the forwarded row for op on comm. */
void hetccl_route_say_forwarded(ncclComm_t comm, const hetccl_op_t *op);

/* The form op takes on comm, said. A forwarded communicator's answer was
 * decided at init: one compare, no walk. */
static inline hetccl_route_t hetccl_route(ncclComm_t comm, const hetccl_op_t *op,
                                          const hetccl_task_t *t) {
  if (hetccl_backend_of(comm) == &hetccl_backend_forward) {
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_COLL)) hetccl_route_say_forwarded(comm, op);
    return (hetccl_route_t){HETCCL_FORM_FORWARDED, HETCCL_HOW_VENDOR};
  }
  return hetccl_route_walk(comm, op, t);
}

#endif
