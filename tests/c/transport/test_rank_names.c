/* Rank names in messages. A communicator whose ranks the user numbers
 * otherwise (an island or leaders communicator of a hierarchical one) hands
 * the transports and the engine user_ranks; every message they write must
 * name a rank as the user numbers it, never by the communicator's own 0..k-1.
 *
 * 3 forked processes, user_ranks = {10, 20, 30}, connected below the
 * bootstrap (address blobs and barriers through an anonymous shared mapping
 * made before fork, as in test_shm.c) on one transport, each phase on a
 * fresh context and engine:
 *   size       rank 1 sends 100 bytes where rank 2 expects 64: rank 2 says
 *              "message 0 from rank 20 carries 100 bytes"; rank 1 hears
 *              "rank 30 gave up", rank 0 "rank 20 gave up because rank 30 did"
 *   signature  rank 2 sends operation #11 where rank 1 expects #12: "ranks 20
 *              and 30 called different operations: rank 30 sent ..., rank 20
 *              expected ..."; ranks 0 and 2 hear "rank 20 gave up"
 *   kill       rank 2 is SIGKILLed in the middle of a 64 MiB send to rank 0:
 *              rank 0's error names rank 30, rank 1's "rank 10 gave up"
 * Each check reads the thread's last error (what ncclGetLastError returns).
 * Every rank also logs at INFO, all subsystems, to a file of its own; at the
 * end the parent reads every line and fails on any rank number that is not
 * 10, 20 or 30 ("rank N", "ranks N and M", "rank N -> M").
 *
 * usage: test_rank_names shm|socket   (HETCCL_SHM_CMA from the environment).
 * Exit status 0 on success; every rank is bounded by alarm(). */
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "p2p/engine.h"
#include "transport/transport.h"
#include "util/log.h"

#define NRANKS 3
static const int32_t USER[NRANKS] = {10, 20, 30};

static int rank = -1;
static hetccl_transport_id_t tid;
static const hetccl_transport_t *T;
static const char *tname;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "FAIL rank %d (user %d): ", rank, rank >= 0 ? USER[rank] : -1); \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    _exit(1);                                                                  \
  } while (0)

#define CHK(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) FAIL("%s -> %d: %s", #call, (int)r_, hetccl_last_error()); \
  } while (0)

/* --- a bootstrap for the test: shared memory made before fork ---------------- */

typedef struct shared {
  _Atomic int count, gen, go;
  int pids[NRANKS];
  uint8_t addrs[3][NRANKS][HETCCL_TRANSPORT_ADDR_BYTES];
} shared_t;
static shared_t *S;
static int alive = NRANKS; /* ranks that still take part in barriers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void barrier(void) {
  int gen = atomic_load(&S->gen);
  if (atomic_fetch_add(&S->count, 1) == alive - 1) {
    atomic_store(&S->count, 0);
    atomic_fetch_add(&S->gen, 1);
    return;
  }
  double t0 = now_s();
  while (atomic_load(&S->gen) == gen) {
    usleep(100);
    if (now_s() - t0 > 60) FAIL("barrier timed out");
  }
}

/* --- one communicator: a context, its endpoints, an engine over them ---------- */

typedef struct comm {
  hetccl_engine_t *engine;
  hetccl_ep_t *eps[NRANKS]; /* the engine's; kept to drive one by hand */
  volatile int abort_flag, error;
  hetccl_fail_note_t note;
  hetccl_tag_mismatch_t mismatch;
  uint64_t tag; /* the signature of the messages it posts (0: unchecked) */
} comm_t;

static void describe_tag(uint64_t tag, char *buf, size_t len) {
  snprintf(buf, len, "operation #%llu", (unsigned long long)tag);
}

static void comm_open(comm_t *c, int which) {
  memset(c, 0, sizeof(*c));
  hetccl_transport_args_t args = {
      .rank = rank, .nranks = NRANKS, .user_ranks = USER,
      .comm_id = 0x7a4e000000000000ull + (uint64_t)which, .secret = 7, .timeout_ms = 20000,
      .abort_flag = &c->abort_flag, .ifname = "", .peer_note = &c->note,
      .mismatch = &c->mismatch};
  hetccl_tctx_t *ctxs[HETCCL_TRANSPORT_COUNT] = {0};
  CHK(T->ctx_create(&args, &ctxs[tid], S->addrs[which][rank]));
  barrier();
  uint8_t use[NRANKS];
  hetccl_peer_locality_t loc[NRANKS];
  const hetccl_transport_t *tps[NRANKS];
  for (int p = 0; p < NRANKS; p++) {
    use[p] = p != rank;
    tps[p] = p != rank ? T : NULL;
    loc[p] = (hetccl_peer_locality_t){.host_hash = 1, .pid = S->pids[p]};
  }
  CHK(T->connect(ctxs[tid], use, &S->addrs[which][0][0], loc, c->eps));
  hetccl_engine_args_t ea = {
      .rank = rank, .nranks = NRANKS, .user_ranks = USER, .eps = c->eps, .transports = tps,
      .ctxs = ctxs, .timeout_ms = 10000, .spin = 100, .idle_yield_us = 1000,
      .abort_flag = &c->abort_flag, .comm_error = &c->error, .peer_note = &c->note,
      .mismatch = &c->mismatch, .describe_tag = describe_tag};
  CHK(hetccl_engine_create(&ea, &c->engine));
}

