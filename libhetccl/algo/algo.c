/* Collective dispatch: picks an algorithm by collective, size, rank count
 * and HETCCL_ALGO, and handles what every algorithm shares (count 0, one
 * rank). Also the helpers of algo_impl.h.
 *
 * Thread: whichever thread drives the engine; never allocates (scratch
 * comes from hetccl_engine_scratch). */
#include "algo/algo_impl.h"

#include <string.h>

#include "util/knobs.h"
#include "util/log.h"

const char *hetccl_func_name(hetccl_func_t f) {
  static const char *const names[HETCCL_FUNC_COUNT] = {
#define HETCCL_FUNC_NAME(id, name) [HETCCL_FUNC_##id] = name,
      HETCCL_FUNCS(HETCCL_FUNC_NAME)
#undef HETCCL_FUNC_NAME
  };
  return (int)f >= 0 && f < HETCCL_FUNC_COUNT ? names[f] : "unknown";
}

/* --- shared helpers --------------------------------------------------------- */

void hetccl_algo_consume(void *ctx, void *dst, const void *src, size_t bytes) {
  const algo_red_ctx_t *c = ctx;
  size_t n = bytes / hetccl_dtype_size(c->op->dtype);
  const char *in = c->in_base + ((char *)dst - c->dst_base);
  if (n == 0) return;
  if (c->op->premul) { /* this rank's contribution is scaled exactly here, once */
    hetccl_reduce_prepare(c->op, dst, in, n);
    in = dst;
  }
  if (c->in_right)
    algo_reduce(c->op, dst, src, in, n);
  else
    algo_reduce(c->op, dst, in, src, n);
}

void hetccl_algo_trace_reduce(const hetccl_redop_t *op, size_t count, uint64_t t0) {
  /* The pairwise operator: a PreMulSum or an average sums (its scaling is
   * applied once, apart). */
  hetccl_trace_ev_t ev = {.kind = HETCCL_TRACE_REDUCE, .name = "reduce",
                          .op = hetccl_redop_name((ncclRedOp_t)op->kind),
                          .dtype = hetccl_dtype_name(op->dtype),
                          .bytes = count * hetccl_dtype_size(op->dtype), .rank = HETCCL_TRACE_NONE,
                          .peer = HETCCL_TRACE_NONE, .root = HETCCL_TRACE_NONE,
                          .step = HETCCL_TRACE_NONE, .seq = HETCCL_TRACE_NO_SEQ};
  hetccl_trace_record(t0, &ev);
}

void hetccl_algo_block(size_t count, size_t esize, int n, int b, size_t *off, size_t *cnt) {
  size_t align = esize < 64 ? 64 / esize : 1;
  size_t base = algo_round_up((count + (size_t)n - 1) / (size_t)n, align);
  size_t o = algo_min((size_t)b * base, count);
  *off = o;
  *cnt = algo_min(base, count - o);
}

/* Below this, splitting a block buys less overlap than the extra messages
 * cost. */
#define MIN_PIECE_BYTES (64u << 10)

size_t hetccl_algo_piece(const hetccl_engine_t *e, size_t block, size_t esize) {
  size_t chunk = hetccl_engine_pipeline_chunk(e); /* a multiple of 64 */
  size_t want = algo_round_up(block * esize / 4 + 1, 64);
  if (want < MIN_PIECE_BYTES) want = MIN_PIECE_BYTES;
  return algo_min(want, chunk) / esize;
}

void hetccl_algo_window_init(algo_window_t *w) { memset(w, 0, sizeof(*w)); }

static ncclResult_t window_retire(hetccl_engine_t *e, algo_window_t *w, int i) {
  hetccl_req_t *reqs[2] = {w->sposted[i] ? &w->sreq[i] : NULL, w->rposted[i] ? &w->rreq[i] : NULL};
  w->sposted[i] = w->rposted[i] = 0;
  return hetccl_engine_wait(e, reqs, 2);
}

