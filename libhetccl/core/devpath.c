/* Staging device buffers for the engine (devpath.h). */
#include "core/devpath.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/proxy.h"
#include "core/trace_points.h"
#include "transport/ib/ib_mem.h"
#include "util/check.h"
#include "util/log.h"

#define STAGE_ALIGN 256                 /* device copies like aligned host addresses */
#define STAGE_MIN_BLOCK (1u << 20)      /* smallest staging block allocated */
#define DESTROY_WAIT_MS 10000           /* how long destroy waits for a stream */
/* Blocks in the pool at most. Pinning memory costs about as much as
 * moving it, so once this many are busy the next launch waits for the
 * oldest to come back (the stream to pass its last copy) instead of
 * pinning another: the caller runs at most this many batches ahead. */
#define STAGE_MAX_BLOCKS 3

typedef struct stage_block {
  void *host;
  size_t bytes;
  void *rdma;         /* the block's declaration to the ib transport (ib_mem.h) */
  void *free_event;   /* recorded after the batch's last copy out of the block */
  int busy;           /* free_event recorded and maybe not reached yet */
  uint64_t last_use;  /* the launch that last recorded free_event */
  struct stage_block *next;
} stage_block_t;

/* Two counters in one pinned page mapped into the device, a cache line
 * apart: `ready` (batches whose inputs are staged; written by the stream)
 * and `done` (batches the engine finished; written by the proxy). Neither
 * side calls the runtime to learn the other's progress: a proxy that asked
 * the runtime (an event query) could wait on a lock that a synchronising
 * call of the API thread holds, while that call waits for a stream that
 * waits for the proxy. */
#define COUNTER_DONE 0
#define COUNTER_READY 8 /* uint64_t slots: 64 bytes on */

struct hetccl_devpath {
  const hetccl_runtime_t *rt;
  volatile uint64_t *counters; /* host view */
  char *counters_dev;          /* device view of the same page */
  uint64_t issued;             /* stage numbers handed out (API thread) */
  uint64_t launches;           /* launches with a staging block */
  stage_block_t *blocks;
  int nblocks;
  /* Blocks replaced by larger ones, freed at destroy: freeing pinned
   * memory waits for the whole device, and a thread that drives several
   * ranks would wait there for a stream that needs a launch of another of
   * its ranks, which it has not made yet. Sizes at least double on each
   * replacement, so these add up to less than the largest block. */
  stage_block_t *retired;
};

