/* An operation becomes engine work: tasks for exec/group.c.
 *
 * Used by backend/engine.c once the route (backend/route.h) has found that
 * an operation runs on hetccl's own engine (not forwarded, not
 * hierarchical): the task is made, the route gives it its form from its
 * buffers (data plane, staged, host), and it is queued. What the operation reads and
 * writes on this rank is worked out here from its function (the `shape`
 * table in enqueue.c), so that device buffers can be staged
 * (exec/devpath.h) or moved by the data plane, and large elementwise
 * collectives cut into pieces.
 *
 * Thread: the API caller's. */
#ifndef HETCCL_EXEC_ENQUEUE_H
#define HETCCL_EXEC_ENQUEUE_H

#include "comm/comm.h"
#include "comm/op.h"
#include "exec/task.h"

/* The function an operation runs on the engine. */
hetccl_func_t hetccl_op_func(hetccl_op_kind_t kind);

/* Is comm able to take another operation? An error naming why (failed
 * earlier, finalized) otherwise. */
ncclResult_t hetccl_comm_usable(ncclComm_t comm, const char *fn);

/* The checks that need the communicator: root and peer against its size,
 * buffers only the root needs, sizes that overflow. */
ncclResult_t hetccl_op_validate(ncclComm_t comm, const hetccl_op_t *op);

/* op (validated) as an engine task, its buffers classified: host, or
 * device ones to be staged on the caller's stream (exec/devpath.h) or
 * reached by the NIC directly. *out is the caller's (hetccl_tasks_free,
 * or hand it to hetccl_enqueue_task); on failure nothing is kept. */
ncclResult_t hetccl_enqueue_task_make(ncclComm_t comm, const hetccl_op_t *op,
                                      hetccl_task_t **out);

/* Queue t, its form set (t->form, by the route): runs now, or at the
 * group's end; large elementwise collectives off the data plane cut into
 * pieces. Takes ownership of t. */
ncclResult_t hetccl_enqueue_task(ncclComm_t comm, hetccl_task_t *t);

#endif