static void comm_close(comm_t *c) {
  hetccl_engine_destroy(c->engine);
  c->engine = NULL;
}

/* Receive `bytes` from peer and expect the engine to fail with `want`;
 * returns the last error. */
static const char *recv_fails(comm_t *c, int peer, size_t bytes, ncclResult_t want) {
  static char buf[128];
  hetccl_req_t r, *rp = &r;
  ncclResult_t res = hetccl_engine_irecv(c->engine, peer, buf, bytes, c->tag, NULL, NULL, &r);
  if (res == ncclSuccess) res = hetccl_engine_wait(c->engine, &rp, 1);
  if (res != want) FAIL("receive from rank %d gave %d, expected %d (%s)", peer, res, want,
                        hetccl_last_error());
  return hetccl_last_error();
}

static void send_ok(comm_t *c, int peer, size_t bytes) {
  static char buf[128];
  hetccl_req_t r, *rp = &r;
  CHK(hetccl_engine_isend(c->engine, peer, buf, bytes, (hetccl_msg_t){c->tag, 0}, &r));
  CHK(hetccl_engine_wait(c->engine, &rp, 1));
}

static void expect_has(const char *msg, const char *want) {
  if (!strstr(msg, want)) FAIL("the error does not say \"%s\": %s", want, msg);
}

/* --- phases ----------------------------------------------------------------- */

static void phase_size(void) {
  static comm_t c;
  comm_open(&c, 0);
  c.tag = 5; /* the signature of this phase's messages */
  char want[256];
  snprintf(want, sizeof(want),
           "%s: message 0 from rank 20 carries 100 bytes, the posted receive expects 64", tname);
  if (rank == 2) {
    const char *e = recv_fails(&c, 1, 64, ncclInvalidUsage);
    if (strcmp(e, want) != 0) FAIL("size mismatch said \"%s\", expected \"%s\"", e, want);
  } else if (rank == 1) {
    send_ok(&c, 2, 100);
    const char *e = recv_fails(&c, 2, 8, ncclInvalidUsage);
    expect_has(e, "rank 30 gave up: ");
    expect_has(e, want);
  } else {
    const char *e = recv_fails(&c, 1, 8, ncclInvalidUsage);
    expect_has(e, "rank 20 gave up because rank 30 did: ");
    expect_has(e, want);
    printf("%s size: %s\n", tname, e);
  }
  barrier();
  comm_close(&c);
}

static void phase_signature(void) {
  static comm_t c;
  comm_open(&c, 1);
  const char *want = "ranks 20 and 30 called different operations: rank 30 sent operation #11, "
                     "rank 20 expected operation #12";
  if (rank == 1) {
    c.tag = 12; /* the signature of this phase's messages */
    const char *e = recv_fails(&c, 2, 16, ncclInvalidUsage);
    if (strcmp(e, want) != 0) FAIL("signature mismatch said \"%s\", expected \"%s\"", e, want);
    printf("%s signature: %s\n", tname, e);
  } else {
    c.tag = 11; /* the signature of this phase's messages */
    if (rank == 2) send_ok(&c, 1, 16);
    const char *e = recv_fails(&c, 1, 8, ncclInvalidUsage);
    expect_has(e, "rank 20 gave up: ");
    expect_has(e, want);
  }
  barrier();
  comm_close(&c);
}

