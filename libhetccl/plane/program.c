/* Programs: the collectives of the data plane as lanes of steps
 * (plane_impl.h).
 *
 *   two ranks        AllReduce and ReduceScatter exchange what the peer
 *                    needs on a send lane while a receive lane reduces what
 *                    arrives (both directions of each PCIe link at once)
 *   rings (n >= 3)   AllReduce = reduce-scatter + all-gather, ReduceScatter,
 *                    AllGather: one lane, piece by piece through every step
 *                    (a wavefront), each intermediate sum written by the
 *                    reduction straight into the next channel's slot
 *   chains           Broadcast from the root, Reduce towards it
 *   direct           AlltoAll, Gather, Scatter, Send/Recv: a lane per peer
 *                    and direction
 *
 * Every result element is reduced on one rank, in one order (a ring's chunk
 * on the rank that finishes it, the two-rank exchange with the lower rank's
 * data first), so every rank ends with the same bits. PreMulSum scales each
 * rank's data by that rank's own scalar (ranks may pass different ones):
 * data leaves a rank scaled (a send of a PreMulSum operation scales as it
 * copies), and a rank scales its own part as it adds it (SCALE_A); Avg
 * divides once, where a chunk is finished.
 *
 * Pieces are numbered per channel in the order they are built here, which
 * is the order a lane moves them; the peer builds the same program and so
 * numbers the same pieces alike. A message of at least the plane's
 * wide_min bytes per channel moves in wide pieces (two slots each, two in
 * flight of the default four; plane_impl.h): the same bytes in flight in
 * half as many pieces, each paying its waits and signals once.
 *
 * Thread: the API caller's (build happens at launch). */
#include <stdlib.h>
#include <string.h>

#include "plane/plane_impl.h"
#include "runtime/reduce.h"
#include "util/check.h"
#include "util/log.h"

typedef struct builder {
  hetccl_plane_t *p;
  plane_phase_t *ph;
  size_t piece;     /* bytes */
  int rank, n;
  int graph;        /* a captured program's (capture.c) */
  plane_chan_t *out, *in; /* the channels it numbers on: the plane's or the captured ones */
} builder_t;

static ncclResult_t phase_open(builder_t *b, plane_prog_t *prog) {
  plane_phase_t *ph = calloc(1, sizeof(*ph));
  if (ph) ph->lanes = calloc((size_t)b->p->nlanes, sizeof(*ph->lanes));
  if (!ph || !ph->lanes) {
    free(ph);
    WARN("plane: out of memory for a program");
    return ncclSystemError;
  }
  ph->nlanes = b->p->nlanes;
  if (prog->tail) prog->tail->next = ph;
  else prog->head = ph;
  prog->tail = ph;
  b->ph = ph;
  return ncclSuccess;
}

/* Append s to lane l, numbering its pieces on its channels. */
static plane_step_t *emit(builder_t *b, int l, const plane_step_t *s) {
  plane_lane_t *lane = &b->ph->lanes[l];
  if (lane->n == lane->cap) {
    int cap = lane->cap ? 2 * lane->cap : 64;
    plane_step_t *n = realloc(lane->steps, (size_t)cap * sizeof(*n));
    if (!n) return NULL;
    lane->steps = n;
    lane->cap = cap;
  }
  plane_step_t *t = &lane->steps[lane->n++];
  *t = *s;
  t->span = t->bytes > b->p->a.piece ? 2 : 1; /* a wide piece (plane_impl.h) */
  t->graph = (uint8_t)b->graph;
  t->oc = t->out >= 0 ? &b->out[t->out] : NULL;
  t->ic = t->in >= 0 ? &b->in[t->in] : NULL;
  if (t->oc) t->out_q = t->oc->next, t->oc->next += t->span;
  if (t->ic) t->in_q = t->ic->next, t->ic->next += t->span;
  /* A piece that crosses to another host: its bridge learns its size. */
  if (t->oc && t->oc->bridge && plane_bridge_queue(b->p, t->oc, t->out_q, t->bytes) != ncclSuccess)
    return NULL;
  if (t->ic && t->ic->bridge && plane_bridge_queue(b->p, t->ic, t->in_q, t->bytes) != ncclSuccess)
    return NULL;
  return t;
}

/* A step with no channels and no extra wait, then the fields given: the
 * defaults are meant to be overridden. */
