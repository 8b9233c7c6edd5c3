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
 * In place, the buffer is input and output at once. Rank r writes only its
 * own block during the reduction (peers read their blocks, never ours),
 * and a block of a peer p lands in our buffer only once p has sent it,
 * that is, after p has finished its reduction, which read our block p
 * first.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

ncclResult_t hetccl_pull_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  size_t es = hetccl_dtype_size(c->dtype), off, cnt;
  pull_plan_t pl = {.e = e, .c = c, .count = c->count, .in = c->sendbuf};
  hetccl_pull_block(&pl, r, &off, &cnt);
  pl.dst = (char *)c->recvbuf + off * es;
  void *mem = hetccl_engine_scratch(e, hetccl_pull_scratch_bytes(&pl));
  if (!mem) return ncclSystemError;
  hetccl_engine_set_pull_ok(e, 1);
  HETCCL_CHECK(hetccl_pull_reduce_own(&pl, mem));

  /* Every rank's finished block to every other: all posted at once, the
   * transport reading them in turn. */
  hetccl_req_t *sreq = mem, *rreq = sreq + n;
  int ns = 0, nr = 0;
  for (int k = 1; k < n; k++) {
    int to = algo_mod(r + k, n), from = algo_mod(r - k, n);
    size_t foff, fcnt;
    hetccl_pull_block(&pl, from, &foff, &fcnt);
    if (fcnt)
      HETCCL_CHECK(hetccl_engine_irecv(e, from, (char *)c->recvbuf + foff * es, fcnt * es, NULL,
                                       NULL, &rreq[nr++]));
    if (cnt) HETCCL_CHECK(hetccl_engine_isend(e, to, pl.dst, cnt * es, &sreq[ns++]));
  }
  for (int i = 0; i < nr; i++) {
    hetccl_req_t *q = &rreq[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
  }
  for (int i = 0; i < ns; i++) {
    hetccl_req_t *q = &sreq[i];
    HETCCL_CHECK(hetccl_engine_wait(e, &q, 1));
  }
  return ncclSuccess;
}