/* What one task moves through staging. */
typedef struct stage_plan {
  const void *dsend;  /* device input, NULL if not staged */
  void *drecv;        /* device output, NULL if not staged */
  void *hsend, *hrecv;
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

static size_t align_up(size_t n) { return (n + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1); }

static const void **task_send(hetccl_task_t *t) {
  return t->kind == HETCCL_TASK_COLL ? &t->coll.sendbuf : (const void **)&t->buf;
}
static void **task_recv(hetccl_task_t *t) {
  return t->kind == HETCCL_TASK_COLL ? &t->coll.recvbuf : &t->buf;
}

/* --- the pool ---------------------------------------------------------------- */

static ncclResult_t devpath_get(ncclComm_t comm, hetccl_devpath_t **out) {
  if (comm->devpath) {
    *out = comm->devpath;
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
  ncclResult_t res = rt->host_alloc_mapped(&host, &dev, STAGE_ALIGN);
  if (res != ncclSuccess) {
    free(dp);
    return res;
  }
  dp->counters = host;
  dp->counters_dev = dev;
  memset(host, 0, STAGE_ALIGN);
  comm->devpath = dp;
  INFO(HETCCL_INIT, "rank %d: device buffers staged through pinned host memory (%s)",
       comm->rank, rt->name);
  *out = dp;
  return ncclSuccess;
}

static int block_idle(hetccl_devpath_t *dp, stage_block_t *b) {
  if (!b->busy) return 1;
  int done = 0;
  if (dp->rt->event_query(b->free_event, &done) != ncclSuccess) return 0;
  if (done) b->busy = 0;
  return done;
}

static void block_free(hetccl_devpath_t *dp, stage_block_t *b) {
  if (b->rdma) hetccl_ib_mem_deregister(b->rdma); /* before the memory goes */
  if (b->free_event) dp->rt->event_destroy(b->free_event);
  if (b->host) dp->rt->host_free(b->host);
  free(b);
}

/* Wait (bounded by the abort flag) until the block the stream has held
 * longest is idle, and return it. */
static ncclResult_t block_wait_oldest(ncclComm_t comm, hetccl_devpath_t *dp,
                                      stage_block_t ***out) {
  stage_block_t **oldest = &dp->blocks;
  for (stage_block_t **pb = &dp->blocks; *pb; pb = &(*pb)->next)
    if ((*pb)->last_use < (*oldest)->last_use) oldest = pb;
  struct timespec nap = {0, 20000};
  while (!block_idle(dp, *oldest)) {
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
      WARN("rank %d: aborted while waiting for a staging block", comm->rank);
      return ncclInvalidUsage;
    }
    nanosleep(&nap, NULL);
  }
  *out = oldest;
  return ncclSuccess;
}

/* An idle block of at least `bytes`: reuse one, else replace an idle one
 * that is too small, else allocate one; with the pool full, the oldest
 * busy block once it is idle (reused, or replaced if too small). */
static ncclResult_t block_acquire(ncclComm_t comm, hetccl_devpath_t *dp, size_t bytes,
                                  stage_block_t **out) {
  stage_block_t **small = NULL;
  for (stage_block_t **pb = &dp->blocks; *pb; pb = &(*pb)->next) {
    if (!block_idle(dp, *pb)) continue;
    if ((*pb)->bytes >= bytes) {
      *out = *pb;
      return ncclSuccess;
    }
    if (!small) small = pb;
  }
  if (!small && dp->nblocks >= STAGE_MAX_BLOCKS) {
    HETCCL_CHECK(block_wait_oldest(comm, dp, &small));
    if ((*small)->bytes >= bytes) {
      *out = *small;
      return ncclSuccess;
    }
  }
  size_t at_least = STAGE_MIN_BLOCK;
  if (small) { /* keep the pool from growing with every larger size */
    stage_block_t *b = *small;
    *small = b->next;
    b->next = dp->retired;
    dp->retired = b;
    dp->nblocks--;
    at_least = 2 * b->bytes;
  }
  stage_block_t *b = calloc(1, sizeof(*b));
  if (!b) {
    WARN("devpath: out of memory");
    return ncclSystemError;
  }
  b->bytes = bytes < at_least ? at_least : align_up(bytes);
  ncclResult_t res = dp->rt->host_alloc(&b->host, b->bytes);
  if (res == ncclSuccess) res = dp->rt->event_create(&b->free_event);
  if (res != ncclSuccess) {
    WARN("devpath: cannot allocate %zu bytes of pinned staging memory", b->bytes);
    block_free(dp, b);
    return res;
  }
  /* Declared as RDMA memory, as ncclCommRegister would: the ib transport
   * then sends from the block and lands in it by RDMA WRITE, so the bytes
   * of a device buffer are moved by the GPU's copy engine and the NIC, and
   * by no CPU (docs/transports.md, "Device buffers"). Where no ib context
   * is open this only records the range; a refused registration leaves the
   * block on ib's copy path. */
  if (hetccl_ib_mem_register(b->host, b->bytes, &b->rdma) != ncclSuccess) b->rdma = NULL;
  b->next = dp->blocks;
  dp->blocks = b;
  dp->nblocks++;
  INFO(HETCCL_ALLOC, "rank %d: staging block of %zu bytes pinned (%d in the pool)", comm->rank,
       b->bytes, dp->nblocks);
  *out = b;
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
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
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
    ncclResult_t run = hetccl_group_run_tasks(comm, tasks);
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
  for (int i = 0; i < j->nstages; i++) hetccl_group_free_tasks(j->stages[i].tasks);
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

/* Lay the batch out in one block: each staged output, and each staged input
 * that does not lie inside its own task's output (in place), gets a slice.
 * Returns the bytes needed; fills plans[i] except host pointers. */
static size_t plan_batch(hetccl_task_t *tasks, stage_plan_t *plans) {
  size_t need = 0;
  int i = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next, i++) {
    stage_plan_t *p = &plans[i];
    memset(p, 0, sizeof(*p));
    p->in = t->in_bytes, p->out = t->out_bytes;
    if (t->stage_recv) {
      p->drecv = *task_recv(t);
      need += align_up(p->out);
    }
    if (t->stage_send) {
      p->dsend = *task_send(t);
      const char *s = p->dsend, *r = p->drecv;
      int inside = r && s >= r && s + p->in <= r + p->out;
      if (!inside) need += align_up(p->in);
    }
  }
  return need;
}

static void plan_place(hetccl_task_t *tasks, stage_plan_t *plans, char *base) {
  if (!base) return; /* nothing to move: every staged buffer is empty */
  size_t off = 0;
  int i = 0;
  for (hetccl_task_t *t = tasks; t; t = t->next, i++) {
    stage_plan_t *p = &plans[i];
    if (p->drecv) {
      p->hrecv = base + off;
      off += align_up(p->out);
      *task_recv(t) = p->hrecv;
    }
    if (p->dsend) {
      const char *s = p->dsend, *r = p->drecv;
      if (r && s >= r && s + p->in <= r + p->out) {
        p->hsend = (char *)p->hrecv + (s - r);
      } else {
        p->hsend = base + off;
        off += align_up(p->in);
      }
      *task_send(t) = p->hsend;
    }
  }
}

/* Collectives first, then sends and receives, each in call order: the
 * order hetccl_group_run_tasks runs them in, which the stages keep (a
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
  stage_block_t *block = NULL;
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
  size_t need = plan_batch(tasks, plans);
  nstages = plan_stages(tasks, plans, stage_of);
  job = calloc(1, sizeof(*job) + (size_t)nstages * sizeof(job->stages[0]));
  if (!job) {
    WARN("devpath: out of memory");
    res = ncclSystemError;
    goto fail;
  }
  if (need) HETCCL_CHECK_GOTO(block_acquire(comm, dp, need, &block), res, fail);
  plan_place(tasks, plans, block ? block->host : NULL);

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
        HETCCL_CHECK_GOTO(rt->memcpy_async(plans[i].hsend, plans[i].dsend, plans[i].in, launch),
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
  TRACE(HETCCL_COLL, "rank %d: staged batch of %d task(s) in %d stage(s) from %llu, %zu bytes",
        comm->rank, ntasks, nstages, (unsigned long long)first, need);
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
        HETCCL_CHECK_GOTO(rt->memcpy_async(plans[i].drecv, plans[i].hrecv, plans[i].out, launch),
                          res, copied);
  }
copied:
  /* The block is busy until the stream has passed everything enqueued. */
  if (block && rt->event_record(block->free_event, launch) == ncclSuccess) {
    block->busy = 1;
    block->last_use = ++dp->launches;
  }
  for (int i = 0; res == ncclSuccess && i < nothers; i++) res = hetccl_runtime_stream_join(rt, others[i], launch);
fail:
  if (tasks) hetccl_group_free_tasks(tasks);
  free(job);
  free(plans);
  free(stage_of);
  if (res != ncclSuccess) hetccl_comm_set_error(comm, res);
  return res;
}

