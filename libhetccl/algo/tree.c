/* Rooted collectives on a chain or a binomial tree: Broadcast (pipelined
 * chain for large messages, binomial tree for small ones) and small Reduce
 * (binomial tree towards the root; large Reduce is in ring.c). The trees
 * are schedules (sched/sched.h); the chain is a plan of ring.c's, written
 * as one there.
 *
 * Ranks are numbered relative to the root (v = rank - root mod n).
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

#include <math.h>
#include <string.h>

/* Chain root -> root+1 -> ... : step 0 receives piece p from the left,
 * step 1 forwards it to the right; the executor overlaps piece p+1's
 * receive with piece p's send. The root copies into its own recvbuf piece
 * by piece while sending from sendbuf. */
static void chain_io(const ring_plan_t *pl, int p, int s, ring_io_t *io) {
  int v = algo_mod(pl->rank - pl->c->root, pl->nranks);
  size_t e = pl->esize, off = (size_t)p * pl->piece; /* one block: the whole buffer */
  size_t len = off < pl->count ? algo_min(pl->piece, pl->count - off) : 0;
  memset(io, 0, sizeof(*io));
  if (s == 0) {
    if (v != 0) {
      io->recv = pl->out + off * e;
      io->rbytes = len * e;
    }
    return;
  }
  if (v == pl->nranks - 1) return;
  io->send = (v == 0 ? pl->in : pl->out) + off * e;
  io->sbytes = len * e;
  if (v == 0 && pl->in != pl->out) {
    io->prep_dst = pl->out + off * e;
    io->prep_src = pl->in + off * e;
    io->prep_count = len;
    io->prep_copy = 1;
  }
}

/* The chain's piece, in elements (0: the ring's rule alone). K pieces
 * through a chain of n ranks take about (K + n - 2) piece times, each
 * alpha + P / beta, which is least at P = sqrt(bytes * alpha * beta /
 * (n - 2)); the pieces of the rings (a quarter of the message, up to the
 * pipeline chunk) leave a long chain waiting for its pipe to fill. On the
 * 16-core machine's host at n=8 (2026-12-08, torch's tensors; docs/
 * measurements.md, "Seven readers of one buffer") a piece-hop took 12.4 us
 * at 64 KiB and 22.4 us at 128 KiB: alpha 2.4 us, beta 6.5 GB/s, their
 * product about CHAIN_ALPHA_BETA bytes. There 1 MiB took 678 us in the
 * rings' 256 KiB pieces, 290 us in 128 KiB and 234 us in 64 KiB; 4 MiB
 * 1.77 ms in 1 MiB pieces, 851-869 us in 64-128 KiB. Never below
 * CHAIN_MIN_PIECE (64 KiB, the smallest measured) nor so small that the
 * message takes more than HETCCL_ALGO_MAX_PIECES, and two ranks (one hop,
 * nothing to fill) keep the rings' rule. */
#define CHAIN_ALPHA_BETA 15700.0
#define CHAIN_MIN_PIECE (64u << 10)

static size_t chain_piece(size_t bytes, int n, size_t esize) {
  if (n <= 2) return 0;
  size_t best = (size_t)sqrt((double)bytes * CHAIN_ALPHA_BETA / (double)(n - 2));
  size_t fewest = bytes / HETCCL_ALGO_MAX_PIECES + 1;
  if (best < CHAIN_MIN_PIECE) best = CHAIN_MIN_PIECE;
  if (best < fewest) best = fewest;
  best = algo_round_up(best, 64);
  return best / esize ? best / esize : 1;
}

