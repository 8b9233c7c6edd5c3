/* Bandwidth-bound collectives on a ring: AllReduce (reduce-scatter then
 * allgather, one pipeline), ReduceScatter, AllGather, and Reduce
 * (reduce-scatter, then the blocks gathered at the root); plus the
 * pipelined executor they share (algo_impl.h: ring_plan_t).
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

/* --- the executor ------------------------------------------------------------- */

typedef struct ring_slot {
  hetccl_req_t sreq, rreq;
  algo_red_ctx_t ctx;
  int sposted, rposted;
} ring_slot_t;

size_t hetccl_ring_slots_bytes(int nsteps) {
  return algo_round_up((size_t)HETCCL_ALGO_WINDOW * (size_t)nsteps * sizeof(ring_slot_t), 64);
}

static ring_slot_t *slot_at(ring_slot_t *slots, int nsteps, int t, int s) {
  return &slots[(t % HETCCL_ALGO_WINDOW) * nsteps + s];
}

/* Wait for every request of wave t. */
static ncclResult_t wave_wait(const ring_plan_t *pl, ring_slot_t *slots, int t) {
  for (int s = 0; s < pl->nsteps; s++) {
    ring_slot_t *sl = slot_at(slots, pl->nsteps, t, s);
    hetccl_req_t *reqs[2] = {sl->sposted ? &sl->sreq : NULL, sl->rposted ? &sl->rreq : NULL};
    sl->sposted = sl->rposted = 0;
    HETCCL_CHECK(hetccl_engine_wait(pl->e, reqs, 2));
  }
  return ncclSuccess;
}

static ncclResult_t wave_post_recvs(const ring_plan_t *pl, ring_slot_t *slots, int t, int s0,
                                    int s1) {
  for (int s = s0; s <= s1; s++) {
    ring_slot_t *sl = slot_at(slots, pl->nsteps, t, s);
    ring_io_t io;
    pl->io(pl, t - s, s, &io);
    if (!io.recv || !io.rbytes) continue;
    hetccl_consume_fn consume = NULL;
    if (io.in) {
      sl->ctx = (algo_red_ctx_t){&pl->c->op, io.recv, io.in, 0};
      consume = hetccl_algo_consume;
    }
    HETCCL_CHECK(hetccl_engine_irecv(pl->e, pl->left, io.recv, io.rbytes, pl->c->tag, consume,
                                     &sl->ctx, &sl->rreq));
    sl->rposted = 1;
  }
  return ncclSuccess;
}

static ncclResult_t wave_post_sends(const ring_plan_t *pl, ring_slot_t *slots, int t, int s0,
                                    int s1) {
  for (int s = s0; s <= s1; s++) {
    ring_io_t io;
    pl->io(pl, t - s, s, &io);
    int sending = io.send && io.sbytes;
    if (!sending && !io.prep_count && !io.fin_count) continue;
    if (s > 0) { /* the data this step sends or finishes arrived one step earlier */
      ring_slot_t *prev = slot_at(slots, pl->nsteps, t - 1, s - 1);
      if (prev->rposted) {
        hetccl_req_t *r = &prev->rreq;
        HETCCL_CHECK(hetccl_engine_wait(pl->e, &r, 1));
      }
    }
    /* A plain copy whose source is what we send can wait until the send is
     * posted: the transport starts moving the piece while we copy. */
    int copy_after = io.prep_count && io.prep_copy && sending && io.send == io.prep_src;
    if (io.prep_count && !copy_after) {
      if (io.prep_copy) algo_copy(io.prep_dst, io.prep_src, io.prep_count * pl->esize);
      else hetccl_reduce_prepare(&pl->c->op, io.prep_dst, io.prep_src, io.prep_count);
    }
    if (io.fin_count) hetccl_reduce_finish(&pl->c->op, io.fin_buf, io.fin_count);
    if (!sending) continue;
    ring_slot_t *sl = slot_at(slots, pl->nsteps, t, s);
    /* a receive that reduces consumes; one that copies may pull */
    HETCCL_CHECK(hetccl_engine_isend(pl->e, pl->right, io.send, io.sbytes,
                                     algo_msg(pl->c, !hetccl_func_reduces(pl->c->func)),
                                     &sl->sreq));
    sl->sposted = 1;
    if (copy_after) algo_copy(io.prep_dst, io.prep_src, io.prep_count * pl->esize);
  }
  return ncclSuccess;
}

