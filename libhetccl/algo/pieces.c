/* The data plane's forms as schedules of pieces (pieces.h).
 *
 * Thread: the caller's. */
#include "algo/pieces.h"

#include "algo/algo_impl.h"
#include "util/knobs.h"
#include "util/log.h"

typedef struct cut {
  hetccl_sched_t *s;
  const hetccl_coll_t *c;
  size_t piece; /* bytes */
  size_t elem;
  int rank, n;
  /* For an executor that does not fuse (the host's): slots for the
   * intermediate sums that have no place in recvbuf, SUM_WAVES pieces
   * deep, and per slot the step that last read it (scratch_bytes). NULL
   * for the data plane, which writes no transient. */
  char *sums;
  int32_t *readers;
  int scaled_sends; /* the host under PreMulSum: this rank's data sent on is scaled into a
                     * buffer first (send_own); the data plane scales it as it sends */
  /* For the host executor: per unit of a ring, the message step (its
   * receive, else its send) of the last SUM_WAVES pieces, which the same
   * unit SUM_WAVES pieces later waits for (ring_window). NULL for the data
   * plane, whose lane runs one piece after another anyway. */
  int32_t *window;
  int host;         /* for the host executor, which runs a local copy on the thread that
                     * also moves the messages: an AllGather's own block, and a chain
                     * Broadcast's root's, are copied piece by piece after each piece's
                     * send (own_piece), not in one go before any message */
} cut_t;

#define AT(buf, off) ((char *)(buf) + (off))

/* Pieces whose intermediate sums may be held at once: piece k reuses the
 * slots of piece k - SUM_WAVES once the sends that read them are done. */
#define SUM_WAVES HETCCL_ALGO_WINDOW

/* Where piece k's intermediate sum of step j (< n) goes, or NULL for an
 * executor that fuses; *war: the step that must be done before it is
 * written (the send that read the slot's last sum). */
static char *sum_slot(const cut_t *u, size_t k, int j, int *war) {
  *war = HETCCL_STEP_NONE;
  if (!u->sums) return NULL;
  size_t at = (k % SUM_WAVES) * (size_t)u->n + (size_t)j;
  *war = u->readers[at];
  return u->sums + at * u->piece;
}

/* Step `send` reads the sum in slot (k, j). */
static void sum_read(const cut_t *u, size_t k, int j, int send) {
  if (u->sums) u->readers[(k % SUM_WAVES) * (size_t)u->n + (size_t)j] = send;
}

/* Elements of chunk c when `count` is split into n chunks. */
static size_t chunk_off(size_t count, int n, int c) {
  size_t base = count / (size_t)n, rem = count % (size_t)n;
  return (size_t)c * base + ((size_t)c < rem ? (size_t)c : rem);
}
static size_t chunk_len(size_t count, int n, int c) {
  return count / (size_t)n + ((size_t)c < count % (size_t)n ? 1 : 0);
}

/* Piece k of a run of `len` elements starting at element `off`: its byte
 * offset and size, 0 when the run has no piece k. */
static size_t piece_at(const cut_t *u, size_t off, size_t len, size_t k, size_t *byte_off) {
  size_t per = u->piece / u->elem;
  *byte_off = 0;
  if (k * per >= len) return 0;
  *byte_off = (off + k * per) * u->elem;
  size_t left = len - k * per;
  return (left < per ? left : per) * u->elem;
}

static size_t npieces(const cut_t *u, size_t len) {
  size_t per = u->piece / u->elem;
  return (len + per - 1) / per;
}

/* Mark step i's result transient (sched.h: HETCCL_STEP_FORWARD). */
static int forward(hetccl_sched_t *s, int i) {
  if (i != HETCCL_STEP_NONE) s->steps[i].flags |= HETCCL_STEP_FORWARD;
  return i;
}

/* This rank's own data at src, entering a reduction: a transient PREPARE. */
static int own(const cut_t *u, const void *src, size_t bytes) {
  return forward(u->s, hetccl_sched_prepare(u->s, NULL, src, bytes, HETCCL_STEP_NONE,
                                            HETCCL_STEP_NONE));
}

