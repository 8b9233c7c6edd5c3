/* Bandwidth-bound collectives on a ring: AllReduce (reduce-scatter then
 * allgather, one pipeline), ReduceScatter, AllGather, and Reduce
 * (reduce-scatter, then the blocks gathered at the root); each a plan
 * (algo_impl.h: ring_plan_t) that the builder below writes as a schedule
 * (sched/sched.h) for the host executor, as it does tree.c's chain.
 *
 * Every byte moves once per step and no more: receive-and-reduce runs in
 * the transport's consume hook straight into its destination, combining
 * with this rank's contribution read from the user's send buffer (or from
 * the destination itself when in place), and each block of the result is
 * reduced on exactly one rank before it travels on. So AllReduce results
 * are bitwise identical on all ranks.
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

#include <string.h>

#include "util/log.h"

/* --- the plans as schedules (sched/sched.h) --------------------------------------
 *
 * Wave by wave (wave t: every (p, s) with p + s = t), as both neighbours
 * enumerate them: first the wave's receives, then its local work and
 * sends, s ascending. Piece p's send at step s waits for its receive at
 * step s - 1 (what it forwards) and for the local work before it (a
 * prepare, a finish), which also waits for that receive. About
 * HETCCL_ALGO_WINDOW waves are in flight: each receive, send and local
 * step waits for the one HETCCL_ALGO_WINDOW pieces earlier at its step,
 * and a receive for its piece's receive HETCCL_ALGO_WINDOW - 1 steps
 * earlier (without it, every step's first pieces would be posted at
 * once). The window also frees the scratch pieces that partial sums pass
 * through (reducescatter_io: piece p at step s lands in
 * slot ((p + s) % W, s), which the send of (p, s + 1) reads): a receive
 * waits for the send that read its slot last, that of (p - W, s + 1); a
 * premul's scaled piece (slot ((p + last) % W, last), written at step 0)
 * waits for the send that read it, (p - W, 0)'s. */

/* The steps of (p, s) appended last for p's place in the window: while
 * piece p is built, those of piece p - W until p's replace them. */
typedef struct ring_at {
  int32_t recv, send;
} ring_at_t;

static ring_at_t *at(const ring_plan_t *pl, int p, int s) {
  return &pl->steps_at[(size_t)(p % HETCCL_ALGO_WINDOW) * (size_t)pl->nsteps + (size_t)s];
}

static int ring_max_steps(const ring_plan_t *pl) {
  return pl->npieces * pl->nsteps * 4 + pl->npieces; /* receive, prepare, finish, send; a finish */
}

hetccl_sched_t *hetccl_ring_sched(ring_plan_t *pl, int more, size_t inter_bytes,
                                  size_t extra_bytes, char **extra) {
  size_t table = algo_round_up((size_t)HETCCL_ALGO_WINDOW * (size_t)pl->nsteps *
                               sizeof(ring_at_t), 64);
  inter_bytes = algo_round_up(inter_bytes, 64);
  char *data = NULL;
  hetccl_sched_t *s = hetccl_algo_sched(pl->e, &pl->c->op, ring_max_steps(pl) + more,
                                        table + inter_bytes + extra_bytes, (void **)&data);
  if (!s) return NULL;
  pl->steps_at = (ring_at_t *)data;
  for (size_t i = 0; i < (size_t)HETCCL_ALGO_WINDOW * (size_t)pl->nsteps; i++)
    pl->steps_at[i] = (ring_at_t){HETCCL_STEP_NONE, HETCCL_STEP_NONE};
  pl->inter = inter_bytes ? data + table : NULL;
  if (extra) *extra = extra_bytes ? data + table + inter_bytes : NULL;
  s->pull_ok = !hetccl_func_reduces(pl->c->func); /* a receive that reduces consumes */
  return s;
}

/* The receive of (p, st), with the step that last read its slot. */
static void build_recv(hetccl_sched_t *s, const ring_plan_t *pl, int p, int st) {
  ring_io_t io;
  pl->io(pl, p, st, &io);
  ring_at_t *a = at(pl, p, st);
  const int W = HETCCL_ALGO_WINDOW;
  int reader = pl->inter && st + 1 < pl->nsteps ? at(pl, p, st + 1)->send : HETCCL_STEP_NONE;
  int span = st >= W - 1 ? at(pl, p, st - W + 1)->recv : HETCCL_STEP_NONE;
  if (!io.recv || !io.rbytes) {
    a->recv = HETCCL_STEP_NONE;
    return;
  }
  int scale = pl->c->op.premul ? HETCCL_STEP_SCALE_IN : 0; /* our contribution, scaled here */
  a->recv = io.in ? hetccl_sched_recv_reduce(s, pl->left, io.recv, io.in, scale, io.rbytes,
                                             a->recv, reader)
                  : hetccl_sched_recv(s, pl->left, io.recv, io.rbytes, a->recv, reader);
  hetccl_sched_also_after(s, a->recv, span);
}

