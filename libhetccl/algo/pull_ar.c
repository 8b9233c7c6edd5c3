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
 * ready while this rank still reduces the rest. One schedule (sched.h)
 * holds both halves: a pair's messages match in the order it lists them,
 * every send of the reduction to a peer before any of these, and the
 * receives of these after those of the reduction. A receive of the
 * gather waits for this rank's reduction to finish, and for the one
 * HETCCL_ALGO_WINDOW earlier from the same peer. Posted while this rank
 * still reduced, they made a two-rank AllReduce of 256 KiB by reads take
 * 33-35 us instead of 25 on the 2-core machine (hetccl-perf, reads forced;
 * commit 93ea7b2 against the hand-posted gather before it, which posted
 * them after the reduction).
 *
 * In place, the buffer is input and output at once. Rank r writes only its
 * own block during the reduction (peers read their blocks, never ours),
 * and a sub-block of a peer p's block lands in our buffer only once p has
 * sent it, that is, after p has finished reducing it, which read that
 * sub-block of ours first.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

/* The reduction of our block (its finished sub-blocks shared), then every
 * other block, sub-block by sub-block, from its owner, into recvbuf.
 * Listed after the reduction: a pair's receives match in that order. */
static int build_allreduce(hetccl_sched_t *s, const pull_plan_t *pl, char *saved) {
  int n = s->nranks, r = s->rank;
  size_t es = hetccl_dtype_size(pl->c->dtype);
  int reduced = hetccl_pull_build_own(s, pl, saved);
  for (int k = 1; k < n; k++) {
    int from = algo_mod(r - k, n);
    size_t foff, fcnt, per;
    hetccl_pull_block(pl, from, &foff, &fcnt);
    int m = hetccl_pull_subs(pl, fcnt, &per), window[HETCCL_ALGO_WINDOW];
    for (int j = 0; j < m; j++) { /* each after the one HETCCL_ALGO_WINDOW earlier */
      size_t o = (size_t)j * per, sc = algo_min(per, fcnt - o);
      window[j % HETCCL_ALGO_WINDOW] =
          hetccl_sched_recv(s, from, (char *)pl->c->recvbuf + (foff + o) * es, sc * es,
                            algo_window_after(window, j), reduced);
    }
  }
  return reduced;
}

ncclResult_t hetccl_pull_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  size_t off, cnt;
  pull_plan_t pl = {.e = e, .c = c, .count = c->count, .in = c->sendbuf, .share_subs = 1};
  hetccl_pull_block(&pl, hetccl_engine_rank(e), &off, &cnt);
  pl.dst = (char *)c->recvbuf + off * hetccl_dtype_size(c->dtype);
  return hetccl_pull_run(&pl, build_allreduce);
}
