/* The host engine's algorithms and the one table that chooses among them.
 *
 * A collective takes the first row of its function whose conditions all
 * hold (auto), or, under HETCCL_ALGO=<word>, the first row of its function
 * that the word names and whose hard condition (NEED_PLAIN_OP) holds, else
 * the function's unconditional row. Each choice is said once per process
 * at INFO (the row, its reason) and per call at TRACE (HETCCL_COLL).
 *
 *   function       algorithm (file)            when (auto)
 *   AllReduce      direct exchange (rd.c)      small, on up to 4 ranks
 *                  halving-doubling (rhd.c)    8 KiB < bytes <= 256 KiB, on more; and
 *                                              1 MiB < bytes < 16 MiB on more than 8
 *                  recursive doubling (rd.c)   small, on more
 *                  reads (pull_ar.c)           single copy on, and large enough that it pays
 *                  ring (ring.c)               otherwise
 *   ReduceScatter  reads (pull_rs.c)           single copy on for these messages
 *                  ring (ring.c)               the whole buffer past the small size
 *                  direct (rd.c)               otherwise
 *   AllGather      direct, read (rd.c)         single copy on for these messages
 *                  ring (ring.c)               the whole buffer past the small size
 *                  direct (rd.c)               otherwise
 *   AlltoAll       pairwise (a2a.c)            always
 *   Broadcast      reads (pull_bcast.c)        single copy on for these messages, on
 *                                              up to 4 ranks or more ranks than CPUs
 *                  chain (tree.c)              past the small size
 *                  binomial tree (tree.c)      otherwise
 *   Reduce         ring (ring.c)               past the small size
 *                  binomial tree (tree.c)      otherwise
 *   Gather/Scatter linear (a2a.c)              always
 *   every one      wavefront (pieces.c)        never (HETCCL_ALGO=wavefront: the data
 *                                              plane's form, on the host executor)
 *
 * "small": per rank, up to the engine's small size (HETCCL_SMALL_BYTES);
 * "single copy on": the pair's transport reads the peer's memory from this
 * size (engine.h: pull_min). Adding an algorithm: its file, its declaration
 * and its row here, its word in HETCCL_ALGO's list (util/knobs.h) where it
 * may be forced, and its file in meson.build (docs/architecture.md).
 *
 * Also what every algorithm shares: count 0, one rank, the signature ring
 * around rooted functions.
 *
 * Thread: whichever thread drives the engine; never allocates. */
#include "algo/algo_impl.h"

#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

/* --- the algorithms the table names, each defined in its file ----------------- */

/* ring.c: bandwidth-bound AllReduce / ReduceScatter / AllGather / Reduce */
ncclResult_t hetccl_ring_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_ring_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_ring_allgather(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_ring_reduce(hetccl_engine_t *e, const hetccl_coll_t *c);

/* rd.c: latency-bound AllReduce (direct exchange, recursive doubling),
 * direct AllGather and ReduceScatter */
ncclResult_t hetccl_direct_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_rd_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_direct_allgather(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_direct_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c);

/* rhd.c: AllReduce by recursive halving then doubling, a schedule
 * (sched/sched.h) */
ncclResult_t hetccl_rhd_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c);

/* tree.c: Broadcast (pipelined chain, binomial tree), small Reduce (binomial) */
ncclResult_t hetccl_chain_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_tree_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_tree_reduce(hetccl_engine_t *e, const hetccl_coll_t *c);

/* pull_rs.c, pull_ar.c, pull_bcast.c: every rank reads its share from its
 * peers' buffers (docs/host-engine.md); AllGather and AlltoAll by reads are
 * rd.c's direct and a2a.c's pairwise exchanges over a pulling transport. */
ncclResult_t hetccl_pull_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_pull_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_pull_broadcast(hetccl_engine_t *e, const hetccl_coll_t *c);

/* pieces.c: the data plane's forms (ring wavefronts, two-rank exchanges,
 * chains, direct exchanges) run by the host executor; forced only
 * (HETCCL_ALGO=wavefront), to hold the two executors to one description */
ncclResult_t hetccl_wavefront_run(hetccl_engine_t *e, const hetccl_coll_t *c);

