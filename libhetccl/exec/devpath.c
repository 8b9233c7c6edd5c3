/* Staging device buffers for the engine (devpath.h). */
#include "exec/devpath.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/proxy.h"
#include "exec/run.h"
#include "exec/stage_pool.h"
#include "exec/trace_points.h"
#include "p2p/engine.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

#define SLICE_ALIGN 256                 /* device copies like aligned addresses; so do NICs */
#define DESTROY_WAIT_MS 10000           /* how long destroy waits for a stream */

/* Two counters in one pinned page mapped into the device, a cache line
 * apart: `ready` (batches whose inputs are staged; written by the stream)
 * and `done` (batches the engine finished; written by the proxy). Neither
 * side calls the runtime to learn the other's progress: a proxy that asked
 * the runtime (an event query) could wait on a lock that a synchronising
 * call of the API thread holds, while that call waits for a stream that
 * waits for the proxy. */
#define COUNTER_DONE 0
#define COUNTER_READY 8   /* uint64_t slots: 64 bytes on */
#define COUNTER_BYTES 256 /* the page as allocated */

struct hetccl_devpath {
  const hetccl_runtime_t *rt;
  volatile uint64_t *counters; /* host view */
  char *counters_dev;          /* device view of the same page */
  uint64_t issued;             /* stage numbers handed out (API thread) */
  hetccl_stage_pool_t pools[2]; /* by hetccl_stage_kind_t */
  int device_refused;          /* a device block could not be made or reached: said once */
};

/* What one task moves through staging. */
typedef struct stage_plan {
  const void *dsend;  /* device input, NULL if not staged */
  void *drecv;        /* device output, NULL if not staged */
  void *ssend, *srecv; /* their slices of the staging block (stage_kind's) */
  size_t in, out;     /* bytes this rank reads / writes */
} stage_plan_t;

/* A batch runs as stages, in order: stage i's inputs are copied in, then
 * `ready` is set to its number; its outputs are copied out once `done`
 * holds that number. The proxy runs stage i while the stream still copies
 * the inputs of the stages after it and the outputs of those before.
 * Numbers grow by one per stage. */
typedef struct devpath_stage {
  hetccl_task_t *tasks; /* owned; a sublist in call order */
  uint64_t number;
} devpath_stage_t;

typedef struct devpath_job {
  hetccl_devpath_t *dp;
  int nstages;
  devpath_stage_t stages[]; /* nstages */
} devpath_job_t;

/* A stage closes after a collective once it moves this many bytes; the
 * sends and receives, which run together after the collectives, all fall
 * in the last stage. */
#define STAGE_MIN_BYTES (256u << 10)

static size_t align_up(size_t n) { return (n + SLICE_ALIGN - 1) & ~(size_t)(SLICE_ALIGN - 1); }

/* The staging block a task's slices lie in. */
static hetccl_stage_kind_t stage_kind(const hetccl_task_t *t) {
  return t->stage_device ? HETCCL_STAGE_DEVICE : HETCCL_STAGE_HOST;
}

static const void **task_send(hetccl_task_t *t) {
  return t->kind == HETCCL_TASK_COLL ? &t->coll.sendbuf : (const void **)&t->buf;
}
static void **task_recv(hetccl_task_t *t) {
  return t->kind == HETCCL_TASK_COLL ? &t->coll.recvbuf : &t->buf;
}

/* --- the counters' page and the pools ------------------------------------------ */

