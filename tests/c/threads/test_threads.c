/* The library's threads against the caller's, in one process: what a race
 * detector can watch (ranks that are forked processes share memory it cannot
 * see) and what a leak check can count.
 *
 *   test_threads initall N CYCLES  ncclCommInitAll(N), one grouped AllReduce
 *                                  from this thread (each communicator's share
 *                                  on its proxy thread), destroy; CYCLES times.
 *                                  File descriptors, threads and /dev/shm
 *                                  entries may not grow.
 *   test_threads ranks N           a thread per rank: ncclCommInitRank, a mix
 *                                  of collectives and send/recv, destroy
 *   test_threads nonblocking N     a thread per rank, config.blocking = 0:
 *                                  init and collectives polled to completion
 *   test_threads abort             rank 0 blocks in an AllReduce that rank 1
 *                                  never joins; another thread aborts it
 *   test_threads failing           the same AllReduce on a nonblocking
 *                                  communicator: it times out on the proxy
 *                                  thread while this one polls its error
 *                                  and message
 *   test_threads logging N         ranks as threads log everything (to a file)
 *                                  and fail argument checks, while one more
 *                                  thread keeps re-reading the debug settings
 *
 * Exit status 0 on success; alarm() bounds every mode. */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define MAX_RANKS 8
#define COUNT 4099 /* prime: uneven pieces in every algorithm */

static int failures;

#define FAIL(...)                                                              \
  do {                                                                         \
    __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                        \
    fprintf(stderr, "FAIL: " __VA_ARGS__);                                     \
    fputc('\n', stderr);                                                       \
  } while (0)

#define CHECK(call)                                                            \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      FAIL("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
           ncclGetLastError(NULL));                                            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* --- what a process holds ------------------------------------------------ */

static int count_dir(const char *path, const char *needle) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && (!needle || strstr(e->d_name, needle))) n++;
  closedir(d);
  return n;
}

typedef struct {
  int fds, threads, shm;
} holdings_t;

static holdings_t holdings(void) {
  char mine[32];
  snprintf(mine, sizeof(mine), "-p%d-", (int)getpid()); /* our shm segments' names */
  holdings_t h = {count_dir("/proc/self/fd", NULL) - 1 /* opendir's own */,
                  count_dir("/proc/self/task", NULL), count_dir("/dev/shm", mine)};
  return h;
}

/* The bootstrap root is a detached thread that leaves once every rank has
 * the table: give it a moment before counting. */
static holdings_t settled_holdings(int threads_wanted) {
  holdings_t h = holdings();
  for (int i = 0; i < 200 && h.threads > threads_wanted; i++) {
    sleep_ms(10);
    h = holdings();
  }
  return h;
}

/* --- data ------------------------------------------------------------------- */

static float value(int rank, size_t i) { return (float)((rank + 1) * 1000 + (int)(i % 97)); }

/* Sum over ranks of value(r, i): exact in float32 for these magnitudes. */
static float summed(int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; r++) s += value(r, i);
  return s;
}

static void fill(float *buf, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) buf[i] = value(rank, i);
}

static int check_sum(const float *got, size_t n, int nranks, const char *what, int rank) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != summed(nranks, i)) {
      FAIL("%s rank %d: [%zu] = %g, expected %g", what, rank, i, got[i], summed(nranks, i));
      return 1;
    }
  return 0;
}

/* --- initall: one thread drives every rank -------------------------------- */

static void initall_cycle(int n, float **send, float **recv) {
  ncclComm_t comms[MAX_RANKS];
  CHECK(ncclCommInitAll(comms, n, NULL));
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclFloat32, ncclSum, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    check_sum(recv[r], COUNT, n, "initall AllReduce", r);
    memset(recv[r], 0, COUNT * sizeof(float));
  }
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(comms[r]));
}

static int mode_initall(int n, int cycles) {
  float *send[MAX_RANKS], *recv[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    send[r] = malloc(COUNT * sizeof(float));
    recv[r] = calloc(COUNT, sizeof(float));
    fill(send[r], COUNT, r);
  }
  holdings_t start = holdings(); /* before any communicator: no library thread yet */
  initall_cycle(n, send, recv);  /* warm: one-time state (knobs, log, runtimes) */
  holdings_t before = settled_holdings(start.threads), peak = before;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int c = 0; c < cycles && !failures; c++) {
    initall_cycle(n, send, recv);
    holdings_t h = holdings();
    if (h.fds > peak.fds) peak.fds = h.fds;
    if (h.threads > peak.threads) peak.threads = h.threads;
    if (h.shm > peak.shm) peak.shm = h.shm;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  holdings_t after = settled_holdings(before.threads);
  printf("initall n=%d: %d cycles in %.1f s; fds %d -> %d (peak %d), threads %d -> %d (peak %d), "
         "shm %d -> %d (peak %d)\n", n, cycles,
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, before.fds,
         after.fds, peak.fds, before.threads, after.threads, peak.threads, before.shm, after.shm,
         peak.shm);
  if (after.fds > before.fds) FAIL("file descriptors grew from %d to %d", before.fds, after.fds);
  if (after.threads > before.threads)
    FAIL("threads grew from %d to %d", before.threads, after.threads);
  if (after.shm > before.shm) FAIL("/dev/shm entries grew from %d to %d", before.shm, after.shm);
  for (int r = 0; r < n; r++) {
    free(send[r]);
    free(recv[r]);
  }
  return failures != 0;
}

