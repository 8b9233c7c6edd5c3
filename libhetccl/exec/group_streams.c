/* How a group's device shares reach their streams (group_streams.h). */
#include "exec/group_streams.h"

#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#include "exec/dataplane.h"
#include "exec/devpath.h"
#include "plane/plane.h"
#include "runtime/runtime.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

/* group_streams.h: a job holding a plane share this large gets a thread. */
#define LAUNCH_INLINE_PIECES 16

typedef struct stream_job {
  hetccl_device_share_t *shares; /* a run of the sorted array: one stream's */
  int n;
  pthread_t thread;
  int started;
  ncclResult_t res;
  char error[256];
} stream_job_t;

struct hetccl_group_streams {
  int njobs;
  stream_job_t jobs[];
};

/* A stream is a pointer on one device of one runtime (the null stream is
 * every device's own). */
static int same_stream(const hetccl_device_share_t *x, const hetccl_device_share_t *y) {
  return x->tasks->stream == y->tasks->stream && x->comm->dev == y->comm->dev &&
         x->comm->ptr_kind == y->comm->ptr_kind;
}

#define THREE_WAY(a, b) ((a) < (b) ? -1 : (a) > (b))

/* By stream (runtime, device, pointer: any order of streams, they are
 * independent), then, within one stream, the order every rank agrees on:
 * comm_id, plane before staged. */
static int share_order(const void *a, const void *b) {
  const hetccl_device_share_t *x = a, *y = b;
  int c = THREE_WAY(x->comm->ptr_kind, y->comm->ptr_kind);
  if (!c) c = THREE_WAY(x->comm->dev, y->comm->dev);
  if (!c) c = THREE_WAY((uintptr_t)x->tasks->stream, (uintptr_t)y->tasks->stream);
  if (!c) c = THREE_WAY(x->comm->comm_id, y->comm->comm_id);
  return c ? c : (int)x->kind - (int)y->kind;
}

static int share_is_large(const hetccl_device_share_t *s) {
  if (s->kind != HETCCL_SHARE_PLANE) return 0;
  size_t bytes = 0, piece = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_PIECE);
  for (const hetccl_task_t *t = s->tasks; t; t = t->next)
    bytes += t->in_bytes > t->out_bytes ? t->in_bytes : t->out_bytes;
  return bytes > LAUNCH_INLINE_PIECES * piece;
}

static ncclResult_t share_launch(hetccl_device_share_t *s) {
  hetccl_task_t *tasks = s->tasks;
  s->tasks = NULL;
  return s->kind == HETCCL_SHARE_PLANE ? hetccl_dataplane_launch(s->comm, tasks)
                                       : hetccl_devpath_launch(s->comm, tasks);
}

/* A share that will not be launched: its peers numbered its pieces too,
 * so it fails the communicator as a failed launch does. */
static void share_fail(hetccl_device_share_t *s, ncclResult_t res) {
  hetccl_tasks_free(s->tasks);
  s->tasks = NULL;
  if (s->kind == HETCCL_SHARE_PLANE) hetccl_plane_fail(s->comm->dataplane.plane, res);
  hetccl_comm_set_error(s->comm, res);
}

static ncclResult_t job_run(stream_job_t *j) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < j->n; i++) {
    ncclResult_t r = share_launch(&j->shares[i]);
    if (res == ncclSuccess) res = r;
  }
  return res;
}

static void *job_thread(void *arg) {
  hetccl_thread_name("hetccl-streams");
  stream_job_t *j = arg;
  /* A new thread has no current context: a runtime's current device reads
   * as 0 without one being bound, so a launch would not switch to device 0
   * and the kernels' driver calls would find none. A job's shares are on
   * one stream, so of one device. */
  ncclComm_t comm = j->shares[0].comm;
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  j->res = comm->dev >= 0 && rt ? rt->set_device(comm->dev) : ncclSuccess;
  if (j->res == ncclSuccess) {
    j->res = job_run(j);
  } else {
    for (int i = 0; i < j->n; i++) share_fail(&j->shares[i], j->res);
  }
  if (j->res != ncclSuccess) snprintf(j->error, sizeof(j->error), "%s", hetccl_last_error());
  return NULL;
}

ncclResult_t hetccl_group_streams_start(hetccl_device_share_t *shares, int n, int others,
                                        hetccl_group_streams_t **out) {
  *out = NULL;
  if (n == 0) return ncclSuccess;
  hetccl_group_streams_t *g = calloc(1, sizeof(*g) + (size_t)n * sizeof(stream_job_t));
  if (!g) {
    WARN("group: out of memory for %d device shares", n);
    for (int i = 0; i < n; i++) share_fail(&shares[i], ncclSystemError);
    return ncclSystemError;
  }
  qsort(shares, (size_t)n, sizeof(*shares), share_order);
  int large = 0;
  for (int i = 0; i < n; i++) {
    if (i == 0 || !same_stream(&shares[i - 1], &shares[i]))
      g->jobs[g->njobs++].shares = &shares[i];
    g->jobs[g->njobs - 1].n++;
    large |= share_is_large(&shares[i]);
  }
  large &= g->njobs > 1 || others;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < g->njobs; i++) {
    stream_job_t *j = &g->jobs[i];
    if (large) {
      j->started = pthread_create(&j->thread, NULL, job_thread, j) == 0;
      if (j->started) continue;
      /* No thread: here, as a small job (it may block; it is all there is). */
      INFO(HETCCL_COLL, "rank %d: no thread for a large launch; enqueueing it here",
           j->shares[0].comm->rank);
    }
    ncclResult_t r = job_run(j);
    if (res == ncclSuccess) res = r;
  }
  *out = g;
  return res;
}

ncclResult_t hetccl_group_streams_finish(hetccl_group_streams_t *g) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; g && i < g->njobs; i++) {
    stream_job_t *j = &g->jobs[i];
    if (!j->started) continue;
    pthread_join(j->thread, NULL);
    if (res == ncclSuccess && j->res != ncclSuccess) {
      res = j->res;
      hetccl_last_error_set(j->error);
    }
  }
  free(g);
  return res;
}
