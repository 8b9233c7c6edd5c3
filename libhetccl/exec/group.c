/* Groups and task execution (group.h). */
#include "exec/group.h"

#include <stdlib.h>
#include <string.h>

#include "comm/init.h"
#include "comm/proxy.h"
#include "exec/dataplane.h"
#include "exec/group_streams.h"
#include "exec/run.h"
#include "trace/trace.h"
#include "util/check.h"
#include "util/log.h"

struct hetccl_group_init {
  ncclComm_t comm;
  ncclUniqueId id;
  struct hetccl_group_init *next;
};

static __thread hetccl_group_t group; /* this thread's (group.h) */

hetccl_group_t *hetccl_group_current(void) { return &group; }

int hetccl_group_depth(void) { return group.depth; }

void hetccl_group_note_error(ncclResult_t res) {
  if (group.depth > 0 && group.error == ncclSuccess) group.error = res;
}

typedef struct tasks_job {
  hetccl_task_t *tasks; /* NULL once run (hetccl_tasks_run frees them) */
} tasks_job_t;

static ncclResult_t tasks_job(ncclComm_t comm, void *arg) {
  tasks_job_t *job = arg;
  hetccl_task_t *tasks = job->tasks;
  job->tasks = NULL;
  return hetccl_tasks_run(comm, tasks);
}

static void tasks_job_release(void *arg) {
  tasks_job_t *job = arg;
  hetccl_tasks_free(job->tasks);
  free(job);
}

static ncclResult_t post_tasks(ncclComm_t comm, hetccl_task_t *tasks, hetccl_sync_t *sync) {
  tasks_job_t *job = malloc(sizeof(*job));
  if (!job) {
    hetccl_tasks_free(tasks);
    WARN("group: out of memory");
    return ncclSystemError;
  }
  job->tasks = tasks;
  return hetccl_proxy_post(comm, tasks_job, job, tasks_job_release, sync);
}

/* --- group ---------------------------------------------------------------- */

ncclResult_t hetccl_group_start(void) {
  group.depth++;
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

static ncclResult_t run_inits(hetccl_group_init_t *inits) {
  hetccl_sync_t *sync = hetccl_sync_new();
  ncclResult_t res = ncclSuccess;
  int any_blocking = 0;
  if (!sync) {
    WARN("group: out of memory");
    res = ncclSystemError;
  }
  while (inits) {
    hetccl_group_init_t *next = inits->next;
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
    res = hetccl_tasks_run(comms[0], lists[0]);
    hetccl_comm_leave(comms[0]);
    return res;
  }
  hetccl_sync_t *sync = hetccl_sync_new();
  if (!sync) {
    for (int i = 0; i < ncomm; i++) hetccl_tasks_free(lists[i]);
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
    if (comms[i]->dataplane.plane && hetccl_dataplane_on_device(lists[i])) {
      hetccl_task_t *plane = hetccl_dataplane_split(comms[i], &lists[i]);
      if (plane) dev[ndev++] = (hetccl_device_share_t){comms[i], plane, HETCCL_SHARE_PLANE};
    }
    if (!lists[i]) continue;
    int staged = 0;
    for (hetccl_task_t *t = lists[i]; t && !staged; t = t->next)
      staged = t->form == HETCCL_FORM_STAGED;
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

/* The outermost end: the group's lists and error handed to the caller,
 * the group empty again. */
static hetccl_task_t *take_group(hetccl_group_init_t **inits, ncclResult_t *err) {
  hetccl_task_t *tasks = group.head;
  *inits = group.inits;
  *err = group.error;
  group.head = group.tail = NULL;
  group.inits = NULL;
  group.error = ncclSuccess;
  return tasks;
}

ncclResult_t hetccl_group_end(void) {
  if (group.depth == 0) {
    WARN("ncclGroupEnd: not inside a group (no matching ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (--group.depth > 0) return ncclSuccess;
  hetccl_group_init_t *inits;
  ncclResult_t err;
  hetccl_task_t *tasks = take_group(&inits, &err);
  if (err != ncclSuccess) {
    hetccl_tasks_free(tasks);
    while (inits) {
      hetccl_group_init_t *n = inits->next;
      free(inits);
      inits = n;
    }
    return err;
  }
  ncclResult_t res = ncclSuccess;
  if (inits) res = run_inits(inits);
  if (res != ncclSuccess && res != ncclInProgress) {
    hetccl_tasks_free(tasks);
    return res;
  }
  ncclResult_t r = run_group(tasks);
  return r != ncclSuccess ? r : res;
}

ncclResult_t hetccl_group_enqueue(hetccl_task_t *task) {
  task->next = NULL;
  if (HETCCL_TRACE_ON()) task->trace_seq = hetccl_trace_seq();
  if (group.depth > 0) {
    if (group.tail) group.tail->next = task;
    else group.head = task;
    group.tail = task;
    return ncclSuccess;
  }
  return run_group(task);
}

ncclResult_t hetccl_group_defer_init(ncclComm_t comm, const ncclUniqueId *id) {
  hetccl_group_init_t *d = malloc(sizeof(*d));
  if (!d) {
    WARN("group: out of memory");
    return ncclSystemError;
  }
  d->comm = comm;
  d->id = *id;
  d->next = group.inits;
  group.inits = d;
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
  if (group.depth == 0) {
    WARN("ncclGroupSimulateEnd: not inside a group");
    return ncclInvalidUsage;
  }
  if (--group.depth > 0) {
    *usec = 0;
    return ncclSuccess;
  }
  hetccl_group_init_t *inits;
  ncclResult_t err;
  hetccl_task_t *tasks = take_group(&inits, &err);
  float total = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next) total += model_usec(t);
  hetccl_tasks_free(tasks);
  while (inits) {
    hetccl_group_init_t *n = inits->next;
    /* Grouped inits are not simulated: their communicators never join. */
    hetccl_comm_abort(inits->comm);
    free(inits);
    inits = n;
  }
  *usec = total;
  return err;
}

/* --- with the vendor's group ------------------------------------------------------ */

ncclResult_t hetccl_group_open(void) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  HETCCL_CHECK(hetccl_group_start());
  if (v) {
    ncclResult_t res = HETCCL_VENDOR_CALL(v, GroupStart);
    if (res != ncclSuccess) {
      hetccl_group_end();
      return res;
    }
    group.vendor_open++;
  }
  return ncclSuccess;
}

/* Closed at the depth that opened it (the vendor's library is loaded once
 * and never unloaded, so the loaded one is the one opened). */
static int vendor_closes_here(void) {
  return group.vendor_open > 0 && group.vendor_open == group.depth;
}

ncclResult_t hetccl_group_close(void) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  int close_vendor = vendor_closes_here();
  ncclResult_t res = hetccl_group_end();
  if (close_vendor) {
    group.vendor_open--;
    ncclResult_t vres = HETCCL_VENDOR_CALL(v, GroupEnd);
    if (res == ncclSuccess || res == ncclInProgress) res = vres == ncclSuccess ? res : vres;
  }
  return res;
}

ncclResult_t hetccl_group_simulate_close(ncclSimInfo_t *info) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  int close_vendor = vendor_closes_here();
  ncclResult_t res = hetccl_group_simulate_end(&info->estimatedTime);
  if (close_vendor) {
    group.vendor_open--;
    ncclSimInfo_t vinfo = *info;
    if (HETCCL_VENDOR_CALL(v, GroupSimulateEnd, &vinfo) == ncclSuccess)
      info->estimatedTime += vinfo.estimatedTime;
  }
  return res;
}
