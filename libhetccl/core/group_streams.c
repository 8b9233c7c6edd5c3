/* How a group's device shares reach their streams (group_streams.h). */
#include "core/group_streams.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dataplane.h"
#include "core/devpath.h"
#include "plane/plane.h"
#include "runtime/runtime.h"
#include "util/knobs.h"
#include "util/log.h"

/* group_streams.h: a job holding a plane share this large gets a thread. */
#define LAUNCH_INLINE_PIECES 16

typedef struct stream_job {
  /* The stream: a pointer is one stream only on one device of one
   * runtime (the null stream is every device's own). */
  hetccl_dev_kind_t runtime;
  int dev;
  void *stream;
  hetccl_device_share_t *shares; /* into the sorted array */
  int n;
  pthread_t thread;
  int started;
  ncclResult_t res;
  char error[256];
} stream_job_t;

struct hetccl_group_streams {
  int njobs;
  hetccl_device_share_t *sorted;
  stream_job_t jobs[];
};

static int share_order(const void *a, const void *b) {
  const hetccl_device_share_t *x = a, *y = b;
  if (x->comm->comm_id != y->comm->comm_id) return x->comm->comm_id < y->comm->comm_id ? -1 : 1;
  return (int)x->kind - (int)y->kind;
}

static int share_is_large(const hetccl_device_share_t *s) {
  if (s->kind != HETCCL_SHARE_PLANE) return 0;
  size_t bytes = 0, piece = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_PIECE);
  for (const hetccl_task_t *t = s->tasks; t; t = t->next)
    bytes += t->in_bytes > t->out_bytes ? t->in_bytes : t->out_bytes;
  return bytes > LAUNCH_INLINE_PIECES * piece;
}

static int on_job(const hetccl_device_share_t *s, const stream_job_t *j) {
  return s->tasks->stream == j->stream && s->comm->dev == j->dev && s->comm->ptr_kind == j->runtime;
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
  hetccl_group_free_tasks(s->tasks);
  s->tasks = NULL;
  if (s->kind == HETCCL_SHARE_PLANE) hetccl_plane_fail(s->comm->plane, res);
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
  hetccl_device_share_t *sorted = malloc((size_t)n * sizeof(*sorted));
  if (!g || !sorted) {
    free(g);
    free(sorted);
    WARN("group: out of memory for %d device shares", n);
    for (int i = 0; i < n; i++) share_fail(&shares[i], ncclSystemError);
    return ncclSystemError;
  }
  memcpy(sorted, shares, (size_t)n * sizeof(*sorted));
  qsort(sorted, (size_t)n, sizeof(*sorted), share_order);
  /* Jobs by stream; shares stay in sorted order within a job, as they are
   * gathered together here (a stable pass over the sorted array). */
  hetccl_device_share_t *byjob = malloc((size_t)n * sizeof(*byjob));
  if (!byjob) {
    free(g);
    WARN("group: out of memory for %d device shares", n);
    for (int i = 0; i < n; i++) share_fail(&sorted[i], ncclSystemError);
    free(sorted);
    return ncclSystemError;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!sorted[i].tasks) continue; /* gathered already */
    stream_job_t *j = &g->jobs[g->njobs++];
    j->runtime = sorted[i].comm->ptr_kind;
    j->dev = sorted[i].comm->dev;
    j->stream = sorted[i].tasks->stream;
    j->shares = &byjob[k];
    for (int m = i; m < n; m++) {
      if (!sorted[m].tasks || !on_job(&sorted[m], j)) continue;
      byjob[k++] = sorted[m];
      j->n++;
      sorted[m].tasks = NULL;
    }
  }
  free(sorted);
  g->sorted = byjob;
  int large = 0;
  for (int i = 0; i < k && (g->njobs > 1 || others) && !large; i++) large = share_is_large(&byjob[i]);
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
  if (g) free(g->sorted);
  free(g);
  return res;
}
