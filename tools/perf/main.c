/* hetccl-perf: ranks, threads, the size sweep and the table.
 *
 * Each thread drives `-g` ranks (one group over their communicators) and
 * runs the same sweep; statistics cross ranks with the library's own
 * all-reduce (float64), so no MPI is needed. Global rank 0 prints. With
 * -T, a watchdog thread ends the program when one size's test runs past
 * its time (thread 0 of each process arms it for each size). */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <stdatomic.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

static struct perf_options opt;
static struct perf_nccl api;

/* This process's place among the launched ones (docs/launching.md). */
static struct {
  int launched; /* HETCCL_LAUNCH_* present */
  int proc, nprocs, local;
  ncclUniqueId id;
  int nranks;   /* in the communicator: nprocs * threads * gpus */
} world;

struct thread_ctx {
  int index;
  pthread_t tid;
  struct perf_rank *ranks; /* opt.gpus of them */
  double bw_sum;
  int bw_count;
  double wrong;
};

#define NCCL_CHECK(call, comm)                                                 \
  do {                                                                         \
    ncclResult_t res_ = (call);                                                \
    if (res_ != ncclSuccess)                                                   \
      nccl_fail(#call, res_, comm);                                            \
  } while (0)

static void nccl_fail(const char *what, ncclResult_t res, ncclComm_t comm)
{
  const char *last = api.GetLastError ? api.GetLastError(comm) : NULL;
  fprintf(stderr, "hetccl-perf: %s failed: %s%s%s\n", what, api.GetErrorString(res),
          last && *last ? ": " : "", last ? last : "");
  exit(1);
}

static double now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- ranks ---- */

static int hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static int env_int(const char *name, int *out)
{
  const char *s = getenv(name);
  char *end;
  if (!s || !*s)
    return -1;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > INT_MAX)
    return -1;
  *out = (int)v;
  return 0;
}

static int world_from_env(void)
{
  const char *hex = getenv("HETCCL_LAUNCH_ID");
  world.proc = 0;
  world.nprocs = 1;
  world.local = 0;
  if (!hex || !*hex)
    return 0;
  if (env_int("HETCCL_LAUNCH_RANK", &world.proc) || env_int("HETCCL_LAUNCH_NRANKS", &world.nprocs)
      || world.proc >= world.nprocs || strlen(hex) != 2 * sizeof world.id.internal) {
    fprintf(stderr, "hetccl-perf: HETCCL_LAUNCH_ID is set but HETCCL_LAUNCH_RANK/NRANKS/ID "
                    "are not valid (docs/launching.md)\n");
    return -1;
  }
  if (env_int("HETCCL_LAUNCH_LOCAL_RANK", &world.local))
    world.local = world.proc;
  for (size_t i = 0; i < sizeof world.id.internal; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      fprintf(stderr, "hetccl-perf: HETCCL_LAUNCH_ID is not hexadecimal\n");
      return -1;
    }
    world.id.internal[i] = (char)(hi << 4 | lo);
  }
  world.launched = 1;
  return 0;
}

static int per_proc(void) { return opt.threads * opt.gpus; }

/* Local ranks take the devices in turn; with more ranks than devices they
 * share them (hetccl allows it where its own engine or data plane carries
 * the ranks, e.g. forced islands on a one-GPU machine; NCCL does not). */
static int device_of(int thread, int g)
{
  if (opt.mem != PERF_MEM_CUDA)
    return -1;
  int ndev = perf_mem_device_count();
  int idx = world.local * per_proc() + thread * opt.gpus + g;
  return ndev > 0 ? idx % ndev : idx;
}

/* Launched, or -p 1: every thread joins its ranks to the communicator,
 * one group around its -g ranks. */
static void init_ranks(struct thread_ctx *t)
{
  if (opt.gpus > 1)
    NCCL_CHECK(api.GroupStart(), NULL);
  for (int g = 0; g < opt.gpus; g++) {
    struct perf_rank *r = &t->ranks[g];
    r->rank = world.proc * per_proc() + t->index * opt.gpus + g;
    perf_mem_set_device(r->device);
    NCCL_CHECK(api.CommInitRank(&r->comm, world.nranks, world.id, r->rank), NULL);
  }
  if (opt.gpus > 1)
    NCCL_CHECK(api.GroupEnd(), NULL);
}