ncclResult_t hetccl_algo_window_step(hetccl_engine_t *e, algo_window_t *w, int to,
                                     const void *sbuf, size_t sbytes, int from, void *rbuf,
                                     size_t rbytes) {
  int i = w->nsteps++ % HETCCL_ALGO_WINDOW;
  HETCCL_CHECK(window_retire(e, w, i));
  if (from >= 0 && rbytes) {
    HETCCL_CHECK(hetccl_engine_irecv(e, from, rbuf, rbytes, NULL, NULL, &w->rreq[i]));
    w->rposted[i] = 1;
  }
  if (to >= 0 && sbytes) {
    HETCCL_CHECK(hetccl_engine_isend(e, to, sbuf, sbytes, &w->sreq[i]));
    w->sposted[i] = 1;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_algo_window_drain(hetccl_engine_t *e, algo_window_t *w) {
  for (int i = 0; i < HETCCL_ALGO_WINDOW; i++) HETCCL_CHECK(window_retire(e, w, i));
  return ncclSuccess;
}

ncclResult_t hetccl_algo_pairwise(hetccl_engine_t *e, const char *sbase, size_t sstride,
                                  char *rbase, size_t rstride, size_t bytes, int copy_own) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  int copy_at = copy_own ? (n - 1 < HETCCL_ALGO_WINDOW ? n - 1 : HETCCL_ALGO_WINDOW) : 0;
  algo_window_t w;
  hetccl_algo_window_init(&w);
  for (int k = 1; k < n; k++) {
    int to = algo_mod(r + k, n), from = algo_mod(r - k, n);
    HETCCL_CHECK(hetccl_algo_window_step(e, &w, to, sbase + (size_t)to * sstride, bytes, from,
                                         rbase + (size_t)from * rstride, bytes));
    if (k == copy_at) algo_copy(rbase + (size_t)r * rstride, sbase + (size_t)r * sstride, bytes);
  }
  return hetccl_algo_window_drain(e, &w);
}

/* --- one rank ---------------------------------------------------------------- */

/* Every collective on one rank is a local copy, reduced ones with the
 * premul/average applied (the contribution is the whole result). */
static ncclResult_t run_single(const hetccl_coll_t *c) {
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  switch (c->func) {
    case HETCCL_FUNC_ALLREDUCE:
    case HETCCL_FUNC_REDUCE:
    case HETCCL_FUNC_REDUCESCATTER:
      if (!c->recvbuf) return ncclSuccess;
      hetccl_reduce_prepare(&c->op, c->recvbuf, c->sendbuf, c->count);
      hetccl_reduce_finish(&c->op, c->recvbuf, c->count);
      return ncclSuccess;
    default:
      algo_copy(c->recvbuf, c->sendbuf, bytes);
      return ncclSuccess;
  }
}

/* --- selection ----------------------------------------------------------------- */

/* Small AllReduce on up to this many ranks exchanges whole buffers with
 * every peer (one round); on more, recursive doubling (log2 n rounds).
 * The direct exchange costs each rank n - 1 messages to post and poll: on
 * the 16-core machine it took 21 us at n = 16 (1.06 x MPICH's 23 us), where
 * four rounds of one message cost a few. */
#define DIRECT_ALLREDUCE_MAX_RANKS 4

/* Large AllReduce by reads (pull_ar.c: a ReduceScatter and an AllGather,
 * each rank reading from its peers) where single copy is on and it beats
 * the ring. On the 16-core machine against MPICH (tools/device/cpu_sweep.sh,
 * group "ar", paired medians, 2026-11-29; docs/measurements.md), pull / ring:
 * at 64 MiB n=2 2.39 / 2.84, n=4 2.39 / 1.61, n=8 2.80 / 1.64, n=16 3.27 /
 * 1.68; at 1 MiB n=2 1.81 / 1.47, n=4 1.55 / 1.95, n=8 1.42 / 1.57, n=16
 * 1.26 / 0.90. So: from PULL_ALLREDUCE_MIN_RANKS ranks at
 * PULL_ALLREDUCE_BYTES and more, and on more than PULL_ALLREDUCE_WIDE_RANKS
 * ranks from PULL_ALLREDUCE_WIDE_BYTES (each rank's block is then small, and
 * the ring's 2 (n - 1) steps cost more than the reads). */
#define PULL_ALLREDUCE_MIN_RANKS 4
#define PULL_ALLREDUCE_BYTES (4u << 20)
#define PULL_ALLREDUCE_WIDE_RANKS 8
#define PULL_ALLREDUCE_WIDE_BYTES (1u << 20)

static int pull_allreduce_pays(const hetccl_engine_t *e, int n, size_t bytes) {
  if (bytes <= hetccl_engine_pull_min(e)) return 0; /* single copy is off, or too small */
  if (n > PULL_ALLREDUCE_WIDE_RANKS && bytes >= PULL_ALLREDUCE_WIDE_BYTES) return 1;
  return n >= PULL_ALLREDUCE_MIN_RANKS && bytes >= PULL_ALLREDUCE_BYTES;
}

static ncclResult_t run_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c, int algo,
                                  size_t bytes) {
  int n = hetccl_engine_nranks(e);
  if (algo == HETCCL_ALGO_PULL && c->op.premul) algo = HETCCL_ALGO_RING; /* pull_rs.c */
  if (algo < 0) {
    if (bytes <= hetccl_engine_small_bytes(e))
      algo = n <= DIRECT_ALLREDUCE_MAX_RANKS ? HETCCL_ALGO_DIRECT : HETCCL_ALGO_RD;
    else if (!c->op.premul && pull_allreduce_pays(e, n, bytes))
      algo = HETCCL_ALGO_PULL;
    else
      algo = HETCCL_ALGO_RING;
  }
  switch (algo) {
    case HETCCL_ALGO_RING: return hetccl_ring_allreduce(e, c);
    case HETCCL_ALGO_RD: return hetccl_rd_allreduce(e, c);
    case HETCCL_ALGO_PULL: return hetccl_pull_allreduce(e, c);
    default: return hetccl_direct_allreduce(e, c);
  }
}

