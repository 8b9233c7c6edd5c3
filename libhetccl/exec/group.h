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

#include "algo/algo.h"
#include "comm/comm.h"

typedef enum { HETCCL_TASK_COLL, HETCCL_TASK_SEND, HETCCL_TASK_RECV } hetccl_task_kind_t;

typedef struct hetccl_task {
  ncclComm_t comm;
  hetccl_task_kind_t kind;
  hetccl_coll_t coll; /* COLL */
  int peer;           /* SEND/RECV */
  void *buf;
  size_t bytes;
  uint64_t tag;
  /* Device buffers on an engine communicator (core/devpath.h): which ones
   * are staged through pinned host memory, ordered on `stream`, and the
   * bytes this rank reads from its send buffer and writes to its receive
   * buffer (api/coll.c, from the function's buffer sizes). */
  void *stream;
  uint8_t stage_send, stage_recv;
  /* A send whose device buffer the pair's transport reads itself, or a
   * receive whose device buffer it writes itself (GPUDirect:
   * hetccl_engine_reaches): not staged, still ordered on `stream` with the
   * staged batch, and posted with hetccl_engine_isend_device or
   * hetccl_engine_irecv_device. */
  uint8_t device_direct;
  /* A staged send or receive whose staging may be device memory that the
   * pair's transport reaches (hetccl_engine_reaches with buf NULL): a copy
   * on the GPU into or out of a registered device-memory block, and the
   * NIC for the rest (core/devpath.c sets device_direct once it is placed;
   * or puts it back on host staging, clearing this, if the block is not
   * reached). */
  uint8_t stage_device;
  size_t in_bytes, out_bytes;
  uint32_t trace_seq; /* the call's number in the trace (trace/trace.h), when tracing */
  struct hetccl_task *next;
} hetccl_task_t;

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

/* Run one communicator's tasks (call order) with the engine on the calling
 * thread, which must be the one driving it, and free them. Marks the
 * communicator failed on error; with it failed already, only frees. */
ncclResult_t hetccl_group_run_tasks(ncclComm_t comm, hetccl_task_t *tasks);
void hetccl_group_free_tasks(hetccl_task_t *tasks);

/* Record an error raised while a group is open: the group end returns it
 * and drops the group's tasks (NCCL's behaviour). */
void hetccl_group_note_error(ncclResult_t res);

#endif
