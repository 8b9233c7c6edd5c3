/* Socket transport test: N processes (fork), every pair connected, every
 * rank sends to and receives from every other rank messages of 0, 1, 7,
 * 4096, 1 MiB + 3 and 64 MiB bytes, all queued at once (FIFO per
 * direction), once copying and once through a summing consume. Then the
 * error paths: a tag mismatch is ncclInvalidUsage, a peer that closes is
 * ncclRemoteError, and (3 ranks or more) a peer that fails in the middle of
 * a 64 MiB send leaves a note that the receiver reports. Ranks 0 and 1 then time 16 MiB messages. Before
 * connecting, rank 0 throws foreign connections at the other listeners;
 * after connecting, no listener may accept any more.
 *
 * usage: test_socket NPROCS   (HETCCL_SOCKET_NSTREAMS / _CHUNK from the
 * environment). Exit status 0 on success; every rank is bounded by alarm().
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/bootstrap.h"
#include "transport/transport.h"
#include "util/knobs.h"
#include "util/net.h"
#include "../common/share_id.h"
#include "../common/transport_check.h"

static int rank = -1;
static hetccl_fail_note_t peer_note; /* args.peer_note: the first note a peer left */

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "FAIL rank %d: ", rank);                                   \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    exit(1);                                                                   \
  } while (0)

#define CHK(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) FAIL("%s -> %d", #call, (int)r_);                   \
  } while (0)

static const size_t sizes[] = {0, 1, 7, 4096, (1u << 20) + 3, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))


static const hetccl_transport_t *T = &hetccl_transport_socket;

/* Progress every endpoint until all reqs are done; returns the first error. */
static ncclResult_t drive(hetccl_ep_t **eps, int n, hetccl_req_t **reqs, int nreq, int ms) {
  int64_t deadline = hetccl_net_now_ms() + ms;
  for (;;) {
    int all_idle = 1, done = 1;
    for (int p = 0; p < n; p++) {
      if (eps[p] == NULL) continue;
      int idle;
      ncclResult_t res = T->progress(eps[p], &idle);
      if (res != ncclSuccess) return res;
      all_idle &= idle;
    }
    for (int i = 0; i < nreq; i++) done &= reqs[i]->done;
    if (done) return ncclSuccess;
    if (hetccl_net_now_ms() > deadline) FAIL("drive: timed out");
    if (all_idle) sched_yield();
  }
}

