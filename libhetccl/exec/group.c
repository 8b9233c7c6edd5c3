/* Groups and task execution (group.h). */
#include "exec/group.h"

#include <stdlib.h>
#include <string.h>

#include "exec/dataplane.h"
#include "exec/devpath.h"
#include "exec/group_streams.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "exec/trace_points.h"
#include "util/check.h"
#include "util/log.h"

typedef struct deferred_init {
  ncclComm_t comm;
  ncclUniqueId id;
  struct deferred_init *next;
} deferred_init_t;

static __thread int depth;
static __thread hetccl_task_t *g_head, *g_tail;
static __thread deferred_init_t *g_inits;
static __thread ncclResult_t g_error;

int hetccl_group_depth(void) { return depth; }

void hetccl_group_note_error(ncclResult_t res) {
  if (depth > 0 && g_error == ncclSuccess) g_error = res;
}

void hetccl_group_free_tasks(hetccl_task_t *t) {
  while (t) {
    hetccl_task_t *next = t->next;
    free(t);
    t = next;
  }
}

/* --- running one communicator's tasks ----------------------------------- */

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
    hetccl_engine_set_tag(comm->engine, t->tag);
    hetccl_engine_set_pull_ok(comm->engine, 1); /* ncclRecv copies */
    if (t->kind == HETCCL_TASK_SEND && t->device_direct)
      res = hetccl_engine_isend_device(comm->engine, t->peer, t->buf, t->bytes, &reqs[n]);
    else if (t->kind == HETCCL_TASK_SEND)
      res = hetccl_engine_isend(comm->engine, t->peer, t->buf, t->bytes, &reqs[n]);
    else if (t->device_direct)
      res = hetccl_engine_irecv_device(comm->engine, t->peer, t->buf, t->bytes, &reqs[n]);
    else
      res = hetccl_engine_irecv(comm->engine, t->peer, t->buf, t->bytes, NULL, NULL, &reqs[n]);
    if (res != ncclSuccess) goto out;
    ptrs[n] = &reqs[n];
    n++;
  }
  res = hetccl_engine_wait(comm->engine, ptrs, n);
out:
  free(reqs);
  free(ptrs);
  return res;
}

ncclResult_t hetccl_group_run_tasks(ncclComm_t comm, hetccl_task_t *tasks) {
  ncclResult_t res = ncclSuccess;
  int nreq = 0;
  /* Another rank's thread may fail this communicator at any time. */
  res = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
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
    hetccl_engine_set_tag(comm->engine, t->tag);
    uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, t) : 0;
    res = hetccl_algo_run(comm->engine, &t->coll);
    if (traced) hetccl_comm_trace_task_end(comm, t, traced);
    if (res != ncclSuccess) goto out;
  }
  if (nreq) {
    uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_task_begin(comm, first_p2p) : 0;
    res = run_p2p(comm, tasks, nreq);
    if (traced) hetccl_comm_trace_batch_end(tasks, HETCCL_TRACE_ENGINE, traced);
  }
out:
  hetccl_group_free_tasks(tasks);
  if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
  return res;
}

typedef struct tasks_job {
  hetccl_task_t *tasks; /* NULL once run (hetccl_group_run_tasks frees them) */
} tasks_job_t;

static ncclResult_t tasks_job(ncclComm_t comm, void *arg) {
  tasks_job_t *job = arg;
  hetccl_task_t *tasks = job->tasks;
  job->tasks = NULL;
  return hetccl_group_run_tasks(comm, tasks);
}

static void tasks_job_release(void *arg) {
  tasks_job_t *job = arg;
  hetccl_group_free_tasks(job->tasks);
  free(job);
}

static ncclResult_t post_tasks(ncclComm_t comm, hetccl_task_t *tasks, hetccl_sync_t *sync) {
  tasks_job_t *job = malloc(sizeof(*job));
  if (!job) {
    hetccl_group_free_tasks(tasks);
    WARN("group: out of memory");
    return ncclSystemError;
  }
  job->tasks = tasks;
  return hetccl_proxy_post(comm, tasks_job, job, tasks_job_release, sync);
}

/* --- group ---------------------------------------------------------------- */

ncclResult_t hetccl_group_start(void) {
  depth++;
  return ncclSuccess;
}

/* The end of a hand-off to proxies: a blocking caller waits for every job
 * posted against sync, a nonblocking one hears "in progress". */