/* The local work and send of (p, st). */
static void build_send(hetccl_sched_t *s, const ring_plan_t *pl, int p, int st) {
  ring_io_t io;
  pl->io(pl, p, st, &io);
  ring_at_t *a = at(pl, p, st);
  int fed = st > 0 ? at(pl, p, st - 1)->recv : HETCCL_STEP_NONE; /* p's own, this wave */
  int window = a->send, sending = io.send && io.sbytes;
  size_t es = pl->esize;
  /* A plain copy whose source is what we send comes after the send: the
   * transport starts moving the piece while we copy. */
  int copy_after = io.prep_count && io.prep_copy && sending && io.send == io.prep_src;
  if (io.prep_count && !copy_after)
    fed = io.prep_copy ? hetccl_sched_copy(s, io.prep_dst, io.prep_src, io.prep_count * es, fed,
                                           window)
                       : hetccl_sched_prepare(s, io.prep_dst, io.prep_src, io.prep_count * es,
                                              fed, window);
  if (io.fin_count) fed = hetccl_sched_finish(s, io.fin_buf, io.fin_count * es, fed, window);
  a->send = sending ? hetccl_sched_send(s, pl->right, io.send, io.sbytes, fed, window)
                    : HETCCL_STEP_NONE;
  if (copy_after)
    hetccl_sched_copy(s, io.prep_dst, io.prep_src, io.prep_count * es, HETCCL_STEP_NONE,
                      HETCCL_STEP_NONE);
}

int hetccl_ring_build(hetccl_sched_t *s, const ring_plan_t *pl) {
  const int P = pl->npieces, S = pl->nsteps, T = P + S - 1;
  int finished = HETCCL_STEP_NONE;
  for (int t = 0; t < T; t++) {
    int s0 = t - P + 1 > 0 ? t - P + 1 : 0, s1 = t < S - 1 ? t : S - 1;
    for (int st = s0; st <= s1; st++) build_recv(s, pl, t - st, st);
    for (int st = s0; st <= s1; st++) build_send(s, pl, t - st, st);
    if (pl->finish_last && s1 == S - 1) { /* piece t - S + 1 is final: finish it */
      ring_io_t io;
      pl->io(pl, t - S + 1, S - 1, &io);
      if (io.recv && io.rbytes)
        finished = hetccl_sched_finish(s, io.recv, io.rbytes, at(pl, t - S + 1, S - 1)->recv,
                                       finished);
    }
  }
  return finished;
}

ncclResult_t hetccl_ring_run(ring_plan_t *pl) {
  hetccl_sched_t *s = hetccl_ring_sched(pl, 0, 0, 0, NULL);
  if (!s) return ncclSystemError;
  hetccl_ring_build(s, pl);
  return hetccl_sched_run_host(s, pl->c->tag);
}

/* --- plans ---------------------------------------------------------------------- */

static void plan_block(const ring_plan_t *pl, int b, size_t *off, size_t *cnt) {
  if (pl->blockcount) {
    *off = (size_t)b * pl->blockcount;
    *cnt = pl->blockcount;
  } else {
    hetccl_algo_block(pl->count, pl->esize, pl->nranks, b, off, cnt);
  }
}

/* Piece p of block b: element offset in the buffer, offset within the
 * block, and length (0 past the block's end). */
static size_t plan_piece(const ring_plan_t *pl, int b, int p, size_t *in_block, size_t *len) {
  size_t off, cnt, start = (size_t)p * pl->piece;
  plan_block(pl, b, &off, &cnt);
  *in_block = start;
  *len = start < cnt ? algo_min(pl->piece, cnt - start) : 0;
  return off + start;
}

static void plan_init(ring_plan_t *pl, hetccl_engine_t *e, const hetccl_coll_t *c) {
  memset(pl, 0, sizeof(*pl));
  pl->e = e;
  pl->c = c;
  pl->rank = hetccl_engine_rank(e);
  pl->nranks = hetccl_engine_nranks(e);
  pl->left = algo_mod(pl->rank - 1, pl->nranks);
  pl->right = algo_mod(pl->rank + 1, pl->nranks);
  pl->esize = hetccl_dtype_size(c->dtype);
}

