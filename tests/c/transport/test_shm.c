/* Shared-memory transport test: N forked processes (2..8), every pair
 * connected, below the bootstrap: address blobs and barriers go through an
 * anonymous shared mapping made before fork.
 *
 * Phases (every rank with every other, all messages queued at once):
 *   sizes 0, 1, 7, 64, slot-1, slot, slot+1, 1 MiB+3, 64 MiB: copy, summing
 *     consume, copy again (sequence numbers carry on), receives with tag 0
 *   many small messages both ways at once, and an 8-byte ping-pong
 *   the segments' names are gone from /dev/shm once connect returns
 *   perf (ranks 0 and 1): 8 B half round trip, 16 MiB one way and both ways
 *   errors on fresh contexts: a wrong tag is ncclInvalidUsage; a peer that
 *     closes is ncclRemoteError; a peer that exits in the middle of a 64 MiB
 *     message is ncclRemoteError within about a second.
 *
 * usage: test_shm NPROCS [perf|denycma]   (HETCCL_SHM_CMA / _CHUNK / _SLOTS
 * from the environment; `perf` runs the figures alone; `denycma` forbids
 * process_vm_readv in odd ranks, so that CMA works in one direction only). Exit status 0 on success; every rank is bounded by alarm().
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/transport.h"
#include "util/knobs.h"
#include "../common/transport_check.h"

#define MAX_RANKS 8

static int rank = -1, nranks, perf_only, deny_cma;
static const hetccl_transport_t *T = &hetccl_transport_shm;

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "FAIL rank %d: ", rank);                                   \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    _exit(1);                                                                  \
  } while (0)

#define CHK(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) FAIL("%s -> %d", #call, (int)r_);                   \
  } while (0)

/* --- a bootstrap for the test: shared memory made before fork ---------------- */

typedef struct shared {
  _Atomic int count, gen, go;
  int pids[MAX_RANKS];
  uint8_t addrs[5][MAX_RANKS][HETCCL_TRANSPORT_ADDR_BYTES];
} shared_t;
static shared_t *S;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sleeps rather than spins: with 3 ranks on 2 cores a spinning bystander
 * would be measured too. `n` ranks take part (the last phase loses one). */
static void barrier_n(int n) {
  int gen = atomic_load(&S->gen);
  if (atomic_fetch_add(&S->count, 1) == n - 1) {
    atomic_store(&S->count, 0);
    atomic_fetch_add(&S->gen, 1);
    return;
  }
  double t0 = now_s();
  for (int i = 0; atomic_load(&S->gen) == gen; i++) {
    if (i < 100) sched_yield();
    else usleep(100);
    if (now_s() - t0 > 60) FAIL("barrier timed out");
  }
}
static int nranks_alive; /* ranks that still take part in barriers */
static void barrier(void) { barrier_n(nranks_alive); }


/* Progress every endpoint until all reqs are done; returns the first error. */
/* Bounds on noticing a closed or dead peer, or giving up on an absent
 * one: the result codes already tell prompt notice from running into
 * drive()'s 10 s or the 20 s connect timeout; the time bound only keeps it
 * prompt, loose enough for a loaded 2-core machine (2.1 s was seen there). */
#define NOTICE_S 5.0

static ncclResult_t drive(hetccl_ep_t **eps, hetccl_req_t **reqs, int nreq, double secs) {
  double deadline = now_s() + secs;
  unsigned idle_polls = 0;
  for (unsigned it = 0;; it++) {
    int all_idle = 1, done = 1;
    for (int p = 0; p < nranks; p++) {
      if (eps[p] == NULL) continue;
      int idle;
      ncclResult_t res = T->progress(eps[p], &idle);
      if (res != ncclSuccess) return res;
      all_idle &= idle;
    }
    for (int i = 0; i < nreq && done; i++) done = reqs[i]->done;
    if (done) return ncclSuccess;
    if ((it & 1023) == 0 && now_s() > deadline) FAIL("drive: timed out");
    /* Spin a while (latency), then share the cores (more ranks than cores). */
    idle_polls = all_idle ? idle_polls + 1 : 0;
    if (idle_polls > 2000) sched_yield();
  }
}

