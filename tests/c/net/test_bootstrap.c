/* Bootstrap test: ranks as processes (fork) and as threads of one process,
 * 1, 2, 3 and 5 ranks; init, allgather, broadcast from a non-zero root,
 * barrier, destroy. "hostile": foreign connections hit the root before and
 * while the real ranks join, and the communicator still forms. "commid":
 * NCCL_COMM_ID set, every rank makes its own unique id, rank 0 serves.
 * "errors": bad ids, a lonely rank times out, an abort flag, a dead peer,
 * ranks calling different collectives. "refusals": a rank the root drops or
 * gives up on is told why (missing ranks named, forged secret, nranks that
 * disagree, a rank taken twice; with and without NCCL_COMM_ID). "flood":
 * more pending connections than the root keeps (NET_MAX_PENDING), silent
 * or stalled, and the communicator still forms.
 *
 * usage: test_bootstrap procs|threads|hostile|commid|errors|refusals|flood
 * Exit status 0 on success; every rank is bounded by alarm(). */
#include <arpa/inet.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/net.h"

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "FAIL rank %d: ", rank);                                   \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    goto out;                                                                  \
  } while (0)

#define CHK(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) FAIL("%s -> %d", #call, (int)r_);                   \
  } while (0)

typedef struct info {
  int32_t rank, pid;
  uint64_t pattern;
  char pad[40];
} info_t;

static uint8_t pat(int rank, size_t i, int salt) { return (uint8_t)(rank * 31 + i * 7 + salt); }

/* One rank's whole life; 0 on success. */
static int run_rank(const ncclUniqueId *id, int rank, int nranks) {
  int ok = 0;
  hetccl_bootstrap_t *bs = NULL;
  info_t me = {.rank = rank, .pid = getpid(), .pattern = 0x1234567800000000ull + rank};
  info_t *all = calloc(nranks, sizeof(info_t));
  size_t big = 100003; /* odd size, several socket buffers' worth in all */
  uint8_t *g = malloc(big * nranks), *b = malloc(big);
  hetccl_bootstrap_opts_t opts = {.timeout_ms = 20000, .abort_flag = NULL};
  CHK(hetccl_bootstrap_init(id, 1, rank, nranks, &me, sizeof(me), all, &opts, &bs));
  for (int r = 0; r < nranks; r++)
    if (all[r].rank != r || all[r].pattern != 0x1234567800000000ull + r)
      FAIL("init table entry %d wrong (rank %d)", r, all[r].rank);
  for (int round = 0; round < 3; round++) {
    /* allgather: out of place, then in place */
    uint8_t *mine = malloc(big);
    for (size_t i = 0; i < big; i++) mine[i] = pat(rank, i, round);
    memset(g, 0xee, big * nranks);
    CHK(hetccl_bootstrap_allgather(bs, mine, g, big));
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < big; i++)
        if (g[r * big + i] != pat(r, i, round)) {
          free(mine);
          FAIL("allgather round %d: byte %zu of rank %d", round, i, r);
        }
    memcpy(g + rank * big, mine, big);
    free(mine);
    CHK(hetccl_bootstrap_allgather(bs, g + rank * big, g, 13));
    /* broadcast from the last rank (non-zero when nranks > 1), then rank 0 */
    for (int k = 0; k < 2; k++) {
      int root = k == 0 ? nranks - 1 : 0;
      for (size_t i = 0; i < big; i++) b[i] = rank == root ? pat(root, i, 100 + round) : 0;
      CHK(hetccl_bootstrap_bcast(bs, b, big, root));
      for (size_t i = 0; i < big; i++)
        if (b[i] != pat(root, i, 100 + round)) FAIL("bcast from %d: byte %zu", root, i);
    }
    CHK(hetccl_bootstrap_barrier(bs));
  }
  ok = 1;
out:
  hetccl_bootstrap_destroy(bs);
  free(all);
  free(g);
  free(b);
  return ok ? 0 : 1;
}

static int wait_children(pid_t *pids, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st;
    if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d (pid %d) failed (status 0x%x)\n", i, pids[i], st);
      bad = 1;
    }
  }
  return bad;
}

/* A rank process is forked and then exec'd afresh (as "test_bootstrap
 * child ROLE ID RANK NRANKS"): by now this process runs the bootstrap root
 * thread, and a child forked from a threaded parent can inherit a lock
 * (malloc's, a sanitizer's) held by a thread it does not have, and hang on
 * it. Only async-signal-safe calls between fork and exec. */