#pragma GCC diagnostic ignored "-Woverride-init"
#define STEP(...) ((plane_step_t){.in = -1, .out = -1, .dep_out = -1, __VA_ARGS__})

static ncclResult_t oom(void) {
  WARN("plane: out of memory for a program");
  return ncclSystemError;
}
#define EMIT(b, l, ...)                                                        \
  do {                                                                         \
    if (!emit((b), (l), &STEP(__VA_ARGS__))) return oom();                     \
  } while (0)

/* --- geometry ------------------------------------------------------------------ */

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
static size_t piece_at(const builder_t *b, size_t elem, size_t off, size_t len, size_t k,
                       size_t *byte_off) {
  size_t per = b->piece / elem;
  *byte_off = 0;
  if (k * per >= len) return 0;
  *byte_off = (off + k * per) * elem;
  size_t left = len - k * per;
  return (left < per ? left : per) * elem;
}

static size_t npieces(const builder_t *b, size_t elem, size_t len) {
  size_t per = b->piece / elem;
  return (len + per - 1) / per;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

#define AT(buf, off) ((char *)(buf) + (off))

/* --- two ranks -------------------------------------------------------------- */

/* AllReduce / ReduceScatter of two ranks: send what the peer reduces on the
 * send lane, reduce what arrives on the receive lane. `mine`/`theirs` are
 * the element offsets in sendbuf of the part this rank keeps / sends. */
static ncclResult_t exchange_reduce(builder_t *b, const hetccl_coll_t *c, size_t len,
                                    size_t mine, size_t theirs, size_t out_off) {
  size_t elem = hetccl_dtype_size(c->dtype);
  int peer = 1 - b->rank;
  const char *s = c->sendbuf;
  char *r = c->recvbuf;
  for (size_t k = 0, K = npieces(b, elem, len); k < K; k++) {
    size_t so, ro, bytes = piece_at(b, elem, theirs, len, k, &so);
    piece_at(b, elem, mine, len, k, &ro);
    size_t dst_off = out_off + (ro - mine * elem);
    plane_step_t *snd = emit(b, PLANE_LANE_OUT(peer), &STEP(.kind = STEP_SEND, .out = peer,
                                                            .src = AT(s, so), .bytes = bytes,
                                                            .op = &c->op));
    if (!snd) return oom();
    /* In place, piece k of the result overwrites what piece k of the send
     * reads when the two parts are the same (AllReduce). */
    int overlap = theirs == mine && r + dst_off == s + so;
    EMIT(b, PLANE_LANE_IN(peer), .kind = STEP_REDUCE, .in = peer, .src = AT(s, ro),
         .dst = AT(r, dst_off), .bytes = bytes, .swap = b->rank > peer, .op = &c->op,
         .flags = HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_FINISH,
         .dep_out = overlap ? peer : -1, .dep_q = snd->out_q + snd->span);
  }
  return ncclSuccess;
}

/* --- rings --------------------------------------------------------------------- */

/* The reduce-scatter half of a ring, piece k: chunk `first` goes out raw,
 * then chunk recv(s) arrives at step s and is reduced with this rank's
 * part, into the next slot or, at the last step, into `dst(chunk)`. The
 * chunk layout is given by `off`/`len` (elements) in sendbuf and where the
 * finished chunk goes (byte offset in recvbuf). */
typedef struct ring_rs {
  size_t (*off)(const struct ring_rs *, int chunk);
  size_t (*len)(const struct ring_rs *, int chunk);
  size_t (*dst)(const struct ring_rs *, int chunk, size_t piece_off); /* recvbuf byte offset */
  size_t count;
  int n;
  size_t elem;
} ring_rs_t;

static ncclResult_t ring_rs_piece(builder_t *b, const hetccl_coll_t *c, const ring_rs_t *g,
                                  int first, int (*recv_chunk)(int rank, int s, int n), size_t k) {
  int next = mod(b->rank + 1, b->n), prev = mod(b->rank - 1, b->n);
  size_t o, bytes = piece_at(b, g->elem, g->off(g, first), g->len(g, first), k, &o);
  if (bytes) EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next, .src = AT(c->sendbuf, o),
                  .bytes = bytes, .op = &c->op);
  for (int s = 0; s <= b->n - 2; s++) {
    int cr = recv_chunk(b->rank, s, b->n);
    bytes = piece_at(b, g->elem, g->off(g, cr), g->len(g, cr), k, &o);
    if (!bytes) continue;
    uint16_t flags = HETCCL_REDUCE_SCALE_A;
    if (s < b->n - 2) {
      EMIT(b, PLANE_LANE_RING, .kind = STEP_REDUCE, .in = prev, .out = next,
           .src = AT(c->sendbuf, o), .dst = NULL, .bytes = bytes, .op = &c->op, .flags = flags);
    } else {
      size_t d = g->dst(g, cr, o - g->off(g, cr) * g->elem);
      EMIT(b, PLANE_LANE_RING, .kind = STEP_REDUCE, .in = prev, .src = AT(c->sendbuf, o),
           .dst = AT(c->recvbuf, d), .bytes = bytes, .op = &c->op,
           .flags = flags | HETCCL_REDUCE_FINISH);
    }
  }
  return ncclSuccess;
}

