/* Groups and the execution of engine operations.
 *
 * Every engine operation becomes a task. Outside a group a task runs at
 * once; inside ncclGroupStart/End tasks (and grouped communicator inits) are
 * collected per thread and run at the outermost ncclGroupEnd.
 *
 * Running one communicator's tasks: collectives in call order, then all
 * sends and receives posted together and waited together, so that a rank
 * may send to and receive from every peer in one group. A blocking
 * communicator whose tasks are the whole group runs them on the calling
 * thread; otherwise each communicator's tasks go to its proxy thread (so one
 * thread can drive several ranks), and a blocking group waits for them.
 *
 * Thread: the API thread. Group state is thread-local. */
#ifndef HETCCL_CORE_GROUP_H
#define HETCCL_CORE_GROUP_H

#include "comm/comm.h"
#include "exec/task.h"

/* Take ownership of task (heap): run now, or queue it in the open group. */
ncclResult_t hetccl_group_enqueue(hetccl_task_t *task);

/* Queue a communicator init to run at the outermost group end. */
ncclResult_t hetccl_group_defer_init(ncclComm_t comm, const ncclUniqueId *id);

int hetccl_group_depth(void);
ncclResult_t hetccl_group_start(void);
ncclResult_t hetccl_group_end(void);

/* End the group without running it; *usec = modelled time of its engine
 * tasks (latency per message step plus bytes over an assumed bandwidth). */
ncclResult_t hetccl_group_simulate_end(float *usec);

/* A group that may hold forwarded and engine operations at once: ours, and
 * the vendor's own alongside it when a vendor library is loaded, so that
 * forwarded calls inside it are grouped by the vendor. close ends ours
 * first (its engine tasks run), then the vendor's; simulate_close ends
 * both without running anything, adding the vendor's estimate to ours.
 * What ncclGroupStart/End do (entry/entry_group.c), and what the
 * hierarchical forms use for their phases. */
ncclResult_t hetccl_group_open(void);
ncclResult_t hetccl_group_close(void);
ncclResult_t hetccl_group_simulate_close(ncclSimInfo_t *info);

/* Record an error raised while a group is open: the group end returns it
 * and drops the group's tasks (NCCL's behaviour). */
void hetccl_group_note_error(ncclResult_t res);

#endif
