/* The core's side of the cross-island data plane (dataplane.h). */
#include "exec/dataplane.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/proxy.h"
#include "exec/trace_points.h"
#include "p2p/engine.h"
#include "plane/plane.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- set-up ------------------------------------------------------------------ */

/* *hosts: 1 if the ranks span several hosts (then not with
 * HETCCL_PLANE_HOSTS=one). */
static int plane_applies(ncclComm_t comm, int *hosts) {
  int n = comm->nranks, stages = 0;
  *hosts = 0;
  if (n < 2 || n > hetccl_knob_int(HETCCL_KNOB_PLANE_MAX_RANKS)) return 0;
  int knob = hetccl_knob_enum(HETCCL_KNOB_PLANE);
  if (knob == HETCCL_KNOB_PLANE_off) return 0;
  for (int r = 0; r < n; r++) {
    *hosts |= comm->boot.peers[r].host_hash != comm->boot.peers[0].host_hash;
    stages |= comm->boot.peers[r].stages;
  }
  if (*hosts && hetccl_knob_enum(HETCCL_KNOB_PLANE_HOSTS) == HETCCL_KNOB_PLANE_HOSTS_one) return 0;
  return stages || knob == HETCCL_KNOB_PLANE_on;
}

/* --- the wire: how bridged channels cross hosts (plane.h) -------------------------- */

/* The bridges' messages carry no operation signature (tag 0): their order
 * is the plane's. Their receives copy into the plane's slots, and a send is
 * done once its bytes left (no pulling: the slot is reused at once). */
static ncclResult_t wire_isend(void *ctx, int peer, const void *buf, size_t bytes,
                               hetccl_req_t *req) {
  return hetccl_engine_isend(((ncclComm_t)ctx)->engine.p2p, peer, buf, bytes,
                             (hetccl_msg_t){0, 0}, req);
}

static ncclResult_t wire_irecv(void *ctx, int peer, void *buf, size_t bytes, hetccl_req_t *req) {
  return hetccl_engine_irecv(((ncclComm_t)ctx)->engine.p2p, peer, buf, bytes, 0, NULL, NULL, req);
}

static ncclResult_t wire_poll(void *ctx, int *idle) {
  return hetccl_engine_progress(((ncclComm_t)ctx)->engine.p2p, idle);
}

static void wire_retract(void *handle) { (void)hetccl_transport_mem_deregister(handle); }

static void wire_fail(void *ctx, ncclResult_t res) {
  /* its last error, as the note */
  (void)hetccl_engine_fail(((ncclComm_t)ctx)->engine.p2p, res, NULL);
}

static ncclResult_t barrier(void *ctx) { return hetccl_bootstrap_barrier(ctx); }

/* Does a rank of comm in another process drive this rank's GPU (same
 * host, same bus id)? The processes' contexts then take turns on the GPU
 * (ranks of one process share a context and run side by side), and a kernel
 * that waits for the other's copies (the split path's resident kernel)
 * holds the GPU through its whole turn: two processes on one H200 took
 * 2 ms for an all_reduce of 1-16 MiB with the split path, 0.17-0.53 ms
 * without it (docs/measurements.md, "Graphs across islands"). */
static int gpu_shared(ncclComm_t comm) {
  const hetccl_peer_info_t *me = &comm->boot.peers[comm->rank];
  if (!me->bus_id[0]) return 0;
  for (int r = 0; r < comm->nranks; r++) {
    const hetccl_peer_info_t *q = &comm->boot.peers[r];
    if (r != comm->rank && q->pid != me->pid && q->host_hash == me->host_hash &&
        !strcmp(q->bus_id, me->bus_id))
      return 1;
  }
  return 0;
}

/* The plane's guard saw a failure while graphs may replay (plane/capture.c). */
static void plane_failed(void *ctx, ncclResult_t res) { hetccl_comm_set_error(ctx, res); }

/* Whether every rank that passes device buffers can reduce on its device
 * (asked here, not at every init: only a communicator with a plane loads a
 * runtime compiler). *first is the first that cannot. */
static ncclResult_t all_reduce_on_device(ncclComm_t comm, const hetccl_runtime_t *rt, int *all,
                                         int *first) {
  char why[256] = "";
  int32_t mine = !rt || rt->reduce_available(why, sizeof(why));
  if (!mine)
    INFO(HETCCL_INIT, "rank %d: no device reductions here: %s", comm->rank, why);
  int32_t *can = calloc((size_t)comm->nranks, sizeof(*can));
  if (!can) {
    WARN("ncclCommInitRank: out of memory for %d ranks", comm->nranks);
    return ncclSystemError;
  }
  ncclResult_t res = hetccl_bootstrap_allgather(comm->boot.links, &mine, can, sizeof(mine));
  *all = 1;
  for (int r = 0; r < comm->nranks && res == ncclSuccess && *all; r++)
    if (!can[r]) *all = 0, *first = r;
  free(can);
  return res;
}