void hetccl_ring_pieces(ring_plan_t *pl, size_t maxblock, size_t max_piece) {
  pl->piece = hetccl_algo_piece(pl->e, maxblock, pl->esize);
  size_t fewest = algo_round_up((maxblock + HETCCL_ALGO_MAX_PIECES - 1) / HETCCL_ALGO_MAX_PIECES,
                                pl->esize < 64 ? 64 / pl->esize : 1);
  if (pl->piece < fewest) pl->piece = fewest;
  if (max_piece && pl->piece > max_piece) pl->piece = max_piece;
  if (pl->piece == 0) pl->piece = 1;
  pl->npieces = (int)((maxblock + pl->piece - 1) / pl->piece);
  if (pl->npieces == 0) pl->npieces = 1;
}

/* AllReduce: steps 0..n-2 reduce-scatter (rank r ends owning block r+1),
 * steps n-1..2n-3 allgather. Partial sums live in recvbuf. */
static void allreduce_io(const ring_plan_t *pl, int p, int s, ring_io_t *io) {
  int n = pl->nranks, r = pl->rank, premul = pl->c->op.premul;
  size_t e = pl->esize, ib, slen, rlen;
  memset(io, 0, sizeof(*io));
  if (s < n - 1) {
    size_t so = plan_piece(pl, algo_mod(r - s, n), p, &ib, &slen);
    size_t ro = plan_piece(pl, algo_mod(r - s - 1, n), p, &ib, &rlen);
    io->send = (s == 0 && !premul ? pl->in : pl->out) + so * e;
    io->sbytes = slen * e;
    if (s == 0 && premul && slen) { /* this rank's own block enters the ring scaled */
      io->prep_dst = pl->out + so * e;
      io->prep_src = pl->in + so * e;
      io->prep_count = slen;
    }
    io->recv = pl->out + ro * e;
    io->rbytes = rlen * e;
    io->in = pl->in + ro * e;
  } else {
    int s2 = s - (n - 1);
    size_t so = plan_piece(pl, algo_mod(r + 1 - s2, n), p, &ib, &slen);
    size_t ro = plan_piece(pl, algo_mod(r - s2, n), p, &ib, &rlen);
    io->send = pl->out + so * e;
    io->sbytes = slen * e;
    if (s2 == 0 && pl->c->op.average) { /* the owned block, final: finish it once, here */
      io->fin_buf = pl->out + so * e;
      io->fin_count = slen;
    }
    io->recv = pl->out + ro * e;
    io->rbytes = rlen * e;
  }
}

ncclResult_t hetccl_ring_allreduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  plan_init(&pl, e, c);
  size_t off, maxblock;
  hetccl_algo_block(c->count, pl.esize, pl.nranks, 0, &off, &maxblock);
  pl.count = c->count;
  pl.in = c->sendbuf;
  pl.out = c->recvbuf;
  pl.nsteps = 2 * (pl.nranks - 1);
  pl.io = allreduce_io;
  hetccl_ring_pieces(&pl, maxblock, 0);
  return hetccl_ring_run(&pl);
}

/* Reduce-scatter into an owned block (ReduceScatter: rank r owns block r;
 * Reduce: the same, then gathered). Partial sums live in scratch pieces
 * indexed by (wave % W, step); the last step lands in pl->final. The slot
 * of the last step, never used for partial sums, holds this rank's scaled
 * piece when the op has a premul. */
/* Partial-sum scratch is capped: pieces shrink on large rings. */
#define INTER_MAX_BYTES (64u << 20)

static char *inter_piece(const ring_plan_t *pl, int p, int s) {
  size_t idx = (size_t)((p + s) % HETCCL_ALGO_WINDOW) * (size_t)pl->nsteps + (size_t)s;
  return pl->inter + idx * pl->piece * pl->esize;
}

static void reducescatter_io(const ring_plan_t *pl, int p, int s, ring_io_t *io) {
  int n = pl->nranks, r = pl->rank, last = pl->nsteps - 1;
  size_t e = pl->esize, ib, slen, rlen;
  memset(io, 0, sizeof(*io));
  size_t so = plan_piece(pl, algo_mod(r - s - 1, n), p, &ib, &slen);
  size_t ro = plan_piece(pl, algo_mod(r - s - 2, n), p, &ib, &rlen);
  if (s == 0 && pl->c->op.premul) {
    io->send = inter_piece(pl, p, last);
    io->prep_dst = (void *)io->send;
    io->prep_src = pl->in + so * e;
    io->prep_count = slen;
  } else {
    io->send = s == 0 ? pl->in + so * e : inter_piece(pl, p, s - 1);
  }
  io->sbytes = slen * e;
  io->recv = s == last ? pl->final + ib * e : inter_piece(pl, p, s);
  io->rbytes = rlen * e;
  io->in = pl->in + ro * e;
}


/* Sets up pl for reduce-scatter, each piece finished once final, and
 * gives its schedule (NULL on OOM) with room for `more` steps and
 * extra_bytes of scratch for the caller (*extra). */