typedef struct conn {
  hetccl_tctx_t *ctx;
  hetccl_ep_t *eps[MAX_RANKS];
} conn_t;

/* Connect the ranks in `members` (a bit mask) pairwise on a context of
 * their own (`which` picks the exchange area and the communicator id).
 * Returns connect's result; ranks outside `members` only publish. */
static ncclResult_t conn_try(conn_t *c, int which, unsigned members) {
  hetccl_transport_args_t args = {.rank = rank, .nranks = nranks,
                                  .comm_id = 0x5e5e000000000000ull + which, .secret = 42,
                                  .timeout_ms = 20000, .abort_flag = NULL, .ifname = ""};
  memset(c, 0, sizeof(*c));
  CHK(T->ctx_create(&args, &c->ctx, S->addrs[which][rank]));
  barrier();
  if (!(members >> rank & 1)) {
    T->ctx_destroy(c->ctx);
    c->ctx = NULL;
    return ncclSuccess;
  }
  uint8_t use[MAX_RANKS], addrs[MAX_RANKS * HETCCL_TRANSPORT_ADDR_BYTES];
  hetccl_peer_locality_t loc[MAX_RANKS];
  for (int p = 0; p < nranks; p++) {
    use[p] = p != rank && (members >> p & 1);
    memcpy(addrs + p * HETCCL_TRANSPORT_ADDR_BYTES, S->addrs[which][p],
           HETCCL_TRANSPORT_ADDR_BYTES);
    loc[p] = (hetccl_peer_locality_t){.host_hash = 1, .pid = S->pids[p]};
  }
  ncclResult_t res = T->connect(c->ctx, use, addrs, loc, c->eps);
  T->ctx_destroy(c->ctx); /* as the engine does: the endpoints live on */
  c->ctx = NULL;
  if (res != ncclSuccess) return res;
  for (int p = 0; p < nranks; p++)
    if ((use[p] != 0) != (c->eps[p] != NULL)) FAIL("connect: endpoint for rank %d", p);
  return ncclSuccess;
}

static void conn_open(conn_t *c, int which) { CHK(conn_try(c, which, ~0u)); }

static void conn_close(conn_t *c) {
  for (int p = 0; p < nranks; p++) T->ep_close(c->eps[p]);
  memset(c, 0, sizeof(*c));
}

/* --- phases ----------------------------------------------------------------- */

static size_t sizes[9];
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void exchange(hetccl_ep_t **eps, uint8_t **sbuf, int use_consume, int any_tag) {
  int nreq = 0;
  hetccl_req_t *rq = calloc(2 * nranks * NSIZES, sizeof(hetccl_req_t));
  hetccl_req_t **all = calloc(2 * nranks * NSIZES, sizeof(*all));
  uint8_t **rbuf = calloc(nranks * NSIZES, sizeof(*rbuf));
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    for (size_t k = 0; k < NSIZES; k++) {
      uint8_t *b = rbuf[p * NSIZES + k] = malloc(sizes[k] + 1);
      for (size_t i = 0; i < sizes[k]; i++) b[i] = use_consume ? prefill(i) : 0xee;
      b[sizes[k]] = 0x5a;
      hetccl_req_t *r = &rq[nreq];
      *r = (hetccl_req_t){.buf = b, .bytes = sizes[k], .tag = any_tag ? 0 : 1000 + k};
      if (use_consume) {
        r->consume = sum_consume;
        r->consume_ctx = r;
      }
      all[nreq++] = r;
      CHK(T->irecv(eps[p], r));
    }
    for (size_t k = 0; k < NSIZES; k++) {
      hetccl_req_t *r = &rq[nreq];
      *r = (hetccl_req_t){.buf = sbuf[k], .bytes = sizes[k], .tag = 1000 + k};
      all[nreq++] = r;
      CHK(T->isend(eps[p], r));
    }
  }
  CHK(drive(eps, all, nreq, 60));
  if (consume_bad) FAIL("consume got a piece that breaks the 8-byte rule or the bounds");
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    for (size_t k = 0; k < NSIZES; k++) {
      uint8_t *b = rbuf[p * NSIZES + k];
      for (size_t i = 0; i < sizes[k]; i++) {
        uint8_t want = content(p, sizes[k], i);
        if (use_consume) want = (uint8_t)(want + prefill(i));
        if (b[i] != want)
          FAIL("%s: size %zu from rank %d: byte %zu is %u, expected %u",
               use_consume ? "consume" : "copy", sizes[k], p, i, b[i], want);
      }
      if (b[sizes[k]] != 0x5a) FAIL("size %zu from rank %d: wrote past the end", sizes[k], p);
      free(b);
    }
  }
  free(rbuf);
  free(all);
  free(rq);
}

