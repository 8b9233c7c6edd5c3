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
 * How: rank r posts, to every peer p, a send of its block p, which a pulling
 * transport turns into one address the reader reads from; then it receives
 * block r from rank 0, 1, ..., n-1 in turn, the first into the destination
 * as a plain copy, each later one reduced into it as it is read (the
 * transport's consume hook: dst = dst op incoming, in L2-sized pieces), its
 * own contribution folded in at its place in the order. So each byte of a
 * peer's block is copied once (by the reader, into a cache-sized bounce
 * buffer) and reduced once, with no ring step through a slot and no
 * partial sums in memory; the order is a function of the ranks only, so
 * runs repeat bitwise (algo_impl.h).
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

size_t hetccl_pull_scratch_bytes(const pull_plan_t *pl) {
  int n = hetccl_engine_nranks(pl->e);
  size_t off, cnt;
  plan_block(pl, hetccl_engine_rank(pl->e), &off, &cnt);
  return algo_round_up((size_t)2 * (size_t)n * sizeof(hetccl_req_t), 64) +
         algo_round_up(cnt * hetccl_dtype_size(pl->c->dtype), 64);
}

ncclResult_t hetccl_pull_reduce_own(const pull_plan_t *pl, void *mem) {
  hetccl_engine_t *e = pl->e;
  const hetccl_coll_t *c = pl->c;
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t es = hetccl_dtype_size(c->dtype), off, cnt;
  hetccl_req_t *sreq = mem, *rreq = sreq + n;
  char *saved = (char *)mem + algo_round_up((size_t)2 * (size_t)n * sizeof(hetccl_req_t), 64);
  int nsent = 0;

  /* Every peer reads its block of ours; post them all, nearest first. */
  for (int k = 1; k < n; k++) {
    int p = algo_mod(r + k, n);
    plan_block(pl, p, &off, &cnt);
    if (!cnt) continue;
    HETCCL_CHECK(hetccl_engine_isend(e, p, pl->in + off * es, cnt * es, &sreq[nsent++]));
  }
  plan_block(pl, r, &off, &cnt);
  const char *own = pl->in + off * es;
  if (cnt && r > 0 && own == pl->dst) { /* in place: our block is overwritten first */
    algo_copy(saved, own, cnt * es);
    own = saved;
  }
  for (int j = 0; j < n && cnt; j++) {
    if (j == r) {
      if (j == 0) algo_copy(pl->dst, own, cnt * es);
      else algo_reduce(&c->op, pl->dst, pl->dst, own, cnt);
      continue;
    }
    algo_red_ctx_t ctx = {&c->op, pl->dst, pl->dst, 0}; /* dst = dst (op) incoming */
    hetccl_req_t *rq = &rreq[j];
    HETCCL_CHECK(hetccl_engine_irecv(e, j, pl->dst, cnt * es, j == 0 ? NULL : hetccl_algo_consume,
                                     j == 0 ? NULL : &ctx, rq));
    HETCCL_CHECK(hetccl_engine_wait(e, &rq, 1));
  }
  /* Our buffer stays readable until every peer has read its block. */
  for (int i = 0; i < nsent; i++) {
    hetccl_req_t *sq = &sreq[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &sq, 1));
  }
  hetccl_reduce_finish(&c->op, pl->dst, cnt);
  return ncclSuccess;
}

ncclResult_t hetccl_pull_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  pull_plan_t pl = {.e = e, .c = c, .blockcount = c->count, .in = c->sendbuf,
                    .dst = c->recvbuf};
  void *mem = hetccl_engine_scratch(e, hetccl_pull_scratch_bytes(&pl));
  if (!mem) return ncclSystemError;
  hetccl_engine_set_pull_ok(e, 1);
  return hetccl_pull_reduce_own(&pl, mem);
}
