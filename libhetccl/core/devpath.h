/* Device buffers on an engine communicator: staged through pinned host
 * memory, in the order of the caller's stream, without blocking the caller.
 *
 * For one communicator's share of a group whose tasks name device memory
 * (task->stage_send / stage_recv), the API thread enqueues on the stream of
 * the first task, and returns:
 *   1. copies of the device inputs into a pinned staging block;
 *   2. a store of this batch's number into the `ready` counter (pinned host
 *      memory mapped into the device) once they are done;
 *   3. a wait until the `done` counter reaches the batch's number;
 *   4. copies of the staged outputs into the device buffers;
 *   5. an event after them that hands the staging block back to the pool.
 * It posts one job to the communicator's proxy thread, which polls `ready`
 * (plain loads, no runtime call; bounded by the abort flag), runs the tasks
 * with the engine on the staged host buffers, and stores the batch number
 * into `done`. That store happens whatever the outcome, so a stream never
 * waits for ever: on failure the communicator holds the error
 * (ncclCommGetAsyncError) and the outputs are undefined, as with NCCL.
 *
 * Several streams in one group: the first task's stream runs the batch; it
 * waits for the others first, and they wait for it after, as in NCCL.
 *
 * Threads: launch runs on the API thread (one at a time per communicator,
 * NCCL's rule), which owns the staging pool; the job runs on the proxy
 * thread, the only writer of the counter. */
#ifndef HETCCL_CORE_DEVPATH_H
#define HETCCL_CORE_DEVPATH_H

#include "core/group.h"

typedef struct hetccl_devpath hetccl_devpath_t;

/* Take ownership of tasks (one communicator's, call order, at least one of
 * them staged) and enqueue them as above. Returns once enqueued. */
ncclResult_t hetccl_devpath_launch(ncclComm_t comm, hetccl_task_t *tasks);

/* After the proxy has stopped: release any stream still waiting on the
 * counter, wait (bounded) for the staging blocks' last copies, free all. */
void hetccl_devpath_destroy(ncclComm_t comm);

#endif