/* --- a thread per rank --------------------------------------------------- */

typedef struct {
  ncclUniqueId id;
  int rank, nranks;
  int blocking;
  int iterations;
} rank_arg_t;

/* Nonblocking calls return ncclInProgress; poll until the communicator
 * says how it went. */
static void settle(ncclComm_t comm, ncclResult_t res, const char *what, int rank) {
  if (res == ncclInProgress) {
    do {
      if (ncclCommGetAsyncError(comm, &res) != ncclSuccess) break;
      if (res == ncclInProgress) sched_yield();
    } while (res == ncclInProgress);
  }
  if (res != ncclSuccess) {
    FAIL("%s rank %d: %s (%s)", what, rank, ncclGetErrorString(res), ncclGetLastError(comm));
    exit(1);
  }
}

static void *rank_main(void *varg) {
  rank_arg_t *a = varg;
  int me = a->rank, n = a->nranks;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = a->blocking;
  ncclComm_t comm = NULL;
  ncclResult_t res = ncclCommInitRankConfig(&comm, n, a->id, me, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    FAIL("init rank %d: %s (%s)", me, ncclGetErrorString(res), ncclGetLastError(NULL));
    exit(1);
  }
  settle(comm, res, "init", me);
  float *send = malloc(COUNT * n * sizeof(float)), *recv = calloc(COUNT * n, sizeof(float));
  fill(send, COUNT, me);
  for (int it = 0; it < a->iterations && !failures; it++) {
    settle(comm, ncclAllReduce(send, recv, COUNT, ncclFloat32, ncclSum, comm, NULL), "AllReduce", me);
    check_sum(recv, COUNT, n, "AllReduce", me);
    int root = it % n;
    settle(comm, ncclBroadcast(send, recv, COUNT, ncclFloat32, root, comm, NULL), "Broadcast", me);
    for (size_t i = 0; i < COUNT; i++)
      if (recv[i] != value(root, i)) {
        FAIL("Broadcast from %d, rank %d: [%zu] = %g", root, me, i, recv[i]);
        break;
      }
    settle(comm, ncclAllGather(send, recv, COUNT, ncclFloat32, comm, NULL), "AllGather", me);
    for (size_t i = 0; i < (size_t)COUNT * n; i++)
      if (recv[i] != value((int)(i / COUNT), i % COUNT)) {
        FAIL("AllGather rank %d: [%zu] = %g", me, i, recv[i]);
        break;
      }
    /* A ring of send/recv in one group: each rank gets its left neighbour's data. */
    int right = (me + 1) % n, left = (me + n - 1) % n;
    CHECK(ncclGroupStart());
    CHECK(ncclSend(send, COUNT, ncclFloat32, right, comm, NULL));
    CHECK(ncclRecv(recv, COUNT, ncclFloat32, left, comm, NULL));
    settle(comm, ncclGroupEnd(), "send/recv", me);
    for (size_t i = 0; i < COUNT; i++)
      if (recv[i] != value(left, i)) {
        FAIL("Recv from %d, rank %d: [%zu] = %g", left, me, i, recv[i]);
        break;
      }
  }
  if (!a->blocking) settle(comm, ncclCommFinalize(comm), "finalize", me);
  CHECK(ncclCommDestroy(comm));
  free(send);
  free(recv);
  return NULL;
}

