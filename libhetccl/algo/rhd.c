/* AllReduce by recursive halving then doubling, written as a schedule
 * (sched/sched.h) and run by either executor: the host engine's
 * (hetccl_rhd_allreduce), and the data plane's under HETCCL_ALGO=rhd
 * (algo/pieces.h; one lane, each round's send and receive taking their
 * pieces in turn).
 *
 *   fold      with n = m + rem (m the largest power of two <= n), ranks
 *             below 2 rem pair up: the even one sends its contribution to
 *             the odd one, which reduces it and stands for both
 *   halving   log2 m rounds over the m standing ranks: partners split the
 *             range they share, each sends the half it gives up and
 *             reduces the partner's copy of the half it keeps into its own
 *   doubling  the same rounds backwards: partners exchange the halves they
 *             finished, each range doubling, until every rank holds it all
 *   unfold    the odd rank of each pair sends the result to the even one
 *
 * Each standing rank sends and receives 2 (m - 1) / m of the message, as
 * a ring does, in 2 log2 m rounds instead of 2 (m - 1) steps: it is the
 * ring's bandwidth at the latency of recursive doubling's rounds
 * (log2 m rounds of whole buffers).
 *
 * Results: element i is reduced along one tree fixed by the ranks (the
 * lower group's partial sum on the left at every round), finished on one
 * rank and copied to the others, so every rank holds the same bits and
 * runs repeat. PreMulSum scales each rank's contribution once, as it
 * enters recvbuf; Avg divides once, where a range is finished.
 *
 * Memory: recvbuf is the working buffer (in place works: the contribution
 * is read once, into it, before anything is sent); the schedule itself
 * takes the engine's scratch, or the data plane's memory.
 *
 * Thread: whichever thread drives the engine, or builds the program. */
#include "algo/algo_impl.h"
#include "algo/pieces.h"

/* Rounds in a power-of-two group of m ranks: log2 m, at most this. */
#define RHD_MAX_ROUNDS 31

/* Steps: prepare, fold, unfold, finish, and two per round of each half. */
#define RHD_STEPS(rounds) (4 * (rounds) + 6)

typedef struct range {
  size_t lo, hi; /* elements */
} range_t;

/* Where [lo, hi) splits between two partners: the lower half first, its
 * end aligned to 64 bytes where the range allows. Both partners share the
 * range, so both compute the same split. */
static size_t split_at(size_t lo, size_t hi, size_t esize) {
  size_t align = esize < 64 ? 64 / esize : 1;
  size_t half = algo_round_up((hi - lo + 1) / 2, align);
  return lo + algo_min(half, hi - lo);
}

static int rounds_of(int n, int *m) {
  int rounds = 0;
  for (*m = 1; *m * 2 <= n; *m *= 2) rounds++;
  return rounds;
}

void hetccl_rhd_build(hetccl_sched_t *s, const hetccl_coll_t *c) {
  int n = s->nranks, r = s->rank, m;
  size_t es = hetccl_dtype_size(c->dtype);
  char *buf = c->recvbuf;
  int rounds = rounds_of(n, &m), rem = n - m;
  /* Every send's matching receive either copies or reduces what it reads,
   * and every source stays put until its send is done: peers may read it
   * in place. On the data plane: one lane, in the order listed. */
  s->pull_ok = 1;
  s->one_lane = 1;
  int prev = hetccl_sched_prepare(s, buf, c->sendbuf, c->count * es, HETCCL_STEP_NONE,
                                  HETCCL_STEP_NONE);

  /* fold */
  int vr; /* this rank among the m standing ones */
  if (r < 2 * rem && r % 2 == 0) {
    int sent = hetccl_sched_send(s, r + 1, buf, c->count * es, prev, HETCCL_STEP_NONE);
    hetccl_sched_recv(s, r + 1, buf, c->count * es, sent, HETCCL_STEP_NONE);
    return;
  }
  if (r < 2 * rem) {
    prev = hetccl_sched_recv_reduce(s, r - 1, buf, buf, HETCCL_STEP_IN_RIGHT, c->count * es,
                                    prev, HETCCL_STEP_NONE);
    vr = r / 2;
  } else {
    vr = r - rem;
  }

  /* halving: round k pairs vr with vr ^ (m >> (k + 1)) */
  range_t given[RHD_MAX_ROUNDS], kept[RHD_MAX_ROUNDS];
  int sent[RHD_MAX_ROUNDS];
  range_t cur = {0, c->count};
  for (int k = 0; k < rounds; k++) {
    int mask = m >> (k + 1), vp = vr ^ mask, partner = vp < rem ? 2 * vp + 1 : vp + rem;
    size_t mid = split_at(cur.lo, cur.hi, es);
    int lower = vr < vp;
    kept[k] = lower ? (range_t){cur.lo, mid} : (range_t){mid, cur.hi};
    given[k] = lower ? (range_t){mid, cur.hi} : (range_t){cur.lo, mid};
    sent[k] = hetccl_sched_send(s, partner, buf + given[k].lo * es,
                                (given[k].hi - given[k].lo) * es, prev, HETCCL_STEP_NONE);
    /* The lower group's partial sum on the left. */
    prev = hetccl_sched_recv_reduce(s, partner, buf + kept[k].lo * es, buf + kept[k].lo * es,
                                    lower ? 0 : HETCCL_STEP_IN_RIGHT,
                                    (kept[k].hi - kept[k].lo) * es, prev,
                                    HETCCL_STEP_NONE);
    cur = kept[k];
  }
  prev = hetccl_sched_finish(s, buf + cur.lo * es, (cur.hi - cur.lo) * es, prev,
                             HETCCL_STEP_NONE);

  /* doubling: the rounds backwards; a range received lands where this
   * rank's own half went out, once that send is done */
  for (int k = rounds - 1; k >= 0; k--) {
    int mask = m >> (k + 1), vp = vr ^ mask, partner = vp < rem ? 2 * vp + 1 : vp + rem;
    hetccl_sched_send(s, partner, buf + kept[k].lo * es, (kept[k].hi - kept[k].lo) * es, prev,
                      HETCCL_STEP_NONE);
    prev = hetccl_sched_recv(s, partner, buf + given[k].lo * es,
                             (given[k].hi - given[k].lo) * es, prev, sent[k]);
  }

  /* unfold */
  if (r < 2 * rem) hetccl_sched_send(s, r - 1, buf, c->count * es, prev, HETCCL_STEP_NONE);
}

ncclResult_t hetccl_rhd_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int m, rounds = rounds_of(hetccl_engine_nranks(e), &m);
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, RHD_STEPS(rounds), 0, NULL);
  if (!s) return ncclSystemError;
  hetccl_rhd_build(s, c);
  return hetccl_sched_run_host(s, c->tag);
}