/* HETCCL_ALGO: an algorithm, or -1 for auto. */
static int algo_forced(void) {
  switch (hetccl_knob_enum(HETCCL_KNOB_ALGO)) {
    case HETCCL_KNOB_ALGO_ring: return HETCCL_ALGO_RING;
    case HETCCL_KNOB_ALGO_rd: return HETCCL_ALGO_RD;
    case HETCCL_KNOB_ALGO_direct: return HETCCL_ALGO_DIRECT;
    case HETCCL_KNOB_ALGO_pull: return HETCCL_ALGO_PULL;
    default: return -1;
  }
}

ncclResult_t hetccl_algo_run(hetccl_engine_t *e, const hetccl_coll_t *c) {
  size_t esize = hetccl_dtype_size(c->dtype);
  int n = hetccl_engine_nranks(e);
  if (esize == 0) {
    WARN("%s: invalid data type %d", hetccl_func_name(c->func), (int)c->dtype);
    return ncclInvalidArgument;
  }
  if (c->count == 0) return ncclSuccess;
  if (n == 1) return run_single(c);
  size_t bytes = c->count * esize; /* per rank, in NCCL's count convention */
  size_t small = hetccl_engine_small_bytes(e);
  int algo = algo_forced();
  int ring = algo == HETCCL_ALGO_RING || (algo < 0 && bytes * (size_t)n > small);
  int ring1 = algo == HETCCL_ALGO_RING || (algo < 0 && bytes > small);
  /* Reads straight from the peers' buffers where every message of the
   * collective would be pulled anyway (docs/host-engine.md). */
  int pull = algo == HETCCL_ALGO_PULL || (algo < 0 && bytes > hetccl_engine_pull_min(e));
  TRACE(HETCCL_COLL, "%s: %zu x %s on %d ranks, algo %d", hetccl_func_name(c->func), c->count,
        hetccl_dtype_name(c->dtype), n, algo);
  ncclResult_t (*fn)(hetccl_engine_t *, const hetccl_coll_t *) = NULL;
  hetccl_engine_set_pull_ok(e, !hetccl_func_reduces(c->func));
  switch (c->func) {
    case HETCCL_FUNC_ALLREDUCE: return run_allreduce(e, c, algo, bytes);
    case HETCCL_FUNC_REDUCESCATTER:
      if (pull && !c->op.premul) return hetccl_pull_reducescatter(e, c);
      return ring ? hetccl_ring_reducescatter(e, c) : hetccl_direct_reducescatter(e, c);
    case HETCCL_FUNC_ALLGATHER:
      /* Where every peer pulls, a ring's forwarding only adds steps: each
       * rank reads every block from its owner (one copy either way). */
      if (pull) return hetccl_direct_allgather(e, c);
      return ring ? hetccl_ring_allgather(e, c) : hetccl_direct_allgather(e, c);
    case HETCCL_FUNC_ALLTOALL: return hetccl_pairwise_alltoall(e, c);
    case HETCCL_FUNC_BROADCAST:
      fn = pull ? hetccl_pull_broadcast : ring1 ? hetccl_chain_broadcast : hetccl_tree_broadcast;
      break;
    case HETCCL_FUNC_REDUCE: fn = ring1 ? hetccl_ring_reduce : hetccl_tree_reduce; break;
    case HETCCL_FUNC_GATHER: fn = hetccl_linear_gather; break;
    case HETCCL_FUNC_SCATTER: fn = hetccl_linear_scatter; break;
    default:
      WARN("%s: not a collective the engine runs", hetccl_func_name(c->func));
      return ncclInvalidUsage;
  }
  /* Rooted: ranks naming different roots may never receive from each
   * other, so the signature ring checks the root (engine.h). */
  HETCCL_CHECK(hetccl_engine_token_post(e));
  HETCCL_CHECK(fn(e, c));
  return hetccl_engine_token_wait(e);
}