void hetccl_devpath_destroy(ncclComm_t comm) {
  hetccl_devpath_t *dp = comm->devpath;
  if (!dp) return;
  comm->devpath = NULL;
  /* Jobs the stopped proxy dropped never stored their numbers. */
  __atomic_store_n(&dp->counters[COUNTER_DONE], UINT64_MAX, __ATOMIC_RELEASE);
  struct timespec nap = {0, 1000000};
  int waited_ms = 0, stuck = 0;
  stage_block_t *lists[2] = {dp->blocks, dp->retired};
  for (int i = 0; i < 2; i++)
    for (stage_block_t *b = lists[i]; b; b = b->next) {
      while (!block_idle(dp, b) && waited_ms < DESTROY_WAIT_MS) {
        nanosleep(&nap, NULL);
        waited_ms++;
      }
      stuck |= b->busy;
    }
  if (stuck) {
    /* A stream still holds work that reads our memory: leak it, never free it under the GPU. */
    WARN("rank %d: a stream still had staged copies pending after %d s; their pinned memory "
         "is left allocated", comm->rank, DESTROY_WAIT_MS / 1000);
    free(dp);
    return;
  }
  for (int i = 0; i < 2; i++)
    while (lists[i]) {
      stage_block_t *b = lists[i];
      lists[i] = b->next;
      block_free(dp, b);
    }
  dp->rt->host_free((void *)dp->counters);
  free(dp);
}