/* Send this rank's own data at src on unreduced (piece k) to peer; returns
 * the send. Its PREPARE is transient; where the executor writes it
 * (scaled_sends) it gets a buffer: `place` if not NULL, else the slot
 * (k, n - 1), which no intermediate sum takes, read by this send. */
static int send_own(const cut_t *u, int peer, const void *src, size_t bytes, size_t k,
                    void *place) {
  if (!u->scaled_sends)
    return hetccl_sched_send(u->s, peer, NULL, bytes, own(u, src, bytes), HETCCL_STEP_NONE);
  int war = HETCCL_STEP_NONE, slot = !place;
  if (slot) place = sum_slot(u, k, u->n - 1, &war);
  int prep = forward(u->s, hetccl_sched_prepare(u->s, place, src, bytes, war, HETCCL_STEP_NONE));
  int sent = hetccl_sched_send(u->s, peer, NULL, bytes, prep, HETCCL_STEP_NONE);
  if (slot) sum_read(u, k, u->n - 1, sent);
  return sent;
}

/* --- two ranks ------------------------------------------------------------------- */

/* AllReduce / ReduceScatter of two ranks: send what the peer reduces,
 * reduce what arrives. `mine`/`theirs`: element offsets in sendbuf of the
 * part this rank keeps / sends; out_off: where the kept part's result goes
 * in recvbuf (bytes). */
static void exchange_reduce(const cut_t *u, size_t len, size_t mine, size_t theirs,
                            size_t out_off) {
  hetccl_sched_t *s = u->s;
  const hetccl_coll_t *c = u->c;
  int peer = 1 - u->rank;
  for (size_t k = 0, K = npieces(u, len); k < K; k++) {
    size_t so, ro, bytes = piece_at(u, theirs, len, k, &so);
    piece_at(u, mine, len, k, &ro);
    size_t dst_off = out_off + (ro - mine * u->elem);
    int snd = send_own(u, peer, AT(c->sendbuf, so), bytes, k, NULL);
    /* In place, piece k of the result overwrites what piece k of the send
     * reads when the two parts are the same (AllReduce). */
    int overlap = theirs == mine && AT(c->recvbuf, dst_off) == AT(c->sendbuf, so);
    char *dst = AT(c->recvbuf, dst_off);
    int rr = hetccl_sched_recv_reduce(s, peer, dst, NULL, u->rank > peer ? HETCCL_STEP_IN_RIGHT : 0,
                                      bytes, own(u, AT(c->sendbuf, ro), bytes),
                                      overlap ? snd : HETCCL_STEP_NONE);
    hetccl_sched_finish(s, dst, bytes, rr, HETCCL_STEP_NONE);
  }
}

/* --- rings --------------------------------------------------------------------------- */

/* The reduce-scatter half of a ring, piece k: chunk `first` goes out, then
 * chunk recv(s) arrives at step s and is reduced with this rank's part and
 * passed on, or, at the last step, finished into recvbuf at dst(chunk).
 * Returns the step that finishes it (HETCCL_STEP_NONE: this piece has no
 * bytes there), for what reads the result: the lane's order makes the data
 * plane wait for it anyway, the host executor needs the `after`. */
typedef struct ring_rs {
  size_t (*off)(const struct ring_rs *, int chunk);
  size_t (*len)(const struct ring_rs *, int chunk);
  size_t (*dst)(const struct ring_rs *, int chunk, size_t piece_off); /* recvbuf byte offset */
  int (*recv)(int rank, int s, int n);
  size_t count;
  int n;
  size_t elem;
  int sums_in_recvbuf; /* an intermediate sum may be written to recvbuf at its offset in
                        * sendbuf (AllReduce), for an executor that does not fuse */
} ring_rs_t;

/* Unit st (0 .. n - 1) of piece k's reduce-scatter: unit 0 sends chunk
 * `first`; unit st >= 1 receives step st - 1's chunk, reduces it with this
 * rank's part and sends the sum on, or, as unit n - 1, finishes it into
 * recvbuf and returns the FINISH (HETCCL_STEP_NONE otherwise, or where
 * this piece has no bytes there). */