static pid_t spawn(const char *role, const ncclUniqueId *id, int rank, int nranks) {
  char hex[2 * sizeof(id->internal) + 1], r[16], n[16];
  for (size_t i = 0; i < sizeof(id->internal); i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->internal[i]);
  snprintf(r, sizeof(r), "%d", rank);
  snprintf(n, sizeof(n), "%d", nranks);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "test_bootstrap", "child", role, hex, r, n, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int procs(int nranks, const ncclUniqueId *given) {
  ncclUniqueId id;
  if (given) id = *given;
  else if (hetccl_bootstrap_root_create(&id) != ncclSuccess) return 1;
  pid_t pids[16];
  for (int r = 0; r < nranks; r++) pids[r] = spawn("rank", &id, r, nranks);
  return wait_children(pids, nranks);
}

typedef struct targ {
  ncclUniqueId id;
  int rank, nranks, rc;
} targ_t;

static void *thread_main(void *p) {
  targ_t *a = p;
  a->rc = run_rank(&a->id, a->rank, a->nranks);
  return NULL;
}

static int threads(int nranks) {
  ncclUniqueId id;
  if (hetccl_bootstrap_root_create(&id) != ncclSuccess) return 1;
  pthread_t th[16];
  targ_t a[16];
  for (int r = 0; r < nranks; r++) {
    a[r] = (targ_t){.id = id, .rank = r, .nranks = nranks, .rc = 1};
    pthread_create(&th[r], NULL, thread_main, &a[r]);
  }
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    bad |= a[r].rc;
  }
  return bad;
}

/* White-box: the root address sits at offset 24 of the id, and a hello
 * is {magic u64, secret u64, rank i32, nranks i32, info_bytes u64, wire
 * address 32 bytes, timeout u32, left u32, first i32, last i32, successor
 * i32, pad} (comm/bootstrap_wire.h). */
#define HELLO_MAGIC 0x48455442534845ull
typedef struct fake_hello {
  uint64_t magic, secret;
  int32_t rank, nranks;
  uint64_t info_bytes;
  uint8_t addr[32];
  uint32_t timeout_ms, left_ms;
  int32_t first, last, successor, pad;
} fake_hello_t;

static int hostile_conn(const hetccl_sockaddr_t *root, const void *buf, size_t n, int keep) {
  int fd = -1;
  if (hetccl_net_connect(root, hetccl_net_deadline(5000), NULL, "hostile", &fd) != ncclSuccess)
    return -1;
  if (n) hetccl_net_send_all(fd, buf, n, hetccl_net_deadline(5000), NULL, "hostile");
  if (!keep) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A new root, and its address from the id (white-box: id_layout_t). */
static int new_root(ncclUniqueId *id, hetccl_sockaddr_t *root) {
  hetccl_net_wire_addr_t w;
  if (hetccl_bootstrap_root_create(id) != ncclSuccess) return 1;
  memcpy(&w, id->internal + 24, sizeof(w));
  return hetccl_net_addr_from_wire(&w, root) != ncclSuccess;
}

static int hostile(int nranks) {
  ncclUniqueId id;
  hetccl_sockaddr_t root;
  if (new_root(&id, &root)) return 1;
  uint64_t secret = hetccl_bootstrap_id_secret(&id);
  int keep[8], nk = 0;
  char garbage[300];
  for (size_t i = 0; i < sizeof(garbage); i++) garbage[i] = (char)(i * 37 + 11);
  fake_hello_t h = {.magic = HELLO_MAGIC, .secret = secret, .rank = 1, .nranks = nranks,
                    .info_bytes = sizeof(info_t), .first = 0, .last = nranks - 1};
  fake_hello_t wrong_secret = h, oversized = h, wrong_magic = h;
  wrong_secret.secret ^= 1;
  oversized.info_bytes = 1u << 30;
  wrong_magic.magic ^= 0xff;
  hostile_conn(&root, garbage, sizeof(garbage), 0);                 /* garbage, closed */
  keep[nk++] = hostile_conn(&root, garbage, 17, 1);                 /* partial header, stalls */
  hostile_conn(&root, &wrong_secret, sizeof(h), 0);                 /* wrong secret */
  hostile_conn(&root, &wrong_magic, sizeof(h), 0);                  /* wrong magic */
  hostile_conn(&root, &oversized, sizeof(h), 0);                    /* oversized info */
  /* A hello carries no payload: a truncated one is a header cut short. */
  char trunc[sizeof(h) - 10];
  memcpy(trunc, &h, sizeof(trunc));
  hostile_conn(&root, trunc, sizeof(trunc), 0);                     /* truncated, closed */
  keep[nk++] = hostile_conn(&root, trunc, sizeof(trunc), 1);        /* truncated, stalls */
  keep[nk++] = hostile_conn(&root, NULL, 0, 1);                     /* silent */
  int bad = procs(nranks, &id);
  for (int i = 0; i < nk; i++)
    if (keep[i] >= 0) close(keep[i]);
  return bad;
}

/* NCCL_COMM_ID=127.0.0.1:<a free port> (bind an ephemeral one, let it go). */
static int set_free_comm_id(void) {
  hetccl_sockaddr_t a;
  memset(&a, 0, sizeof(a));
  a.sin.sin_family = AF_INET;
  a.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd;
  if (hetccl_net_listen(&a, 1, &fd) != ncclSuccess) return 1;
  char env[64];
  snprintf(env, sizeof(env), "127.0.0.1:%d", hetccl_net_addr_port(&a));
  close(fd);
  setenv("NCCL_COMM_ID", env, 1);
  return 0;
}

static int commid(int nranks) {
  if (set_free_comm_id()) return 1;
  pid_t pids[16];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(60);
      ncclUniqueId id;
      if (hetccl_bootstrap_root_create(&id) != ncclSuccess) _exit(1);
      _exit(run_rank(&id, r, nranks));
    }
  }
  return wait_children(pids, nranks);
}

