/* The order in which a group's device shares reach their streams
 * (exec/group_streams.h), with stand-ins for the launches, which record
 * which share reached which stream from which thread:
 *
 *   order     every order of four shares on two streams, as two ranks'
 *             calls could give them: each stream gets its shares by
 *             comm_id, a plane share before a staged one of the same
 *             communicator, all from the calling thread (small shares)
 *   threads   one large share: each stream's shares come from one thread
 *             of its own, in the same order; a single stream with a large
 *             share gets a thread only when the group holds host shares
 *   devices   one thread driving two GPUs' ranks, each given the null
 *             stream: two streams (one per device), a thread each
 *   errors    a failed launch is the group's error, from this thread or
 *             from a job's (its message this thread's last error), and the
 *             other shares are still launched
 *
 * Exit status 0 on success. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "exec/dataplane.h"
#include "exec/devpath.h"
#include "exec/group_streams.h"
#include "plane/plane.h"
#include "runtime/runtime.h"
#include "util/knobs.h"
#include "util/log.h"

#include "../common/check.h"

/* --- stand-ins for what group_streams.c calls ----------------------------- */

typedef struct launched {
  uint64_t comm_id;
  hetccl_share_kind_t kind;
  void *stream;
  pthread_t thread;
} launched_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static launched_t seen[64];
static int nseen;
static uint64_t fail_comm; /* a launch of this communicator fails */

static ncclResult_t record(ncclComm_t comm, hetccl_task_t *tasks, hetccl_share_kind_t kind) {
  usleep(2000); /* long enough for jobs on threads to overlap */
  pthread_mutex_lock(&lock);
  if (nseen < 64) seen[nseen++] = (launched_t){comm->comm_id, kind, tasks->stream, pthread_self()};
  pthread_mutex_unlock(&lock);
  hetccl_tasks_free(tasks);
  if (comm->comm_id == fail_comm) {
    hetccl_last_error_set("stand-in launch failed");
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_dataplane_launch(ncclComm_t comm, hetccl_task_t *tasks) {
  return record(comm, tasks, HETCCL_SHARE_PLANE);
}
ncclResult_t hetccl_devpath_launch(ncclComm_t comm, hetccl_task_t *tasks) {
  return record(comm, tasks, HETCCL_SHARE_STAGED);
}
void hetccl_plane_fail(hetccl_plane_t *plane, ncclResult_t res) {
  (void)plane;
  (void)res;
}
void hetccl_comm_set_error(ncclComm_t comm, ncclResult_t res) { comm->state.error = res; }
const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind) {
  (void)kind;
  return NULL;
}

/* --- shares ------------------------------------------------------------------ */

static struct ncclComm comms[3];
static char streams[2]; /* their addresses are the streams */

typedef struct spec {
  int comm; /* index into comms */
  hetccl_share_kind_t kind;
  int stream;
  int large;
} spec_t;

static hetccl_device_share_t make(const spec_t *s) {
  size_t piece = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_PIECE);
  hetccl_task_t *t = calloc(1, sizeof(*t));
  t->comm = &comms[s->comm];
  t->stream = &streams[s->stream];
  t->in_bytes = t->out_bytes = s->large ? 17 * piece : piece;
  return (hetccl_device_share_t){&comms[s->comm], t, s->kind};
}

static void reset(void) {
  nseen = 0;
  fail_comm = 0;
  for (int i = 0; i < 3; i++) comms[i].state.error = ncclSuccess;
}

/* What stream s received, in order, as "id/kind" words. */
static void stream_order(int s, char *out, size_t len) {
  out[0] = 0;
  for (int i = 0; i < nseen; i++) {
    if (seen[i].stream != &streams[s]) continue;
    size_t used = strlen(out);
    snprintf(out + used, len - used, "%s%llu/%s", used ? " " : "",
             (unsigned long long)seen[i].comm_id, seen[i].kind == HETCCL_SHARE_PLANE ? "plane" : "staged");
  }
}

/* The thread that launched every share of stream s, or 0 if two did. */
static int stream_thread(int s, pthread_t *who) {
  int any = 0;
  for (int i = 0; i < nseen; i++) {
    if (seen[i].stream != &streams[s]) continue;
    if (any && !pthread_equal(*who, seen[i].thread)) return 0;
    *who = seen[i].thread;
    any = 1;
  }
  return any;
}

/* Shares: comms 0, 1, 2 have ids 9, 3, 5. Stream 0 holds comm 0's plane
 * share and comm 1's plane and staged shares; stream 1 comm 2's. */
static const spec_t SPECS[4] = {{0, HETCCL_SHARE_PLANE, 0, 0},
                                {1, HETCCL_SHARE_PLANE, 0, 0},
                                {1, HETCCL_SHARE_STAGED, 0, 0},
                                {2, HETCCL_SHARE_PLANE, 1, 0}};
static const char *STREAM0 = "3/plane 3/staged 9/plane";
static const char *STREAM1 = "5/plane";

static ncclResult_t run(const spec_t *specs, const int *perm, int n, int others) {
  hetccl_device_share_t shares[4];
  for (int i = 0; i < n; i++) shares[i] = make(&specs[perm[i]]);
  hetccl_group_streams_t *g = NULL;
  ncclResult_t res = hetccl_group_streams_start(shares, n, others, &g);
  ncclResult_t fin = hetccl_group_streams_finish(g);
  return res != ncclSuccess ? res : fin;
}

