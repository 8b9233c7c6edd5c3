/* Device buffers on an engine communicator: staged through pinned host
 * memory, in the order of the caller's stream, without blocking the caller;
 * or, for the sends and receives enqueue marked stage_device (the NIC
 * reaches registered device memory: docs/gpudirect.md), through a block of
 * device memory, the copies then device to device (exec/stage_pool.h has
 * both pools).
 *
 * For one communicator's share of a group whose tasks name device memory
 * (task->stage_send / stage_recv), the API thread enqueues on the stream of
 * the first task, and returns. The share runs as stages (collectives in call
 * order, a new stage after each that brings the stage to 256 KiB moved;
 * the sends and receives in the last one), each with its own number:
 *   1. per stage: copies of its device inputs into a pinned staging block,
 *      then a store of the stage's number into the `ready` counter (pinned
 *      host memory mapped into the device);
 *   2. per stage: a wait until the `done` counter reaches its number, then
 *      copies of its staged outputs into the device buffers;
 *   3. an event after them that hands the staging block back to the pool.
 * It posts one job to the communicator's proxy thread, which for each stage
 * polls `ready` (plain loads, no runtime call; bounded by the abort flag),
 * runs the stage's tasks with the engine on the staged host buffers, and
 * stores the number into `done`: stage k runs while the stream copies the
 * inputs of the stages after it. The store happens whatever the outcome,
 * so a stream never waits for ever: on failure the communicator holds the
 * error (ncclCommGetAsyncError) and the outputs are undefined, as with
 * NCCL. Large elementwise collectives reach here already cut into pieces
 * (api/coll.c, comm->engine.stage_piece), one stage each.
 *
 * Each pool holds at most a few staging blocks: with all in use, a launch
 * waits (bounded by the abort flag) for the stream to finish with the
 * oldest rather than pinning more memory.
 *
 * Several streams in one group: the first task's stream runs the batch; it
 * waits for the others first, and they wait for it after, as in NCCL.
 *
 * Threads: launch runs on the API thread (one at a time per communicator,
 * NCCL's rule), which owns the staging pool; the job runs on the proxy
 * thread, the only writer of `done` (the stream writes `ready`). */
#ifndef HETCCL_EXEC_DEVPATH_H
#define HETCCL_EXEC_DEVPATH_H

#include "exec/task.h"

typedef struct hetccl_devpath hetccl_devpath_t;

/* Take ownership of tasks (one communicator's, call order, at least one of
 * them staged) and enqueue them as above. Returns once enqueued. */
ncclResult_t hetccl_devpath_launch(ncclComm_t comm, hetccl_task_t *tasks);

/* After the proxy has stopped: release any stream still waiting on the
 * counter, wait (bounded) for the staging blocks' last copies, free all. */
void hetccl_devpath_destroy(ncclComm_t comm);

#endif