/* Error paths, each an answer rather than a hang. */
static volatile int abort_flag;
static void *set_abort(void *p) {
  (void)p;
  usleep(200 * 1000);
  __atomic_store_n(&abort_flag, 1, __ATOMIC_RELEASE);
  return NULL;
}

static int expect(const char *what, ncclResult_t got, ncclResult_t want) {
  if (got == want) return 0;
  fprintf(stderr, "FAIL %s: got %d, expected %d\n", what, (int)got, (int)want);
  return 1;
}

/* rank1 is the role of the child (see child_main), rank0 runs here. */
static int two_procs(const char *rank1, int (*rank0)(const ncclUniqueId *)) {
  ncclUniqueId id;
  if (hetccl_bootstrap_root_create(&id) != ncclSuccess) return 1;
  pid_t pid = spawn(rank1, &id, 1, 2);
  int bad = rank0(&id), st;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
  return bad;
}

static int join2(const ncclUniqueId *id, int rank, hetccl_bootstrap_t **bs) {
  hetccl_bootstrap_opts_t o = {.timeout_ms = 10000};
  int x = rank, all[2];
  return hetccl_bootstrap_init(id, 1, rank, 2, &x, sizeof(x), all, &o, bs) != ncclSuccess;
}

static int dead_rank1(const ncclUniqueId *id) {
  hetccl_bootstrap_t *bs;
  if (join2(id, 1, &bs)) return 1;
  hetccl_bootstrap_destroy(bs); /* and vanish */
  return 0;
}
static int dead_rank0(const ncclUniqueId *id) {
  hetccl_bootstrap_t *bs;
  if (join2(id, 0, &bs)) return 1;
  int x = 0, all[2];
  int bad = expect("allgather with a dead peer", hetccl_bootstrap_allgather(bs, &x, all, sizeof(x)),
                   ncclRemoteError);
  hetccl_bootstrap_destroy(bs);
  return bad;
}

static int skew_rank1(const ncclUniqueId *id) {
  hetccl_bootstrap_t *bs;
  if (join2(id, 1, &bs)) return 1;
  int x = 1, all[2];
  int bad = expect("allgather against a broadcast",
                   hetccl_bootstrap_allgather(bs, &x, all, sizeof(x)), ncclSystemError);
  hetccl_bootstrap_destroy(bs);
  return bad;
}
static int skew_rank0(const ncclUniqueId *id) {
  hetccl_bootstrap_t *bs;
  if (join2(id, 0, &bs)) return 1;
  int x = 0;
  int bad = expect("broadcast", hetccl_bootstrap_bcast(bs, &x, sizeof(x), 0), ncclSuccess);
  hetccl_bootstrap_barrier(bs); /* keep the link up until rank 1 has judged */
  hetccl_bootstrap_destroy(bs);
  return bad;
}

