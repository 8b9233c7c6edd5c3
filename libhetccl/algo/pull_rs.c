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
 * How: rank r posts, to every peer p, sends of its block p, one per
 * sub-block (PULL_SUB_BYTES), which a pulling transport turns into
 * addresses the reader reads from; then, sub-block by sub-block, it
 * receives its piece of block r from rank 0, 1, ..., n-1 in turn, the
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
 * hetccl_pull_reduce_own.
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

/* Block b of a pull plan: [off, off + cnt) elements of every rank's input. */
static void plan_block(const pull_plan_t *pl, int b, size_t *off, size_t *cnt) {
  if (pl->blockcount) {
    *off = (size_t)b * pl->blockcount;
    *cnt = pl->blockcount;
  } else {
    hetccl_algo_block(pl->count, hetccl_dtype_size(pl->c->dtype), hetccl_engine_nranks(pl->e),
                      b, off, cnt);
  }
}

void hetccl_pull_block(const pull_plan_t *pl, int b, size_t *off, size_t *cnt) {
  plan_block(pl, b, off, cnt);
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
  *per = algo_round_up((cnt + m - 1) / m, align);
  return (int)((cnt + *per - 1) / *per);
}

/* The sends this rank posts: to every peer p its block p, one message per
 * sub-block. */
static int plan_sends(const pull_plan_t *pl) {
  int n = hetccl_engine_nranks(pl->e), r = hetccl_engine_rank(pl->e), total = 0;
  for (int p = 0; p < n; p++) {
    size_t off, cnt, per;
    if (p == r) continue;
    plan_block(pl, p, &off, &cnt);
    total += hetccl_pull_subs(pl, cnt, &per);
  }
  return total;
}

size_t hetccl_pull_scratch_bytes(const pull_plan_t *pl) {
  size_t off, cnt, per;
  plan_block(pl, hetccl_engine_rank(pl->e), &off, &cnt);
  hetccl_pull_subs(pl, cnt, &per);
  return algo_round_up((size_t)(plan_sends(pl) + 1) * sizeof(hetccl_req_t), 64) +
         algo_round_up(per * hetccl_dtype_size(pl->c->dtype), 64);
}

/* Every peer p reads block p of our input, one message per sub-block, in
 * the order it receives them: peer by peer, nearest first, sub-blocks in
 * order (a pair's messages match in posting order). */
static ncclResult_t post_sends(const pull_plan_t *pl, hetccl_req_t *sreq, int *nsent) {
  hetccl_engine_t *e = pl->e;
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t es = hetccl_dtype_size(pl->c->dtype);
  for (int k = 1; k < n; k++) {
    int p = algo_mod(r + k, n);
    size_t off, cnt, per;
    plan_block(pl, p, &off, &cnt);
    int m = hetccl_pull_subs(pl, cnt, &per);
    for (int j = 0; j < m; j++) {
      size_t o = (size_t)j * per, sc = algo_min(per, cnt - o);
      /* the reader reduces what it reads: pulled, though its receive reduces */
      HETCCL_CHECK(hetccl_engine_isend(e, p, pl->in + (off + o) * es, sc * es, algo_msg(pl->c, 1),
                                       &sreq[(*nsent)++]));
    }
  }
  return ncclSuccess;
}

/* Sub-block `sub` (sc elements) of the result: ranks 0..n-1 in turn, the
 * first copied in, each later one reduced into it as it is read; `own` is
 * this rank's contribution (never the destination itself, but for rank 0). */
static ncclResult_t reduce_sub(const pull_plan_t *pl, char *sub, const char *own, size_t sc,
                               hetccl_req_t *rq) {
  hetccl_engine_t *e = pl->e;
  const hetccl_coll_t *c = pl->c;
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t es = hetccl_dtype_size(c->dtype);
  for (int j = 0; j < n; j++) {
    if (j == r) {
      if (j == 0) algo_copy(sub, own, sc * es);
      else algo_reduce(&c->op, sub, sub, own, sc);
      continue;
    }
    algo_red_ctx_t ctx = {&c->op, sub, sub, 0}; /* dst = dst (op) incoming */
    hetccl_consume_fn consume = j == 0 ? NULL : hetccl_algo_consume;
    HETCCL_CHECK(hetccl_engine_irecv(e, j, sub, sc * es, c->tag, consume, j == 0 ? NULL : &ctx, rq));
    HETCCL_CHECK(hetccl_engine_wait(e, &rq, 1));
  }
  hetccl_reduce_finish(&c->op, sub, sc);
  return ncclSuccess;
}

ncclResult_t hetccl_pull_reduce_own(const pull_plan_t *pl, void *mem) {
  hetccl_engine_t *e = pl->e;
  size_t es = hetccl_dtype_size(pl->c->dtype), off, cnt, per;
  int r = hetccl_engine_rank(e), nsent = 0;
  hetccl_req_t *sreq = mem, *rreq = sreq + plan_sends(pl);
  char *saved = (char *)mem + algo_round_up((size_t)(plan_sends(pl) + 1) * sizeof(hetccl_req_t), 64);

  HETCCL_CHECK(post_sends(pl, sreq, &nsent));
  plan_block(pl, r, &off, &cnt);
  int m = hetccl_pull_subs(pl, cnt, &per);
  const char *own = pl->in + off * es;
  int inplace = r > 0 && own == pl->dst; /* our block is overwritten before we add it */
  for (int j = 0; j < m; j++) {
    size_t o = (size_t)j * per, sc = algo_min(per, cnt - o);
    const char *mine = own + o * es;
    if (inplace) {
      algo_copy(saved, mine, sc * es);
      mine = saved;
    }
    HETCCL_CHECK(reduce_sub(pl, pl->dst + o * es, mine, sc, rreq));
    if (pl->on_sub) HETCCL_CHECK(pl->on_sub(pl, pl->dst + o * es, sc));
  }
  /* Our buffer stays readable until every peer has read its block. */
  for (int i = 0; i < nsent; i++) {
    hetccl_req_t *sq = &sreq[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &sq, 1));
  }
  return ncclSuccess;
}

ncclResult_t hetccl_pull_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  pull_plan_t pl = {.e = e, .c = c, .blockcount = c->count, .in = c->sendbuf,
                    .dst = c->recvbuf};
  void *mem = hetccl_engine_scratch(e, hetccl_pull_scratch_bytes(&pl));
  if (!mem) return ncclSystemError;
  return hetccl_pull_reduce_own(&pl, mem);
}