/* The all-gather half of a ring, piece k: block `first` (this rank's
 * finished one, at byte offset from(first) in `from`) goes out, then block
 * (first - 1 - t) arrives at step t into recvbuf and is passed on. */
static ncclResult_t ring_ag_piece(builder_t *b, const void *from, size_t from_off, void *recvbuf,
                                  size_t (*blk_off)(size_t count, int n, int c),
                                  size_t (*blk_len)(size_t count, int n, int c), size_t count,
                                  size_t elem, int first, size_t k) {
  int next = mod(b->rank + 1, b->n), prev = mod(b->rank - 1, b->n);
  size_t o, bytes = piece_at(b, elem, blk_off(count, b->n, first), blk_len(count, b->n, first), k,
                             &o);
  if (bytes) EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next,
                  .src = AT(from, from_off + o - blk_off(count, b->n, first) * elem),
                  .bytes = bytes);
  for (int t = 0; t <= b->n - 2; t++) {
    int cr = mod(first - 1 - t, b->n);
    bytes = piece_at(b, elem, blk_off(count, b->n, cr), blk_len(count, b->n, cr), k, &o);
    if (!bytes) continue;
    EMIT(b, PLANE_LANE_RING, .kind = STEP_RECV, .in = prev, .dst = AT(recvbuf, o), .bytes = bytes);
    if (t < b->n - 2)
      EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next, .src = AT(recvbuf, o),
           .bytes = bytes);
  }
  return ncclSuccess;
}

/* AllReduce's chunks: chunk c of count, at the same place in both buffers. */
static size_t ar_off(const ring_rs_t *g, int c) { return chunk_off(g->count, g->n, c); }
static size_t ar_len(const ring_rs_t *g, int c) { return chunk_len(g->count, g->n, c); }
static size_t ar_dst(const ring_rs_t *g, int c, size_t po) {
  return chunk_off(g->count, g->n, c) * g->elem + po;
}
static int ar_recv(int r, int s, int n) { return mod(r - s - 1, n); }

/* ReduceScatter's blocks: block c of sendbuf (count each); the finished one
 * is recvbuf. */
static size_t rs_off(const ring_rs_t *g, int c) { return (size_t)c * g->count; }
static size_t rs_len(const ring_rs_t *g, int c) { (void)c; return g->count; }
static size_t rs_dst(const ring_rs_t *g, int c, size_t po) { (void)g; (void)c; return po; }
static int rs_recv(int r, int s, int n) { return mod(r - s - 2, n); }

static size_t blk_off(size_t count, int n, int c) { (void)n; return (size_t)c * count; }
static size_t blk_len(size_t count, int n, int c) { (void)n; (void)c; return count; }

static ncclResult_t ring_allreduce(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype);
  ring_rs_t g = {ar_off, ar_len, ar_dst, c->count, b->n, elem};
  int mine = mod(b->rank + 1, b->n); /* the chunk this rank finishes */
  for (size_t k = 0, K = npieces(b, elem, chunk_len(c->count, b->n, 0)); k < K; k++) {
    HETCCL_CHECK(ring_rs_piece(b, c, &g, b->rank, ar_recv, k));
    HETCCL_CHECK(ring_ag_piece(b, c->recvbuf, chunk_off(c->count, b->n, mine) * elem,
                               c->recvbuf, chunk_off, chunk_len, c->count, elem, mine, k));
  }
  return ncclSuccess;
}