static int errors(void) {
  int bad = 0, x = 0, all[2];
  hetccl_bootstrap_t *bs = NULL;
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  bad |= expect("zeroed id", hetccl_bootstrap_init(&id, 1, 0, 2, &x, sizeof(x), all, NULL, &bs),
                ncclInvalidArgument);
  if (hetccl_bootstrap_root_create(&id) != ncclSuccess) return 1;
  bad |= expect("rank out of range", hetccl_bootstrap_init(&id, 1, 2, 2, &x, sizeof(x), all, NULL, &bs),
                ncclInvalidArgument);
  /* Alone in a communicator of two: the timeout, then the abort flag. */
  hetccl_bootstrap_opts_t o = {.timeout_ms = 300};
  int64_t t0 = hetccl_net_now_ms();
  bad |= expect("lonely rank", hetccl_bootstrap_init(&id, 1, 0, 2, &x, sizeof(x), all, &o, &bs),
                ncclTimeout);
  if (hetccl_net_now_ms() - t0 > 2000) bad |= expect("timeout took too long", 1, 0);
  /* An id whose root is not there (its port closed): the error says where
   * the root should run. */
  hetccl_sockaddr_t root;
  int lfd = -1;
  if (new_root(&id, &root)) return 1;
  hetccl_net_addr_set_port(&root, 0);
  if (hetccl_net_listen(&root, 0, &lfd) != ncclSuccess) return 1;
  uint16_t closed = htons((uint16_t)hetccl_net_addr_port(&root));
  hetccl_net_close(&lfd); /* bound to port 0: a fresh port, now closed */
  memcpy(id.internal + 24 + 2, &closed, sizeof(closed));
  bad |= expect("no root", hetccl_bootstrap_init(&id, 1, 0, 2, &x, sizeof(x), all, &o, &bs),
                ncclTimeout);
  if (strstr(hetccl_last_error(), "The root runs in the process that made the unique id") == NULL) {
    fprintf(stderr, "FAIL no root: '%s' does not say where the root runs\n", hetccl_last_error());
    bad = 1;
  }
  if (hetccl_bootstrap_root_create(&id) != ncclSuccess) return 1;
  o = (hetccl_bootstrap_opts_t){.timeout_ms = 20000, .abort_flag = &abort_flag};
  pthread_t th;
  pthread_create(&th, NULL, set_abort, NULL);
  t0 = hetccl_net_now_ms();
  bad |= expect("aborted rank", hetccl_bootstrap_init(&id, 1, 0, 2, &x, sizeof(x), all, &o, &bs),
                ncclInternalError);
  pthread_join(th, NULL);
  if (hetccl_net_now_ms() - t0 > 2000) bad |= expect("abort took too long", 1, 0);
  bad |= two_procs("dead", dead_rank0);
  bad |= two_procs("skew", skew_rank0);
  return bad;
}

/* ---- refusals: a rank is told why it cannot join ------------------------ */

typedef struct joiner {
  const ncclUniqueId *id;
  int rank, nranks, timeout_ms, delay_ms;
  ncclResult_t res;
  int64_t ms; /* how long init took */
  char msg[512];
} joiner_t;

static void *joiner_main(void *p) {
  joiner_t *j = p;
  usleep(j->delay_ms * 1000);
  hetccl_bootstrap_opts_t o = {.timeout_ms = j->timeout_ms};
  int x = j->rank, *all = calloc(j->nranks, sizeof(int));
  hetccl_bootstrap_t *bs = NULL;
  int64_t t0 = hetccl_net_now_ms();
  j->res = hetccl_bootstrap_init(j->id, 1, j->rank, j->nranks, &x, sizeof(x), all, &o, &bs);
  j->ms = hetccl_net_now_ms() - t0;
  snprintf(j->msg, sizeof(j->msg), "%s", j->res == ncclSuccess ? "" : hetccl_last_error());
  hetccl_bootstrap_destroy(bs);
  free(all);
  return NULL;
}