static ncclResult_t devpath_get(ncclComm_t comm, hetccl_devpath_t **out) {
  if (comm->engine.devpath) {
    *out = comm->engine.devpath;
    return ncclSuccess;
  }
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  if (!rt || !(rt->caps & HETCCL_RT_CAP_STREAMS)) {
    WARN("rank %d: device buffers on a communicator that spans several islands need the %s "
         "runtime's events and stream waits", comm->rank, hetccl_dev_kind_name(comm->ptr_kind));
    return ncclInvalidUsage;
  }
  hetccl_devpath_t *dp = calloc(1, sizeof(*dp));
  if (!dp) {
    WARN("devpath: out of memory");
    return ncclSystemError;
  }
  dp->rt = rt;
  void *host = NULL, *dev = NULL;
  ncclResult_t res = rt->host_alloc_mapped(&host, &dev, COUNTER_BYTES);
  if (res != ncclSuccess) {
    free(dp);
    return res;
  }
  dp->counters = host;
  dp->counters_dev = dev;
  for (int k = 0; k < 2; k++) dp->pools[k] = (hetccl_stage_pool_t){.rt = rt, .kind = k};
  dp->pools[HETCCL_STAGE_DEVICE].max_block =
      (size_t)hetccl_knob_int(HETCCL_KNOB_IB_GDR_STAGING_MAX);
  memset(host, 0, COUNTER_BYTES);
  comm->engine.devpath = dp;
  INFO(HETCCL_INIT, "rank %d: device buffers staged through pinned host memory, or device "
       "memory the NIC reaches (%s)", comm->rank, rt->name);
  *out = dp;
  return ncclSuccess;
}

/* --- the proxy's half ----------------------------------------------------------- */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static ncclResult_t wait_ready(ncclComm_t comm, hetccl_devpath_t *dp, uint64_t number) {
  struct timespec nap = {0, 10000};
  for (long polls = 0;; polls++) {
    if (__atomic_load_n(&dp->counters[COUNTER_READY], __ATOMIC_ACQUIRE) >= number)
      return ncclSuccess;
    if (__atomic_load_n(&comm->state.abort_flag, __ATOMIC_ACQUIRE)) {
      WARN("rank %d: aborted while waiting for the stream to reach a staged operation",
           comm->rank);
      return ncclInvalidUsage;
    }
    if (polls > 200) nanosleep(&nap, NULL); /* the stream is busy with earlier work */
  }
}

static ncclResult_t devpath_job(ncclComm_t comm, void *arg) {
  devpath_job_t *j = arg;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < j->nstages; i++) {
    devpath_stage_t *st = &j->stages[i];
    double t0 = now_us(), t1 = t0;
    if (res == ncclSuccess) {
      res = wait_ready(comm, j->dp, st->number);
      if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
      t1 = now_us();
      if (HETCCL_TRACE_ON()) hetccl_comm_trace_stage_wait(comm, t0, t1);
    }
    /* With the communicator failed, this only frees the tasks. */
    hetccl_task_t *tasks = st->tasks;
    int landed = 0; /* a NIC wrote into device memory (GPUDirect receives) */
    for (const hetccl_task_t *t = tasks; t; t = t->next)
      landed |= t->kind == HETCCL_TASK_RECV && t->device_direct;
    st->tasks = NULL;
    ncclResult_t run = hetccl_tasks_run(comm, tasks);
    if (run == ncclSuccess && landed) run = j->dp->rt->flush_nic_writes();
    if (res == ncclSuccess) res = run;
    __atomic_store_n(&j->dp->counters[COUNTER_DONE], st->number, __ATOMIC_RELEASE);
    TRACE(HETCCL_COLL, "rank %d: stage %llu waited %.0f us for its inputs, ran %.0f us",
          comm->rank, (unsigned long long)st->number, t1 - t0, now_us() - t1);
  }
  return res;
}

/* A job dropped unrun (the proxy stopped) still owns its tasks; the
 * streams it would have released are released by hetccl_devpath_destroy. */
static void devpath_job_release(void *arg) {
  devpath_job_t *j = arg;
  for (int i = 0; i < j->nstages; i++) hetccl_tasks_free(j->stages[i].tasks);
  free(j);
}

/* --- the API thread's half ---------------------------------------------------- */

/* Every stream of the batch but `launch` (usually none). */
static int other_streams(const hetccl_task_t *tasks, void *launch, void **out, int max) {
  int n = 0;
  for (const hetccl_task_t *t = tasks; t; t = t->next) {
    if (t->stream == launch) continue;
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = out[i] == t->stream;
    if (!seen && n < max) out[n++] = t->stream;
  }
  return n;
}

/* Lay the batch out in its blocks: each staged output, and each staged
 * input that does not lie inside its own task's output (in place), gets a
 * slice of the block of its task's kind (device memory for the sends and
 * receives enqueue marked stage_device, else pinned host memory).
 * need[kind]: the bytes of each block; fills plans[i] except the slices. */