static ncclResult_t ring_reducescatter(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype);
  ring_rs_t g = {rs_off, rs_len, rs_dst, c->count, b->n, elem};
  for (size_t k = 0, K = npieces(b, elem, c->count); k < K; k++)
    HETCCL_CHECK(ring_rs_piece(b, c, &g, mod(b->rank - 1, b->n), rs_recv, k));
  return ncclSuccess;
}

static ncclResult_t ring_allgather(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype), blk = c->count * elem;
  char *mine = AT(c->recvbuf, (size_t)b->rank * blk);
  if ((const char *)c->sendbuf != mine)
    EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = c->sendbuf, .dst = mine, .bytes = blk);
  for (size_t k = 0, K = npieces(b, elem, c->count); k < K; k++)
    HETCCL_CHECK(ring_ag_piece(b, c->sendbuf, 0, c->recvbuf, blk_off, blk_len, c->count, elem,
                               b->rank, k));
  return ncclSuccess;
}

/* --- chains ---------------------------------------------------------------------- */

static ncclResult_t chain_broadcast(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype);
  int pos = mod(b->rank - c->root, b->n);
  int next = mod(b->rank + 1, b->n), prev = mod(b->rank - 1, b->n);
  if (pos == 0 && c->sendbuf != c->recvbuf)
    EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = c->sendbuf, .dst = c->recvbuf,
         .bytes = c->count * elem);
  for (size_t k = 0, K = npieces(b, elem, c->count); k < K; k++) {
    size_t o, bytes = piece_at(b, elem, 0, c->count, k, &o);
    if (pos == 0) {
      EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next, .src = AT(c->sendbuf, o),
           .bytes = bytes);
      continue;
    }
    EMIT(b, PLANE_LANE_RING, .kind = STEP_RECV, .in = prev, .dst = AT(c->recvbuf, o),
         .bytes = bytes);
    if (pos < b->n - 1)
      EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next, .src = AT(c->recvbuf, o),
           .bytes = bytes);
  }
  return ncclSuccess;
}

static ncclResult_t chain_reduce(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype);
  int pos = mod(b->rank - c->root - 1, b->n); /* the root is last */
  int next = mod(b->rank + 1, b->n), prev = mod(b->rank - 1, b->n);
  for (size_t k = 0, K = npieces(b, elem, c->count); k < K; k++) {
    size_t o, bytes = piece_at(b, elem, 0, c->count, k, &o);
    uint16_t flags = HETCCL_REDUCE_SCALE_A;
    if (pos == 0)
      EMIT(b, PLANE_LANE_RING, .kind = STEP_SEND, .out = next, .src = AT(c->sendbuf, o),
           .bytes = bytes, .op = &c->op);
    else if (pos < b->n - 1)
      EMIT(b, PLANE_LANE_RING, .kind = STEP_REDUCE, .in = prev, .out = next,
           .src = AT(c->sendbuf, o), .bytes = bytes, .op = &c->op, .flags = flags);
    else
      EMIT(b, PLANE_LANE_RING, .kind = STEP_REDUCE, .in = prev, .src = AT(c->sendbuf, o),
           .dst = AT(c->recvbuf, o), .bytes = bytes, .op = &c->op,
           .flags = flags | HETCCL_REDUCE_FINISH);
  }
  return ncclSuccess;
}

/* --- direct ---------------------------------------------------------------------- */

/* `bytes` from src to peer on its send lane, piece by piece; the first
 * step is returned in *first (NULL when bytes is 0). */
static ncclResult_t send_to(builder_t *b, int peer, const void *src, size_t bytes) {
  for (size_t o = 0; o < bytes; o += b->piece) {
    size_t n = bytes - o < b->piece ? bytes - o : b->piece;
    EMIT(b, PLANE_LANE_OUT(peer), .kind = STEP_SEND, .out = peer, .src = AT(src, o), .bytes = n);
  }
  return ncclSuccess;
}

/* From peer into dst; `guard` in place: each piece waits until the send
 * lane to the same peer has copied out what it overwrites (the pieces of
 * the send that started at out piece `guard_q`, cut as these are: the
 * send's steps up to this one's end number that many slots' pieces). */