ncclResult_t hetccl_chain_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  memset(&pl, 0, sizeof(pl));
  pl.e = e;
  pl.c = c;
  pl.rank = hetccl_engine_rank(e);
  pl.nranks = hetccl_engine_nranks(e);
  pl.left = algo_mod(pl.rank - 1, pl.nranks);
  pl.right = algo_mod(pl.rank + 1, pl.nranks);
  pl.esize = hetccl_dtype_size(c->dtype);
  pl.count = c->count;
  pl.in = c->sendbuf;
  pl.out = c->recvbuf;
  pl.nsteps = 2;
  pl.io = chain_io;
  hetccl_ring_pieces(&pl, c->count, chain_piece(c->count * pl.esize, pl.nranks, pl.esize));
  return hetccl_ring_run(&pl);
}

/* Lowest set bit of v; for the root (v == 0), the first power of two >= n. */
static int tree_span(int v, int n) {
  if (v) return v & -v;
  int m = 1;
  while (m < n) m <<= 1;
  return m;
}

/* Binomial Broadcast: relative rank v receives from its parent, then
 * forwards to its children (log2 n at most, all posted at once), the
 * farthest first: each subtree then starts sooner. A schedule
 * (sched/sched.h). */
ncclResult_t hetccl_tree_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e), root = c->root;
  int v = algo_mod(r - root, n), span = tree_span(v, n), rounds = 0;
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  for (int m = 1; m < span; m <<= 1) rounds++;
  hetccl_sched_t *s = hetccl_algo_sched(e, NULL, rounds + 1, 0, NULL);
  if (!s) return ncclSystemError;
  s->pull_ok = 1; /* plain receives: children may read our buffer in place */
  int got = v == 0 ? hetccl_sched_copy(s, c->recvbuf, c->sendbuf, bytes, HETCCL_STEP_NONE,
                                       HETCCL_STEP_NONE)
                   : hetccl_sched_recv(s, algo_mod(v - span + root, n), c->recvbuf, bytes,
                                       HETCCL_STEP_NONE, HETCCL_STEP_NONE);
  for (int mask = span >> 1; mask > 0; mask >>= 1)
    if (v + mask < n)
      hetccl_sched_send(s, algo_mod(v + mask + root, n), c->recvbuf, bytes, got, HETCCL_STEP_NONE);
  return hetccl_sched_run_host(s, c->tag);
}

/* Binomial reduce: relative rank v gathers the partial results of its
 * children v+1, v+2, v+4, ... (each covering the ranks up to the next
 * one), combines them in that order (rank order, whatever the arrival
 * order: each as soon as it and the one before are in) and passes the
 * result to its parent. A schedule (sched/sched.h). */
ncclResult_t hetccl_tree_reduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e), root = c->root;
  int v = algo_mod(r - root, n), span = tree_span(v, n), nchild = 0;
  size_t bytes = c->count * hetccl_dtype_size(c->dtype), stride = algo_round_up(bytes, 64);
  for (int mask = 1; mask < span && v + mask < n; mask <<= 1) nchild++;
  char *acc;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, 2 * nchild + 4, stride * (size_t)(1 + nchild),
                                        (void **)&acc);
  if (!s) return ncclSystemError;
  int prev = hetccl_sched_prepare(s, acc, c->sendbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
  for (int i = 0; i < nchild; i++) { /* log2 n receives at most, all posted at once */
    char *in = acc + (size_t)(1 + i) * stride;
    int got = hetccl_sched_recv(s, algo_mod(v + (1 << i) + root, n), in, bytes, HETCCL_STEP_NONE,
                                HETCCL_STEP_NONE);
    prev = hetccl_sched_reduce(s, acc, acc, in, bytes, prev, got, HETCCL_STEP_NONE);
  }
  if (v != 0) {
    hetccl_sched_send(s, algo_mod(v - span + root, n), acc, bytes, prev, HETCCL_STEP_NONE);
    return hetccl_sched_run_host(s, c->tag);
  }
  prev = hetccl_sched_finish(s, acc, bytes, prev, HETCCL_STEP_NONE);
  hetccl_sched_copy(s, c->recvbuf, acc, bytes, prev, HETCCL_STEP_NONE);
  return hetccl_sched_run_host(s, c->tag);
}