static void plan_batch(hetccl_task_t *tasks, stage_plan_t *plans, size_t need[2]) {
  need[HETCCL_STAGE_HOST] = need[HETCCL_STAGE_DEVICE] = 0;
  int i = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next, i++) {
    stage_plan_t *p = &plans[i];
    memset(p, 0, sizeof(*p));
    p->in = t->in_bytes, p->out = t->out_bytes;
    hetccl_stage_kind_t k = stage_kind(t);
    if (t->stage_recv) {
      p->drecv = *task_recv(t);
      need[k] += align_up(p->out);
    }
    if (t->stage_send) {
      p->dsend = *task_send(t);
      const char *s = p->dsend, *r = p->drecv;
      int inside = r && s >= r && s + p->in <= r + p->out;
      if (!inside) need[k] += align_up(p->in);
    }
  }
}

static void plan_place(hetccl_task_t *tasks, stage_plan_t *plans, char *const base[2]) {
  size_t off[2] = {0, 0};
  int i = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next, i++) {
    stage_plan_t *p = &plans[i];
    hetccl_stage_kind_t k = stage_kind(t);
    char *b = base[k];
    size_t *o = &off[k];
    if (!b) continue; /* nothing to move: every staged buffer of the kind is empty */
    if (p->drecv) {
      p->srecv = b + *o;
      *o += align_up(p->out);
      *task_recv(t) = p->srecv;
    }
    if (p->dsend) {
      const char *s = p->dsend, *r = p->drecv;
      if (r && s >= r && s + p->in <= r + p->out) {
        p->ssend = (char *)p->srecv + (s - r);
      } else {
        p->ssend = b + *o;
        *o += align_up(p->in);
      }
      *task_send(t) = p->ssend;
    }
    /* The transport reaches the slice itself (GPUDirect): no CPU touches it. */
    if (k == HETCCL_STAGE_DEVICE) t->device_direct = 1;
  }
}

/* The device block for the batch's sends and receives marked stage_device,
 * or NULL. A task whose slice the pair's transport would not reach (the
 * block could not be made, or its registration was refused or did not fit
 * the registration cache) goes back to pinned host staging, and need[] is
 * laid out again; one INFO line says why, and from then on the
 * communicator stages every device buffer through host memory. */
static hetccl_stage_block_t *device_block(ncclComm_t comm, hetccl_devpath_t *dp,
                                          hetccl_task_t *tasks, stage_plan_t *plans,
                                          size_t need[2]) {
  hetccl_stage_block_t *b = NULL;
  const char *why = "it could not be allocated";
  if (need[HETCCL_STAGE_DEVICE] > (size_t)hetccl_knob_int(HETCCL_KNOB_IB_GDR_STAGING_MAX)) {
    /* Device memory is scarcer than pinned host memory: this batch only. */
    TRACE(HETCCL_COLL, "rank %d: %zu bytes to stage exceed HETCCL_IB_GDR_STAGING_MAX: pinned "
          "host memory for this batch", comm->rank, need[HETCCL_STAGE_DEVICE]);
    for (hetccl_task_t *t = tasks; t; t = t->next) t->stage_device = 0;
    plan_batch(tasks, plans, need);
    return NULL;
  }
  if (!dp->device_refused &&
      hetccl_stage_pool_acquire(comm, &dp->pools[HETCCL_STAGE_DEVICE],
                                need[HETCCL_STAGE_DEVICE], &b) != ncclSuccess)
    b = NULL;
  int back = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next) {
    if (!t->stage_device) continue;
    if (b && hetccl_engine_reaches(comm->engine.p2p, t->peer, b->mem, t->bytes,
                                   t->kind == HETCCL_TASK_RECV))
      continue;
    if (b) why = "the NIC does not reach it (its registration was refused, or exceeds "
                 "HETCCL_IB_REG_CACHE)";
    t->stage_device = 0;
    back = 1;
  }
  if (!back) return b;
  if (!dp->device_refused)
    INFO(HETCCL_INIT | HETCCL_NET, "rank %d: device buffers go through pinned host staging "
         "from now on, not a device-memory staging block: %s", comm->rank, why);
  dp->device_refused = 1;
  plan_batch(tasks, plans, need);
  return need[HETCCL_STAGE_DEVICE] ? b : NULL;
}

