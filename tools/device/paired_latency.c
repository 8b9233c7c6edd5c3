/* Small-message latency of hetccl against the real NCCL, paired in one
 * process.
 *
 * Two invocations of a benchmark on the GPU machine differ by several
 * microseconds at 8 bytes (clocks, placement), more than the difference
 * being looked for. Here both libraries run in the same process on the same
 * two GPUs and streams: each loaded with dlopen (RTLD_LOCAL), each with its
 * own pair of communicators (ncclCommInitAll over devices 0 and 1), hetccl
 * forwarding to the very NCCL that is measured beside it. Each round times
 * `iters` operations through one library and then through the other (the
 * order alternates round by round), and the round's difference is one
 * sample. Reported per collective and size: the median time per operation
 * of each library, the median of the paired differences (hetccl - NCCL) and
 * a distribution-free 95% interval for that median (order statistics),
 * and the ratio of the medians (NCCL / hetccl: hetccl's bus bandwidth over
 * NCCL's, so that large sizes read as the perf table's ratio does).
 *
 *   gcc -O2 tools/device/paired_latency.c -ldl -lm -o paired_latency
 *   HETCCL_NCCL_LIBRARY=$REAL HETCCL_DEVICE=cuda \
 *     ./paired_latency $REAL build/libhetccl/libhetccl.so [options]
 *
 * Options: --sizes 8,1K (bytes, default 8), --colls all_reduce,...
 * (default the six of nccl-tests' table), --rounds N (400), --iters N (20),
 * --bar US (0.5: the interval's upper end must stay below it), --memory
 * host (host buffers and ranks, no CUDA: checks the tool itself anywhere).
 * The time per operation is what nccl-tests reports: host clock around
 * `iters` launches and a stream synchronize, divided by `iters`.
 * Exit status: 0 when every row meets the bar, 1 when one does not, 2 on
 * an error. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NDEV 2
#define NCCL_FLOAT32 7
#define NCCL_SUM 0

typedef int (*init_all_fn)(void **comms, int n, const int *devs);
typedef int (*destroy_fn)(void *comm);
typedef int (*group_fn)(void);
typedef int (*version_fn)(int *v);
typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*allgather_fn)(const void *, void *, size_t, int, void *, void *);
typedef int (*bcast_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*p2p_fn)(const void *, size_t, int, int, void *, void *);

struct lib {
  const char *path;
  const char *label;
  int version;
  void *comms[NDEV];
  init_all_fn init_all;
  destroy_fn destroy;
  group_fn group_start, group_end;
  allreduce_fn allreduce, reduce_scatter;
  allgather_fn allgather, alltoall; /* same shape: (send, recv, count, type, comm, stream) */
  bcast_fn broadcast;
  p2p_fn send, recv;
};

static struct {
  int (*set_device)(int);
  int (*malloc_)(void **, size_t);
  int (*memset_)(void *, int, size_t);
  int (*stream_create)(void **);
  int (*stream_sync)(void *);
} cuda;

static int host_memory;
static void *streams[NDEV];
static void *sendbuf[NDEV], *recvbuf[NDEV];

static void die(const char *what, int rc) {
  fprintf(stderr, "paired_latency: %s failed (%d)\n", what, rc);
  exit(2);
}

#define CHECK(call)                  \
  do {                               \
    int rc_ = (call);                \
    if (rc_) die(#call, rc_);        \
  } while (0)

static void *sym(void *h, const char *path, const char *name) {
  void *p = dlsym(h, name);
  if (!p) {
    fprintf(stderr, "paired_latency: %s has no %s\n", path, name);
    exit(2);
  }
  return p;
}

static int host_noop(void) { return 0; }
static int host_malloc(void **p, size_t n) { return (*p = calloc(1, n)) == NULL; }
static int host_memset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
static int host_stream(void **s) { *s = NULL; return 0; }

static void load_cuda(void) {
  if (host_memory) {
    *(void **)&cuda.set_device = (void *)host_noop;
    *(void **)&cuda.stream_sync = (void *)host_noop;
    cuda.malloc_ = host_malloc;
    cuda.memset_ = host_memset;
    cuda.stream_create = host_stream;
    return;
  }
  const char *names[] = {getenv("HETCCL_PERF_CUDART"), "libcudart.so.13", "libcudart.so.12",
                         "libcudart.so"};
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
    if (names[i] && *names[i]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "paired_latency: no libcudart (set HETCCL_PERF_CUDART): %s\n", dlerror());
    exit(2);
  }
  *(void **)&cuda.set_device = sym(h, "libcudart", "cudaSetDevice");
  *(void **)&cuda.malloc_ = sym(h, "libcudart", "cudaMalloc");
  *(void **)&cuda.memset_ = sym(h, "libcudart", "cudaMemset");
  *(void **)&cuda.stream_create = sym(h, "libcudart", "cudaStreamCreate");
  *(void **)&cuda.stream_sync = sym(h, "libcudart", "cudaStreamSynchronize");
}