/* Not launched (and -p 0): one ncclCommInitAll over every local rank. */
static void init_all(struct thread_ctx *threads)
{
  int n = per_proc();
  ncclComm_t *comms = calloc((size_t)n, sizeof *comms);
  int *devs = calloc((size_t)n, sizeof *devs);
  for (int i = 0; i < n; i++)
    devs[i] = device_of(i / opt.gpus, i % opt.gpus);
  NCCL_CHECK(api.CommInitAll(comms, n, opt.mem == PERF_MEM_CUDA ? devs : NULL), NULL);
  for (int i = 0; i < n; i++) {
    threads[i / opt.gpus].ranks[i % opt.gpus].comm = comms[i];
    threads[i / opt.gpus].ranks[i % opt.gpus].rank = i;
  }
  free(comms);
  free(devs);
}

/* ---- one operation on all of this thread's ranks ---- */

/* `ops` operations on each of this thread's ranks, in one group where
 * there is more than one call (-g ranks, -m operations). */
static void run_group(struct thread_ctx *t, const struct perf_args *a,
                      const struct perf_counts *c, int inplace, int ops)
{
  int grouped = opt.gpus > 1 || ops > 1;
  if (grouped)
    NCCL_CHECK(api.GroupStart(), NULL);
  for (int op = 0; op < ops; op++) {
    for (int g = 0; g < opt.gpus; g++) {
      struct perf_rank *r = &t->ranks[g];
      const struct perf_counts *rc = &c[g];
      const void *send = r->send;
      void *recv = r->recv;
      if (inplace) {
        send = (char *)r->recv + rc->send_inplace * a->type->size;
        recv = (char *)r->recv + rc->recv_inplace * a->type->size;
      }
      perf_mem_set_device(r->device);
      NCCL_CHECK(opt.coll->launch(a, rc, send, recv, r->comm, r->rank, r->stream), r->comm);
    }
  }
  if (grouped)
    NCCL_CHECK(api.GroupEnd(), NULL);
}

static void sync_all(struct thread_ctx *t)
{
  for (int g = 0; g < opt.gpus; g++) {
    perf_mem_set_device(t->ranks[g].device);
    perf_mem_stream_sync(t->ranks[g].stream);
  }
}

/* An all-reduce of `n` doubles over every rank, in place in `vals` (one
 * array per local rank). Doubles as the barrier before each timing. */
static void allreduce_stats(struct thread_ctx *t, double (*vals)[8], int n, ncclRedOp_t op)
{
  if (opt.gpus > 1)
    NCCL_CHECK(api.GroupStart(), NULL);
  for (int g = 0; g < opt.gpus; g++) {
    struct perf_rank *r = &t->ranks[g];
    perf_mem_set_device(r->device);
    perf_mem_to_device(r->stats, vals[g], n * sizeof(double));
    NCCL_CHECK(api.AllReduce(r->stats, r->stats, (size_t)n, ncclFloat64, op, r->comm, r->stream),
               r->comm);
  }
  if (opt.gpus > 1)
    NCCL_CHECK(api.GroupEnd(), NULL);
  sync_all(t);
  for (int g = 0; g < opt.gpus; g++) {
    perf_mem_set_device(t->ranks[g].device);
    perf_mem_to_host(vals[g], t->ranks[g].stats, n * sizeof(double));
  }
}

static void barrier(struct thread_ctx *t)
{
  double v[opt.gpus][8];
  memset(v, 0, sizeof v);
  allreduce_stats(t, v, 1, ncclSum);
}

/* ---- data check ----
 * Before the checked run, out-of-place outputs are overwritten with a
 * pattern no test value has, so that a stale result cannot pass. */