/* Collectives first, then sends and receives, each in call order: the
 * order hetccl_tasks_run runs them in, which the stages keep (a
 * peer that runs the batch unstaged runs it in that order too). */
static hetccl_task_t *colls_first(hetccl_task_t *tasks) {
  hetccl_task_t *heads[2] = {NULL, NULL}, **tails[2] = {&heads[0], &heads[1]};
  while (tasks) {
    hetccl_task_t *t = tasks;
    tasks = t->next;
    t->next = NULL;
    int k = t->kind != HETCCL_TASK_COLL;
    *tails[k] = t;
    tails[k] = &t->next;
  }
  *tails[0] = heads[1];
  return heads[0];
}

/* Cut the batch (at least one task, collectives first) into stages (devpath_job_t):
 * stage_of[i] for task i. Returns the number of stages. */
static int plan_stages(const hetccl_task_t *tasks, const stage_plan_t *plans, int *stage_of) {
  int i = 0, stage = 0;
  size_t bytes = 0;
  for (const hetccl_task_t *t = tasks; t; t = t->next, i++) {
    stage_of[i] = stage;
    if (t->kind != HETCCL_TASK_COLL) continue;
    bytes += plans[i].in + plans[i].out;
    if (bytes >= STAGE_MIN_BYTES && t->next && t->next->kind == HETCCL_TASK_COLL) {
      stage++;
      bytes = 0;
    }
  }
  return stage + 1;
}

/* Cut the task list into the job's per-stage sublists (stage_of never
 * decreases along the list, so each stage is a run of it). */
static void split_stages(hetccl_task_t *tasks, const int *stage_of, devpath_job_t *job) {
  hetccl_task_t *prev = NULL;
  for (int i = 0; tasks; i++, prev = tasks, tasks = tasks->next) {
    if (prev && stage_of[i] == stage_of[i - 1]) continue;
    if (prev) prev->next = NULL;
    job->stages[stage_of[i]].tasks = tasks;
  }
}