static void exchange(hetccl_ep_t **eps, int n, uint8_t **sbuf, int use_consume) {
  int npeer = n - 1, nreq = 0;
  hetccl_req_t *rq = calloc(2 * npeer * NSIZES, sizeof(hetccl_req_t));
  hetccl_req_t **all = calloc(2 * npeer * NSIZES, sizeof(*all));
  uint8_t **rbuf = calloc(n * NSIZES, sizeof(*rbuf));
  for (int p = 0; p < n; p++) {
    if (p == rank) continue;
    for (size_t k = 0; k < NSIZES; k++) {
      uint8_t *b = rbuf[p * NSIZES + k] = malloc(sizes[k] + 1);
      for (size_t i = 0; i < sizes[k]; i++) b[i] = use_consume ? prefill(i) : 0xee;
      hetccl_req_t *r = &rq[nreq];
      *r = (hetccl_req_t){.buf = b, .bytes = sizes[k], .tag = 1000 + k};
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
  CHK(drive(eps, n, all, nreq, 30000));
  if (consume_bad) FAIL("consume got a piece that breaks the 8-byte rule or the bounds");
  for (int p = 0; p < n; p++) {
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
      free(b);
    }
  }
  free(rbuf);
  free(all);
  free(rq);
}

static void throughput(hetccl_bootstrap_t *bs, hetccl_ep_t **eps, int n, uint8_t *buf) {
  const size_t bytes = 16u << 20;
  const int iters = 20, warm = 3;
  double secs = 0;
  for (int it = 0; it < warm + iters; it++) {
    CHK(hetccl_bootstrap_barrier(bs));
    if (rank > 1) continue;
    hetccl_req_t r = {.buf = buf, .bytes = bytes, .tag = 7};
    hetccl_req_t *rp = &r;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    CHK(rank == 0 ? T->isend(eps[1], &r) : T->irecv(eps[0], &r));
    CHK(drive(eps, n, &rp, 1, 30000));
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (it >= warm) secs += (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
  }
  /* The receiver's clock: from posting to the last byte in place. */
  if (rank == 1)
    printf("socket nstreams=%d chunk=%lld: 16 MiB rank 0 -> 1: %.2f GB/s (%d iterations)\n",
           (int)hetccl_knob_int(HETCCL_KNOB_SOCKET_NSTREAMS),
           (long long)hetccl_knob_int(HETCCL_KNOB_SOCKET_CHUNK), bytes * (double)iters / secs / 1e9,
           iters);
  fflush(stdout);
}

static void error_paths(hetccl_bootstrap_t *bs, hetccl_ep_t **eps, int n, hetccl_tctx_t **ctx) {
  char buf[100] = {0};
  CHK(hetccl_bootstrap_barrier(bs));
  if (rank == 0) {
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 5}, *rp = &r;
    CHK(drive(eps, n, (T->isend(eps[1], &r), &rp), 1, 10000));
  } else if (rank == 1) {
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 6}, *rp = &r;
    CHK(T->irecv(eps[0], &r));
    ncclResult_t res = drive(eps, n, &rp, 1, 10000);
    if (res != ncclInvalidUsage) FAIL("tag mismatch gave %d, expected ncclInvalidUsage", res);
  }
  CHK(hetccl_bootstrap_barrier(bs));
  if (rank == 1) { /* vanish */
    for (int p = 0; p < n; p++) {
      T->ep_close(eps[p]);
      eps[p] = NULL;
    }
    T->ctx_destroy(*ctx);
    *ctx = NULL;
  }
  CHK(hetccl_bootstrap_barrier(bs));
  if (rank == 0) {
    hetccl_req_t r = {.buf = buf, .bytes = sizeof(buf), .tag = 0}, *rp = &r;
    CHK(T->irecv(eps[1], &r));
    ncclResult_t res = drive(eps, n, &rp, 1, 10000);
    if (res != ncclRemoteError) FAIL("closed peer gave %d, expected ncclRemoteError", res);
    if (peer_note.code != 0) FAIL("a peer that closed without a note left one: %s", peer_note.text);
    T->ep_close(eps[1]); /* done with it: drive() would report it again */
    eps[1] = NULL;
  }
  CHK(hetccl_bootstrap_barrier(bs));
  if (n < 3) return;
  /* Rank 2 fails part-way through a 64 MiB send to rank 0: the data
   * streams stop mid-piece, the note line says why. */
  size_t big = 64u << 20;
  char *data = calloc(1, big);
  if (data == NULL) FAIL("out of memory");
  if (rank == 2) {
    hetccl_req_t r = {.buf = data, .bytes = big, .tag = 9}, *rp = &r;
    CHK(T->isend(eps[0], &r));
    (void)rp; /* push what the kernel takes for 50 ms: the peer does not read yet */
    for (int64_t until = hetccl_net_now_ms() + 50; hetccl_net_now_ms() < until;) {
      int idle;
      CHK(T->progress(eps[0], &idle));
    }
    if (r.done) FAIL("64 MiB left before the receiver posted its receive");
    hetccl_fail_note_t note = {.code = ncclInvalidUsage, .origin = 2};
    snprintf(note.text, sizeof(note.text), "rank 2 gave up for a test");
    T->ep_fail(eps[0], &note);
    eps[0] = NULL;
  }
  CHK(hetccl_bootstrap_barrier(bs));
  if (rank == 0) {
    hetccl_req_t r = {.buf = data, .bytes = big, .tag = 9}, *rp = &r;
    CHK(T->irecv(eps[2], &r));
    ncclResult_t res = drive(eps, n, &rp, 1, 10000);
    if (res != ncclInvalidUsage) FAIL("a peer's note of ncclInvalidUsage gave %d", res);
    if (peer_note.code != ncclInvalidUsage || peer_note.origin != 2 ||
        strcmp(peer_note.text, "rank 2 gave up for a test") != 0)
      FAIL("the note arrived as code %d origin %d '%s'", peer_note.code, peer_note.origin,
           peer_note.text);
    if (r.progress == 0 || r.progress >= big)
      FAIL("the failed send moved %zu of %zu bytes: not a mid-message failure", r.progress, big);
    printf("note: rank 0 got rank 2's note after %zu of %zu bytes\n", r.progress, big);
    fflush(stdout);
  }
  free(data);
  CHK(hetccl_bootstrap_barrier(bs));
}

/* Foreign connections on every higher rank's listener before the real
 * ones: garbage, and a handshake with the wrong secret (white-box: the
 * layout of handshake_t in socket.c). connect must drop them and go on. */
static void hostile(const uint8_t *addrs, int nranks, uint64_t comm_id, uint64_t secret) {
  struct {
    uint64_t magic, comm_id, secret;
    int32_t rank, nranks, stream, nstreams;
  } hs = {0x534f434b48414e44ull, comm_id, secret ^ 1, 0, nranks, 0,
          (int32_t)hetccl_knob_int(HETCCL_KNOB_SOCKET_NSTREAMS)};
  for (int p = 1; p < nranks; p++) {
    hetccl_net_wire_addr_t w;
    hetccl_sockaddr_t a;
    memcpy(&w, addrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES + 8, sizeof(w));
    if (hetccl_net_addr_from_wire(&w, &a) != ncclSuccess) FAIL("address blob of rank %d", p);
    int fd;
    CHK(hetccl_net_connect(&a, hetccl_net_deadline(5000), NULL, "hostile", &fd));
    CHK(hetccl_net_send_all(fd, "garbage garbage garbage garbage garbage garbage", 48,
                            hetccl_net_deadline(5000), NULL, "hostile"));
    close(fd);
    CHK(hetccl_net_connect(&a, hetccl_net_deadline(5000), NULL, "hostile", &fd));
    CHK(hetccl_net_send_all(fd, &hs, sizeof(hs), hetccl_net_deadline(5000), NULL, "hostile"));
    close(fd);
  }
}