static void fill(struct perf_rank *r, const struct perf_args *a, const struct perf_counts *c,
                 int inplace)
{
  size_t ts = a->type->size;
  char *dst = inplace ? (char *)r->recv + c->send_inplace * ts : (char *)r->send;
  char *host = opt.mem == PERF_MEM_CUDA ? (char *)r->stage : dst;
  for (size_t i = 0; i < c->send; i++)
    a->type->store(host + i * ts, perf_value(a->type, a->op, a->nranks, r->rank, i));
  perf_mem_set_device(r->device);
  perf_mem_to_device(dst, host, c->send * ts);
}

static void poison_output(struct perf_rank *r, const struct perf_args *a,
                          const struct perf_counts *c)
{
  size_t bytes = c->recv * a->type->size;
  char *host = opt.mem == PERF_MEM_CUDA ? (char *)r->stage : (char *)r->recv;
  memset(host, 0xa5, bytes);
  perf_mem_to_device(r->recv, host, bytes);
}

static double count_wrong(struct perf_rank *r, const struct perf_args *a,
                          const struct perf_counts *c, int inplace)
{
  size_t ts = a->type->size;
  char *out = (char *)r->recv + (inplace ? c->recv_inplace * ts : 0);
  char *host = out;
  if (opt.mem == PERF_MEM_CUDA) {
    perf_mem_set_device(r->device);
    perf_mem_to_host(r->stage, out, c->recv * ts);
    host = r->stage;
  }
  double wrong = 0;
  for (size_t i = 0; i < c->recv; i++) {
    double want;
    if (!opt.coll->expected(a, c, r->rank, i, &want))
      continue;
    double got = a->type->load(host + i * ts);
    if (!perf_value_matches(a->type, a->op, a->nranks, got, want))
      wrong++;
  }
  return wrong;
}

/* -c N: N checked runs, each from fresh inputs; the wrong elements of all. */
static double check(struct thread_ctx *t, const struct perf_args *a, const struct perf_counts *c,
                    int inplace)
{
  double wrong = 0;
  for (int k = 0; k < opt.check; k++) {
    for (int g = 0; g < opt.gpus; g++) {
      if (!inplace)
        poison_output(&t->ranks[g], a, &c[g]);
      fill(&t->ranks[g], a, &c[g], inplace);
    }
    barrier(t);
    run_group(t, a, c, inplace, 1);
    sync_all(t);
    for (int g = 0; g < opt.gpus; g++)
      wrong += count_wrong(&t->ranks[g], a, &c[g], inplace);
  }
  return wrong;
}

/* ---- timing and the table ---- */

/* Microseconds per operation: -n iterations of -m operations each. -z
 * waits (1, 2, 3) and barriers (1, 3) after each iteration, 3 leaving the
 * barrier out of the time; -C 1 reports the time the calls took to issue
 * (up to the last call's return, before the final wait). */
static double time_iters(struct thread_ctx *t, const struct perf_args *a,
                         const struct perf_counts *c, int inplace)
{
  for (int i = 0; i < opt.warmup; i++)
    run_group(t, a, c, inplace, 1);
  sync_all(t);
  barrier(t);
  double start = now_us(), busy = 0;
  for (int i = 0; i < opt.iters; i++) {
    double t0 = now_us();
    run_group(t, a, c, inplace, opt.agg_iters);
    if (opt.blocking)
      sync_all(t);
    if (opt.blocking == 3)
      busy += now_us() - t0;
    if (opt.blocking == 1 || opt.blocking == 3)
      barrier(t);
  }
  double issued = opt.blocking == 3 ? busy : now_us() - start;
  sync_all(t);
  double done = opt.blocking == 3 ? busy : now_us() - start;
  return (opt.report_cputime ? issued : done) / ((double)opt.iters * opt.agg_iters);
}

static int checked(int inplace) { return opt.check && (!inplace || opt.coll->check_inplace); }

static int is_printer(const struct thread_ctx *t) { return world.proc == 0 && t->index == 0; }

static void print_time(double us)
{
  printf(us >= 10000 ? "  %7.0f" : us >= 100 ? "  %7.1f" : "  %7.2f", us);
}

/* Rows of the whole sweep, for the progress line. */
static int rows_done, rows_total;

/* -T: the time (now_us) by which what runs now (the communicators'
 * init, then each size's test) must end; 0 while nothing is timed. Thread
 * 0 of each process (or main, for ncclCommInitAll) arms it, the watchdog
 * reads it. */
