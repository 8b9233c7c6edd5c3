/* AllReduce by reads: a ReduceScatter by reads (pull_rs.c) into this rank's
 * block of the result, then an AllGather by reads of the finished blocks.
 *
 * Contract (besides algo.h's): the built-in operators (not PreMulSum, as
 * pull_rs.c); meant for ranks that read each other's memory (engine.h:
 * pull_min), correct over any transport.
 *
 * Each byte is copied twice per rank (read for the reduction, read back as
 * a result) and reduced once, where the ring copies it four times, two of
 * them into slots that another core reads (docs/host-engine.md). Block b
 * of the result is reduced on rank b alone, in rank order, and copied to
 * the others as is: results are bitwise equal on every rank.
 *
 * The reduction runs in sub-blocks (pull_rs.c: PULL_SUB_BYTES); each one
 * is sent to every peer as soon as it is finished, one message per
 * sub-block, so that a peer done with its own reduction reads what is
 * ready while this rank still reduces the rest. A pair's messages match in
 * posting order: every send of the reduction to a peer is posted before
 * any of these, and a peer posts its receives of them after its
 * reduction.
 *
 * In place, the buffer is input and output at once. Rank r writes only its
 * own block during the reduction (peers read their blocks, never ours),
 * and a sub-block of a peer p's block lands in our buffer only once p has
 * sent it, that is, after p has finished reducing it, which read that
 * sub-block of ours first.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

/* The sends of finished sub-blocks, posted from hetccl_pull_reduce_own. */
typedef struct ar_sends {
  hetccl_req_t *req;
  int n;
} ar_sends_t;

/* A finished sub-block to every peer, nearest first. */
static ncclResult_t send_sub(const pull_plan_t *pl, char *sub, size_t sc) {
  ar_sends_t *s = pl->on_sub_arg;
  int n = hetccl_engine_nranks(pl->e), r = hetccl_engine_rank(pl->e);
  size_t bytes = sc * hetccl_dtype_size(pl->c->dtype);
  for (int k = 1; k < n; k++)
    HETCCL_CHECK(hetccl_engine_isend(pl->e, algo_mod(r + k, n), sub, bytes, algo_msg(pl->c, 1),
                                     &s->req[s->n++]));
  return ncclSuccess;
}

/* Requests of the gather: (n - 1) sends of each of our sub-blocks, one
 * receive of each sub-block of every other block. */
static int gather_reqs(const pull_plan_t *pl) {
  int n = hetccl_engine_nranks(pl->e), r = hetccl_engine_rank(pl->e), total = 0;
  for (int b = 0; b < n; b++) {
    size_t off, cnt, per;
    hetccl_pull_block(pl, b, &off, &cnt);
    int m = hetccl_pull_subs(pl, cnt, &per);
    total += b == r ? (n - 1) * m : m;
  }
  return total;
}

ncclResult_t hetccl_pull_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t es = hetccl_dtype_size(c->dtype), off, cnt;
  ar_sends_t sends = {NULL, 0};
  pull_plan_t pl = {.e = e, .c = c, .count = c->count, .in = c->sendbuf, .on_sub = send_sub,
                    .on_sub_arg = &sends};
  hetccl_pull_block(&pl, r, &off, &cnt);
  pl.dst = (char *)c->recvbuf + off * es;
  size_t own_bytes = hetccl_pull_scratch_bytes(&pl); /* a multiple of 64 */
  char *mem = hetccl_engine_scratch(e, own_bytes + (size_t)gather_reqs(&pl) * sizeof(hetccl_req_t));
  if (!mem) return ncclSystemError;
  sends.req = (hetccl_req_t *)(mem + own_bytes);
  HETCCL_CHECK(hetccl_pull_reduce_own(&pl, mem));

  /* Every other block, sub-block by sub-block, from its owner. */
  hetccl_req_t *rreq = sends.req + sends.n;
  int nr = 0;
  for (int k = 1; k < n; k++) {
    int from = algo_mod(r - k, n);
    size_t foff, fcnt, per;
    hetccl_pull_block(&pl, from, &foff, &fcnt);
    int m = hetccl_pull_subs(&pl, fcnt, &per);
    for (int j = 0; j < m; j++) {
      size_t o = (size_t)j * per, sc = algo_min(per, fcnt - o);
      HETCCL_CHECK(hetccl_engine_irecv(e, from, (char *)c->recvbuf + (foff + o) * es, sc * es,
                                       c->tag, NULL, NULL, &rreq[nr++]));
    }
  }
  for (int i = 0; i < nr; i++) {
    hetccl_req_t *q = &rreq[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
  }
  for (int i = 0; i < sends.n; i++) {
    hetccl_req_t *q = &sends.req[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
  }
  return ncclSuccess;
}