static ncclResult_t sync_finish(hetccl_sync_t *sync, int wait, ncclResult_t res) {
  if (wait) {
    ncclResult_t r = hetccl_sync_wait(sync);
    if (res == ncclSuccess) res = r;
  } else if (res == ncclSuccess) {
    res = ncclInProgress;
  }
  hetccl_sync_release(sync);
  return res;
}

static ncclResult_t run_inits(deferred_init_t *inits) {
  hetccl_sync_t *sync = hetccl_sync_new();
  ncclResult_t res = ncclSuccess;
  int any_blocking = 0;
  if (!sync) {
    WARN("group: out of memory");
    res = ncclSystemError;
  }
  while (inits) {
    deferred_init_t *next = inits->next;
    if (res == ncclSuccess) {
      ncclUniqueId *id = malloc(sizeof(*id));
      if (!id) {
        WARN("group: out of memory");
        res = ncclSystemError;
      } else {
        *id = inits->id;
        any_blocking |= inits->comm->blocking;
        res = hetccl_proxy_post(inits->comm, hetccl_comm_init_job, id, NULL,
                                inits->comm->blocking ? sync : NULL);
      }
    }
    free(inits);
    inits = next;
  }
  return sync ? sync_finish(sync, any_blocking, res) : res;
}

/* Host-buffer shares of a group, one list per communicator: inline when a
 * blocking communicator's share is the whole group, else on the proxies
 * (a blocking group waits for them). */