ncclResult_t hetccl_dataplane_setup(ncclComm_t comm) {
  int n = comm->nranks;
  int hosts = 0;
  if (!plane_applies(comm, &hosts)) return ncclSuccess;
  comm->dataplane.pids = malloc((size_t)n * sizeof(*comm->dataplane.pids));
  comm->dataplane.hosts = malloc((size_t)n * sizeof(*comm->dataplane.hosts));
  if (!comm->dataplane.pids || !comm->dataplane.hosts) {
    WARN("ncclCommInitRank: out of memory for %d ranks", n);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) {
    comm->dataplane.pids[r] = comm->boot.peers[r].pid;
    comm->dataplane.hosts[r] = comm->boot.peers[r].host_hash;
  }
  const hetccl_runtime_t *rt = NULL;
  if (comm->ptr_kind != HETCCL_DEV_HOST) {
    rt = hetccl_runtime_get(comm->ptr_kind);
    unsigned need = HETCCL_RT_CAP_STREAMS | HETCCL_RT_CAP_HOST_REGISTER;
    if (rt && (rt->caps & need) != need) rt = NULL;
  }
  int slow = -1, reduces = 0, host_rank = -1;
  HETCCL_CHECK(all_reduce_on_device(comm, rt, &reduces, &slow));
  /* A rank that presents itself as a host rank passes host buffers, which
   * its CPU moves: no graph can replay that (plane/capture.c). */
  for (int r = 0; r < n && host_rank < 0; r++)
    if (comm->boot.peers[r].dev_kind == HETCCL_DEV_HOST) host_rank = r;
  size_t stage_bytes = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_STAGE);
  int shared = rt && gpu_shared(comm);
  if (shared && stage_bytes && !hetccl_knob_is_set(HETCCL_KNOB_PLANE_STAGE)) {
    stage_bytes = 0;
    INFO(HETCCL_INIT, "rank %d: another process of this communicator drives this GPU too: "
         "reductions stay on the copy lane (no split path; HETCCL_PLANE_STAGE sets it)",
         comm->rank);
  }
  int inflight = (int)hetccl_knob_int(HETCCL_KNOB_PLANE_INFLIGHT);
  if (shared && !hetccl_knob_is_set(HETCCL_KNOB_PLANE_INFLIGHT)) {
    inflight = 1;
    INFO(HETCCL_INIT, "rank %d: another process of this communicator drives this GPU too: a "
         "launch waits (briefly) for this rank's previous program to end "
         "(HETCCL_PLANE_INFLIGHT)", comm->rank);
  }
  hetccl_plane_args_t args = {
      .rank = comm->rank, .nranks = n, .comm_id = comm->comm_id, .pids = comm->dataplane.pids,
      .user_ranks = comm->user_ranks, .rt = rt, .dev = comm->dev,
      .hosts = hosts ? comm->dataplane.hosts : NULL,
      .wire = {.ctx = comm, .isend = wire_isend, .irecv = wire_irecv, .poll = wire_poll,
               .declare = hetccl_transport_mem_register, .retract = wire_retract, .fail = wire_fail},
      .piece = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_PIECE) & ~(size_t)4095,
      .slots = (int)hetccl_knob_int(HETCCL_KNOB_PLANE_SLOTS),
      .wide_min = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_WIDE_MIN),
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_TIMEOUT) * 1000,
      .abort_flag = &comm->state.abort_flag, .device_reduce = reduces,
      .reduce_copy = hetccl_knob_enum(HETCCL_KNOB_PLANE_REDUCE_READ) ==
                     HETCCL_KNOB_PLANE_REDUCE_READ_copy,
      .urgent_streams = hetccl_knob_enum(HETCCL_KNOB_PLANE_PRIORITY) ==
                        HETCCL_KNOB_PLANE_PRIORITY_high,
      .stage_bytes = stage_bytes,
      .inflight = inflight,
      .resident_blocks = (unsigned)hetccl_knob_int(HETCCL_KNOB_PLANE_RESIDENT),
      .lane_streams = (int)hetccl_knob_int(HETCCL_KNOB_PLANE_LANE_STREAMS),
      .copied = &comm->engine.copied[HETCCL_COPIED_PLANE],
      .barrier = barrier,
      .barrier_ctx = comm->boot.links,
      .host_rank = host_rank,
      .on_failure = plane_failed,
      .failure_ctx = comm};
  hetccl_plane_t *p = NULL;
  ncclResult_t mine = hetccl_plane_create(&args, &p);
  /* Everyone, or no one: a rank that could not make it says so. */
  int32_t *all = calloc((size_t)n, sizeof(*all)), ok = mine == ncclSuccess;
  ncclResult_t res = all ? hetccl_bootstrap_allgather(comm->boot.links, &ok, all, sizeof(ok))
                         : ncclSystemError;
  int failed = -1;
  for (int r = 0; r < n && res == ncclSuccess && failed < 0; r++)
    if (!all[r]) failed = r;
  free(all);
  if (res != ncclSuccess || failed >= 0) {
    hetccl_plane_destroy(p);
    if (res != ncclSuccess) return res;
    INFO(HETCCL_INIT, "rank %d: no data plane (rank %d could not make it: see its log); device "
         "buffers are staged through host memory", comm->rank, failed);
    hetccl_last_error_clear();
    return ncclSuccess;
  }
  comm->dataplane.plane = p;
  comm->dataplane.reduces = reduces;
  if (!reduces)
    INFO(HETCCL_INIT, "rank %d: rank %d cannot reduce on its device (see its log): reducing "
         "collectives keep the engine, device buffers staged through host memory", comm->rank,
         slow);
  return ncclSuccess;
}