static hetccl_sched_t *reducescatter_sched(ring_plan_t *pl, size_t maxblock, int more,
                                           size_t extra_bytes, char **extra) {
  pl->nsteps = pl->nranks - 1;
  pl->io = reducescatter_io;
  pl->finish_last = 1;
  size_t align = 64 / pl->esize;
  size_t per_piece = (size_t)HETCCL_ALGO_WINDOW * (size_t)pl->nsteps * pl->esize;
  size_t cap = INTER_MAX_BYTES / per_piece / align * align;
  hetccl_ring_pieces(pl, maxblock, cap ? cap : align);
  return hetccl_ring_sched(pl, more, per_piece * pl->piece, extra_bytes, extra);
}

ncclResult_t hetccl_ring_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  plan_init(&pl, e, c);
  pl.blockcount = c->count;
  pl.in = c->sendbuf;
  pl.final = c->recvbuf;
  hetccl_sched_t *s = reducescatter_sched(&pl, c->count, 0, 0, NULL);
  if (!s) return ncclSystemError;
  hetccl_ring_build(s, &pl);
  return hetccl_sched_run_host(s, c->tag);
}

/* Reduce: reduce-scatter (the root's block straight into its recvbuf, the
 * others' into scratch), each rank finishing its block, which it then
 * sends to the root; the root receives the other blocks,
 * HETCCL_ALGO_WINDOW at a time. One schedule: a pair's messages match in
 * the order it lists them, the reduce-scatter's before the gather's. */
ncclResult_t hetccl_ring_reduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  char *own = NULL;
  plan_init(&pl, e, c);
  int r = pl.rank, n = pl.nranks, root = c->root;
  size_t off, cnt, maxblock, esz = pl.esize;
  hetccl_algo_block(c->count, esz, n, 0, &off, &maxblock);
  pl.count = c->count;
  pl.in = c->sendbuf;
  hetccl_sched_t *s = reducescatter_sched(&pl, maxblock, n, r == root ? 0 : maxblock * esz, &own);
  if (!s) return ncclSystemError;
  hetccl_algo_block(c->count, esz, n, r, &off, &cnt);
  pl.final = r == root ? (char *)c->recvbuf + off * esz : own;
  int finished = hetccl_ring_build(s, &pl);
  if (r != root) {
    if (cnt) /* an empty block is not sent */
      hetccl_sched_send(s, root, own, cnt * esz, finished, HETCCL_STEP_NONE);
    return hetccl_sched_run_host(s, c->tag);
  }
  int window[HETCCL_ALGO_WINDOW], posted = 0;
  for (int k = 1; k < n; k++) {
    int b = algo_mod(root + k, n);
    hetccl_algo_block(c->count, esz, n, b, &off, &cnt);
    if (cnt == 0) continue;
    window[posted % HETCCL_ALGO_WINDOW] =
        hetccl_sched_recv(s, b, (char *)c->recvbuf + off * esz, cnt * esz,
                          algo_window_after(window, posted), HETCCL_STEP_NONE);
    posted++;
  }
  return hetccl_sched_run_host(s, c->tag);
}

/* AllGather: step s sends block r - s (its own, from sendbuf, at step 0)
 * and receives block r - s - 1. The local copy of the own block (out of
 * place) is done piece by piece while the first pieces travel. */
static void allgather_io(const ring_plan_t *pl, int p, int s, ring_io_t *io) {
  int n = pl->nranks, r = pl->rank;
  size_t e = pl->esize, ib, slen, rlen;
  memset(io, 0, sizeof(*io));
  size_t so = plan_piece(pl, algo_mod(r - s, n), p, &ib, &slen);
  size_t ro = plan_piece(pl, algo_mod(r - s - 1, n), p, &ib, &rlen);
  if (s == 0) {
    io->send = pl->in + (size_t)p * pl->piece * e;
    if (io->send != pl->out + so * e) { /* not in place */
      io->prep_dst = pl->out + so * e;
      io->prep_src = io->send;
      io->prep_count = slen;
      io->prep_copy = 1;
    }
  } else {
    io->send = pl->out + so * e;
  }
  io->sbytes = slen * e;
  io->recv = pl->out + ro * e;
  io->rbytes = rlen * e;
}

ncclResult_t hetccl_ring_allgather(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  plan_init(&pl, e, c);
  pl.blockcount = c->count;
  pl.in = c->sendbuf;
  pl.out = c->recvbuf;
  pl.nsteps = pl.nranks - 1;
  pl.io = allgather_io;
  hetccl_ring_pieces(&pl, c->count, 0);
  return hetccl_ring_run(&pl);
}