static _Atomic double test_deadline;
static _Atomic size_t test_bytes; /* SIZE_MAX: the init */

static void *watchdog(void *unused)
{
  (void)unused;
  for (;;) {
    usleep(100 * 1000);
    double deadline = atomic_load(&test_deadline);
    if (deadline > 0 && now_us() > deadline) {
      size_t bytes = atomic_load(&test_bytes);
      char what[96];
      if (bytes == SIZE_MAX)
        snprintf(what, sizeof what, "the communicators' init");
      else
        snprintf(what, sizeof what, "%s of %zu bytes", opt.coll->name, bytes);
      fflush(stdout);
      fprintf(stderr, "hetccl-perf: test timeout (-T %d s): %s did not finish (process %d "
                      "of %d)\n", opt.timeout_s, what, world.proc, world.nprocs);
      _exit(1); /* the ranks may be blocked in the library: no exit handlers */
    }
  }
  return NULL;
}

static void arm_timeout(size_t bytes)
{
  if (opt.timeout_s <= 0)
    return;
  atomic_store(&test_bytes, bytes);
  atomic_store(&test_deadline, now_us() + opt.timeout_s * 1e6);
}

static void disarm_timeout(void) { atomic_store(&test_deadline, 0); }

static void print_timestamp(void)
{
  char text[32];
  time_t now = time(NULL);
  struct tm tm;
  strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
  printf("  %s", text);
}

static struct perf_report_result result_of(double us, double bytes, double factor, int checked,
                                           double wrong)
{
  double algbw = us > 0 ? bytes / us / 1e3 : 0;
  struct perf_report_result r = {us, algbw, algbw * factor, wrong, checked};
  return r;
}

static void print_result(double us, double bytes, double factor, int checked, double wrong)
{
  double algbw = us > 0 ? bytes / us / 1e3 : 0;
  print_time(us);
  printf("  %6.2f  %6.2f", algbw, algbw * factor);
  if (checked)
    printf("  %6.0f", wrong);
  else
    printf("  %6s", "N/A");
}

static void run_size(struct thread_ctx *t, const struct perf_args *a, size_t bytes)
{
  if (t->index == 0)
    arm_timeout(bytes);
  struct perf_counts c[opt.gpus];
  for (int g = 0; g < opt.gpus; g++)
    opt.coll->counts(&c[g], bytes / a->type->size, a->nranks, t->ranks[g].rank, a->type->size);
  double us[2], wrong[2] = {0, 0};
  for (int inplace = 0; inplace < 2; inplace++) {
    us[inplace] = time_iters(t, a, c, inplace);
    if (checked(inplace))
      wrong[inplace] = check(t, a, c, inplace);
  }
  /* per local rank: [oop time, ip time, oop wrong, ip wrong] */
  double sum[opt.gpus][8], mx[opt.gpus][8], mn[opt.gpus][8];
  for (int g = 0; g < opt.gpus; g++) {
    double v[4] = {us[0], us[1], g == 0 ? wrong[0] : 0, g == 0 ? wrong[1] : 0};
    memcpy(sum[g], v, sizeof v);
    memcpy(mx[g], v, sizeof v);
    memcpy(mn[g], v, sizeof v);
  }
  allreduce_stats(t, sum, 4, ncclSum);
  allreduce_stats(t, mx, 2, ncclMax);
  allreduce_stats(t, mn, 2, ncclMin);
  if (t->index == 0)
    disarm_timeout();
  double shown[2];
  for (int i = 0; i < 2; i++) {
    switch (opt.average) {
    case 0: shown[i] = us[i]; break; /* printed by rank 0: its own time */
    case 2: shown[i] = mn[0][i]; break;
    case 3: shown[i] = mx[0][i]; break;
    default: shown[i] = sum[0][i] / a->nranks; break;
    }
  }
  double factor = opt.coll->bus_factor(a->nranks);
  for (int i = 0; i < 2; i++) {
    if (shown[i] > 0) {
      t->bw_sum += c[0].bytes / shown[i] / 1e3 * factor;
      t->bw_count++;
    }
  }
  t->wrong += sum[0][2] + sum[0][3];
  if (!is_printer(t))
    return;
  const char *opname = opt.coll->has_op ? perf_redop_at((int)a->op)->name : "none";
  printf("%12zu  %12zu  %8s  %6s  %6d", c[0].bytes, c[0].bytes / a->type->size, a->type->name,
         opname, opt.coll->has_root ? a->root : -1);
  print_result(shown[0], (double)c[0].bytes, factor, checked(0), sum[0][2]);
  print_result(shown[1], (double)c[0].bytes, factor, checked(1), sum[0][3]);
  if (opt.report_timestamps)
    print_timestamp();
  printf("\n");
  fflush(stdout);
  struct perf_report_row row = {
    .collective = opt.coll->name, .type = a->type->name, .redop = opname,
    .size = c[0].bytes, .count = c[0].bytes / a->type->size,
    .root = opt.coll->has_root ? a->root : -1,
    .oop = result_of(shown[0], (double)c[0].bytes, factor, checked(0), sum[0][2]),
    .ip = result_of(shown[1], (double)c[0].bytes, factor, checked(1), sum[0][3]),
    .index = rows_done++, .total = rows_total,
  };
  perf_report_row(&row);
}