/* After connect every rank has closed its listener: a connection to a
 * published address is refused (hetccl_net_connect retries until its
 * deadline, then says ncclTimeout). */
static void listeners_closed(const uint8_t *addrs, int nranks) {
  for (int p = 0; p < nranks; p++) {
    hetccl_net_wire_addr_t w;
    hetccl_sockaddr_t a;
    memcpy(&w, addrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES + 8, sizeof(w));
    if (hetccl_net_addr_from_wire(&w, &a) != ncclSuccess) FAIL("address blob of rank %d", p);
    int fd = -1;
    if (hetccl_net_connect(&a, hetccl_net_deadline(100), NULL, NULL, &fd) == ncclSuccess)
      FAIL("rank %d still accepts connections on its socket listener after connect", p);
  }
}

static int rank_main(const ncclUniqueId *id, int nranks) {
  hetccl_bootstrap_t *bs;
  hetccl_bootstrap_opts_t o = {.timeout_ms = 20000};
  int dummy = rank, *dummies = calloc(nranks, sizeof(int));
  CHK(hetccl_bootstrap_init(id, rank, nranks, &dummy, sizeof(dummy), dummies, &o, &bs));
  hetccl_transport_args_t args = {.rank = rank, .nranks = nranks,
                                  .comm_id = hetccl_bootstrap_id_comm_id(id),
                                  .secret = hetccl_bootstrap_id_secret(id), .timeout_ms = 20000,
                                  .abort_flag = NULL, .ifname = "", .peer_note = &peer_note};
  hetccl_tctx_t *ctx;
  uint8_t mine[HETCCL_TRANSPORT_ADDR_BYTES];
  uint8_t *addrs = malloc(nranks * HETCCL_TRANSPORT_ADDR_BYTES);
  CHK(T->ctx_create(&args, &ctx, mine));
  CHK(hetccl_bootstrap_allgather(bs, mine, addrs, HETCCL_TRANSPORT_ADDR_BYTES));
  uint8_t *use = malloc(nranks);
  for (int p = 0; p < nranks; p++) use[p] = p != rank;
  hetccl_ep_t **eps = calloc(nranks, sizeof(*eps));
  hetccl_peer_locality_t *loc = calloc(nranks, sizeof(*loc));
  if (rank == 0) hostile(addrs, nranks, args.comm_id, args.secret);
  CHK(T->connect(ctx, use, addrs, loc, eps));
  CHK(hetccl_bootstrap_barrier(bs));
  if (rank == 0) listeners_closed(addrs, nranks);

  uint8_t *sbuf[NSIZES];
  for (size_t k = 0; k < NSIZES; k++) {
    sbuf[k] = malloc(sizes[k] + 1);
    for (size_t i = 0; i < sizes[k]; i++) sbuf[k][i] = content(rank, sizes[k], i);
  }
  exchange(eps, nranks, sbuf, 0);
  exchange(eps, nranks, sbuf, 1);
  exchange(eps, nranks, sbuf, 0); /* sequence numbers carry on */
  throughput(bs, eps, nranks, sbuf[NSIZES - 1]);
  error_paths(bs, eps, nranks, &ctx);

  for (int p = 0; p < nranks; p++) T->ep_close(eps[p]);
  T->ctx_destroy(ctx);
  hetccl_bootstrap_destroy(bs);
  for (size_t k = 0; k < NSIZES; k++) free(sbuf[k]);
  free(eps);
  free(loc);
  free(use);
  free(addrs);
  free(dummies);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 2 || n > 8) {
    fprintf(stderr, "usage: %s NPROCS (2..8)\n", argv[0]);
    return 2;
  }
  setenv("HETCCL_CONNECT_TIMEOUT", "20", 0);
  int idpipe[2]; /* rank 0 makes the id after the fork (common/share_id.h) */
  if (pipe(idpipe) != 0) return 1;
  pid_t pids[8];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      rank = r;
      alarm(90);
      ncclUniqueId id;
      if (share_id(&id, idpipe, r, n, hetccl_bootstrap_root_create) != 0) {
        fprintf(stderr, "rank %d: no unique id\n", r);
        _exit(1);
      }
      _exit(rank_main(&id, n));
    }
  }
  close(idpipe[0]);
  close(idpipe[1]);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
      bad = 1;
    }
  }
  printf("socket transport, %d processes: %s\n", n, bad ? "FAIL" : "ok");
  return bad;
}
