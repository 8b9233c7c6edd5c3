/* ReduceScatter by reads: every rank reads its own block straight from each
 * peer's send buffer and reduces it there, in rank order.
 *
 * Contract (besides algo.h's): the built-in operators (not PreMulSum: a
 * peer's scalar is the peer's, and the reader only sees raw data; algo.c
 * sends PreMulSum to the ring). Meant for ranks that can read each other's
 * memory (the engine's pull_min: shm with single copy on, process_vm_readv);
 * correct whatever the transport, since a message below pull_min simply
 * travels through the transport and is reduced as it lands.
 *
 * How, as a schedule (sched/sched.h) the host executor runs: rank r posts,
 * to every peer p, sends of its block p, one per sub-block
 * (PULL_SUB_BYTES), which a pulling transport turns into addresses the
 * reader reads from; then, sub-block by sub-block (each one's first step
 * after the last of the one before), it receives its piece of block r
 * from rank 0, 1, ..., n-1 in turn (each receive after the one before), the
 * first into the destination as a plain copy, each later one reduced into
 * it as it is read (the transport's consume hook: dst = dst op incoming,
 * in L2-sized pieces), its own contribution folded in at its place in the
 * order. So each byte of a peer's block is copied once (by the reader,
 * into a cache-sized bounce buffer) and reduced once, with no ring step
 * through a slot and no partial sums in memory, and the piece being
 * reduced stays in cache for its n contributions; every element is still
 * reduced in rank order, a function of the ranks only, so runs repeat
 * bitwise (algo_impl.h) whatever the sub-block size.
 *
 * In place, rank r > 0 copies each sub-block of its own contribution aside
 * before rank 0's piece overwrites it (one sub-block of scratch); peers
 * never read block r of our buffer, only their own blocks.
 *
 * Where the ranks are many and the cores fast (16-core machine), the ring
 * copies each byte into a slot that another core then reads: the reads
 * here skip that copy and the cross-core traffic (docs/host-engine.md).
 *
 * Also the first half of the pull AllReduce (pull_ar.c), through
 * hetccl_pull_build_own.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

/* Sub-blocks: rank r reduces its block in pieces of about this many bytes,
 * each from rank 0, 1, ..., n-1 before the next piece, so that the piece
 * of the destination stays in this core's L2 (2 MiB a core on the 16-core
 * machine) while the n contributions are folded into it. Reduced whole, a
 * block larger than L2 goes to memory and back n times: a 64 MiB AllReduce
 * at n = 4 took 36.6 ms whole and 24.3 ms as sixteen 4 MiB operations
 * (through torch, 16-core machine). Half of L2 leaves room for the
 * transport's 256 KiB bounce buffer and the incoming lines. The engine's
 * pipeline chunk (HETCCL_PIPELINE_CHUNK, 1 MiB unset) caps it, so that
 * tests reach many sub-blocks with small buffers. */
#define PULL_SUB_BYTES (1u << 20)
/* At most this many sub-blocks per block, whatever the pipeline chunk
 * says (a test's 64-byte chunk on a 4 MiB buffer): a schedule's steps
 * grow with them. What is in flight to a peer does not: sends go at most
 * PULL_OFFERS_AHEAD ahead, the gather's receives HETCCL_ALGO_WINDOW. */
#define PULL_MAX_SUBS 1024

/* Block b of a pull plan: [off, off + cnt) elements of every rank's input. */
void hetccl_pull_block(const pull_plan_t *pl, int b, size_t *off, size_t *cnt) {
  if (pl->blockcount) {
    *off = (size_t)b * pl->blockcount;
    *cnt = pl->blockcount;
  } else {
    hetccl_algo_block(pl->count, hetccl_dtype_size(pl->c->dtype), hetccl_engine_nranks(pl->e),
                      b, off, cnt);
  }
}

int hetccl_pull_subs(const pull_plan_t *pl, size_t cnt, size_t *per) {
  size_t es = hetccl_dtype_size(pl->c->dtype);
  size_t sub = algo_min(PULL_SUB_BYTES, hetccl_engine_pipeline_chunk(pl->e)); /* >= 64 */
  size_t align = es < 64 ? 64 / es : 1;
  if (cnt == 0) {
    *per = 0;
    return 0;
  }
  /* Equal pieces, each a multiple of 64 bytes but the last: none of them
   * so small that it falls under the single-copy threshold. */
  size_t m = (cnt * es + sub - 1) / sub;
  if (m > PULL_MAX_SUBS) m = PULL_MAX_SUBS;
  *per = algo_round_up((cnt + m - 1) / m, align);
  return (int)((cnt + *per - 1) / *per);
}

/* Offers ahead: a peer finds this many sub-blocks of its block offered
 * at once, however busy this rank's thread is with its own reduction.
 * Four (HETCCL_ALGO_WINDOW, commit 7ab9eb0) made a two-rank ReduceScatter
 * of 16 MiB by reads (eight 1 MiB sub-blocks a peer) take 1.0-1.16 ms
 * instead of 0.81-1.02 out of place and 0.96-1.05 instead of 0.64-0.73 in
 * place (2-core machine, hetccl-perf, reads forced): the reader waited
 * for offers this rank posted only between its own reduction steps. The
 * bound keeps what is in flight, which the executor looks at after each
 * event, finite where a tiny pipeline chunk cuts a block into
 * PULL_MAX_SUBS sub-blocks (the tests' sweeps). */
#define PULL_OFFERS_AHEAD 64

/* Every peer p reads block p of our input, one message per sub-block, in
 * the order it receives them: peer by peer, nearest first, sub-blocks in
 * order (a pair's messages match in posting order), each after the one
 * PULL_OFFERS_AHEAD earlier has been read. No step of ours waits for
 * them; the schedule ends only once every peer has read its block (our
 * buffer stays readable until then). */