/* --- which tasks ----------------------------------------------------------------- */

int hetccl_dataplane_takes(ncclComm_t comm, const hetccl_task_t *t) {
  if (!comm->dataplane.plane) return 0;
  if (t->kind == HETCCL_TASK_COLL && hetccl_func_reduces(t->coll.func) && !comm->dataplane.reduces)
    return 0;
  return 1;
}

ncclResult_t hetccl_dataplane_capture_check(ncclComm_t comm, const char *fn,
                                            const hetccl_task_t *t) {
  char why[256];
  if (t->form == HETCCL_FORM_PLANE) {
    if (hetccl_plane_capturable(comm->dataplane.plane, why, sizeof(why))) return ncclSuccess;
  } else if (!comm->dataplane.plane) {
    snprintf(why, sizeof(why), "this communicator has no data plane (HETCCL_PLANE=off, or it "
             "could not be made: see the init log), so its device buffers are staged by "
             "hetccl's engine, which a graph cannot replay");
  } else if (t->kind == HETCCL_TASK_COLL && hetccl_func_reduces(t->coll.func) &&
             !comm->dataplane.reduces) {
    snprintf(why, sizeof(why), "a rank of this communicator cannot reduce on its device (see "
             "its log), so its reductions are staged by hetccl's engine, which a graph cannot "
             "replay");
  } else {
    snprintf(why, sizeof(why), "this call is staged by hetccl's engine, which a graph cannot "
             "replay");
  }
  WARN("%s: stream %p is being captured into a graph, and %s", fn, t->stream, why);
  return ncclInvalidUsage;
}

hetccl_task_t *hetccl_dataplane_split(ncclComm_t comm, hetccl_task_t **tasks) {
  (void)comm; /* each task carries its answer */
  hetccl_task_t *taken = NULL, **ttail = &taken, **keep = tasks;
  while (*keep) {
    hetccl_task_t *t = *keep;
    if (t->form != HETCCL_FORM_PLANE) { /* the route's answer (backend/route.h) */
      keep = &t->next;
      continue;
    }
    *keep = t->next;
    t->next = NULL;
    *ttail = t;
    ttail = &t->next;
  }
  return taken;
}

int hetccl_dataplane_on_device(const hetccl_task_t *tasks) {
  for (const hetccl_task_t *t = tasks; t; t = t->next)
    if (t->stage_send || t->stage_recv) return 1;
  return 0;
}

/* Do all of tasks move their bytes through device buffers (device 1) or
 * all through host buffers (device 0)? A WARN and ncclInvalidUsage if not. */