static int ring_rs_unit(const cut_t *u, const ring_rs_t *g, int first, size_t k, int st) {
  hetccl_sched_t *s = u->s;
  const hetccl_coll_t *c = u->c;
  int next = algo_mod(u->rank + 1, u->n), prev = algo_mod(u->rank - 1, u->n);
  size_t o, bytes;
  if (st == 0) {
    bytes = piece_at(u, g->off(g, first), g->len(g, first), k, &o);
    if (bytes) /* an AllReduce's own chunk scaled where its sums go (recvbuf), else a slot */
      send_own(u, next, AT(c->sendbuf, o), bytes, k, g->sums_in_recvbuf ? AT(c->recvbuf, o) : NULL);
    return HETCCL_STEP_NONE;
  }
  int cr = g->recv(u->rank, st - 1, u->n);
  bytes = piece_at(u, g->off(g, cr), g->len(g, cr), k, &o);
  if (!bytes) return HETCCL_STEP_NONE;
  int in = own(u, AT(c->sendbuf, o), bytes);
  if (st < u->n - 1) {
    int war = HETCCL_STEP_NONE;
    char *sum = g->sums_in_recvbuf ? AT(c->recvbuf, o) : sum_slot(u, k, st - 1, &war);
    int rr = forward(s, hetccl_sched_recv_reduce(s, prev, sum, NULL, 0, bytes, in, war));
    int sent = hetccl_sched_send(s, next, NULL, bytes, rr, HETCCL_STEP_NONE);
    if (!g->sums_in_recvbuf) sum_read(u, k, st - 1, sent);
    return HETCCL_STEP_NONE;
  }
  char *dst = AT(c->recvbuf, g->dst(g, cr, o - g->off(g, cr) * g->elem));
  int rr = hetccl_sched_recv_reduce(s, prev, dst, NULL, 0, bytes, in, HETCCL_STEP_NONE);
  return hetccl_sched_finish(s, dst, bytes, rr, HETCCL_STEP_NONE);
}

/* The all-gather half of a ring, piece k, unit t (0 .. n - 1): unit 0
 * sends block `first` (this rank's finished one, at byte offset from_off
 * in `from`, once step `ready` is done); unit t >= 1 receives block
 * first - t into recvbuf and passes it on (but the last). */
typedef struct ring_ag {
  const void *from;
  size_t from_off;
  size_t (*blk_off)(size_t count, int n, int c);
  size_t (*blk_len)(size_t count, int n, int c);
  size_t count;
  int first;
} ring_ag_t;

static void ring_ag_unit(const cut_t *u, const ring_ag_t *a, size_t k, int t, int ready) {
  hetccl_sched_t *s = u->s;
  int next = algo_mod(u->rank + 1, u->n), prev = algo_mod(u->rank - 1, u->n);
  size_t o, bytes;
  if (t == 0) {
    size_t first_off = a->blk_off(a->count, u->n, a->first);
    bytes = piece_at(u, first_off, a->blk_len(a->count, u->n, a->first), k, &o);
    if (bytes)
      hetccl_sched_send(s, next, AT(a->from, a->from_off + o - first_off * u->elem), bytes, ready,
                        HETCCL_STEP_NONE);
    return;
  }
  int cr = algo_mod(a->first - t, u->n);
  bytes = piece_at(u, a->blk_off(a->count, u->n, cr), a->blk_len(a->count, u->n, cr), k, &o);
  if (!bytes) return;
  int got = hetccl_sched_recv(s, prev, AT(u->c->recvbuf, o), bytes, HETCCL_STEP_NONE,
                              HETCCL_STEP_NONE);
  if (t < u->n - 1) hetccl_sched_send(s, next, AT(u->c->recvbuf, o), bytes, got, HETCCL_STEP_NONE);
}