/* Run the joiners as threads (each after its delay) and wait for them all. */
static void join_all(joiner_t *j, int n) {
  pthread_t th[8];
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, joiner_main, &j[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static int expect_refusal(const char *what, const joiner_t *j, ncclResult_t want,
                          const char *needle, int64_t max_ms) {
  if (j->res == want && strstr(j->msg, needle) != NULL && j->ms <= max_ms) {
    printf("  %s: %d after %" PRId64 " ms: %s\n", what, (int)j->res, j->ms, j->msg);
    return 0;
  }
  fprintf(stderr, "FAIL %s: got %d after %" PRId64 " ms '%s'; expected %d within %" PRId64
          " ms with '%s'\n", what, (int)j->res, j->ms, j->msg, (int)want, max_ms, needle);
  return 1;
}

/* id_c: a forged id (NULL under NCCL_COMM_ID, where rank 0 serves the root). */
static int refusals_with(const ncclUniqueId *id_a, const ncclUniqueId *id_b,
                         const ncclUniqueId *id_c, const char *mode) {
  int bad = 0;
  char what[96];
  /* Ranks 0 and 2 of 5 join; the others never come. */
  joiner_t miss[2] = {{.id = id_a, .rank = 0, .nranks = 5, .timeout_ms = 400},
                      {.id = id_a, .rank = 2, .nranks = 5, .timeout_ms = 400}};
  join_all(miss, 2);
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof(what), "%s: rank %d of 5, three missing", mode, miss[i].rank);
    bad |= expect_refusal(what, &miss[i], ncclTimeout,
                          "ranks 1, 3-4 of 5 never joined within 0.4 s (HETCCL_CONNECT_TIMEOUT of "
                          "rank ", 2000);
  }
  /* nranks that disagree, then a rank taken twice: the first one waits in
   * vain and hears who is missing; the late one hears why it was refused. */
  joiner_t shape[3] = {{.id = id_b, .rank = 0, .nranks = 2, .timeout_ms = 1000},
                       {.id = id_b, .rank = 1, .nranks = 3, .timeout_ms = 1000, .delay_ms = 150},
                       {.id = id_b, .rank = 0, .nranks = 2, .timeout_ms = 1000, .delay_ms = 150}};
  join_all(shape, 3);
  snprintf(what, sizeof(what), "%s: the rank that waited", mode);
  bad |= expect_refusal(what, &shape[0], ncclTimeout, "rank 1 of 2 never joined", 3000);
  snprintf(what, sizeof(what), "%s: nranks=3 against nranks=2", mode);
  bad |= expect_refusal(what, &shape[1], ncclInvalidUsage,
                        "this rank says nranks=3, the ranks that joined first say nranks=2", 1000);
  snprintf(what, sizeof(what), "%s: rank 0 again", mode);
  if (id_c) /* the root refuses it */
    bad |= expect_refusal(what, &shape[2], ncclInvalidUsage, "rank 0 already joined from", 1000);
  else /* the second rank 0 cannot serve the root at the same address */
    bad |= expect_refusal(what, &shape[2], ncclSystemError, "(NCCL_COMM_ID): net: bind to", 1000);
  if (id_c) {
    joiner_t forged = {.id = id_c, .rank = 0, .nranks = 1, .timeout_ms = 1000};
    join_all(&forged, 1);
    snprintf(what, sizeof(what), "%s: a forged secret", mode);
    bad |= expect_refusal(what, &forged, ncclInvalidUsage, "secret does not match", 1000);
  }
  return bad;
}

static int refusals(void) {
  int bad = 0;
  ncclUniqueId a, b, c;
  if (hetccl_bootstrap_root_create(&a) != ncclSuccess ||
      hetccl_bootstrap_root_create(&b) != ncclSuccess ||
      hetccl_bootstrap_root_create(&c) != ncclSuccess)
    return 1;
  for (int i = 16; i < 24; i++) c.internal[i] ^= 0x5a; /* the secret */
  bad |= refusals_with(&a, &b, &c, "root thread");

  /* The root's own timeout is the shorter one. */
  setenv("HETCCL_CONNECT_TIMEOUT", "1", 1);
  hetccl_knobs_reload();
  if (hetccl_bootstrap_root_create(&a) != ncclSuccess) return 1;
  setenv("HETCCL_CONNECT_TIMEOUT", "20", 1);
  hetccl_knobs_reload();
  joiner_t patient = {.id = &a, .rank = 1, .nranks = 2, .timeout_ms = 10000};
  join_all(&patient, 1);
  bad |= expect_refusal("root thread: the root's timeout first", &patient, ncclTimeout,
                        "rank 0 of 2 never joined within 1.0 s (HETCCL_CONNECT_TIMEOUT of the "
                        "process that made the unique id", 3000);

  /* ...counted from the first rank's arrival: ranks that come later than
   * that after the id was made are still served. */
  setenv("HETCCL_CONNECT_TIMEOUT", "1", 1);
  hetccl_knobs_reload();
  if (hetccl_bootstrap_root_create(&a) != ncclSuccess) return 1;
  setenv("HETCCL_CONNECT_TIMEOUT", "20", 1);
  hetccl_knobs_reload();
  joiner_t late[2] = {{.id = &a, .rank = 0, .nranks = 2, .timeout_ms = 5000, .delay_ms = 1600},
                      {.id = &a, .rank = 1, .nranks = 2, .timeout_ms = 5000, .delay_ms = 1700}};
  join_all(late, 2);
  for (int i = 0; i < 2; i++)
    if (late[i].res != ncclSuccess) {
      fprintf(stderr, "FAIL root thread: rank %d, 1.6 s after an id whose root has a 1 s "
              "timeout: %d '%s'\n", late[i].rank, (int)late[i].res, late[i].msg);
      bad = 1;
    }

  /* NCCL_COMM_ID: rank 0 serves the root; each case on a port of its own. */
  ncclUniqueId ids[2];
  for (int k = 0; k < 2; k++) {
    if (set_free_comm_id()) return 1;
    hetccl_knobs_reload();
    if (hetccl_bootstrap_root_create(&ids[k]) != ncclSuccess) return 1;
  }
  unsetenv("NCCL_COMM_ID");
  hetccl_knobs_reload();
  bad |= refusals_with(&ids[0], &ids[1], NULL, "NCCL_COMM_ID");
  return bad;
}