/* 2000 small messages of varying size to every peer and from every peer,
 * all posted before any progress: both directions at once. */
static void many_small(hetccl_ep_t **eps) {
  enum { N = 2000 };
  int nreq = 0;
  hetccl_req_t *rq = calloc(2 * nranks * N, sizeof(hetccl_req_t));
  hetccl_req_t **all = calloc(2 * nranks * N, sizeof(*all));
  uint8_t *rbuf = calloc((size_t)nranks * N, 256), sbuf[256];
  for (int i = 0; i < 256; i++) sbuf[i] = (uint8_t)(rank * 17 + i);
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    for (int i = 0; i < N; i++) {
      hetccl_req_t *r = &rq[nreq];
      *r = (hetccl_req_t){.buf = rbuf + ((size_t)p * N + i) * 256, .bytes = 1 + (i * 37) % 255,
                          .tag = 77 + i};
      all[nreq++] = r;
      CHK(T->irecv(eps[p], r));
      r = &rq[nreq];
      *r = (hetccl_req_t){.buf = sbuf, .bytes = 1 + (i * 37) % 255, .tag = 77 + i};
      all[nreq++] = r;
      CHK(T->isend(eps[p], r));
    }
  }
  CHK(drive(eps, all, nreq, 60));
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < 1 + (i * 37) % 255; j++)
        if (rbuf[((size_t)p * N + i) * 256 + j] != (uint8_t)(p * 17 + j))
          FAIL("small message %d from rank %d: byte %d wrong", i, p, j);
  }
  free(rbuf);
  free(all);
  free(rq);
}

/* 8-byte ping-pong between a and b; returns the half round trip in us. */
static double pingpong(hetccl_ep_t **eps, int a, int b, int iters) {
  uint64_t sv = 0, rv = 0;
  hetccl_req_t s, r, *rp = &r;
  int peer = rank == a ? b : a;
  double t0 = 0;
  for (int it = -iters / 10; it < iters; it++) {
    if (it == 0) t0 = now_s();
    s = (hetccl_req_t){.buf = &sv, .bytes = 8, .tag = 9};
    r = (hetccl_req_t){.buf = &rv, .bytes = 8, .tag = 9};
    CHK(T->irecv(eps[peer], &r));
    if (rank == a) {
      sv = (uint64_t)it;
      CHK(T->isend(eps[peer], &s));
      CHK(drive(eps, &rp, 1, 30));
      if (rv != (uint64_t)it + 1) FAIL("ping-pong: got %llu, expected %d", (unsigned long long)rv, it + 1);
    } else {
      CHK(drive(eps, &rp, 1, 30));
      sv = rv + 1;
      CHK(T->isend(eps[peer], &s));
    }
    hetccl_req_t *sp = &s;
    CHK(drive(eps, &sp, 1, 30));
  }
  return (now_s() - t0) / iters / 2 * 1e6;
}

/* 16 MiB from the even to the odd rank of each pair (0,1), (2,3)... (one
 * way) or both ways at once; GB/s per direction on the receiver's clock.
 * All pairs run at once: with 4 ranks on 2 cores, that is the
 * oversubscribed case. */
static double bandwidth(hetccl_ep_t **eps, uint8_t *sbuf, uint8_t *rbuf, int both, size_t bytes) {
  const int iters = bytes >= (4u << 20) ? 20 : 200, warm = 3;
  double t0 = 0;
  int peer = rank ^ 1;
  for (int it = 0; it < warm + iters; it++) {
    if (it == warm) t0 = now_s();
    hetccl_req_t s = {.buf = sbuf, .bytes = bytes, .tag = 3};
    hetccl_req_t r = {.buf = rbuf, .bytes = bytes, .tag = 3};
    hetccl_req_t *reqs[2];
    int n = 0;
    if (both || (rank & 1)) {
      CHK(T->irecv(eps[peer], &r));
      reqs[n++] = &r;
    }
    if (both || !(rank & 1)) {
      CHK(T->isend(eps[peer], &s));
      reqs[n++] = &s;
    }
    CHK(drive(eps, reqs, n, 30));
  }
  return bytes * (double)iters / (now_s() - t0) / 1e9;
}

