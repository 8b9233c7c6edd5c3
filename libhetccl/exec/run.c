/* Running one communicator's tasks with the engine (run.h). */
#include "exec/run.h"

#include <stdlib.h>
#include <string.h>

#include "exec/dataplane.h"
#include "exec/trace_points.h"
#include "util/check.h"
#include "util/log.h"

static ncclResult_t run_p2p(ncclComm_t comm, hetccl_task_t *tasks, int nreq) {
  hetccl_req_t *reqs = calloc(nreq ? nreq : 1, sizeof(*reqs));
  hetccl_req_t **ptrs = calloc(nreq ? nreq : 1, sizeof(*ptrs));
  ncclResult_t res = ncclSuccess;
  if (!reqs || !ptrs) {
    WARN("p2p: out of memory for %d requests", nreq);
    res = ncclSystemError;
    goto out;
  }
  /* Messages to ourselves: the k-th send meets the k-th receive. */
  hetccl_task_t *self_send = tasks;
  int n = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next) {
    if (t->kind == HETCCL_TASK_COLL || t->bytes == 0) continue;
    if (t->peer == comm->rank) {
      if (t->kind != HETCCL_TASK_RECV) continue;
      while (self_send && !(self_send->kind == HETCCL_TASK_SEND && self_send->peer == comm->rank &&
                            self_send->bytes))
        self_send = self_send->next;
      if (!self_send || self_send->bytes != t->bytes) {
        WARN("p2p: rank %d receives %zu bytes from itself without a matching send", comm->rank,
             t->bytes);
        res = ncclInvalidUsage;
        goto out;
      }
      if (t->buf != self_send->buf) memmove(t->buf, self_send->buf, t->bytes);
      self_send = self_send->next;
      continue;
    }
    hetccl_engine_t *e = comm->engine.p2p;
    hetccl_msg_t m = {t->tag, 1}; /* ncclRecv copies: it may pull */
    if (t->kind == HETCCL_TASK_SEND && t->device_direct)
      res = hetccl_engine_isend_device(e, t->peer, t->buf, t->bytes, m, &reqs[n]);
    else if (t->kind == HETCCL_TASK_SEND)
      res = hetccl_engine_isend(e, t->peer, t->buf, t->bytes, m, &reqs[n]);
    else if (t->device_direct)
      res = hetccl_engine_irecv_device(e, t->peer, t->buf, t->bytes, t->tag, &reqs[n]);
    else
      res = hetccl_engine_irecv(e, t->peer, t->buf, t->bytes, t->tag, NULL, NULL, &reqs[n]);
    if (res != ncclSuccess) goto out;
    ptrs[n] = &reqs[n];
    n++;
  }
  res = hetccl_engine_wait(comm->engine.p2p, ptrs, n);
out:
  free(reqs);
  free(ptrs);
  return res;
}

ncclResult_t hetccl_tasks_run(ncclComm_t comm, hetccl_task_t *tasks) {
  ncclResult_t res = ncclSuccess;
  int nreq = 0;
  /* Another rank's thread may fail this communicator at any time. */
  res = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  if (res != ncclSuccess) goto out;
  /* The data plane's share runs on it (host buffers here); the rest on the
   * engine. Independent paths: either order is the peers' order too. */
  hetccl_task_t *plane = hetccl_dataplane_split(comm, &tasks);
  if (plane) {
    uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, plane) : 0;
    res = hetccl_dataplane_run(comm, plane);
    if (traced) hetccl_comm_trace_batch_end(plane, HETCCL_TRACE_PLANE, traced);
    if (res != ncclSuccess) goto out;
  }
  hetccl_task_t *first_p2p = NULL;
  for (hetccl_task_t *t = tasks; t; t = t->next) {
    if (t->kind != HETCCL_TASK_COLL) {
      if (!nreq++) first_p2p = t;
      continue;
    }
    TRACE(HETCCL_COLL, "rank %d: %s count %zu %s", comm->rank, hetccl_func_name(t->coll.func),
          t->coll.count, hetccl_dtype_name(t->coll.dtype));
    t->coll.tag = t->tag;
    uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, t) : 0;
    res = hetccl_algo_run(comm->engine.p2p, &t->coll);
    if (traced) hetccl_comm_trace_task_end(comm, t, traced);
    if (res != ncclSuccess) goto out;
  }
  if (nreq) {
    uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, first_p2p) : 0;
    res = run_p2p(comm, tasks, nreq);
    if (traced) hetccl_comm_trace_batch_end(tasks, HETCCL_TRACE_ENGINE, traced);
  }
out:
  hetccl_tasks_free(tasks);
  if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
  return res;
}