static int run_rank_threads(int n, int blocking, int iterations) {
  rank_arg_t a[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < n; r++) {
    a[r] = (rank_arg_t){.id = id, .rank = r, .nranks = n, .blocking = blocking,
                        .iterations = iterations};
    pthread_create(&th[r], NULL, rank_main, &a[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  return failures != 0;
}

/* --- abort from another thread -------------------------------------------- */

typedef struct {
  ncclComm_t comm;
  ncclResult_t res;
} stuck_arg_t;

static void *stuck_main(void *varg) {
  stuck_arg_t *s = varg;
  static float buf[COUNT];
  s->res = ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, s->comm, NULL);
  return NULL;
}

static int mode_abort(void) {
  ncclComm_t comms[2];
  CHECK(ncclCommInitAll(comms, 2, NULL));
  stuck_arg_t s = {comms[0], ncclSuccess};
  pthread_t th;
  pthread_create(&th, NULL, stuck_main, &s);
  sleep_ms(200); /* rank 1 never joins: rank 0 waits in the engine */
  CHECK(ncclCommAbort(comms[0]));
  pthread_join(th, NULL);
  if (s.res == ncclSuccess) FAIL("an AllReduce that rank 1 never joined succeeded");
  CHECK(ncclCommAbort(comms[1]));
  printf("abort: the stuck AllReduce returned %s\n", ncclGetErrorString(s.res));
  return failures != 0;
}

/* A nonblocking AllReduce that rank 1 never joins fails on rank 0's proxy
 * thread (HETCCL_TIMEOUT=1) while this thread polls the communicator's
 * error and last message. */
static int mode_failing(void) {
  setenv("HETCCL_TIMEOUT", "1", 1); /* before any thread, and before the knobs are read */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  ncclComm_t comms[2];
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < 2; r++) {
    ncclResult_t res = ncclCommInitRankConfig(&comms[r], 2, id, r, &config);
    if (res != ncclSuccess && res != ncclInProgress) CHECK(res);
  }
  ncclResult_t res = ncclGroupEnd();
  for (int r = 0; r < 2; r++) settle(comms[r], res, "grouped nonblocking init", r);
  static float buf[COUNT];
  res = ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, comms[0], NULL);
  size_t seen = 0; /* message bytes read while the proxy may write them */
  while (res == ncclInProgress) {
    seen += strlen(ncclGetLastError(comms[0]));
    if (ncclCommGetAsyncError(comms[0], &res) != ncclSuccess) break;
    sched_yield();
  }
  int message_with_error = ncclGetLastError(comms[0])[0] != '\0';
  ncclCommFinalize(comms[0]); /* the failed job has returned after this */
  const char *msg = ncclGetLastError(comms[0]);
  if (res == ncclSuccess) FAIL("an AllReduce that rank 1 never joined succeeded");
  else if (!msg[0]) FAIL("the failed AllReduce left no message on the communicator");
  else if (!message_with_error) FAIL("the error showed before its message did");
  printf("failing: the AllReduce ended with %s (%zu message bytes read meanwhile; message "
         "there %s): %s\n", ncclGetErrorString(res), seen,
         message_with_error ? "with the error" : "only after its job returned", msg);
  for (int r = 0; r < 2; r++) CHECK(ncclCommAbort(comms[r]));
  return failures != 0;
}

/* --- logging under load ------------------------------------------------------ */

static int stop_flag;

static void *reset_main(void *unused) {
  (void)unused;
  while (!__atomic_load_n(&stop_flag, __ATOMIC_ACQUIRE)) {
    ncclResetDebugInit();
    sleep_ms(1);
  }
  return NULL;
}

/* Argument errors on this thread must leave this thread's message. */
static void *misuse_main(void *varg) {
  const char *fn = varg ? "ncclBroadcast" : "ncclAllReduce";
  for (int i = 0; i < 200; i++) {
    float x = 0;
    ncclResult_t res = varg ? ncclBroadcast(&x, &x, 1, ncclFloat32, 0, NULL, NULL)
                            : ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL);
    if (res != ncclInvalidArgument) FAIL("%s with a NULL comm gave %s", fn, ncclGetErrorString(res));
    if (!strstr(ncclGetLastError(NULL), fn))
      FAIL("last error after a failed %s is \"%s\"", fn, ncclGetLastError(NULL));
    int v;
    CHECK(ncclGetVersion(&v));
  }
  return NULL;
}

static int mode_logging(int n) {
  char path[64];
  snprintf(path, sizeof(path), "/tmp/hetccl-test-threads-%d.log", (int)getpid());
  /* Before any thread: setenv is not safe against a concurrent getenv. */
  setenv("HETCCL_DEBUG", "TRACE", 1);
  setenv("HETCCL_DEBUG_SUBSYS", "ALL", 1);
  setenv("HETCCL_DEBUG_FILE", path, 1);
  pthread_t resetter, misuse[2];
  pthread_create(&resetter, NULL, reset_main, NULL);
  for (long k = 0; k < 2; k++) pthread_create(&misuse[k], NULL, misuse_main, (void *)k);
  run_rank_threads(n, 1, 3);
  for (int k = 0; k < 2; k++) pthread_join(misuse[k], NULL);
  __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
  pthread_join(resetter, NULL);
  FILE *f = fopen(path, "r");
  long lines = 0;
  for (int c; f && (c = fgetc(f)) != EOF;) lines += c == '\n';
  if (f) fclose(f);
  unlink(path);
  if (lines == 0) FAIL("TRACE logging to %s wrote nothing", path);
  printf("logging: %d ranks, %ld log lines\n", n, lines);
  return failures != 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  int n = argc > 2 ? atoi(argv[2]) : 2;
  if (n < 1 || n > MAX_RANKS) n = 2;
  alarm(300);
  if (!strcmp(mode, "initall")) return mode_initall(n, argc > 3 ? atoi(argv[3]) : 20);
  if (!strcmp(mode, "ranks")) return run_rank_threads(n, 1, 10);
  if (!strcmp(mode, "nonblocking")) return run_rank_threads(n, 0, 10);
  if (!strcmp(mode, "abort")) return mode_abort();
  if (!strcmp(mode, "failing")) return mode_failing();
  if (!strcmp(mode, "logging")) return mode_logging(n);
  fprintf(stderr,
          "usage: %s initall N CYCLES | ranks N | nonblocking N | abort | failing | logging N\n",
          argv[0]);
  return 2;
}