static void perf(hetccl_ep_t **eps, uint8_t *big) {
  uint8_t *rbuf = malloc(16u << 20);
  memset(rbuf, 0, 16u << 20);
  int pairs = nranks / 2, in_pair = rank < 2 * pairs;
  double lat = 0, one = 0, two = 0;
  barrier();
  if (rank <= 1) lat = pingpong(eps, 0, 1, 20000);
  barrier();
  if (in_pair) one = bandwidth(eps, big, rbuf, 0, 16u << 20);
  barrier();
  if (in_pair) two = bandwidth(eps, big, rbuf, 1, 16u << 20);
  for (size_t b = 64u << 10; perf_only && b <= (4u << 20); b *= 4) { /* the curve */
    barrier();
    double x = 0, y = 0;
    if (in_pair) x = bandwidth(eps, big, rbuf, 0, b);
    barrier();
    if (in_pair) y = bandwidth(eps, big, rbuf, 1, b);
    if (rank == 1) printf("shm %8zu B: one way %.2f GB/s, both ways %.2f GB/s per direction\n", b, x, y);
  }
  if (rank == 1) {
    printf("shm np=%d cma=%d chunk=%lld slots=%lld: 8 B half round trip %.3f us; 16 MiB one "
           "way %.2f GB/s; both ways %.2f GB/s per direction (%d pair%s at once)\n",
           nranks, (int)hetccl_knob_int(HETCCL_KNOB_SHM_CMA),
           (long long)hetccl_knob_int(HETCCL_KNOB_SHM_CHUNK),
           (long long)hetccl_knob_int(HETCCL_KNOB_SHM_SLOTS), lat, one, two, pairs,
           pairs > 1 ? "s" : "");
    fflush(stdout);
  }
  barrier();
  free(rbuf);
}

/* The segment name in an address blob (white-box: addr_blob_t in shm.c). */
static void blob_name(char *name, const uint8_t *blob) {
  memcpy(name, blob + 8, HETCCL_TRANSPORT_ADDR_BYTES - 8);
  name[HETCCL_TRANSPORT_ADDR_BYTES - 8] = '\0';
}

/* Our segments' names must be gone once connect has returned everywhere. */
static void check_unlinked(int which) {
  char name[HETCCL_TRANSPORT_ADDR_BYTES];
  blob_name(name, S->addrs[which][rank]);
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd >= 0 || errno != ENOENT) FAIL("segment %s still exists after connect", name);
}