static void test_order(void) {
  int perm[4] = {0, 1, 2, 3}, tried = 0;
  /* Every permutation of the four shares (Heap's algorithm, iterative). */
  int c[4] = {0, 0, 0, 0}, i = 0;
  for (;;) {
    reset();
    ncclResult_t res = run(SPECS, perm, 4, 0);
    char got[256];
    CHECK(res == ncclSuccess, "order: status %d", res);
    CHECK(nseen == 4, "order: %d launches, not 4", nseen);
    stream_order(0, got, sizeof(got));
    CHECK(!strcmp(got, STREAM0), "order %d%d%d%d: stream 0 got \"%s\", not \"%s\"", perm[0],
          perm[1], perm[2], perm[3], got, STREAM0);
    stream_order(1, got, sizeof(got));
    CHECK(!strcmp(got, STREAM1), "order: stream 1 got \"%s\"", got);
    for (int k = 0; k < nseen; k++)
      CHECK(pthread_equal(seen[k].thread, pthread_self()), "order: small shares launched off "
            "the calling thread");
    tried++;
    while (i < 4 && c[i] >= i) c[i++] = 0;
    if (i == 4) break;
    int j = i % 2 ? c[i] : 0, t = perm[j];
    perm[j] = perm[i], perm[i] = t;
    c[i]++;
    i = 0;
  }
  CHECK(tried == 24, "order: %d permutations tried", tried);
}

static void test_threads(void) {
  spec_t specs[4];
  memcpy(specs, SPECS, sizeof(specs));
  specs[0].large = 1; /* comm 0 (id 9) on stream 0 */
  int perms[2][4] = {{0, 1, 2, 3}, {3, 2, 0, 1}};
  for (int p = 0; p < 2; p++) {
    reset();
    CHECK(run(specs, perms[p], 4, 0) == ncclSuccess, "threads: status");
    char got[256];
    stream_order(0, got, sizeof(got));
    CHECK(!strcmp(got, STREAM0), "threads: stream 0 got \"%s\", not \"%s\"", got, STREAM0);
    pthread_t t0 = pthread_self(), t1 = pthread_self();
    CHECK(stream_thread(0, &t0) && stream_thread(1, &t1), "threads: a stream's shares came "
          "from two threads");
    CHECK(!pthread_equal(t0, pthread_self()) && !pthread_equal(t1, pthread_self()) &&
              !pthread_equal(t0, t1), "threads: two streams with a large share, not a thread each");
  }
  /* One stream: a thread only if this thread has host shares to run too. */
  int one[3] = {0, 1, 2};
  for (int others = 0; others < 2; others++) {
    reset();
    CHECK(run(specs, one, 3, others) == ncclSuccess, "threads: status (one stream)");
    pthread_t t0 = pthread_self();
    CHECK(stream_thread(0, &t0), "threads: one stream's shares came from two threads");
    CHECK(pthread_equal(t0, pthread_self()) == !others, "threads: one stream, others=%d: %s",
          others, others ? "launched here" : "launched on a thread");
  }
}

static void test_devices(void) {
  /* Two ranks of one communicator (one id), on devices 0 and 1, both on
   * the null stream, both large: as ncclCommInitAll's ranks driven by one
   * thread. */
  struct ncclComm ranks[2];
  memset(ranks, 0, sizeof(ranks));
  size_t piece = (size_t)hetccl_knob_int(HETCCL_KNOB_PLANE_PIECE);
  hetccl_device_share_t shares[2];
  for (int r = 0; r < 2; r++) {
    ranks[r].comm_id = 7, ranks[r].rank = r, ranks[r].nranks = 2, ranks[r].dev = r;
    hetccl_task_t *t = calloc(1, sizeof(*t));
    t->comm = &ranks[r];
    t->stream = NULL;
    t->in_bytes = t->out_bytes = 17 * piece;
    shares[r] = (hetccl_device_share_t){&ranks[r], t, HETCCL_SHARE_PLANE};
  }
  reset();
  hetccl_group_streams_t *g = NULL;
  CHECK(hetccl_group_streams_start(shares, 2, 0, &g) == ncclSuccess, "devices: status");
  CHECK(hetccl_group_streams_finish(g) == ncclSuccess, "devices: status at finish");
  CHECK(nseen == 2, "devices: %d launches, not 2", nseen);
  if (nseen == 2)
    CHECK(!pthread_equal(seen[0].thread, seen[1].thread) &&
              !pthread_equal(seen[0].thread, pthread_self()) &&
              !pthread_equal(seen[1].thread, pthread_self()),
          "devices: two devices' null streams launched as one stream");
}

static void test_errors(void) {
  spec_t specs[4];
  memcpy(specs, SPECS, sizeof(specs));
  int perm[4] = {0, 1, 2, 3};
  for (int large = 0; large < 2; large++) {
    specs[0].large = large;
    reset();
    fail_comm = 3; /* comm 1: first on stream 0 */
    hetccl_last_error_set("");
    ncclResult_t res = run(specs, perm, 4, 0);
    CHECK(res == ncclSystemError, "errors (large=%d): status %d", large, res);
    CHECK(nseen == 4, "errors (large=%d): %d launches, not 4", large, nseen);
    CHECK(!strcmp(hetccl_last_error(), "stand-in launch failed"),
          "errors (large=%d): last error \"%s\"", large, hetccl_last_error());
  }
}

int main(void) {
  comms[0].comm_id = 9, comms[1].comm_id = 3, comms[2].comm_id = 5;
  for (int i = 0; i < 3; i++) comms[i].dev = -1, comms[i].rank = 0, comms[i].nranks = 2;
  test_order();
  test_threads();
  test_devices();
  test_errors();
  if (failures) {
    fprintf(stderr, "test_group_streams: %d failures\n", failures);
    return 1;
  }
  printf("test_group_streams: order, threads, devices and errors right\n");
  return 0;
}