/* a2a.c: pairwise AlltoAll, Gather, Scatter */
ncclResult_t hetccl_pairwise_alltoall(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_linear_gather(hetccl_engine_t *e, const hetccl_coll_t *c);
ncclResult_t hetccl_linear_scatter(hetccl_engine_t *e, const hetccl_coll_t *c);

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
/* Medium AllReduce on more than DIRECT_ALLREDUCE_MAX_RANKS ranks by
 * recursive halving then doubling (rhd.c): the ring's bandwidth in
 * 2 log2 n rounds. On the 16-core machine against MPICH (busbw, paired
 * medians of 3; tools/device/before_after.sh's extra group, 2026-11-29,
 * docs/measurements.md), rhd / the default of then: n=8 16 KiB 2.33 / 1.79
 * GB/s, 64 KiB 3.86 / 2.33, 256 KiB 5.13 / 4.45, 1 MiB 3.55 / 3.94 (ring);
 * n=16 16 KiB 1.99 / 1.33, 64 KiB 3.40 / 1.43, 256 KiB 3.59 / 3.05, 1 MiB
 * 2.73 / 2.96 (reads); at 1-4 KiB recursive doubling stays ahead (n=16 1 KiB
 * 6.6 us against 8.3). */
#define RHD_ALLREDUCE_MIN_BYTES (8u << 10)
#define RHD_ALLREDUCE_MAX_BYTES (256u << 10)

/* On more than PULL_ALLREDUCE_WIDE_RANKS ranks, rhd also beats the reads
 * below 16 MiB (same machine, 3 alternations; docs/measurements.md), rhd /
 * reads / ring, GB/s: n=16 2 MiB 3.17 / 1.86 / 2.93 (MPICH 2.21), 4 MiB
 * 3.03 / 1.72 / 2.41, 8 MiB 3.22 / 2.93 / 2.33; at 1 MiB 2.73 / 2.96 /
 * 2.82 and at 32 MiB 1.97 / 2.99 / 1.64 the reads keep it. */
#define RHD_ALLREDUCE_WIDE_MIN_BYTES (1u << 20)
#define RHD_ALLREDUCE_WIDE_MAX_BYTES (16u << 20)

/* Broadcast by reads while at most PULL_BCAST_MAX_RANKS ranks read the
 * root's buffer at once; on more, the chain (tree.c). Seven readers of one
 * buffer of 4 KiB pages (torch's CPU tensors) contend in process_vm_readv:
 * on the 16-core machine (1 x H100's host, 2026-12-08, n=8, torch's
 * tensors, tools/bench_torch.py --direct; docs/measurements.md, "Seven
 * readers of one buffer") 1 MiB took 702 us by reads against 234 us by the
 * chain (gloo 721), 4 MiB 1.52 ms against 869 us, 256 KiB 89 against 91;
 * at n=4 the reads were 2.3-5.5 x gloo's. Huge-page buffers read far
 * faster (hetccl-perf's from 4 MiB: 1 MiB in 60-90 us at n=8), which is
 * not what a framework hands over. Where the ranks outnumber the CPUs the
 * reads stay: a reader copies whenever it runs, where a chain waits at
 * every hop for that rank to be scheduled (the 2-core machine, n=5 and 8,
 * hetccl-perf: the chain 0.45-0.65 x the reads' speed from 1 MiB). */
#define PULL_BCAST_MAX_RANKS 4

#define PULL_ALLREDUCE_MIN_RANKS 4
#define PULL_ALLREDUCE_BYTES (4u << 20)
#define PULL_ALLREDUCE_WIDE_RANKS 8
#define PULL_ALLREDUCE_WIDE_BYTES (1u << 20)

/* Conditions a row may ask for; all of a row's must hold. */
enum {
  NEED_SMALL = 1u << 0,       /* bytes per rank <= the small size */
  NEED_LARGE = 1u << 1,       /* bytes per rank > the small size */
  NEED_LARGE_TOTAL = 1u << 2, /* bytes of all ranks > the small size */
  NEED_FEW = 1u << 3,         /* n <= DIRECT_ALLREDUCE_MAX_RANKS */
  NEED_PULL = 1u << 4,        /* bytes per rank > the engine's pull_min */
  NEED_PULL_PAYS = 1u << 5,   /* the AllReduce by reads pays (above) */
  NEED_PLAIN_OP = 1u << 6,    /* not PreMulSum (hard: holds when forced too) */
  NEED_MANY = 1u << 7,        /* n > DIRECT_ALLREDUCE_MAX_RANKS */
  NEED_MEDIUM = 1u << 8,      /* RHD_ALLREDUCE_MIN_BYTES < bytes <= RHD_ALLREDUCE_MAX_BYTES */
  NEED_WIDE_MEDIUM = 1u << 9, /* n > PULL_ALLREDUCE_WIDE_RANKS, RHD_ALLREDUCE_WIDE_MIN_BYTES <
                               * bytes < RHD_ALLREDUCE_WIDE_MAX_BYTES */
  NEED_FEW_READERS = 1u << 10, /* n <= PULL_BCAST_MAX_RANKS, or more ranks than CPUs */
};
#define NEED_HARD NEED_PLAIN_OP

typedef ncclResult_t (*algo_fn)(hetccl_engine_t *, const hetccl_coll_t *);

typedef struct rule {
  hetccl_func_t func;
  int word;           /* the HETCCL_ALGO word that forces this row (auto: none) */
  unsigned need;
  const char *name;   /* what runs */
  algo_fn run;
  const char *why;
} rule_t;

#define F(x) HETCCL_FUNC_##x
#define W(x) HETCCL_KNOB_ALGO_##x
static const rule_t rules[] = {
    {F(ALLREDUCE), W(direct), NEED_SMALL | NEED_FEW, "direct exchange", hetccl_direct_allreduce,
     "small, few ranks: one round"},
    {F(ALLREDUCE), W(rhd), NEED_MEDIUM | NEED_MANY, "halving-doubling", hetccl_rhd_allreduce,
     "medium, many ranks: a ring's bandwidth in 2 log2 n rounds"},
    {F(ALLREDUCE), W(rhd), NEED_WIDE_MEDIUM, "halving-doubling", hetccl_rhd_allreduce,
     "1-16 MiB on more than 8 ranks: ahead of the reads there"},
    {F(ALLREDUCE), W(rd), NEED_SMALL, "recursive doubling", hetccl_rd_allreduce,
     "small: log2 n rounds"},
    {F(ALLREDUCE), W(pull), NEED_PULL_PAYS | NEED_PLAIN_OP, "reads", hetccl_pull_allreduce,
     "ranks read each other's memory and it pays"},
    {F(ALLREDUCE), W(ring), 0, "ring", hetccl_ring_allreduce, "bandwidth"},
    {F(ALLREDUCE), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(REDUCESCATTER), W(pull), NEED_PULL | NEED_PLAIN_OP, "reads", hetccl_pull_reducescatter,
     "ranks read each other's memory"},
    {F(REDUCESCATTER), W(ring), NEED_LARGE_TOTAL, "ring", hetccl_ring_reducescatter, "bandwidth"},
    {F(REDUCESCATTER), W(direct), 0, "direct", hetccl_direct_reducescatter, "small: one round"},
    {F(REDUCESCATTER), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(ALLGATHER), W(pull), NEED_PULL, "direct, read", hetccl_direct_allgather,
     "ranks read each other's memory: a ring's forwarding only adds steps"},
    {F(ALLGATHER), W(ring), NEED_LARGE_TOTAL, "ring", hetccl_ring_allgather, "bandwidth"},
    {F(ALLGATHER), W(direct), 0, "direct", hetccl_direct_allgather, "small: one round"},
    {F(ALLGATHER), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(ALLTOALL), W(auto), 0, "pairwise", hetccl_pairwise_alltoall, "the one form"},
    {F(ALLTOALL), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(BROADCAST), W(pull), NEED_PULL | NEED_FEW_READERS, "reads", hetccl_pull_broadcast,
     "ranks read the root's memory"},
    {F(BROADCAST), W(ring), NEED_LARGE, "chain", hetccl_chain_broadcast, "bandwidth"},
    {F(BROADCAST), W(auto), 0, "binomial tree", hetccl_tree_broadcast, "small: log2 n rounds"},
    {F(BROADCAST), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(REDUCE), W(ring), NEED_LARGE, "ring", hetccl_ring_reduce, "bandwidth"},
    {F(REDUCE), W(auto), 0, "binomial tree", hetccl_tree_reduce, "small: log2 n rounds"},
    {F(REDUCE), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(GATHER), W(auto), 0, "linear", hetccl_linear_gather, "the one form"},
    {F(GATHER), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
    {F(SCATTER), W(auto), 0, "linear", hetccl_linear_scatter, "the one form"},
    {F(SCATTER), W(wavefront), 0, "wavefront", hetccl_wavefront_run,
     "the data plane's form"},
};
#undef F
#undef W
#define NRULES ((int)(sizeof(rules) / sizeof(rules[0])))

static int pull_allreduce_pays(const hetccl_engine_t *e, int n, size_t bytes) {
  if (bytes <= hetccl_engine_pull_min(e)) return 0; /* single copy is off, or too small */
  if (n > PULL_ALLREDUCE_WIDE_RANKS && bytes >= PULL_ALLREDUCE_WIDE_BYTES) return 1;
  return n >= PULL_ALLREDUCE_MIN_RANKS && bytes >= PULL_ALLREDUCE_BYTES;
}

/* The conditions that hold for c on e (bytes per rank). */
static unsigned conditions(const hetccl_engine_t *e, const hetccl_coll_t *c, size_t bytes) {
  int n = hetccl_engine_nranks(e);
  size_t small = hetccl_engine_small_bytes(e);
  unsigned have = 0;
  have |= bytes <= small ? NEED_SMALL : NEED_LARGE;
  if (bytes * (size_t)n > small) have |= NEED_LARGE_TOTAL;
  have |= n <= DIRECT_ALLREDUCE_MAX_RANKS ? NEED_FEW : NEED_MANY;
  if (bytes > RHD_ALLREDUCE_MIN_BYTES && bytes <= RHD_ALLREDUCE_MAX_BYTES) have |= NEED_MEDIUM;
  /* (ranks that all read each other's memory are on this host) */
  if (n <= PULL_BCAST_MAX_RANKS || n > hetccl_host_cpus()) have |= NEED_FEW_READERS;
  if (n > PULL_ALLREDUCE_WIDE_RANKS && bytes > RHD_ALLREDUCE_WIDE_MIN_BYTES &&
      bytes < RHD_ALLREDUCE_WIDE_MAX_BYTES)
    have |= NEED_WIDE_MEDIUM;
  if (bytes > hetccl_engine_pull_min(e)) have |= NEED_PULL;
  if (pull_allreduce_pays(e, n, bytes)) have |= NEED_PULL_PAYS;
  if (!(hetccl_func_reduces(c->func) && c->op.premul)) have |= NEED_PLAIN_OP;
  return have;
}

/* How a row was taken. */
enum { BY_RULE, BY_FORCE, BY_FALLBACK };
static const char *const how_text[] = {"", "HETCCL_ALGO; ", "HETCCL_ALGO names no row that fits; "};

static const rule_t *choose(const hetccl_engine_t *e, const hetccl_coll_t *c, size_t bytes,
                            int *how) {
  int forced = hetccl_knob_enum(HETCCL_KNOB_ALGO);
  unsigned have = conditions(e, c, bytes);
  const rule_t *fallback = NULL;
  for (int i = 0; i < NRULES; i++) {
    const rule_t *r = &rules[i];
    if (r->func != c->func) continue;
    if (forced != HETCCL_KNOB_ALGO_auto) {
      *how = BY_FORCE;
      if (r->word == forced && (r->need & NEED_HARD & ~have) == 0) return r;
      if (!r->need && !fallback) fallback = r;
    } else if ((r->need & ~have) == 0) {
      *how = BY_RULE;
      return r;
    }
  }
  *how = BY_FALLBACK;
  return fallback;
}

/* Once per process and row, at INFO: which row a function took, and why. */
static void say_choice(const rule_t *r, int how, const hetccl_coll_t *c, size_t bytes, int n) {
  static unsigned char said[NRULES];
  int i = (int)(r - rules);
  TRACE(HETCCL_COLL, "%s: %zu x %s (%zu bytes per rank) on %d ranks: %s (%s%s)",
        hetccl_func_name(c->func), c->count, hetccl_dtype_name(c->dtype), bytes, n, r->name,
        how_text[how], r->why);
  if (__atomic_exchange_n(&said[i], 1, __ATOMIC_RELAXED)) return;
  INFO(HETCCL_COLL, "host engine: %s of %zu bytes per rank on %d ranks takes %s (%s%s); "
       "the first such call, later ones are not logged", hetccl_func_name(c->func), bytes, n,
       r->name, how_text[how], r->why);
}

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
  int how;
  const rule_t *r = choose(e, c, bytes, &how);
  if (!r) {
    WARN("%s: not a collective the engine runs", hetccl_func_name(c->func));
    return ncclInvalidUsage;
  }
  if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_COLL)) say_choice(r, how, c, bytes, n);
  if (!hetccl_func_rooted(c->func)) return r->run(e, c);
  /* Rooted: ranks naming different roots may never receive from each
   * other, so the signature ring checks the root (engine.h). */
  HETCCL_CHECK(hetccl_engine_token_post(e, c->tag));
  HETCCL_CHECK(r->run(e, c));
  return hetccl_engine_token_wait(e);
}