/* The order in which a ring's units are listed, for K pieces of `units`
 * units each. The data plane's (by_piece): piece by piece, each through
 * all its units before the next enters, which one lane in listed order
 * keeps busy. The host executor's (by wave): wave w lists unit i of piece
 * w - i, i ascending, as ring.c does. Both ranks of a pair must list its
 * messages in one order (sched.h), and the host executor starts a message
 * only after the pair's messages listed before it: piece by piece, the
 * first send of piece k + 1 would wait for the last send of piece k, that
 * is for piece k to have come (nearly) round the ring, and the ring would
 * carry one piece at a time. By wave, a piece's first send waits only for
 * the sends of the wave before. */
typedef void (*ring_unit_fn)(const cut_t *u, const void *form, size_t k, int i);

/* About SUM_WAVES waves in flight on the host, as ring.c keeps them: the
 * message of unit i of piece k (its receive, else its send; steps from
 * `first` on) waits for that of unit i of piece k - SUM_WAVES. Without it
 * every piece's receives were posted at once, and the executor looks at
 * every message in flight after each event: at n = 8 on the 16-core
 * machine the wavefront's AllReduce and AllGather, which had no window,
 * trailed ring.c by 20-60 %, its ReduceScatter, held to one by its sum
 * slots, did not (docs/measurements/cpu-ranks.md). */
static void ring_window(const cut_t *u, size_t k, int i, int units, int first) {
  hetccl_sched_t *s = u->s;
  if (!u->window || !s->steps) return; /* the data plane, or a counting build */
  int msg = HETCCL_STEP_NONE;
  for (int j = first; j < s->nsteps; j++) {
    int kind = s->steps[j].kind;
    if (kind == HETCCL_STEP_RECV || kind == HETCCL_STEP_RECV_REDUCE) { msg = j; break; }
    if (kind == HETCCL_STEP_SEND && msg == HETCCL_STEP_NONE) msg = j;
  }
  if (msg == HETCCL_STEP_NONE) return;
  int32_t *at = &u->window[(k % SUM_WAVES) * (size_t)units + (size_t)i];
  if (*at != HETCCL_STEP_NONE) hetccl_sched_also_after(s, msg, *at);
  *at = msg;
}

static void ring_units(const cut_t *u, const void *form, size_t K, int units, int by_piece,
                       ring_unit_fn unit) {
  if (by_piece) {
    for (size_t k = 0; k < K; k++)
      for (int i = 0; i < units; i++) unit(u, form, k, i);
    return;
  }
  if (u->window)
    for (int j = 0; j < SUM_WAVES * units; j++) u->window[j] = HETCCL_STEP_NONE;
  for (size_t w = 0; w + 1 < K + (size_t)units; w++)
    for (int i = 0; i < units && (size_t)i <= w; i++)
      if (w - (size_t)i < K) {
        int first = u->s->nsteps;
        unit(u, form, w - (size_t)i, i);
        ring_window(u, w - (size_t)i, i, units, first);
      }
}

/* AllReduce's chunks: chunk c of count, at the same place in both buffers. */
static size_t ar_off(const ring_rs_t *g, int c) { return chunk_off(g->count, g->n, c); }
static size_t ar_len(const ring_rs_t *g, int c) { return chunk_len(g->count, g->n, c); }
static size_t ar_dst(const ring_rs_t *g, int c, size_t po) {
  return chunk_off(g->count, g->n, c) * g->elem + po;
}
static int ar_recv(int r, int s, int n) { return algo_mod(r - s - 1, n); }

/* ReduceScatter's blocks: block c of sendbuf (count each); the finished one
 * is recvbuf. */
static size_t rs_off(const ring_rs_t *g, int c) { return (size_t)c * g->count; }
static size_t rs_len(const ring_rs_t *g, int c) { (void)c; return g->count; }
static size_t rs_dst(const ring_rs_t *g, int c, size_t po) { (void)g; (void)c; return po; }
static int rs_recv(int r, int s, int n) { return algo_mod(r - s - 2, n); }

static size_t blk_off(size_t count, int n, int c) { (void)n; return (size_t)c * count; }
static size_t blk_len(size_t count, int n, int c) { (void)n; (void)c; return count; }

/* AllReduce: the reduce-scatter's n units, its last (the finish) also the
 * all-gather's first, then the all-gather's n - 1 more. */
typedef struct ring_ar {
  ring_rs_t rs;
  ring_ag_t ag;
} ring_ar_t;