static void build_sends(hetccl_sched_t *s, const pull_plan_t *pl) {
  int n = s->nranks, r = s->rank;
  size_t es = hetccl_dtype_size(pl->c->dtype);
  for (int k = 1; k < n; k++) {
    int p = algo_mod(r + k, n), first = HETCCL_STEP_NONE;
    size_t off, cnt, per;
    hetccl_pull_block(pl, p, &off, &cnt);
    int m = hetccl_pull_subs(pl, cnt, &per);
    for (int j = 0; j < m; j++) { /* a peer's offers are consecutive steps */
      size_t o = (size_t)j * per, sc = algo_min(per, cnt - o);
      int ahead = j >= PULL_OFFERS_AHEAD && first != HETCCL_STEP_NONE
                      ? first + j - PULL_OFFERS_AHEAD : HETCCL_STEP_NONE;
      int sent = hetccl_sched_send(s, p, pl->in + (off + o) * es, sc * es, ahead,
                                   HETCCL_STEP_NONE);
      if (j == 0) first = sent;
    }
  }
}

/* Sub-block `sub` (sc elements) of the result, after step `prev`: ranks
 * 0..n-1 in turn, each step after the one before, the first copied in,
 * each later one reduced into it as it is read (dst = dst (op) incoming);
 * `own` is this rank's contribution (never the destination itself, but
 * for rank 0). Returns the step that finishes it (Avg's division). */
static int build_sub(hetccl_sched_t *s, const pull_plan_t *pl, char *sub, const char *own,
                     size_t sc, int prev) {
  int n = s->nranks, r = s->rank;
  size_t bytes = sc * hetccl_dtype_size(pl->c->dtype);
  for (int j = 0; j < n; j++) {
    if (j == r && j == 0) prev = hetccl_sched_copy(s, sub, own, bytes, prev, HETCCL_STEP_NONE);
    else if (j == r)
      prev = hetccl_sched_reduce(s, sub, sub, own, bytes, prev, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    else if (j == 0) prev = hetccl_sched_recv(s, j, sub, bytes, prev, HETCCL_STEP_NONE);
    else prev = hetccl_sched_recv_reduce(s, j, sub, sub, 0, bytes, prev, HETCCL_STEP_NONE);
  }
  return hetccl_sched_finish(s, sub, bytes, prev, HETCCL_STEP_NONE);
}

size_t hetccl_pull_saved_bytes(const pull_plan_t *pl) {
  size_t off, cnt, per;
  hetccl_pull_block(pl, hetccl_engine_rank(pl->e), &off, &cnt);
  hetccl_pull_subs(pl, cnt, &per);
  return algo_round_up(per * hetccl_dtype_size(pl->c->dtype), 64);
}

int hetccl_pull_build_own(hetccl_sched_t *s, const pull_plan_t *pl, char *saved) {
  int n = s->nranks, r = s->rank;
  size_t es = hetccl_dtype_size(pl->c->dtype), off, cnt, per;
  build_sends(s, pl);
  hetccl_pull_block(pl, r, &off, &cnt);
  int m = hetccl_pull_subs(pl, cnt, &per);
  const char *own = pl->in + off * es;
  int inplace = r > 0 && own == pl->dst; /* our block is overwritten before we add it */
  int done = HETCCL_STEP_NONE;           /* the previous sub-block's last step */
  int shared[PULL_OFFERS_AHEAD];         /* by sub-block: the first of its n - 1 sends */
  for (int j = 0; j < m; j++) {
    size_t o = (size_t)j * per, sc = algo_min(per, cnt - o);
    const char *mine = own + o * es;
    char *sub = pl->dst + o * es;
    if (inplace) { /* one sub-block aside: the previous one has read it */
      done = hetccl_sched_copy(s, saved, mine, sc * es, done, HETCCL_STEP_NONE);
      mine = saved;
    }
    done = build_sub(s, pl, sub, mine, sc, done);
    if (!pl->share_subs) continue;
    /* To every peer, nearest first, each send after the one to the same
     * peer PULL_OFFERS_AHEAD sub-blocks earlier (appended together, in
     * the same order). */
    int *first = &shared[j % PULL_OFFERS_AHEAD], earlier = *first;
    for (int k = 1; k < n; k++) {
      int before = j >= PULL_OFFERS_AHEAD && earlier != HETCCL_STEP_NONE ? earlier + k - 1
                                                                         : HETCCL_STEP_NONE;
      int sent = hetccl_sched_send(s, algo_mod(r + k, n), sub, sc * es, done, before);
      if (k == 1) *first = sent;
    }
  }
  return done;
}

ncclResult_t hetccl_pull_run(const pull_plan_t *pl, pull_build_fn build) {
  hetccl_engine_t *e = pl->e;
  const hetccl_coll_t *c = pl->c;
  hetccl_sched_t counting;
  hetccl_sched_init_ranks(&counting, NULL, 0, hetccl_engine_rank(e), hetccl_engine_nranks(e),
                          &c->op);
  build(&counting, pl, NULL);
  void *saved = NULL;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, counting.wanted, hetccl_pull_saved_bytes(pl),
                                        &saved);
  if (!s) return ncclSystemError;
  build(s, pl, saved);
  s->pull_ok = 1; /* the reader reduces what it reads: pulled, though its receives reduce */
  return hetccl_sched_run_host(s, c->tag);
}

ncclResult_t hetccl_pull_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  pull_plan_t pl = {.e = e, .c = c, .blockcount = c->count, .in = c->sendbuf,
                    .dst = c->recvbuf};
  return hetccl_pull_run(&pl, hetccl_pull_build_own);
}