static size_t next_size(size_t bytes)
{
  size_t next = opt.step_factor > 1 ? (size_t)(bytes * opt.step_factor) : bytes + opt.step_bytes;
  return next <= bytes ? bytes + 1 : next;
}

/* Rows of one cycle (-N repeats the sweep). */
static int sweep_rows(void)
{
  int sizes = 0;
  for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes = next_size(bytes))
    sizes++;
  return sizes * opt.ntypes * (opt.coll->has_op ? opt.nops : 1);
}

/* -u: the buffers start `unalign` elements of `type` past the allocation. */
static void place_buffers(struct thread_ctx *t, const struct perf_dtype *type)
{
  for (int g = 0; g < opt.gpus; g++) {
    struct perf_rank *r = &t->ranks[g];
    r->send = (char *)r->send_base + (size_t)opt.unalign * type->size;
    r->recv = (char *)r->recv_base + (size_t)opt.unalign * type->size;
  }
}

/* One cycle: every type, operator and size. */
static void sweep_once(struct thread_ctx *t)
{
  for (int ti = 0; ti < opt.ntypes; ti++) {
    place_buffers(t, opt.types[ti]);
    for (int oi = 0; oi < (opt.coll->has_op ? opt.nops : 1); oi++) {
      struct perf_args a = {
        .api = &api,
        .type = opt.types[ti],
        /* collectives that do not reduce take values from the max/min range */
        .op = opt.coll->has_op ? opt.ops[oi]->nccl : ncclMax,
        .root = opt.root,
        .nranks = world.nranks,
      };
      for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes = next_size(bytes))
        run_size(t, &a, bytes);
    }
  }
}

/* -N cycles of the sweep, each printed; 0: until the program is stopped. */
static void sweep(struct thread_ctx *t)
{
  for (int cycle = 0; opt.run_cycles == 0 || cycle < opt.run_cycles; cycle++)
    sweep_once(t);
}

/* ---- setup ---- */

static size_t largest_buffer(void)
{
  size_t most = 64; /* room for the statistics even at size 0 */
  size_t pad = (size_t)opt.unalign * 8; /* -u: the widest element */
  for (int ti = 0; ti < opt.ntypes; ti++) {
    struct perf_counts c;
    size_t ts = opt.types[ti]->size;
    /* the last rank has the largest in-place offset */
    opt.coll->counts(&c, opt.max_bytes / ts, world.nranks, world.nranks - 1, ts);
    size_t need = ts * (c.send > c.recv ? c.send : c.recv);
    if (need > most)
      most = need;
  }
  return most + pad;
}

/* Buffers, streams (-y 1: the NULL stream) and, with -R 1, the buffers
 * registered with each rank's communicator. */