static ncclResult_t recv_from(builder_t *b, int peer, void *dst, size_t bytes, int guard,
                              uint64_t guard_q) {
  size_t slot = b->p->a.piece;
  for (size_t o = 0; o < bytes; o += b->piece) {
    size_t n = bytes - o < b->piece ? bytes - o : b->piece;
    EMIT(b, PLANE_LANE_IN(peer), .kind = STEP_RECV, .in = peer, .dst = AT(dst, o), .bytes = n,
         .dep_out = guard ? peer : -1, .dep_q = guard_q + (o + n + slot - 1) / slot);
  }
  return ncclSuccess;
}

static ncclResult_t direct_alltoall(builder_t *b, const hetccl_coll_t *c) {
  size_t blk = c->count * hetccl_dtype_size(c->dtype);
  int inplace = c->sendbuf == c->recvbuf;
  for (int q = 1; q < b->n; q++) {
    int p = mod(b->rank + q, b->n);
    uint64_t first = b->out[p].next;
    HETCCL_CHECK(send_to(b, p, AT(c->sendbuf, (size_t)p * blk), blk));
    HETCCL_CHECK(recv_from(b, p, AT(c->recvbuf, (size_t)p * blk), blk, inplace, first));
  }
  if (!inplace)
    EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = AT(c->sendbuf, (size_t)b->rank * blk),
         .dst = AT(c->recvbuf, (size_t)b->rank * blk), .bytes = blk);
  return ncclSuccess;
}

static ncclResult_t direct_gather(builder_t *b, const hetccl_coll_t *c) {
  size_t blk = c->count * hetccl_dtype_size(c->dtype);
  if (b->rank != c->root) return send_to(b, c->root, c->sendbuf, blk);
  for (int p = 0; p < b->n; p++)
    if (p != b->rank) HETCCL_CHECK(recv_from(b, p, AT(c->recvbuf, (size_t)p * blk), blk, 0, 0));
  char *mine = AT(c->recvbuf, (size_t)b->rank * blk);
  if ((const char *)c->sendbuf != mine)
    EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = c->sendbuf, .dst = mine, .bytes = blk);
  return ncclSuccess;
}

static ncclResult_t direct_scatter(builder_t *b, const hetccl_coll_t *c) {
  size_t blk = c->count * hetccl_dtype_size(c->dtype);
  if (b->rank != c->root) return recv_from(b, c->root, c->recvbuf, blk, 0, 0);
  for (int p = 0; p < b->n; p++)
    if (p != b->rank) HETCCL_CHECK(send_to(b, p, AT(c->sendbuf, (size_t)p * blk), blk));
  const char *mine = AT(c->sendbuf, (size_t)b->rank * blk);
  if (mine != (const char *)c->recvbuf)
    EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = mine, .dst = c->recvbuf, .bytes = blk);
  return ncclSuccess;
}

/* --- programs ------------------------------------------------------------------- */

/* The pieces of a message of `bytes` per channel: wide (two slots' worth,
 * plane_impl.h) from the plane's wide_min, else a slot's worth. Fewer,
 * larger pieces pay the per-piece waits and signals less often, at the
 * same bytes in flight; small messages keep more pieces to overlap. */
static void pieces_for(builder_t *b, size_t bytes) {
  size_t slot = b->p->a.piece;
  b->piece = b->p->wide_min && !b->graph && bytes >= b->p->wide_min ? 2 * slot : slot;
}

static ncclResult_t build_coll(builder_t *b, const hetccl_coll_t *c) {
  size_t elem = hetccl_dtype_size(c->dtype);
  int two = b->n == 2;
  /* a ring AllReduce moves a chunk per step, everything else the count */
  pieces_for(b, c->count * elem / (c->func == HETCCL_FUNC_ALLREDUCE && !two ? b->n : 1));
  switch (c->func) {
    case HETCCL_FUNC_ALLREDUCE:
      return two ? exchange_reduce(b, c, c->count, 0, 0, 0) : ring_allreduce(b, c);
    case HETCCL_FUNC_REDUCESCATTER:
      return two ? exchange_reduce(b, c, c->count, (size_t)b->rank * c->count,
                                   (size_t)(1 - b->rank) * c->count, 0)
                 : ring_reducescatter(b, c);
    case HETCCL_FUNC_ALLGATHER:
      if (two) { /* both directions at once: a lane each */
        int peer = 1 - b->rank;
        size_t blk = c->count * elem;
        char *mine = AT(c->recvbuf, (size_t)b->rank * blk);
        if ((const char *)c->sendbuf != mine)
          EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = c->sendbuf, .dst = mine, .bytes = blk);
        HETCCL_CHECK(send_to(b, peer, c->sendbuf, blk));
        return recv_from(b, peer, AT(c->recvbuf, (size_t)peer * blk), blk, 0, 0);
      }
      return ring_allgather(b, c);
    case HETCCL_FUNC_BROADCAST: return chain_broadcast(b, c);
    case HETCCL_FUNC_REDUCE: return chain_reduce(b, c);
    case HETCCL_FUNC_ALLTOALL: return direct_alltoall(b, c);
    case HETCCL_FUNC_GATHER: return direct_gather(b, c);
    case HETCCL_FUNC_SCATTER: return direct_scatter(b, c);
    default: break;
  }
  WARN("plane: %s is not a collective", hetccl_func_name(c->func));
  return ncclInternalError;
}

