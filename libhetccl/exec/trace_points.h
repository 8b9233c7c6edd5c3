/* The core's trace points: what a call, a hierarchical phase, an engine
 * task, a group's end and a staging wait record in the trace
 * (trace/trace.h), worked out from the communicator and the operation.
 *
 * Each is called only under the caller's one branch on HETCCL_TRACE_ON()
 * (or on a start that HETCCL_TRACE_BEGIN() left 0 when off), so none of
 * this runs with the trace off. A rank here is the one the user knows:
 * an island's or leaders' communicator counts as its parent's.
 *
 * Thread: the caller's: the API thread for calls, phases and group ends;
 * whichever thread drives the engine for tasks and staging waits. */
#ifndef HETCCL_EXEC_TRACE_POINTS_H
#define HETCCL_EXEC_TRACE_POINTS_H

#include "comm/comm.h"
#include "comm/op.h"
#include "exec/task.h"
#include "trace/trace.h"

/* An NCCL call on comm: its start (0 inside another call: not traced). */
uint64_t hetccl_comm_trace_call_begin(ncclComm_t comm);
void hetccl_comm_trace_call_end(ncclComm_t comm, const hetccl_op_t *op, uint64_t t0);

/* The outermost ncclGroupEnd (depth: the group's before it ends): its
 * start, or 0 (nested, or no call on this thread yet to give it a rank). */
uint64_t hetccl_comm_trace_group_begin(int depth);
void hetccl_comm_trace_group_end(uint64_t t0);

/* One phase of a hierarchical collective on comm: `phase` ran on `on`
 * (its island, leaders or rail communicator, named by `where`) from t0
 * until now; step counts the call's phases from 0. */
void hetccl_comm_trace_phase(ncclComm_t comm, ncclComm_t on, const char *where,
                             const hetccl_op_t *phase, int step, uint64_t t0);

/* Engine work on comm: task t (a collective), the sends and receives of a
 * batch (batch_end with ENGINE: the list's sends and receives), or the data
 * plane's share (PLANE: the whole list). begin makes comm and the task's
 * call the thread's context, for the messages and reductions inside. */
uint64_t hetccl_comm_trace_task_begin(ncclComm_t comm, const hetccl_task_t *t);
void hetccl_comm_trace_task_end(ncclComm_t comm, const hetccl_task_t *t, uint64_t t0);
void hetccl_comm_trace_batch_end(const hetccl_task_t *tasks, hetccl_trace_kind_t kind,
                                 uint64_t t0);

/* The proxy waited for the stream to stage a batch's inputs, from t0_us to
 * t1_us (CLOCK_MONOTONIC microseconds, as exec/devpath.c measures). */
void hetccl_comm_trace_stage_wait(ncclComm_t comm, double t0_us, double t1_us);

#endif