/* Rank 2 dies (SIGKILL: no note, no close) in the middle of a 64 MiB send. */
static void phase_kill(void) {
  static comm_t c;
  comm_open(&c, 2);
  c.tag = 21; /* the signature of this phase's messages */
  const size_t bytes = 64u << 20;
  char *big = calloc(1, bytes);
  if (!big) FAIL("out of memory");
  hetccl_req_t r, *rp = &r;
  if (rank == 0) CHK(hetccl_engine_irecv(c.engine, 2, big, bytes, c.tag, NULL, NULL, &r));
  if (rank == 1) CHK(hetccl_engine_irecv(c.engine, 0, big, 8, c.tag, NULL, NULL, &r));
  barrier();
  alive = NRANKS - 1;
  if (rank == 2) {
    CHK(hetccl_engine_isend(c.engine, 0, big, bytes, (hetccl_msg_t){c.tag, 0}, &r));
    /* Push an eighth by hand; a rendezvous (shm CMA) moves nothing here,
     * the receiver pulls: give it a moment. */
    for (double t0 = now_s(); r.progress < bytes / 8 && now_s() - t0 < 0.05;) {
      int idle;
      CHK(T->progress(c.eps[0], &idle));
    }
    raise(SIGKILL);
  }
  ncclResult_t res = hetccl_engine_wait(c.engine, &rp, 1);
  const char *e = hetccl_last_error();
  if (res == ncclSuccess) FAIL("the receive survived a peer killed mid-message");
  if (rank == 0) {
    if (r.progress >= bytes) FAIL("all %zu bytes arrived from a killed peer", bytes);
    expect_has(e, "rank 30 ");
    printf("%s kill: rank 10 after %zu of %zu bytes: %s\n", tname, r.progress, bytes, e);
  } else {
    expect_has(e, "rank 10 gave up: ");
    expect_has(e, "rank 30 ");
    printf("%s kill: rank 20: %s\n", tname, e);
  }
  fflush(stdout);
  barrier();
  comm_close(&c);
  free(big);
}

/* --- the logs ----------------------------------------------------------------- */

static int is_user(long n) { return n == 10 || n == 20 || n == 30; }

/* Every rank number in one line, after "rank "/"ranks " and the " and " or
 * " -> " that may follow it, must be a user number. Returns how many it
 * checked, -1 on a bad one. */
static int line_check(const char *line) {
  int checked = 0;
  for (const char *p = line; (p = strstr(p, "rank")) != NULL; p += 4) {
    if (p > line && ((p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z'))) continue;
    const char *q = p + 4;
    if (*q == 's') q++;
    if (*q++ != ' ' || *q < '0' || *q > '9') continue;
    for (;;) {
      char *end;
      long n = strtol(q, &end, 10);
      if (!is_user(n)) return -1;
      checked++;
      if (!strncmp(end, " and ", 5) && end[5] >= '0' && end[5] <= '9') q = end + 5;
      else if (!strncmp(end, " -> ", 4) && end[4] >= '0' && end[4] <= '9') q = end + 4;
      else break;
    }
  }
  return checked;
}

static int logs_check(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 1;
  struct dirent *ent;
  int bad = 0, lines = 0, names = 0;
  while ((ent = readdir(d)) != NULL) {
    if (strncmp(ent->d_name, "log.", 4) != 0) continue;
    char path[512], line[2048];
    snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    while (fgets(line, sizeof(line), f)) {
      lines++;
      int k = line_check(line);
      if (k < 0) {
        fprintf(stderr, "FAIL: a message names a rank by the communicator's number: %s", line);
        bad = 1;
      } else {
        names += k;
      }
    }
    fclose(f);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
  if (!bad) printf("%s logs: %d lines, %d rank names, all the user's\n", tname, lines, names);
  if (names < 10) {
    fprintf(stderr, "FAIL: only %d rank names in %d log lines (was logging on?)\n", names, lines);
    bad = 1;
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "shm") && strcmp(argv[1], "socket"))) {
    fprintf(stderr, "usage: %s shm|socket\n", argv[0]);
    return 2;
  }
  tname = argv[1];
  tid = !strcmp(tname, "shm") ? HETCCL_TRANSPORT_shm : HETCCL_TRANSPORT_socket;
  T = hetccl_transport_get(tid);
  char dir[] = "/tmp/hetccl-rank-names-XXXXXX", pattern[64];
  if (!T || !mkdtemp(dir)) return 1;
  snprintf(pattern, sizeof(pattern), "%s/log.%%p", dir);
  /* Read by each rank's first log call, after fork. */
  setenv("HETCCL_DEBUG", "INFO", 1);
  setenv("HETCCL_DEBUG_SUBSYS", "ALL", 1);
  setenv("HETCCL_DEBUG_FILE", pattern, 1);
  S = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED) return 1;
  memset(S, 0, sizeof(*S));
  fflush(stdout);
  pid_t kids[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    kids[r] = fork();
    if (kids[r] == 0) {
      rank = r;
      alarm(120);
      while (!atomic_load(&S->go)) usleep(100);
      phase_size();
      phase_signature();
      phase_kill();
      exit(0);
    }
    S->pids[r] = kids[r];
  }
  atomic_store(&S->go, 1);
  int bad = 0;
  for (int r = 0; r < NRANKS; r++) {
    int st;
    int ok = waitpid(kids[r], &st, 0) == kids[r] &&
             (r == 2 ? WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL
                     : WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!ok) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
      bad = 1;
    }
  }
  bad |= logs_check(dir);
  printf("rank names over %s, 3 processes: %s\n", tname, bad ? "FAIL" : "ok");
  return bad;
}