static void errors(void) {
  conn_t c;
  char buf[100] = {0};
  hetccl_req_t r, *rp = &r;
  /* A receive that expects another tag. */
  conn_open(&c, 1);
  if (rank == 0) {
    r = (hetccl_req_t){.buf = buf, .bytes = sizeof(buf), .tag = 5};
    CHK(T->isend(c.eps[1], &r));
    CHK(drive(c.eps, &rp, 1, 10));
  } else if (rank == 1) {
    r = (hetccl_req_t){.buf = buf, .bytes = sizeof(buf), .tag = 6};
    ncclResult_t res = T->irecv(c.eps[0], &r);
    if (res == ncclSuccess) res = drive(c.eps, &rp, 1, 10);
    if (res != ncclInvalidUsage) FAIL("tag mismatch gave %d, expected ncclInvalidUsage", res);
    if (T->irecv(c.eps[0], &r) != ncclInvalidUsage) FAIL("failed endpoint did not stay failed");
  }
  barrier();
  /* A peer that closes its end while we wait on it. */
  if (rank == 1) {
    T->ep_close(c.eps[0]);
    c.eps[0] = NULL;
  }
  barrier();
  if (rank == 0) {
    double t0 = now_s();
    r = (hetccl_req_t){.buf = buf, .bytes = sizeof(buf), .tag = 0};
    CHK(T->irecv(c.eps[1], &r));
    ncclResult_t res = drive(c.eps, &rp, 1, 10);
    if (res != ncclRemoteError) FAIL("closed peer gave %d, expected ncclRemoteError", res);
    if (now_s() - t0 > NOTICE_S) FAIL("closed peer took %.2f s to notice", now_s() - t0);
  }
  barrier();
  conn_close(&c);

  /* A peer that never connects: a bounded wait, and the abort flag. */
  {
    volatile int abort_flag = 0;
    hetccl_transport_args_t args = {.rank = rank, .nranks = nranks,
                                    .comm_id = 0x5e5e000000000004ull, .timeout_ms = 300,
                                    .abort_flag = &abort_flag};
    CHK(T->ctx_create(&args, &c.ctx, S->addrs[4][rank]));
    barrier();
    if (rank == 0) {
      uint8_t use[MAX_RANKS] = {0}, addrs[MAX_RANKS * HETCCL_TRANSPORT_ADDR_BYTES];
      hetccl_peer_locality_t loc[MAX_RANKS];
      for (int p = 0; p < nranks; p++) {
        use[p] = p != 0;
        memcpy(addrs + p * HETCCL_TRANSPORT_ADDR_BYTES, S->addrs[4][p], HETCCL_TRANSPORT_ADDR_BYTES);
        loc[p] = (hetccl_peer_locality_t){.host_hash = 1, .pid = S->pids[p]};
      }
      double t0 = now_s();
      ncclResult_t res = T->connect(c.ctx, use, addrs, loc, c.eps);
      double dt = now_s() - t0;
      if (res != ncclTimeout || dt > NOTICE_S) FAIL("connect to absent peers gave %d after %.2f s", res, dt);
      abort_flag = 1;
      t0 = now_s();
      res = T->connect(c.ctx, use, addrs, loc, c.eps);
      dt = now_s() - t0;
      if (res != ncclInternalError || dt > 1.0) FAIL("aborted connect gave %d after %.2f s", res, dt);
      for (int p = 0; p < nranks; p++)
        if (c.eps[p]) FAIL("failed connect left an endpoint for rank %d", p);
    }
    barrier();
    T->ctx_destroy(c.ctx);
    c.ctx = NULL;
  }

  /* A peer that exits before it connects (rank 2, when there is one). */
  if (nranks >= 3) {
    if (rank == 2) {
      CHK(T->ctx_create(&(hetccl_transport_args_t){.rank = 2, .nranks = nranks,
                                                   .comm_id = 0x5e5e000000000002ull,
                                                   .timeout_ms = 20000},
                        &c.ctx, S->addrs[2][2]));
      barrier();
      _exit(0); /* leaves its segment behind: the next ctx_create removes it */
    }
    double t0 = now_s();
    ncclResult_t res = conn_try(&c, 2, ~0u);
    if (res != ncclRemoteError) FAIL("peer gone before connect gave %d, expected ncclRemoteError", res);
    if (now_s() - t0 > NOTICE_S) FAIL("peer gone before connect took %.2f s to notice", now_s() - t0);
    nranks_alive = nranks - 1;
  }

  /* A peer that exits in the middle of a 64 MiB message (rank 1 to rank 0). */
  CHK(conn_try(&c, 3, 3u));
  barrier();
  if (rank == 0 && nranks >= 3) { /* ctx_create swept the segment dead rank 2 left */
    char name[HETCCL_TRANSPORT_ADDR_BYTES];
    blob_name(name, S->addrs[2][2]);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0 || errno != ENOENT) FAIL("segment %s of dead rank 2 was not removed", name);
  }
  if (rank > 1) return;
  const size_t bytes = 64u << 20;
  uint8_t *big = malloc(bytes);
  memset(big, 1, bytes);
  if (rank == 1) {
    r = (hetccl_req_t){.buf = big, .bytes = bytes, .tag = 8};
    CHK(T->isend(c.eps[0], &r));
    while (r.progress < bytes / 16 && !r.done) {
      int idle;
      CHK(T->progress(c.eps[0], &idle));
      if (r.progress == 0 && idle) break; /* rendezvous: the receiver pulls */
    }
    usleep(2000);
    _exit(0);
  }
  if (rank == 0) {
    r = (hetccl_req_t){.buf = big, .bytes = bytes, .tag = 8};
    double t0 = now_s();
    ncclResult_t res = T->irecv(c.eps[1], &r); /* may see the exit at once */
    if (res == ncclSuccess) res = drive(c.eps, &rp, 1, 10);
    double dt = now_s() - t0;
    if (res != ncclRemoteError) FAIL("dead peer gave %d, expected ncclRemoteError (%zu bytes in, done %d, %.3f s)", res, r.progress, r.done, dt);
    if (dt > NOTICE_S) FAIL("dead peer took %.2f s to notice", dt);
    printf("shm np=%d cma=%d: peer exit mid-message noticed after %.3f s (%zu of %zu bytes in)\n",
           nranks, (int)hetccl_knob_int(HETCCL_KNOB_SHM_CMA), dt, r.progress, bytes);
    fflush(stdout);
  }
  conn_close(&c);
  free(big);
}