static void ring_allreduce_unit(const cut_t *u, const void *form, size_t k, int i) {
  const ring_ar_t *f = form;
  int done = HETCCL_STEP_NONE;
  if (i < u->n) done = ring_rs_unit(u, &f->rs, u->rank, k, i);
  if (i >= u->n - 1) ring_ag_unit(u, &f->ag, k, i - (u->n - 1), done);
}

static void ring_allreduce(const cut_t *u, int by_piece) {
  const hetccl_coll_t *c = u->c;
  int mine = algo_mod(u->rank + 1, u->n); /* the chunk this rank finishes */
  ring_ar_t f = {{ar_off, ar_len, ar_dst, ar_recv, c->count, u->n, u->elem, 1},
                 {c->recvbuf, chunk_off(c->count, u->n, mine) * u->elem, chunk_off, chunk_len,
                  c->count, mine}};
  ring_units(u, &f, npieces(u, chunk_len(c->count, u->n, 0)), 2 * u->n - 1, by_piece,
             ring_allreduce_unit);
}

static void ring_reducescatter_unit(const cut_t *u, const void *form, size_t k, int i) {
  ring_rs_unit(u, form, algo_mod(u->rank - 1, u->n), k, i);
}

static void ring_reducescatter(const cut_t *u, int by_piece) {
  ring_rs_t g = {rs_off, rs_len, rs_dst, rs_recv, u->c->count, u->n, u->elem, 0};
  ring_units(u, &g, npieces(u, u->c->count), u->n, by_piece, ring_reducescatter_unit);
}

/* This rank's block of an AllGather (or a Gather's root's) into its place
 * in recvbuf, whole. */
