/* An operation becomes engine work: tasks for exec/group.c.
 *
 * Used by backend/engine.c once an operation is known to run on hetccl's own
 * engine (not forwarded, not hierarchical). What the operation reads and
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

/* The function an operation runs on the engine. */
hetccl_func_t hetccl_op_func(hetccl_op_kind_t kind);

/* Is comm able to take another operation? An error naming why (failed
 * earlier, finalized) otherwise. */
ncclResult_t hetccl_comm_usable(ncclComm_t comm, const char *fn);

/* The checks that need the communicator: root and peer against its size,
 * buffers only the root needs, sizes that overflow. */
ncclResult_t hetccl_op_validate(ncclComm_t comm, const hetccl_op_t *op);

/* Queue op (validated) as engine tasks: runs now, or at the group's end. */
ncclResult_t hetccl_enqueue_op(ncclComm_t comm, const hetccl_op_t *op);

#endif