ncclResult_t hetccl_ring_run(const ring_plan_t *pl, void *mem) {
  ring_slot_t *slots = mem;
  const int W = HETCCL_ALGO_WINDOW, P = pl->npieces, S = pl->nsteps, T = P + S - 1;
  memset(slots, 0, (size_t)W * (size_t)S * sizeof(*slots));
  for (int t = 0; t < T; t++) {
    /* At most W waves in flight: this also frees wave t's request slots and
     * the scratch pieces indexed by t % W (read by wave t - W + 1's sends). */
    if (t >= W - 1) HETCCL_CHECK(wave_wait(pl, slots, t - (W - 1)));
    int s0 = t - P + 1 > 0 ? t - P + 1 : 0, s1 = t < S - 1 ? t : S - 1;
    HETCCL_CHECK(wave_post_recvs(pl, slots, t, s0, s1));
    HETCCL_CHECK(wave_post_sends(pl, slots, t, s0, s1));
  }
  for (int t = T - (W - 1) > 0 ? T - (W - 1) : 0; t < T; t++)
    HETCCL_CHECK(wave_wait(pl, slots, t));
  return ncclSuccess;
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

/* Pieces per block, given the largest block. */
static void plan_pieces(ring_plan_t *pl, size_t maxblock, size_t max_piece) {
  pl->piece = hetccl_algo_piece(pl->e, maxblock, pl->esize);
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
  plan_pieces(&pl, maxblock, 0);
  void *slots = hetccl_engine_scratch(e, hetccl_ring_slots_bytes(pl.nsteps));
  if (!slots) return ncclSystemError;
  return hetccl_ring_run(&pl, slots);
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


/* Sets up pl for reduce-scatter and carves the scratch: request slots,
 * partial-sum pieces, then extra_bytes for the caller (*extra). */
static ncclResult_t reducescatter_setup(ring_plan_t *pl, size_t maxblock, size_t extra_bytes,
                                        void **slots, char **extra) {
  pl->nsteps = pl->nranks - 1;
  pl->io = reducescatter_io;
  size_t align = 64 / pl->esize;
  size_t per_piece = (size_t)HETCCL_ALGO_WINDOW * (size_t)pl->nsteps * pl->esize;
  size_t cap = INTER_MAX_BYTES / per_piece / align * align;
  plan_pieces(pl, maxblock, cap ? cap : align);
  size_t slots_bytes = hetccl_ring_slots_bytes(pl->nsteps);
  size_t inter_bytes = algo_round_up(per_piece * pl->piece, 64);
  char *mem = hetccl_engine_scratch(pl->e, slots_bytes + inter_bytes + extra_bytes);
  if (!mem) return ncclSystemError;
  *slots = mem;
  pl->inter = mem + slots_bytes;
  if (extra) *extra = mem + slots_bytes + inter_bytes;
  return ncclSuccess;
}

ncclResult_t hetccl_ring_reducescatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  void *slots;
  plan_init(&pl, e, c);
  pl.blockcount = c->count;
  pl.in = c->sendbuf;
  pl.final = c->recvbuf;
  HETCCL_CHECK(reducescatter_setup(&pl, c->count, 0, &slots, NULL));
  HETCCL_CHECK(hetccl_ring_run(&pl, slots));
  hetccl_reduce_finish(&c->op, c->recvbuf, c->count);
  return ncclSuccess;
}

/* Reduce: reduce-scatter (the root's block straight into its recvbuf, the
 * others' into scratch), then every rank finishes its block and sends it
 * to the root. */
ncclResult_t hetccl_ring_reduce(hetccl_engine_t *e, const hetccl_coll_t *c) {
  ring_plan_t pl;
  void *slots;
  char *own = NULL;
  plan_init(&pl, e, c);
  int r = pl.rank, n = pl.nranks, root = c->root;
  size_t off, cnt, maxblock, esz = pl.esize;
  hetccl_algo_block(c->count, esz, n, 0, &off, &maxblock);
  pl.count = c->count;
  pl.in = c->sendbuf;
  HETCCL_CHECK(reducescatter_setup(&pl, maxblock, r == root ? 0 : maxblock * esz, &slots, &own));
  hetccl_algo_block(c->count, esz, n, r, &off, &cnt);
  pl.final = r == root ? (char *)c->recvbuf + off * esz : own;
  HETCCL_CHECK(hetccl_ring_run(&pl, slots));
  hetccl_reduce_finish(&c->op, pl.final, cnt);
  if (r != root) {
    if (cnt == 0) return ncclSuccess;
    return hetccl_engine_sendrecv(e, algo_msg(c, 0), root, own, cnt * esz, -1, NULL, 0, NULL,
                                  NULL);
  }
  /* The root gathers the other blocks, HETCCL_ALGO_WINDOW receives in
   * flight (a schedule: the ring's scratch is no longer needed). */
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, n, 0, NULL);
  if (!s) return ncclSystemError;
  int window[HETCCL_ALGO_WINDOW], posted = 0;
  for (int k = 1; k < n; k++) {
    int b = algo_mod(root + k, n), slot = posted % HETCCL_ALGO_WINDOW;
    hetccl_algo_block(c->count, esz, n, b, &off, &cnt);
    if (cnt == 0) continue; /* an empty block is not sent (above) */
    window[slot] = hetccl_sched_recv(s, b, (char *)c->recvbuf + off * esz, cnt * esz,
                                     posted >= HETCCL_ALGO_WINDOW ? window[slot]
                                                                  : HETCCL_STEP_NONE,
                                     HETCCL_STEP_NONE);
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
  plan_pieces(&pl, c->count, 0);
  void *slots = hetccl_engine_scratch(e, hetccl_ring_slots_bytes(pl.nsteps));
  if (!slots) return ncclSystemError;
  return hetccl_ring_run(&pl, slots);
}
