/* exec/: running operations on hetccl's engine. It owns the engine's tasks
 * (task.h), making them from calls (enqueue.h), groups (this file),
 * running a communicator's tasks on the engine (run.h), the data plane's
 * share (dataplane.h), staging device buffers on the caller's stream
 * (devpath.h, stage_pool.h, group_streams.h) and the trace points. Its
 * calls come from the API thread (enqueue, groups, launches) and its tasks
 * run on whichever thread drives the communicator (the caller's for a
 * blocking share, else its proxy). It never blocks the caller on a peer
 * unless the call is blocking by contract, never sees a vendor's
 * communicator (that is backend/forward.c's) and never includes hier/,
 * backend/ or entry/.
 *
 * Groups and the execution of engine operations.
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
 * Thread: the API thread. Group state is per thread (hetccl_group_t). */
#ifndef HETCCL_EXEC_GROUP_H
#define HETCCL_EXEC_GROUP_H

#include "comm/comm.h"
#include "exec/task.h"

/* A thread's group: what its ncclGroupStart .. ncclGroupEnd collect.
 *
 * One per thread (hetccl_group_current), in thread-local storage, zeroed
 * when the thread starts and living as long as it. Only its thread reads or
 * writes it (a group belongs to the thread that opened it, as in NCCL), so
 * it takes no lock. Between groups (depth 0) its lists are empty and its
 * error is ncclSuccess; a thread that exits inside a group leaks what the
 * group kept.
 *
 *   depth        ncclGroupStart calls not yet ended; the outermost end
 *                (depth back to 0) runs the group or drops it
 *   vendor_open  how many of those levels opened the vendor's group as
 *                well (hetccl_group_open with a vendor loaded): the
 *                level hetccl_group_close ends while this equals depth
 *                ends the vendor's too
 *   head, tail   the engine's tasks, in call order; the group owns them
 *                until the outermost end runs or frees them
 *   inits        grouped communicator inits (hetccl_group_defer_init), run
 *                at the outermost end before the tasks
 *   error        the first error raised while open (hetccl_group_note_error):
 *                the outermost end returns it and drops tasks and inits
 *   hier         the hierarchical operations kept for the outermost end,
 *                in call order: hier/hier_ops.c makes, links, runs and frees
 *                the entries (hetccl_hier_defer, hetccl_hier_run_deferred);
 *                the group only holds the list, and exec/ never reads it */
typedef struct hetccl_group_init hetccl_group_init_t; /* group.c's */
typedef struct hetccl_hier_deferred hetccl_hier_deferred_t; /* hier/hier_ops.c's */

typedef struct hetccl_group {
  int depth;
  int vendor_open;
  hetccl_task_t *head, *tail;
  hetccl_group_init_t *inits;
  ncclResult_t error;
  struct {
    hetccl_hier_deferred_t *head, *last;
  } hier;
} hetccl_group_t;

/* The calling thread's group. */
hetccl_group_t *hetccl_group_current(void);

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