static void load_lib(struct lib *l) {
  void *h = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "paired_latency: dlopen %s: %s\n", l->path, dlerror());
    exit(2);
  }
  *(void **)&l->init_all = sym(h, l->path, "ncclCommInitAll");
  *(void **)&l->destroy = sym(h, l->path, "ncclCommDestroy");
  *(void **)&l->group_start = sym(h, l->path, "ncclGroupStart");
  *(void **)&l->group_end = sym(h, l->path, "ncclGroupEnd");
  *(void **)&l->allreduce = sym(h, l->path, "ncclAllReduce");
  *(void **)&l->reduce_scatter = sym(h, l->path, "ncclReduceScatter");
  *(void **)&l->allgather = sym(h, l->path, "ncclAllGather");
  *(void **)&l->alltoall = sym(h, l->path, "ncclAlltoAll");
  *(void **)&l->broadcast = sym(h, l->path, "ncclBroadcast");
  *(void **)&l->send = sym(h, l->path, "ncclSend");
  *(void **)&l->recv = sym(h, l->path, "ncclRecv");
  version_fn version = (version_fn)sym(h, l->path, "ncclGetVersion");
  CHECK(version(&l->version));
  int devs[NDEV];
  for (int d = 0; d < NDEV; d++) devs[d] = d;
  CHECK(l->init_all(l->comms, NDEV, host_memory ? NULL : devs));
}

/* One operation on both GPUs, in one group, as nccl-tests' -g 2 issues it.
 * `bytes` is nccl-tests' size: the larger of the two buffers. */
static void launch(const struct lib *l, const char *coll, size_t bytes) {
  size_t n = bytes / sizeof(float);
  CHECK(l->group_start());
  for (int d = 0; d < NDEV; d++) {
    CHECK(cuda.set_device(d));
    void *c = l->comms[d], *s = streams[d];
    if (!strcmp(coll, "all_reduce"))
      CHECK(l->allreduce(sendbuf[d], recvbuf[d], n, NCCL_FLOAT32, NCCL_SUM, c, s));
    else if (!strcmp(coll, "reduce_scatter"))
      CHECK(l->reduce_scatter(sendbuf[d], recvbuf[d], n / NDEV, NCCL_FLOAT32, NCCL_SUM, c, s));
    else if (!strcmp(coll, "all_gather"))
      CHECK(l->allgather(sendbuf[d], recvbuf[d], n / NDEV, NCCL_FLOAT32, c, s));
    else if (!strcmp(coll, "alltoall"))
      CHECK(l->alltoall(sendbuf[d], recvbuf[d], n / NDEV, NCCL_FLOAT32, c, s));
    else if (!strcmp(coll, "broadcast"))
      CHECK(l->broadcast(sendbuf[d], recvbuf[d], n, NCCL_FLOAT32, 0, c, s));
    else { /* sendrecv: to the next rank, from the previous one */
      CHECK(l->send(sendbuf[d], n, NCCL_FLOAT32, (d + 1) % NDEV, c, s));
      CHECK(l->recv(recvbuf[d], n, NCCL_FLOAT32, (d + NDEV - 1) % NDEV, c, s));
    }
  }
  CHECK(l->group_end());
}