static void setup_buffers(struct thread_ctx *t)
{
  size_t bytes = largest_buffer();
  for (int g = 0; g < opt.gpus; g++) {
    struct perf_rank *r = &t->ranks[g];
    perf_mem_set_device(r->device);
    r->stream = opt.stream_null ? NULL : perf_mem_stream_create();
    r->send = r->send_base = perf_mem_alloc(bytes);
    r->recv = r->recv_base = perf_mem_alloc(bytes);
    r->stats = perf_mem_alloc(8 * sizeof(double));
    r->stage = opt.mem == PERF_MEM_CUDA ? malloc(bytes) : NULL;
    if (opt.local_register) {
      NCCL_CHECK(api.CommRegister(r->comm, r->send_base, bytes, &r->send_reg), r->comm);
      NCCL_CHECK(api.CommRegister(r->comm, r->recv_base, bytes, &r->recv_reg), r->comm);
    }
  }
}

static void teardown(struct thread_ctx *t)
{
  for (int g = 0; g < opt.gpus; g++) {
    struct perf_rank *r = &t->ranks[g];
    perf_mem_set_device(r->device);
    if (opt.local_register) {
      NCCL_CHECK(api.CommDeregister(r->comm, r->send_reg), r->comm);
      NCCL_CHECK(api.CommDeregister(r->comm, r->recv_reg), r->comm);
    }
    NCCL_CHECK(api.CommDestroy(r->comm), NULL);
    perf_mem_free(r->send_base);
    perf_mem_free(r->recv_base);
    perf_mem_free(r->stats);
    perf_mem_stream_destroy(r->stream);
    free(r->stage);
  }
}

static void *thread_main(void *arg)
{
  struct thread_ctx *t = arg;
  if (world.launched || opt.parallel_init) {
    if (t->index == 0)
      arm_timeout(SIZE_MAX);
    init_ranks(t);
  }
  setup_buffers(t);
  barrier(t);
  sweep(t);
  teardown(t);
  return NULL;
}

static void print_header(struct thread_ctx *threads)
{
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  printf("# hetccl-perf %s: nThread %d nGpus %d minBytes %zu maxBytes %zu step: ",
         opt.coll->name, opt.threads, opt.gpus, opt.min_bytes, opt.max_bytes);
  if (opt.step_factor > 1)
    printf("%g(factor)", opt.step_factor);
  else
    printf("%zu(bytes)", opt.step_bytes);
  printf(" warmup iters: %d iters: %d agg iters: %d validation: %d blocking: %d average: %d "
         "cycles: %d\n", opt.warmup, opt.iters, opt.agg_iters, opt.check, opt.blocking,
         opt.average, opt.run_cycles);
  int v = api.version;
  printf("# library: %s (ncclGetVersion %d: %d.%d.%d)\n", api.path, v, v / 10000,
         (v % 10000) / 100, v % 100);
  printf("# memory: %s; ranks: %d (%d processes x %d threads x %d per thread), %s\n",
         opt.mem == PERF_MEM_CUDA ? "cuda" : "host", world.nranks, world.nprocs, opt.threads,
         opt.gpus, world.launched ? "launched (HETCCL_LAUNCH_*)"
                   : opt.parallel_init ? "ncclCommInitRank in each thread (-p 1)"
                                       : "ncclCommInitAll");
  if (opt.report_cputime)
    printf("# time: the calls' time to return (-C 1), not the operations' to finish\n");
  if (!api.AlltoAll || !api.Gather || !api.Scatter)
    printf("# note: the library lacks ncclAlltoAll/Gather/Scatter: composed from Send/Recv\n");
  printf("#\n# Using devices (this process)\n");
  for (int i = 0; i < per_proc(); i++) {
    struct perf_rank *r = &threads[i / opt.gpus].ranks[i % opt.gpus];
    char dev[64];
    perf_mem_device_name(r->device, dev, sizeof dev);
    printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s]\n",
           world.proc * per_proc() + i, i / opt.gpus, (int)getpid(), host, r->device, dev);
  }
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s  %31s  %31s\n", "", "", "", "", "",
         "out-of-place", "in-place");
  const char *ts = opt.report_timestamps ? "  timestamp" : "";
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "size",
         "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
         "busbw", "#wrong", ts);
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
         "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