static int rank_main(void) {
  size_t chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_SHM_CHUNK) & ~(size_t)63;
  size_t init[NSIZES] = {0, 1, 7, 64, chunk - 1, chunk, chunk + 1, (1u << 20) + 3, 64u << 20};
  memcpy(sizes, init, sizeof(sizes));
  conn_t c;
  conn_open(&c, 0);
  barrier();
  check_unlinked(0);

  uint8_t *sbuf[NSIZES];
  for (size_t k = 0; k < NSIZES; k++) {
    sbuf[k] = malloc(sizes[k] + 1);
    for (size_t i = 0; i < sizes[k]; i++) sbuf[k][i] = content(rank, sizes[k], i);
  }
  if (perf_only) {
    perf(c.eps, sbuf[NSIZES - 1]);
    conn_close(&c);
    return 0;
  }
  exchange(c.eps, sbuf, 0, 0);
  exchange(c.eps, sbuf, 1, 0);
  exchange(c.eps, sbuf, 0, 1);
  many_small(c.eps);
  for (int p = 0; p < nranks; p++) { /* ping-pong with each in turn */
    for (int q = p + 1; q < nranks; q++) {
      barrier();
      if (rank == p || rank == q) pingpong(c.eps, p, q, 2000);
    }
  }
  perf(c.eps, sbuf[NSIZES - 1]);
  conn_close(&c);
  errors();
  for (size_t k = 0; k < NSIZES; k++) free(sbuf[k]);
  return 0;
}

/* Make process_vm_readv fail with EPERM in this process, as a restrictive
 * ptrace policy would: the CMA probe must fail and the ring carry all. */
static void cma_forbid(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
    FAIL("seccomp filter: %s", strerror(errno));
}

int main(int argc, char **argv) {
  nranks = argc > 1 ? atoi(argv[1]) : 2;
  nranks_alive = nranks;
  perf_only = argc > 2 && !strcmp(argv[2], "perf");
  deny_cma = argc > 2 && !strcmp(argv[2], "denycma");
  if (nranks < 2 || nranks > MAX_RANKS || (argc > 2 && !perf_only && !deny_cma)) {
    fprintf(stderr, "usage: %s NPROCS (2..%d) [perf|denycma]\n", argv[0], MAX_RANKS);
    return 2;
  }
  S = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED) return 1;
  memset(S, 0, sizeof(*S));
  pid_t kids[MAX_RANKS];
  for (int r = 0; r < nranks; r++) {
    kids[r] = fork();
    if (kids[r] == 0) {
      rank = r;
      alarm(120);
      /* wait for the parent to publish every pid */
      while (!atomic_load(&S->go)) usleep(100);
      if (deny_cma && (r & 1)) cma_forbid(); /* odd ranks cannot read the others */
      exit(rank_main()); /* exit, not _exit: a leak checker looks at each rank */
    }
    S->pids[r] = kids[r];
  }
  atomic_store(&S->go, 1);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    int st;
    if (waitpid(kids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
      bad = 1;
    }
  }
  printf("shm transport, %d processes: %s\n", nranks, bad ? "FAIL" : "ok");
  return bad;
}