static void sync_all(void) {
  for (int d = 0; d < NDEV; d++) {
    CHECK(cuda.set_device(d));
    CHECK(cuda.stream_sync(streams[d]));
  }
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Microseconds per operation over `iters`, after a short warm-up. */
static double time_ops(const struct lib *l, const char *coll, size_t bytes, int iters) {
  for (int i = 0; i < 3; i++) launch(l, coll, bytes);
  sync_all();
  double t0 = now_us();
  for (int i = 0; i < iters; i++) launch(l, coll, bytes);
  sync_all();
  return (now_us() - t0) / iters;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
  case 'K': case 'k': v *= 1024; break;
  case 'M': case 'm': v *= 1024 * 1024; break;
  case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  default: break;
  }
  return (size_t)v;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NCCL_LIBRARY HETCCL_LIBRARY [--sizes 8,1K] [--colls LIST] "
                    "[--rounds N] [--iters N] [--bar US]\n", argv[0]);
    return 2;
  }
  struct lib libs[2] = {{.path = argv[1], .label = "nccl"}, {.path = argv[2], .label = "hetccl"}};
  char sizes_arg[256] = "8";
  char colls_arg[256] = "all_reduce,all_gather,broadcast,reduce_scatter,alltoall,sendrecv";
  int rounds = 400, iters = 20;
  double bar = 0.5;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--sizes")) snprintf(sizes_arg, sizeof sizes_arg, "%s", argv[i + 1]);
    else if (!strcmp(argv[i], "--colls")) snprintf(colls_arg, sizeof colls_arg, "%s", argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bar")) bar = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--memory")) host_memory = !strcmp(argv[i + 1], "host");
    else {
      fprintf(stderr, "paired_latency: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (rounds < 10 || iters < 1) {
    fprintf(stderr, "paired_latency: --rounds must be >= 10 and --iters >= 1\n");
    return 2;
  }

  load_cuda();
  size_t most = 0;
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s", sizes_arg);
  for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ",")) {
    size_t b = parse_size(tok);
    if (b < NDEV * sizeof(float) || b % (NDEV * sizeof(float))) {
      fprintf(stderr, "paired_latency: size %s is not a multiple of %zu bytes\n", tok,
              NDEV * sizeof(float));
      return 2;
    }
    if (b > most) most = b;
  }
  for (int d = 0; d < NDEV; d++) {
    CHECK(cuda.set_device(d));
    CHECK(cuda.stream_create(&streams[d]));
    CHECK(cuda.malloc_(&sendbuf[d], most));
    CHECK(cuda.malloc_(&recvbuf[d], most));
    CHECK(cuda.memset_(sendbuf[d], 0, most));
  }
  for (int k = 0; k < 2; k++) load_lib(&libs[k]);
  printf("# paired latency, one process, %d %s ranks, float32, out-of-place\n", NDEV,
         host_memory ? "host" : "GPU");
  for (int k = 0; k < 2; k++)
    printf("# %-6s %s (ncclGetVersion %d)\n", libs[k].label, libs[k].path, libs[k].version);
  printf("# %d rounds x %d operations per library, order alternating by round; diff = "
         "hetccl - nccl per round; 95%% interval of the median diff; bar: upper end < %.2f us\n",
         rounds, iters, bar);
  printf("# %-14s %10s %10s %10s %9s %21s %7s %7s\n", "collective", "bytes", "nccl us",
         "hetccl us", "diff us", "95% interval", "bar", "ratio");

  double *t[2] = {malloc(sizeof(double) * rounds), malloc(sizeof(double) * rounds)};
  double *diff = malloc(sizeof(double) * rounds);
  /* order statistics bounding the median with >= 95% confidence */
  int lo = (int)floor(rounds / 2.0 - 1.96 * sqrt(rounds) / 2.0);
  int hi = (int)ceil(rounds / 2.0 + 1.96 * sqrt(rounds) / 2.0);
  if (lo < 0) lo = 0;
  if (hi > rounds - 1) hi = rounds - 1;
  int missed = 0;
  char colls[256];
  snprintf(colls, sizeof colls, "%s", colls_arg);
  char *csave = NULL;
  for (char *coll = strtok_r(colls, ",", &csave); coll; coll = strtok_r(NULL, ",", &csave)) {
    char sizes[256];
    snprintf(sizes, sizeof sizes, "%s", sizes_arg);
    char *ssave = NULL;
    for (char *tok = strtok_r(sizes, ",", &ssave); tok; tok = strtok_r(NULL, ",", &ssave)) {
      size_t bytes = parse_size(tok);
      for (int r = 0; r < rounds; r++) {
        int first = r % 2;
        for (int k = 0; k < 2; k++) {
          int which = k ^ first;
          t[which][r] = time_ops(&libs[which], coll, bytes, iters);
        }
        diff[r] = t[1][r] - t[0][r];
      }
      double mn = median(t[0], rounds), mh = median(t[1], rounds), md = median(diff, rounds);
      int ok = diff[hi] < bar; /* diff is sorted by median() */
      missed += !ok;
      /* ratio: NCCL's median time over hetccl's, i.e. hetccl's busbw over NCCL's */
      printf("  %-14s %10zu %10.2f %10.2f %+9.2f [%+8.2f, %+8.2f] %7s %7.3f\n", coll, bytes, mn,
             mh, md, diff[lo], diff[hi], ok ? "met" : "MISSED", mh > 0 ? mn / mh : 0);
      fflush(stdout);
    }
  }
  for (int k = 0; k < 2; k++)
    for (int d = 0; d < NDEV; d++) libs[k].destroy(libs[k].comms[d]);
  free(t[0]);
  free(t[1]);
  free(diff);
  return missed ? 1 : 0;
}
