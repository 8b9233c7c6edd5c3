/* A task: one engine operation of one communicator, as exec/enqueue.c
 * makes it from a call and the rest of exec/ runs it (run.h: on the
 * engine; dataplane.h: on the data plane; devpath.h: staged on a stream).
 * Tasks travel in lists linked by `next`, in call order; whoever holds a
 * list owns it and frees it (hetccl_tasks_free) or hands it on. */
#ifndef HETCCL_EXEC_TASK_H
#define HETCCL_EXEC_TASK_H

#include <stdlib.h>

#include "algo/algo.h"
#include "comm/comm.h"
#include "exec/form.h"

typedef enum { HETCCL_TASK_COLL, HETCCL_TASK_SEND, HETCCL_TASK_RECV } hetccl_task_kind_t;

typedef struct hetccl_task {
  ncclComm_t comm;
  hetccl_task_kind_t kind;
  hetccl_coll_t coll; /* COLL */
  int peer;           /* SEND/RECV */
  void *buf;
  size_t bytes;
  uint64_t tag;
  /* Device buffers on an engine communicator (exec/devpath.h): which ones
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
   * NIC for the rest (exec/devpath.c sets device_direct once it is placed;
   * or puts it back on host staging, clearing this, if the block is not
   * reached). */
  uint8_t stage_device;
  /* Its stream is being captured into a graph: only the data plane may
   * take it (exec/dataplane.h, hetccl_dataplane_capture_check). */
  uint8_t captured;
  size_t in_bytes, out_bytes;
  /* Where it runs, as the route decided once the buffers were classified
   * (backend/route.h): HETCCL_FORM_PLANE (the data plane's share),
   * HETCCL_FORM_STAGED or HETCCL_FORM_HOST (the engine). */
  hetccl_form_t form;
  uint32_t trace_seq; /* the call's number in the trace (trace/trace.h), when tracing */
  struct hetccl_task *next;
} hetccl_task_t;

/* Free a list of tasks. */
static inline void hetccl_tasks_free(hetccl_task_t *t) {
  while (t) {
    hetccl_task_t *next = t->next;
    free(t);
    t = next;
  }
}

#endif