/* Every send and receive of the share: per peer in call order; a message to
 * this rank itself is a copy from the matching send (k-th with k-th). */
static ncclResult_t build_p2p(builder_t *b, const hetccl_plane_task_t *tasks, int ntasks) {
  int self_send = 0;
  for (int i = 0; i < ntasks; i++) {
    const hetccl_plane_task_t *t = &tasks[i];
    if (t->kind == HETCCL_PLANE_COLL || t->bytes == 0) continue;
    if (t->peer != b->rank) {
      pieces_for(b, t->bytes);
      if (t->kind == HETCCL_PLANE_SEND) HETCCL_CHECK(send_to(b, t->peer, t->buf, t->bytes));
      else HETCCL_CHECK(recv_from(b, t->peer, t->buf, t->bytes, 0, 0));
      continue;
    }
    if (t->kind != HETCCL_PLANE_RECV) continue;
    while (self_send < ntasks && !(tasks[self_send].kind == HETCCL_PLANE_SEND &&
                                   tasks[self_send].peer == b->rank && tasks[self_send].bytes))
      self_send++;
    if (self_send == ntasks || tasks[self_send].bytes != t->bytes) {
      WARN("p2p: rank %d receives %zu bytes from itself without a matching send",
           plane_user_rank(b->p, b->rank), t->bytes);
      return ncclInvalidUsage;
    }
    if (t->buf != tasks[self_send].buf)
      EMIT(b, PLANE_LANE_RING, .kind = STEP_COPY, .src = tasks[self_send].buf, .dst = t->buf,
           .bytes = t->bytes);
    self_send++;
  }
  return ncclSuccess;
}

ncclResult_t plane_prog_build(hetccl_plane_t *p, const hetccl_plane_task_t *tasks, int ntasks,
                              int graph, plane_prog_t *prog) {
  memset(prog, 0, sizeof(*prog));
  builder_t b = {.p = p, .piece = p->a.piece, .rank = p->a.rank, .n = p->a.nranks,
                 .graph = graph, .out = graph ? p->gout : p->out, .in = graph ? p->gin : p->in};
  prog->graph = graph;
  for (int q = 0; graph && q < p->a.nranks; q++) {
    p->gout[q].prog_base = p->gout[q].next;
    p->gout[q].dep_used = 0;
  }
  ncclResult_t res = ncclSuccess;
  int p2p = 0;
  for (int i = 0; i < ntasks && res == ncclSuccess; i++) {
    if (tasks[i].kind != HETCCL_PLANE_COLL) {
      p2p = 1;
      continue;
    }
    if (tasks[i].coll.count == 0) continue;
    res = phase_open(&b, prog);
    if (res == ncclSuccess) res = build_coll(&b, &tasks[i].coll);
  }
  if (res == ncclSuccess && p2p) {
    res = phase_open(&b, prog);
    if (res == ncclSuccess) res = build_p2p(&b, tasks, ntasks);
  }
  if (res != ncclSuccess) plane_prog_free(prog);
  else if (p->bridges) prog->bridge_end = plane_bridge_mark(p);
  return res;
}

void plane_prog_free(plane_prog_t *prog) {
  while (prog->head) {
    plane_phase_t *ph = prog->head;
    prog->head = ph->next;
    for (int l = 0; l < ph->nlanes; l++) free(ph->lanes[l].steps);
    free(ph->lanes);
    free(ph);
  }
  prog->tail = NULL;
}

int hetccl_plane_task_reduces(const hetccl_plane_task_t *t) {
  return t->kind == HETCCL_PLANE_COLL && hetccl_func_reduces(t->coll.func) && t->coll.count;
}