static void allgather_own(const cut_t *u) {
  size_t blk = u->c->count * u->elem;
  char *mine = AT(u->c->recvbuf, (size_t)u->rank * blk);
  if ((const char *)u->c->sendbuf != mine)
    hetccl_sched_copy(u->s, mine, u->c->sendbuf, blk, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
}

/* The host's share of allgather_own: piece k of this rank's block. */
static void own_piece(const cut_t *u, size_t k) {
  size_t blk = u->c->count * u->elem, o;
  char *mine = AT(u->c->recvbuf, (size_t)u->rank * blk);
  size_t bytes = piece_at(u, 0, u->c->count, k, &o);
  if (u->host && bytes && (const char *)u->c->sendbuf != mine)
    hetccl_sched_copy(u->s, mine + o, AT(u->c->sendbuf, o), bytes, HETCCL_STEP_NONE,
                      HETCCL_STEP_NONE);
}

static void ring_allgather_unit(const cut_t *u, const void *form, size_t k, int i) {
  ring_ag_unit(u, form, k, i, HETCCL_STEP_NONE);
  if (i == 0) own_piece(u, k);
}

static void ring_allgather(const cut_t *u, int by_piece) {
  if (!u->host) allgather_own(u);
  ring_ag_t a = {u->c->sendbuf, 0, blk_off, blk_len, u->c->count, u->rank};
  ring_units(u, &a, npieces(u, u->c->count), u->n, by_piece, ring_allgather_unit);
}

/* --- chains ------------------------------------------------------------------------- */

static void chain_broadcast(const cut_t *u) {
  hetccl_sched_t *s = u->s;
  const hetccl_coll_t *c = u->c;
  int pos = algo_mod(u->rank - c->root, u->n);
  int next = algo_mod(u->rank + 1, u->n), prev = algo_mod(u->rank - 1, u->n);
  int copy = pos == 0 && c->sendbuf != c->recvbuf; /* the root's own, out of place */
  if (copy && !u->host) /* the host's: piece by piece after each send, as AllGather's */
    hetccl_sched_copy(s, c->recvbuf, c->sendbuf, c->count * u->elem, HETCCL_STEP_NONE,
                      HETCCL_STEP_NONE);
  for (size_t k = 0, K = npieces(u, c->count); k < K; k++) {
    size_t o, bytes = piece_at(u, 0, c->count, k, &o);
    if (pos == 0) {
      hetccl_sched_send(s, next, AT(c->sendbuf, o), bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
      if (copy && u->host)
        hetccl_sched_copy(s, AT(c->recvbuf, o), AT(c->sendbuf, o), bytes, HETCCL_STEP_NONE,
                          HETCCL_STEP_NONE);
      continue;
    }
    int got = hetccl_sched_recv(s, prev, AT(c->recvbuf, o), bytes, HETCCL_STEP_NONE,
                                HETCCL_STEP_NONE);
    if (pos < u->n - 1)
      hetccl_sched_send(s, next, AT(c->recvbuf, o), bytes, got, HETCCL_STEP_NONE);
  }
}

static void chain_reduce(const cut_t *u) {
  hetccl_sched_t *s = u->s;
  const hetccl_coll_t *c = u->c;
  int pos = algo_mod(u->rank - c->root - 1, u->n); /* the root is last */
  int next = algo_mod(u->rank + 1, u->n), prev = algo_mod(u->rank - 1, u->n);
  for (size_t k = 0, K = npieces(u, c->count); k < K; k++) {
    size_t o, bytes = piece_at(u, 0, c->count, k, &o);
    if (pos == 0) {
      send_own(u, next, AT(c->sendbuf, o), bytes, k, NULL);
      continue;
    }
    int in = own(u, AT(c->sendbuf, o), bytes);
    if (pos < u->n - 1) {
      int war;
      char *sum = sum_slot(u, k, 0, &war);
      int rr = forward(s, hetccl_sched_recv_reduce(s, prev, sum, NULL, 0, bytes, in, war));
      sum_read(u, k, 0, hetccl_sched_send(s, next, NULL, bytes, rr, HETCCL_STEP_NONE));
    } else {
      char *dst = AT(c->recvbuf, o);
      int rr = hetccl_sched_recv_reduce(s, prev, dst, NULL, 0, bytes, in, HETCCL_STEP_NONE);
      hetccl_sched_finish(s, dst, bytes, rr, HETCCL_STEP_NONE);
    }
  }
}

/* --- direct --------------------------------------------------------------------------- */

void hetccl_pieces_send(hetccl_sched_t *s, int peer, const void *src, size_t bytes, size_t piece) {
  for (size_t o = 0; o < bytes; o += piece)
    hetccl_sched_send(s, peer, AT(src, o), bytes - o < piece ? bytes - o : piece,
                      HETCCL_STEP_NONE, HETCCL_STEP_NONE);
}

void hetccl_pieces_recv(hetccl_sched_t *s, int peer, void *dst, size_t bytes, size_t piece,
                        int guard) {
  for (size_t o = 0, k = 0; o < bytes; o += piece, k++)
    hetccl_sched_recv(s, peer, AT(dst, o), bytes - o < piece ? bytes - o : piece,
                      guard == HETCCL_STEP_NONE ? HETCCL_STEP_NONE : guard + (int)k,
                      HETCCL_STEP_NONE);
}

static void direct_alltoall(const cut_t *u) {
  hetccl_sched_t *s = u->s;
  const hetccl_coll_t *c = u->c;
  size_t blk = c->count * u->elem;
  int inplace = c->sendbuf == c->recvbuf;
  for (int q = 1; q < u->n; q++) {
    int p = algo_mod(u->rank + q, u->n);
    int first = s->nsteps; /* the send's first piece, where the schedule has room */
    hetccl_pieces_send(s, p, AT(c->sendbuf, (size_t)p * blk), blk, u->piece);
    hetccl_pieces_recv(s, p, AT(c->recvbuf, (size_t)p * blk), blk, u->piece,
                       inplace && s->steps ? first : HETCCL_STEP_NONE);
  }
  if (!inplace)
    hetccl_sched_copy(s, AT(c->recvbuf, (size_t)u->rank * blk),
                      AT(c->sendbuf, (size_t)u->rank * blk), blk, HETCCL_STEP_NONE,
                      HETCCL_STEP_NONE);
}

static void direct_gather(const cut_t *u) {
  const hetccl_coll_t *c = u->c;
  size_t blk = c->count * u->elem;
  if (u->rank != c->root) {
    hetccl_pieces_send(u->s, c->root, c->sendbuf, blk, u->piece);
    return;
  }
  for (int p = 0; p < u->n; p++)
    if (p != u->rank)
      hetccl_pieces_recv(u->s, p, AT(c->recvbuf, (size_t)p * blk), blk, u->piece,
                         HETCCL_STEP_NONE);
  allgather_own(u);
}

static void direct_scatter(const cut_t *u) {
  const hetccl_coll_t *c = u->c;
  size_t blk = c->count * u->elem;
  if (u->rank != c->root) {
    hetccl_pieces_recv(u->s, c->root, c->recvbuf, blk, u->piece, HETCCL_STEP_NONE);
    return;
  }
  for (int p = 0; p < u->n; p++)
    if (p != u->rank) hetccl_pieces_send(u->s, p, AT(c->sendbuf, (size_t)p * blk), blk, u->piece);
  const char *mine = AT(c->sendbuf, (size_t)u->rank * blk);
  if (mine != (const char *)c->recvbuf)
    hetccl_sched_copy(u->s, c->recvbuf, mine, blk, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
}

/* Both directions of a two-rank AllGather at once: a lane each. */
static void exchange_allgather(const cut_t *u) {
  int peer = 1 - u->rank;
  size_t blk = u->c->count * u->elem;
  if (!u->host) {
    allgather_own(u);
    hetccl_pieces_send(u->s, peer, u->c->sendbuf, blk, u->piece);
    hetccl_pieces_recv(u->s, peer, AT(u->c->recvbuf, (size_t)peer * blk), blk, u->piece,
                       HETCCL_STEP_NONE);
    return;
  }
  for (size_t k = 0, o = 0; o < blk; k++, o += u->piece) {
    size_t bytes = blk - o < u->piece ? blk - o : u->piece;
    hetccl_sched_send(u->s, peer, AT(u->c->sendbuf, o), bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    hetccl_sched_recv(u->s, peer, AT(u->c->recvbuf, (size_t)peer * blk + o), bytes,
                      HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    own_piece(u, k);
  }
}

/* --- the forms -------------------------------------------------------------------------- */

size_t hetccl_pieces_message_bytes(const hetccl_coll_t *c, int nranks) {
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  return c->func == HETCCL_FUNC_ALLREDUCE && nranks != 2 ? bytes / (size_t)nranks : bytes;
}

/* Bytes of scratch for build's intermediate sums (cut_t: sums, readers). */
static size_t scratch_bytes(int n, size_t piece) {
  return algo_round_up(SUM_WAVES * (size_t)n * piece, 64) +
         SUM_WAVES * (size_t)n * sizeof(int32_t);
}

/* host: for the host executor, which reduces on the CPU: a two-rank
 * AllReduce takes the ring (each rank reduces half the buffer) rather
 * than the whole-buffer exchange that saves the data plane a wavefront. */
static ncclResult_t build(hetccl_sched_t *s, const hetccl_coll_t *c, size_t piece, void *scratch,
                          int32_t *window, int host, int *cut) {
  cut_t u = {.s = s, .c = c, .piece = piece, .elem = hetccl_dtype_size(c->dtype),
             .rank = s->rank, .n = s->nranks, .window = window};
  if (scratch) {
    u.sums = scratch;
    u.readers = (int32_t *)(u.sums + algo_round_up(SUM_WAVES * (size_t)u.n * piece, 64));
    for (int i = 0; i < SUM_WAVES * u.n; i++) u.readers[i] = HETCCL_STEP_NONE;
  }
  u.scaled_sends = host && c->op.premul && hetccl_func_reduces(c->func);
  u.host = host;
  int two = u.n == 2;
  s->one_lane = 0;
  *cut = 0;
  switch (c->func) {
    case HETCCL_FUNC_ALLREDUCE:
      if (hetccl_knob_enum(HETCCL_KNOB_ALGO) == HETCCL_KNOB_ALGO_rhd) {
        hetccl_rhd_build(s, c);
        *cut = 1;
        return ncclSuccess;
      }
      if (two && !host) exchange_reduce(&u, c->count, 0, 0, 0);
      else s->one_lane = 1, ring_allreduce(&u, !host);
      return ncclSuccess;
    case HETCCL_FUNC_REDUCESCATTER:
      if (two)
        exchange_reduce(&u, c->count, (size_t)u.rank * c->count, (size_t)(1 - u.rank) * c->count,
                        0);
      else s->one_lane = 1, ring_reducescatter(&u, !host);
      return ncclSuccess;
    case HETCCL_FUNC_ALLGATHER:
      if (two) exchange_allgather(&u);
      else s->one_lane = 1, ring_allgather(&u, !host);
      return ncclSuccess;
    case HETCCL_FUNC_BROADCAST: s->one_lane = 1, chain_broadcast(&u); return ncclSuccess;
    case HETCCL_FUNC_REDUCE: s->one_lane = 1, chain_reduce(&u); return ncclSuccess;
    case HETCCL_FUNC_ALLTOALL: direct_alltoall(&u); return ncclSuccess;
    case HETCCL_FUNC_GATHER: direct_gather(&u); return ncclSuccess;
    case HETCCL_FUNC_SCATTER: direct_scatter(&u); return ncclSuccess;
    default: break;
  }
  WARN("plane: %s is not a collective", hetccl_func_name(c->func));
  return ncclInternalError;
}

ncclResult_t hetccl_pieces_coll(hetccl_sched_t *s, const hetccl_coll_t *c, size_t piece,
                                int *cut) {
  return build(s, c, piece, NULL, NULL, 0, cut);
}

/* --- on the host engine ---------------------------------------------------------- */

/* The data plane's form of c, run by the host executor (select.c's rows
 * under HETCCL_ALGO=wavefront): the same schedule both executors run, in
 * the host's pieces, with slots for the sums that have no place in recvbuf
 * (pieces.h). */
ncclResult_t hetccl_wavefront_run(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e), cut;
  size_t esize = hetccl_dtype_size(c->dtype);
  size_t piece = hetccl_algo_piece(e, hetccl_pieces_message_bytes(c, n) / esize, esize) * esize;
  /* slots only where a form keeps sums, or scaled data sent on, outside recvbuf */
  int slots = (n > 2 || c->op.premul) &&
              (c->func == HETCCL_FUNC_REDUCESCATTER || c->func == HETCCL_FUNC_REDUCE);
  size_t sums = slots ? scratch_bytes(n, piece) : 0;
  size_t window = SUM_WAVES * 2 * (size_t)n * sizeof(int32_t); /* a ring's units: at most 2n - 1 */
  hetccl_sched_t counting;
  hetccl_sched_init_ranks(&counting, NULL, 0, hetccl_engine_rank(e), n, &c->op);
  HETCCL_CHECK(build(&counting, c, piece, NULL, NULL, 1, &cut)); /* slots, window: no step */
  char *scratch = NULL;
  hetccl_sched_t *s = hetccl_algo_sched(e, &c->op, counting.wanted, sums + window,
                                        (void **)&scratch);
  if (!s) return ncclSystemError;
  HETCCL_CHECK(build(s, c, piece, sums ? scratch : NULL, (int32_t *)(scratch + sums), 1, &cut));
  /* A form whose receives only copy lets a pulling transport read its
   * sends in place (except where a receive waits for the rank's own send,
   * an in-place AlltoAll for one: the executor sees it, sched.h). One
   * whose receives reduce keeps its sends in the ring, as ring.c does.
   * Read in place, each piece's reduction waited on a process_vm_readv:
   * three ranks on the 2-core machine (single copy on: more ranks than
   * CPUs) took 3.4-3.7 ms for a 16 MiB ReduceScatter, 2.3-2.9 ms through
   * the ring; paired over 6 alternations the ring's way was 1.17-1.49 x
   * for ReduceScatter, 1.72-3.87 x for Reduce and 1.01-1.21 x for
   * AllReduce (docs/measurements.md). */
  s->pull_ok = !hetccl_func_reduces(c->func);
  return hetccl_sched_run_host(s, c->tag);
}