/* ---- flood: more pending connections than the root keeps ----------------- */

static int flood(void) {
  enum { NFLOOD = 1100 }; /* > NET_MAX_PENDING (1024) in util/net.c */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * NFLOOD + 256) {
    rl.rlim_cur = rl.rlim_max < 2 * NFLOOD + 256 ? rl.rlim_max : 2 * NFLOOD + 256;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 2 * NFLOOD + 256) {
    printf("bootstrap flood: skipped (RLIMIT_NOFILE %ld too small)\n", (long)rl.rlim_cur);
    return 0;
  }
  ncclUniqueId id;
  hetccl_sockaddr_t root;
  if (new_root(&id, &root)) return 1;
  static int fds[NFLOOD];
  int n = 0;
  char partial[20];
  memset(partial, 0x48, sizeof(partial));
  for (int i = 0; i < NFLOOD; i++) /* silent, or a header that never ends */
    fds[n++] = hostile_conn(&root, partial, i % 2 ? sizeof(partial) : 0, 1);
  int64_t t0 = hetccl_net_now_ms();
  int bad = procs(3, &id);
  printf("bootstrap flood: %d stalled connections, then 3 ranks joined in %" PRId64 " ms: %s\n",
         NFLOOD, hetccl_net_now_ms() - t0, bad ? "FAIL" : "ok");
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  return bad;
}

/* A spawned rank: child ROLE ID RANK NRANKS. */
static int child_main(int argc, char **argv) {
  ncclUniqueId id;
  if (argc != 6 || strlen(argv[3]) != 2 * sizeof(id.internal)) return 2;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    unsigned v;
    if (sscanf(argv[3] + 2 * i, "%2x", &v) != 1) return 2;
    id.internal[i] = (char)v;
  }
  int rank = atoi(argv[4]), nranks = atoi(argv[5]);
  alarm(60);
  if (strcmp(argv[2], "rank") == 0) return run_rank(&id, rank, nranks);
  if (strcmp(argv[2], "dead") == 0) return dead_rank1(&id);
  if (strcmp(argv[2], "skew") == 0) return skew_rank1(&id);
  return 2;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "procs";
  if (strcmp(mode, "child") == 0) return child_main(argc, argv);
  static const int sizes[] = {1, 2, 3, 5};
  setenv("HETCCL_CONNECT_TIMEOUT", "20", 0);
  alarm(120);
  if (strcmp(mode, "errors") == 0) {
    int b = errors();
    printf("bootstrap errors: %s\n", b ? "FAIL" : "ok");
    return b;
  }
  if (strcmp(mode, "refusals") == 0) {
    int b = refusals();
    printf("bootstrap refusals: %s\n", b ? "FAIL" : "ok");
    return b;
  }
  if (strcmp(mode, "flood") == 0) return flood();
  int bad = 0;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    int n = sizes[i], b;
    if (strcmp(mode, "procs") == 0) b = procs(n, NULL);
    else if (strcmp(mode, "threads") == 0) b = threads(n);
    else if (strcmp(mode, "hostile") == 0) b = n > 1 ? hostile(n) : 0;
    else if (strcmp(mode, "commid") == 0) b = commid(n);
    else {
      fprintf(stderr, "usage: %s procs|threads|hostile|commid|errors|refusals|flood\n", argv[0]);
      return 2;
    }
    printf("bootstrap %-7s nranks=%d: %s\n", mode, n, b ? "FAIL" : "ok");
    bad |= b;
  }
  return bad;
}