static ncclResult_t one_kind(ncclComm_t comm, const hetccl_task_t *tasks, int device) {
  for (const hetccl_task_t *t = tasks; t; t = t->next) {
    int host = (t->in_bytes && !t->stage_send) || (t->out_bytes && !t->stage_recv);
    int dev = t->stage_send || t->stage_recv;
    if (device ? !host : !dev) continue;
    WARN("rank %d: a group mixes device and host buffers on a communicator whose ranks are in "
         "several islands; give each group buffers of one kind", comm->rank);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* The plane's view of tasks: an array, in call order. */
static ncclResult_t to_plane(const hetccl_task_t *tasks, hetccl_plane_task_t **out, int *n) {
  int k = 0;
  for (const hetccl_task_t *t = tasks; t; t = t->next) k++;
  hetccl_plane_task_t *a = calloc((size_t)(k ? k : 1), sizeof(*a));
  if (!a) {
    WARN("plane: out of memory for %d operations", k);
    return ncclSystemError;
  }
  k = 0;
  for (const hetccl_task_t *t = tasks; t; t = t->next, k++) {
    a[k].kind = t->kind == HETCCL_TASK_COLL   ? HETCCL_PLANE_COLL
                : t->kind == HETCCL_TASK_SEND ? HETCCL_PLANE_SEND
                                              : HETCCL_PLANE_RECV;
    a[k].coll = t->coll;
    a[k].peer = t->peer;
    a[k].buf = t->buf;
    a[k].bytes = t->bytes;
  }
  *out = a;
  *n = k;
  return ncclSuccess;
}

/* --- running ----------------------------------------------------------------- */

typedef struct watch_job {
  hetccl_plane_ticket_t ticket;
} watch_job_t;

static ncclResult_t watch_job(ncclComm_t comm, void *arg) {
  return hetccl_plane_watch(comm->dataplane.plane, ((watch_job_t *)arg)->ticket);
}

static ncclResult_t watch_post(void *ctx, hetccl_plane_ticket_t ticket) {
  ncclComm_t comm = ctx;
  watch_job_t *w = malloc(sizeof(*w));
  if (!w) {
    WARN("plane: out of memory");
    return ncclSystemError;
  }
  w->ticket = ticket;
  return hetccl_proxy_post(comm, watch_job, w, NULL, NULL);
}

/* Enqueue on `stream` with comm's device current (a thread may drive ranks
 * of several devices, ncclCommInitAll); other streams of the share wait
 * for it at the start and it waits for them, as NCCL's group does. */
static ncclResult_t launch_on(ncclComm_t comm, const hetccl_runtime_t *rt, hetccl_task_t *tasks,
                              hetccl_plane_task_t *a, int n) {
  void *stream = tasks->stream;
  ncclResult_t res = ncclSuccess;
  for (const hetccl_task_t *t = tasks->next; t && res == ncclSuccess; t = t->next)
    if (t->stream != stream) res = hetccl_runtime_stream_join(rt, stream, t->stream);
  if (res == ncclSuccess)
    res = hetccl_plane_launch(comm->dataplane.plane, a, n, stream, watch_post, comm);
  for (const hetccl_task_t *t = tasks->next; t && res == ncclSuccess; t = t->next)
    if (t->stream != stream) res = hetccl_runtime_stream_join(rt, t->stream, stream);
  return res;
}

ncclResult_t hetccl_dataplane_launch(ncclComm_t comm, hetccl_task_t *tasks) {
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  hetccl_plane_task_t *a = NULL;
  int n = 0, saved = -1;
  ncclResult_t res = one_kind(comm, tasks, 1);
  if (res == ncclSuccess) res = to_plane(tasks, &a, &n);
  if (res == ncclSuccess && comm->dev >= 0) {
    char busid[32];
    res = rt->current_device(&saved, busid, sizeof(busid));
    if (res == ncclSuccess && saved != comm->dev) res = rt->set_device(comm->dev);
  }
  /* Traced: the enqueue, on this thread (the streams' work is the device's). */
  uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, tasks) : 0;
  if (res == ncclSuccess) res = launch_on(comm, rt, tasks, a, n);
  if (traced) hetccl_comm_trace_batch_end(tasks, HETCCL_TRACE_PLANE, traced);
  if (saved >= 0 && saved != comm->dev) (void)rt->set_device(saved);
  free(a);
  hetccl_tasks_free(tasks);
  if (res != ncclSuccess) {
    hetccl_plane_fail(comm->dataplane.plane, res);
    hetccl_comm_set_error(comm, res);
  }
  return res;
}

ncclResult_t hetccl_dataplane_run(ncclComm_t comm, hetccl_task_t *tasks) {
  hetccl_plane_task_t *a = NULL;
  int n = 0;
  ncclResult_t res = one_kind(comm, tasks, 0);
  if (res == ncclSuccess) res = to_plane(tasks, &a, &n);
  if (res == ncclSuccess) res = hetccl_plane_run_host(comm->dataplane.plane, a, n);
  free(a);
  hetccl_tasks_free(tasks);
  if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
  return res;
}

void hetccl_dataplane_abort(ncclComm_t comm) {
  if (comm->dataplane.plane) hetccl_plane_fail(comm->dataplane.plane, ncclInvalidUsage);
}

void hetccl_dataplane_destroy(ncclComm_t comm) {
  hetccl_plane_destroy(comm->dataplane.plane);
  comm->dataplane.plane = NULL;
  free(comm->dataplane.pids);
  comm->dataplane.pids = NULL;
  free(comm->dataplane.hosts);
  comm->dataplane.hosts = NULL;
}