static ncclResult_t run_host_shares(ncclComm_t *comms, hetccl_task_t **lists, int ncomm) {
  if (ncomm == 0) return ncclSuccess;
  int all_blocking = 1;
  for (int i = 0; i < ncomm; i++) all_blocking &= comms[i]->blocking;
  ncclResult_t res = ncclSuccess;
  if (ncomm == 1 && all_blocking && hetccl_proxy_pending(comms[0]) == 0) {
    /* Counted as in flight: an abort from another thread waits for it. */
    hetccl_comm_enter(comms[0]);
    res = hetccl_group_run_tasks(comms[0], lists[0]);
    hetccl_comm_leave(comms[0]);
    return res;
  }
  hetccl_sync_t *sync = hetccl_sync_new();
  if (!sync) {
    for (int i = 0; i < ncomm; i++) hetccl_group_free_tasks(lists[i]);
    WARN("group: out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < ncomm; i++) {
    ncclResult_t r = post_tasks(comms[i], lists[i], sync);
    if (res == ncclSuccess) res = r;
  }
  return sync_finish(sync, all_blocking, res);
}

/* Run a list of tasks (any communicators, call order). */
static ncclResult_t run_group(hetccl_task_t *head) {
  if (!head) return ncclSuccess;
  /* Split into per-communicator lists, keeping call order. */
  int ncomm = 0;
  hetccl_task_t *lists[64];
  hetccl_task_t *tails[64];
  ncclComm_t comms[64];
  hetccl_task_t *rest = NULL;
  while (head) {
    hetccl_task_t *t = head;
    head = head->next;
    t->next = NULL;
    int i;
    for (i = 0; i < ncomm && comms[i] != t->comm; i++) {}
    if (i == ncomm) {
      if (ncomm == 64) { /* more communicators than slots: run this batch, then the rest */
        t->next = rest;
        rest = t;
        continue;
      }
      comms[i] = t->comm;
      lists[i] = tails[i] = NULL;
      ncomm++;
    }
    if (tails[i]) tails[i]->next = t;
    else lists[i] = t;
    tails[i] = t;
  }
  /* Shares with device buffers go to their stream: the data plane's
   * (dataplane.h), and what stays on the engine through staging
   * (devpath.h); the caller never waits for them. They are enqueued in an
   * order every rank agrees on, by threads of their own where large
   * (group_streams.h); the threads are joined before the group returns.
   * The others run as before. */
  int kept = 0, ndev = 0;
  hetccl_device_share_t dev[128]; /* lives until hetccl_group_streams_finish */
  for (int i = 0; i < ncomm; i++) {
    if (comms[i]->plane && hetccl_dataplane_on_device(lists[i])) {
      hetccl_task_t *plane = hetccl_dataplane_split(comms[i], &lists[i]);
      if (plane) dev[ndev++] = (hetccl_device_share_t){comms[i], plane, HETCCL_SHARE_PLANE};
    }
    if (!lists[i]) continue;
    int staged = 0;
    for (hetccl_task_t *t = lists[i]; t && !staged; t = t->next)
      staged = t->stage_send || t->stage_recv || t->device_direct;
    if (staged)
      dev[ndev++] = (hetccl_device_share_t){comms[i], lists[i], HETCCL_SHARE_STAGED};
    else
      comms[kept] = comms[i], lists[kept] = lists[i], kept++;
  }
  hetccl_group_streams_t *launches = NULL;
  ncclResult_t res = hetccl_group_streams_start(dev, ndev, kept > 0 || rest, &launches);
  ncclResult_t r = run_host_shares(comms, lists, kept);
  if (res == ncclSuccess) res = r;
  if (rest) {
    /* restore call order of the overflow and run it too */
    hetccl_task_t *rev = NULL;
    while (rest) {
      hetccl_task_t *n = rest->next;
      rest->next = rev;
      rev = rest;
      rest = n;
    }
    ncclResult_t r = run_group(rev);
    if (res == ncclSuccess) res = r;
  }
  r = hetccl_group_streams_finish(launches);
  if (res == ncclSuccess) res = r;
  return res;
}

ncclResult_t hetccl_group_end(void) {
  if (depth == 0) {
    WARN("ncclGroupEnd: not inside a group (no matching ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (--depth > 0) return ncclSuccess;
  hetccl_task_t *tasks = g_head;
  deferred_init_t *inits = g_inits;
  ncclResult_t err = g_error;
  g_head = g_tail = NULL;
  g_inits = NULL;
  g_error = ncclSuccess;
  if (err != ncclSuccess) {
    hetccl_group_free_tasks(tasks);
    while (inits) {
      deferred_init_t *n = inits->next;
      free(inits);
      inits = n;
    }
    return err;
  }
  ncclResult_t res = ncclSuccess;
  if (inits) res = run_inits(inits);
  if (res != ncclSuccess && res != ncclInProgress) {
    hetccl_group_free_tasks(tasks);
    return res;
  }
  ncclResult_t r = run_group(tasks);
  return r != ncclSuccess ? r : res;
}

ncclResult_t hetccl_group_enqueue(hetccl_task_t *task) {
  task->next = NULL;
  if (HETCCL_TRACE_ON()) task->trace_seq = hetccl_trace_seq();
  if (depth > 0) {
    if (g_tail) g_tail->next = task;
    else g_head = task;
    g_tail = task;
    return ncclSuccess;
  }
  return run_group(task);
}

ncclResult_t hetccl_group_defer_init(ncclComm_t comm, const ncclUniqueId *id) {
  deferred_init_t *d = malloc(sizeof(*d));
  if (!d) {
    WARN("group: out of memory");
    return ncclSystemError;
  }
  d->comm = comm;
  d->id = *id;
  d->next = g_inits;
  g_inits = d;
  return ncclSuccess;
}

/* A simple alpha-beta model: about 2 us per message round and 5 GB/s per
 * byte moved by a rank (the CPU engine's order of magnitude on one host). */
static float model_usec(const hetccl_task_t *t) {
  const float alpha = 2.0f, beta = 1.0f / 5000.0f; /* us, us per byte */
  int n = t->comm->nranks;
  if (t->kind != HETCCL_TASK_COLL) return alpha + beta * (float)t->bytes;
  size_t bytes = t->coll.count * hetccl_dtype_size(t->coll.dtype);
  switch (t->coll.func) {
    case HETCCL_FUNC_ALLREDUCE: return 2 * (n - 1) * alpha + beta * 2.0f * (n - 1) / n * bytes;
    case HETCCL_FUNC_ALLGATHER:
    case HETCCL_FUNC_REDUCESCATTER:
    case HETCCL_FUNC_ALLTOALL: return (n - 1) * alpha + beta * (float)(n - 1) * bytes;
    default: return (n > 1 ? alpha : 0) + beta * (float)bytes;
  }
}

ncclResult_t hetccl_group_simulate_end(float *usec) {
  if (depth == 0) {
    WARN("ncclGroupSimulateEnd: not inside a group");
    return ncclInvalidUsage;
  }
  if (--depth > 0) {
    *usec = 0;
    return ncclSuccess;
  }
  float total = 0;
  for (hetccl_task_t *t = g_head; t; t = t->next) total += model_usec(t);
  hetccl_group_free_tasks(g_head);
  g_head = g_tail = NULL;
  while (g_inits) {
    deferred_init_t *n = g_inits->next;
    /* Grouped inits are not simulated: their communicators never join. */
    hetccl_comm_abort(g_inits->comm);
    free(g_inits);
    g_inits = n;
  }
  ncclResult_t err = g_error;
  g_error = ncclSuccess;
  *usec = total;
  return err;
}