ncclResult_t hetccl_devpath_launch(ncclComm_t comm, hetccl_task_t *tasks) {
  hetccl_devpath_t *dp = NULL;
  stage_plan_t *plans = NULL;
  int *stage_of = NULL;
  hetccl_stage_block_t *blocks[2] = {NULL, NULL}; /* by hetccl_stage_kind_t */
  devpath_job_t *job = NULL;
  void *others[16];
  void *launch = tasks->stream;
  int ntasks = 0, nothers, nstages = 0;
  uint64_t first = 0;
  ncclResult_t res = devpath_get(comm, &dp);
  if (res != ncclSuccess) goto fail;
  const hetccl_runtime_t *rt = dp->rt;
  tasks = colls_first(tasks);
  for (hetccl_task_t *t = tasks; t; t = t->next) ntasks++;
  plans = calloc(ntasks, sizeof(*plans));
  stage_of = calloc(ntasks, sizeof(*stage_of));
  if (!plans || !stage_of) {
    WARN("devpath: out of memory");
    res = ncclSystemError;
    goto fail;
  }
  size_t need[2];
  plan_batch(tasks, plans, need);
  nstages = plan_stages(tasks, plans, stage_of);
  job = calloc(1, sizeof(*job) + (size_t)nstages * sizeof(job->stages[0]));
  if (!job) {
    WARN("devpath: out of memory");
    res = ncclSystemError;
    goto fail;
  }
  if (need[HETCCL_STAGE_DEVICE])
    blocks[HETCCL_STAGE_DEVICE] = device_block(comm, dp, tasks, plans, need);
  if (need[HETCCL_STAGE_HOST])
    HETCCL_CHECK_GOTO(hetccl_stage_pool_acquire(comm, &dp->pools[HETCCL_STAGE_HOST],
                                                need[HETCCL_STAGE_HOST],
                                                &blocks[HETCCL_STAGE_HOST]),
                      res, fail);
  char *bases[2];
  for (int k = 0; k < 2; k++) bases[k] = blocks[k] ? blocks[k]->mem : NULL;
  plan_place(tasks, plans, bases);

  nothers = other_streams(tasks, launch, others, 16);
  if (nothers == 16) {
    WARN("devpath: a group of staged operations on more than 16 streams");
    res = ncclInvalidUsage;
    goto fail;
  }
  for (int i = 0; i < nothers; i++) HETCCL_CHECK_GOTO(hetccl_runtime_stream_join(rt, launch, others[i]), res, fail);
  /* Inputs, stage by stage, each stage's copies followed by its number. */
  first = dp->issued + 1;
  for (int s = 0, i = 0; s < nstages; s++) {
    for (; i < ntasks && stage_of[i] == s; i++)
      if (plans[i].dsend && plans[i].in)
        HETCCL_CHECK_GOTO(rt->memcpy_async(plans[i].ssend, plans[i].dsend, plans[i].in, launch),
                          res, copied);
    HETCCL_CHECK_GOTO(rt->stream_write_counter(launch, &dp->counters[COUNTER_READY],
                                               dp->counters_dev + COUNTER_READY * 8, first + s),
                      res, copied);
  }
  job->dp = dp;
  job->nstages = nstages;
  for (int s = 0; s < nstages; s++) job->stages[s].number = first + s;
  split_stages(tasks, stage_of, job);
  tasks = NULL;
  dp->issued += nstages;
  TRACE(HETCCL_COLL, "rank %d: staged batch of %d task(s) in %d stage(s) from %llu, %zu bytes "
        "in host memory, %zu in device memory", comm->rank, ntasks, nstages,
        (unsigned long long)first, need[HETCCL_STAGE_HOST], need[HETCCL_STAGE_DEVICE]);
  res = hetccl_proxy_post(comm, devpath_job, job, devpath_job_release, NULL);
  job = NULL; /* the proxy's now, or released if posting failed */
  if (res != ncclSuccess) goto copied;
  /* From here the batch runs whatever happens (its peers count on it).
   * Outputs, stage by stage, each after its number is done. */
  for (int s = 0, i = 0; s < nstages; s++) {
    HETCCL_CHECK_GOTO(rt->stream_wait_counter(launch, &dp->counters[COUNTER_DONE],
                                              dp->counters_dev + COUNTER_DONE * 8, first + s),
                      res, copied);
    for (; i < ntasks && stage_of[i] == s; i++)
      if (plans[i].drecv && plans[i].out)
        HETCCL_CHECK_GOTO(rt->memcpy_async(plans[i].drecv, plans[i].srecv, plans[i].out, launch),
                          res, copied);
  }
copied:
  /* The blocks are busy until the stream has passed everything enqueued. */
  for (int k = 0; k < 2; k++)
    if (blocks[k]) hetccl_stage_pool_release(&dp->pools[k], blocks[k], launch);
  for (int i = 0; res == ncclSuccess && i < nothers; i++) res = hetccl_runtime_stream_join(rt, others[i], launch);
fail:
  if (tasks) hetccl_tasks_free(tasks);
  free(job);
  free(plans);
  free(stage_of);
  if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
  return res;
}

void hetccl_devpath_destroy(ncclComm_t comm) {
  hetccl_devpath_t *dp = comm->engine.devpath;
  if (!dp) return;
  comm->engine.devpath = NULL;
  /* Jobs the stopped proxy dropped never stored their numbers. */
  __atomic_store_n(&dp->counters[COUNTER_DONE], UINT64_MAX, __ATOMIC_RELEASE);
  int left_ms = DESTROY_WAIT_MS, stuck = 0;
  for (int k = 0; k < 2; k++) stuck |= hetccl_stage_pool_drain(&dp->pools[k], &left_ms);
  if (stuck) {
    /* A stream still holds work that reads our memory: leak it, never free it under the GPU. */
    WARN("rank %d: a stream still had staged copies pending after %d s; their staging memory "
         "is left allocated", comm->rank, DESTROY_WAIT_MS / 1000);
    free(dp);
    return;
  }
  for (int k = 0; k < 2; k++) hetccl_stage_pool_free(&dp->pools[k]);
  dp->rt->host_free((void *)dp->counters);
  free(dp);
}