int main(int argc, char **argv)
{
  int rc = perf_options_parse(&opt, argc, argv);
  if (rc)
    return rc > 0 ? 0 : 2;
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[len > 0 ? len : 0] = 0;
  if (world_from_env() || perf_mem_init(opt.mem) || perf_nccl_load(&api, dirname(exe)))
    return 2;
  world.nranks = world.nprocs * per_proc();
  if (opt.coll->has_root && opt.root >= world.nranks) {
    fprintf(stderr, "hetccl-perf: root %d is not a rank of %d\n", opt.root, world.nranks);
    return 2;
  }
  if (opt.mem == PERF_MEM_CUDA && perf_mem_device_count() < 1) {
    fprintf(stderr, "hetccl-perf: --mem_type cuda but the CUDA runtime sees no device\n");
    return 2;
  }
  if (opt.local_register && (!api.CommRegister || !api.CommDeregister)) {
    fprintf(stderr, "hetccl-perf: -R 1: not supported: %s has no ncclCommRegister\n", api.path);
    return 2;
  }
  if (!world.launched && opt.parallel_init) {
    world.nprocs = 1;
    NCCL_CHECK(api.GetUniqueId(&world.id), NULL);
  }
  pthread_t dog;
  if (opt.timeout_s > 0 && pthread_create(&dog, NULL, watchdog, NULL) == 0)
    pthread_detach(dog);

  struct thread_ctx *threads = calloc((size_t)opt.threads, sizeof *threads);
  for (int i = 0; i < opt.threads; i++) {
    threads[i].index = i;
    threads[i].ranks = calloc((size_t)opt.gpus, sizeof(struct perf_rank));
    for (int g = 0; g < opt.gpus; g++)
      threads[i].ranks[g].device = device_of(i, g);
  }
  if (!world.launched && !opt.parallel_init) {
    arm_timeout(SIZE_MAX);
    init_all(threads);
    disarm_timeout();
  }
  if (world.proc == 0) {
    rows_total = sweep_rows() * (opt.run_cycles > 0 ? opt.run_cycles : 1);
    struct perf_report_info info = {
      .collective = opt.coll->name, .library = api.path,
      .memory = opt.mem == PERF_MEM_CUDA ? "cuda" : "host", .nccl_version = api.version,
      .nranks = world.nranks, .processes = world.nprocs, .threads = opt.threads,
      .gpus = opt.gpus, .iters = opt.iters, .warmup = opt.warmup, .check = opt.check,
      .average = opt.average, .progress_after = opt.progress_after,
    };
    if (perf_report_open(opt.json_path, &info))
      return 2;
    print_header(threads);
  }
  for (int i = 0; i < opt.threads; i++) {
    int err = pthread_create(&threads[i].tid, NULL, thread_main, &threads[i]);
    if (err) {
      fprintf(stderr, "hetccl-perf: pthread_create: %s\n", strerror(err));
      return 1;
    }
  }
  for (int i = 0; i < opt.threads; i++)
    pthread_join(threads[i].tid, NULL);

  struct thread_ctx *t0 = &threads[0];
  double avg_bw = t0->bw_count ? t0->bw_sum / t0->bw_count : 0.0;
  /* NCCL_TESTS_MIN_BW, as nccl-tests reads it: below 90% of it fails. */
  int slow = opt.min_bw >= 0 && avg_bw < opt.min_bw * 0.9;
  if (world.proc == 0) {
    if (opt.check)
      printf("# Wrong elements       : %.0f %s\n", t0->wrong, t0->wrong > 0 ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g %s\n#\n", avg_bw,
           opt.min_bw < 0 ? "" : slow ? "FAILED" : "OK");
    if (slow)
      fprintf(stderr, "hetccl-perf: average bus bandwidth %g GB/s is below 0.9 x "
                      "NCCL_TESTS_MIN_BW=%g\n", avg_bw, opt.min_bw);
    perf_report_close(t0->wrong, avg_bw);
  }
  int failed = (opt.check && t0->wrong > 0) || slow;
  for (int i = 0; i < opt.threads; i++)
    free(threads[i].ranks);
  free(threads);
  return failed ? 1 : 0;
}
