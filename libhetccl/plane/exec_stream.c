/* The stream executor: a program enqueued on a GPU rank's streams
 * (plane_impl.h).
 *
 * Each step becomes up to three stream waits on slot counters, one copy
 * (the copy engine: device memory to a slot, a slot to device memory) or
 * one reduction, and one or two stream writes of counters. A reduction is
 * a copy of the peer's piece from its slot into a stage in device memory,
 * then a kernel that reads the stage (args.reduce_copy; a kernel reading
 * the slot through its device mapping, the other way, moves host memory
 * at half the copy engine's speed or less). Nothing runs on a CPU after
 * this returns: the streams wait on the counters the peers' streams (or
 * CPUs) write.
 *
 * A phase with one lane runs on the caller's stream itself; a phase with
 * several gives each lane streams of this plane's, forked from the
 * caller's stream by an event and joined back to it by one event per
 * stream, so that the caller's later work waits for all of them. A lane
 * to or from one peer (not the ring lane, whose steps feed each other)
 * spreads its pieces over HETCCL_PLANE_LANE_STREAMS streams, piece q on
 * stream q % K: each stream waits and signals between its copies, and the
 * other's copy fills that gap. K divides the slot count, so a slot's
 * pieces all pass on one stream, in order, and its counters only grow.
 *
 * In such a phase a receiving lane's reductions into device memory run on
 * a stream of their own (the split path): the lane copies each piece from
 * its slot into the channel's split stage (HETCCL_PLANE_STAGE) and frees
 * the slot at once; the reduction stream reduces stage pieces as SMs come
 * free. A kernel that waits for the application's compute (a GEMM holding
 * every SM) then holds back neither the copy engines nor the sender, only
 * the operation's end:
 *
 *   lane:      wait produced(q) [wait reduced >= i+1-S] copy slot->stage[i%S]
 *              write consumed(q) write staged[i%S] = i+1
 *   reduction: [wait dep] wait staged[i%S] >= i+1  kernel(stage[i%S])
 *              write reduced = i+1
 *
 * staged and reduced are this rank's own counters per channel (mapped
 * host memory), i counts the channel's split reductions. reduced has one
 * writer, the reduction stream, in order; staged[j] is written again only
 * after the reduction of its last piece has begun, so it too only grows.
 *
 * Thread: the API caller's, with this rank's device current. */
#include <stdlib.h>

#include "plane/plane_impl.h"
#include "runtime/reduce.h"
#include "util/check.h"
#include "util/log.h"

ncclResult_t plane_streams_create(hetccl_plane_t *p) {
  if (p->lane_stream) return ncclSuccess;
  size_t n = (size_t)p->nlanes, subs = n * (size_t)p->lane_streams;
  void **s = calloc(subs, sizeof(*s)), **e = calloc(subs, sizeof(*e));
  void **rs = calloc(n, sizeof(*rs)), **re = calloc(n, sizeof(*re));
  if (!s || !e || !rs || !re) {
    free(s);
    free(e);
    free(rs);
    free(re);
    WARN("plane: out of memory for %d streams", p->nlanes);
    return ncclSystemError;
  }
  p->lane_stream = s;
  p->lane_event = e;
  p->reduce_stream = rs;
  p->reduce_event = re;
  return p->a.rt->event_create(&p->fork_event);
}

/* *stream (and the *event that joins it), made on first use: a device has
 * few hardware queues (8 by default), and streams beyond them share one,
 * so only the lanes a program uses get streams. */
static ncclResult_t stream_made(hetccl_plane_t *p, void **stream, void **event, void **out) {
  if (!*stream) {
    HETCCL_CHECK(p->a.rt->stream_create(stream, p->a.urgent_streams));
    HETCCL_CHECK(p->a.rt->event_create(event));
  }
  *out = *stream;
  return ncclSuccess;
}

/* Lane streams are indexed l * lane_streams + sub. */
static ncclResult_t lane_stream(hetccl_plane_t *p, int idx, void **out) {
  return stream_made(p, &p->lane_stream[idx], &p->lane_event[idx], out);
}

/* Which of lane l's streams takes step s: its piece's, except on the ring
 * lane (and for a step with no channel), which keeps one, and for a wide
 * piece, which keeps the lane's first: two wide pieces in flight on two
 * streams moved half as fast as on one (2 x H200, 256 MiB and up). */
static int lane_sub(const hetccl_plane_t *p, int l, const plane_step_t *s) {
  if (l == PLANE_LANE_RING || s->span > 1) return 0;
  uint64_t q = s->in >= 0 ? s->in_q : s->out >= 0 ? s->out_q : 0;
  return (int)(q % (uint64_t)p->lane_streams);
}

/* Lane l's reduction stream (the split path). */
static ncclResult_t reduce_stream(hetccl_plane_t *p, int l, void **out) {
  return stream_made(p, &p->reduce_stream[l], &p->reduce_event[l], out);
}

void plane_streams_destroy(hetccl_plane_t *p) {
  const hetccl_runtime_t *rt = p->a.rt;
  for (int i = 0; p->lane_stream && i < p->nlanes * p->lane_streams; i++) {
    if (p->lane_stream[i]) rt->stream_destroy(p->lane_stream[i]);
    if (p->lane_event[i]) rt->event_destroy(p->lane_event[i]);
  }
  for (int l = 0; p->reduce_stream && l < p->nlanes; l++) {
    if (p->reduce_stream[l]) rt->stream_destroy(p->reduce_stream[l]);
    if (p->reduce_event[l]) rt->event_destroy(p->reduce_event[l]);
  }
  if (p->fork_event) rt->event_destroy(p->fork_event);
  free(p->lane_stream);
  free(p->lane_event);
  free(p->reduce_stream);
  free(p->reduce_event);
  p->lane_stream = p->lane_event = p->reduce_stream = p->reduce_event = NULL;
  p->fork_event = NULL;
}

static ncclResult_t wait_on(hetccl_plane_t *p, void *st, const plane_chan_t *c,
                            volatile uint64_t *counter, uint64_t value) {
  return p->a.rt->stream_wait_counter(st, counter, plane_counter_dev(c, counter), value);
}

static ncclResult_t write_to(hetccl_plane_t *p, void *st, const plane_chan_t *c,
                             volatile uint64_t *counter, uint64_t value) {
  return p->a.rt->stream_write_counter(st, counter, plane_counter_dev(c, counter), value);
}

/* The counters of step s's pieces, a wide one's too (plane_impl.h): its
 * piece is in (the last slot's produced), its slots are free (each one's
 * consumed), it has been read (each consumed set), it has been written
 * (the last produced set).
 *
 * A captured program's step (s->graph) treats them as mailboxes instead
 * (capture.c): produced[slot] is 1 while the slot holds a piece, consumed
 * [slot] 1 while it is free, and whoever takes the state it waited for
 * clears it; its pieces are never wide. */
static ncclResult_t wait_arrived(hetccl_plane_t *p, void *st, const plane_step_t *s) {
  plane_chan_t *in = s->ic;
  uint64_t last = s->in_q + s->span - 1;
  if (s->graph) {
    HETCCL_CHECK(wait_on(p, st, in, plane_produced(p, in, last), 1));
    return write_to(p, st, in, plane_produced(p, in, last), 0);
  }
  return wait_on(p, st, in, plane_produced(p, in, last), last + 1);
}

static ncclResult_t wait_free(hetccl_plane_t *p, void *st, const plane_step_t *s) {
  plane_chan_t *out = s->oc;
  uint64_t slots = (uint64_t)p->a.slots;
  if (s->graph) {
    HETCCL_CHECK(wait_on(p, st, out, plane_consumed(p, out, s->out_q), 1));
    return write_to(p, st, out, plane_consumed(p, out, s->out_q), 0);
  }
  for (uint64_t q = s->out_q; q < s->out_q + s->span; q++)
    if (q + 1 > slots) HETCCL_CHECK(wait_on(p, st, out, plane_consumed(p, out, q), q + 1 - slots));
  return ncclSuccess;
}

static ncclResult_t mark_read(hetccl_plane_t *p, void *st, const plane_step_t *s) {
  plane_chan_t *in = s->ic;
  for (uint64_t q = s->in_q; q < s->in_q + s->span; q++)
    HETCCL_CHECK(write_to(p, st, in, plane_consumed(p, in, q), s->graph ? 1 : q + 1));
  return ncclSuccess;
}

static ncclResult_t mark_written(hetccl_plane_t *p, void *st, const plane_step_t *s) {
  plane_chan_t *out = s->oc;
  uint64_t last = s->out_q + s->span - 1;
  if (!s->graph) return write_to(p, st, out, plane_produced(p, out, last), last + 1);
  HETCCL_CHECK(write_to(p, st, out, plane_produced(p, out, last), 1));
  if (!out->dep_used) return ncclSuccess;
  /* a step of this program waits for this piece (wait_dep): counted from
   * the program's start, so that every replay counts alike */
  volatile uint64_t *d = plane_gdep(p, s->out, last);
  return p->a.rt->stream_write_counter(st, d, plane_gdep_dev(p, d), last - out->prog_base + 1);
}

/* This rank's split-path counters for channel `in` (plane_impl.h). */
static ncclResult_t wait_local(hetccl_plane_t *p, void *st, volatile uint64_t *ctr,
                               uint64_t value) {
  return p->a.rt->stream_wait_counter(st, ctr, plane_ctr_dev(p, ctr), value);
}

static ncclResult_t write_local(hetccl_plane_t *p, void *st, volatile uint64_t *ctr,
                                uint64_t value) {
  return p->a.rt->stream_write_counter(st, ctr, plane_ctr_dev(p, ctr), value);
}

/* Bytes after a split stage for its arrive words and its seen word
 * (plane_impl.h), and how many of them are zeroed. */
#define ARRIVE_BYTES 4096u
#define ARRIVE_SEEN (PLANE_MAX_STAGE_PIECES * sizeof(unsigned))
#define ARRIVE_ZEROED (ARRIVE_SEEN + sizeof(uint64_t))

/* Channel c's stage in device memory (plane_impl.h), or with `split` its
 * split stage (and arrive words, zeroed on `stream`), made on first use. */
static ncclResult_t chan_stage(hetccl_plane_t *p, plane_chan_t *c, int split, void *stream) {
  static const uint64_t zeros[ARRIVE_ZEROED / 8];
  char **stage = split ? &c->split_stage : &c->stage;
  int pieces = split ? p->stage_pieces : p->a.slots;
  if (*stage || !p->a.reduce_copy || !pieces) return ncclSuccess;
  void *mem = NULL; /* room for a wide piece past the last (plane_impl.h) */
  size_t room = p->wide_min ? 1 : 0, bytes = ((size_t)pieces + room) * p->a.piece;
  ncclResult_t res = p->a.rt->mem_alloc(&mem, bytes + (split ? ARRIVE_BYTES : 0));
  if (res == ncclSuccess && split) {
    c->arrive = (unsigned *)((char *)mem + bytes);
    res = p->a.rt->memcpy_async(c->arrive, zeros, sizeof(zeros), stream);
    if (res != ncclSuccess) (void)p->a.rt->mem_free(mem);
  }
  if (res != ncclSuccess) { /* the runtime logged why */
    hetccl_last_error_prefix("plane: rank %d: no device memory for a %sstage of %d pieces of "
                             "%zu bytes%s", plane_user_rank(p, p->a.rank), split ? "split " : "",
                             pieces, p->a.piece, split ? " (HETCCL_PLANE_STAGE)" : "");
    return res;
  }
  *stage = mem;
  return ncclSuccess;
}

void plane_stages_free(hetccl_plane_t *p) {
  int saved = -1;
  char busid[32];
  for (int k = 0; k < 2 * p->a.nranks; k++) {
    int q = k % p->a.nranks;
    plane_chan_t *c = k < p->a.nranks ? (p->in ? &p->in[q] : NULL) : (p->gin ? &p->gin[q] : NULL);
    if (!c) continue;
    char **stages[2] = {&c->stage, &c->split_stage};
    for (int i = 0; i < 2; i++) {
      if (!*stages[i]) continue;
      if (saved < 0 && p->a.rt->current_device(&saved, busid, sizeof(busid)) == ncclSuccess &&
          saved != p->a.dev)
        (void)p->a.rt->set_device(p->a.dev);
      (void)p->a.rt->mem_free(*stages[i]);
      *stages[i] = NULL;
      if (i == 1) c->arrive = NULL;
    }
  }
  if (saved >= 0 && saved != p->a.dev) (void)p->a.rt->set_device(saved);
}

/* Below this, a reduction reads the slot itself even with a stage: one
 * more copy would cost more latency than reading so few bytes over the bus
 * takes. */
#define STAGE_MIN_BYTES (64u << 10)

/* The operand a reduction reads for piece in_q of `in`: its stage, filled
 * from the slot by a copy enqueued here, or the slot itself. */
static ncclResult_t reduce_operand(hetccl_plane_t *p, const plane_step_t *s, void *st,
                                   const void **operand) {
  const plane_chan_t *in = s->ic;
  if (!in->stage || s->bytes < STAGE_MIN_BYTES) {
    *operand = plane_slot_dev(p, in, s->in_q);
    return ncclSuccess;
  }
  char *stage = in->stage + (s->in_q % (uint64_t)p->a.slots) * p->a.piece;
  HETCCL_CHECK(p->a.rt->memcpy_async(stage, plane_slot_host(p, in, s->in_q), s->bytes, st));
  *operand = stage;
  return ncclSuccess;
}

/* The kernel of reduction step s, reading the peer's piece at `slot` (its
 * slot, or a stage piece); count 0 loads the kernel only (runtime.h,
 * reduce_async). */
/* The kernel flags of reduction step s: with swap the slot is the first
 * operand, and its scaling goes with it. */
static unsigned reduce_flags(const plane_step_t *s) {
  unsigned a = s->flags & HETCCL_REDUCE_SCALE_A, b = s->flags & HETCCL_REDUCE_SCALE_B;
  if (!s->swap) return s->flags;
  return (s->flags & HETCCL_REDUCE_FINISH) | (b ? HETCCL_REDUCE_SCALE_A : 0) |
         (a ? HETCCL_REDUCE_SCALE_B : 0);
}

static ncclResult_t reduce_with(hetccl_plane_t *p, const plane_step_t *s, const void *slot,
                                size_t count, void *st) {
  void *dst = s->dst ? s->dst : plane_slot_dev(p, s->oc, s->out_q);
  if (s->swap)
    return p->a.rt->reduce_async(s->op, dst, slot, s->src, count, reduce_flags(s), st);
  return p->a.rt->reduce_async(s->op, dst, s->src, slot, count, reduce_flags(s), st);
}

/* ahead: load the kernel only. */
static ncclResult_t reduce_step(hetccl_plane_t *p, const plane_step_t *s, void *st, int ahead) {
  const void *slot = NULL;
  if (ahead) return reduce_with(p, s, plane_slot_dev(p, s->ic, s->in_q), 0, st);
  HETCCL_CHECK(reduce_operand(p, s, st, &slot));
  return reduce_with(p, s, slot, s->bytes / hetccl_dtype_size(s->op->dtype), st);
}

/* May reduction step s take the split path (in a multi-lane phase)? Only
 * a reduction into device memory: one into the next channel's slot (a
 * ring's middle steps) has nothing to gain, as the next rank waits for it
 * anyway. */
static int split_path(const hetccl_plane_t *p, const plane_step_t *s) {
  /* (a captured program's counters cannot carry the split path's numbers) */
  return s->kind == STEP_REDUCE && s->dst && s->out < 0 && p->stage_pieces > 0 && !s->graph &&
         s->bytes >= STAGE_MIN_BYTES; /* stage_pieces is 0 without reduce_copy (plane.c) */
}

/* Stream st waits until piece dep_q - 1 of this rank's channel to
 * s->dep_out is in its slot (plane_impl.h), if s asks it. */
static ncclResult_t wait_dep(hetccl_plane_t *p, void *st, const plane_step_t *s) {
  if (s->dep_out < 0) return ncclSuccess;
  if (s->graph) { /* this rank's own count of the piece (mark_written) */
    volatile uint64_t *c = plane_gdep(p, s->dep_out, s->dep_q - 1);
    uint64_t value = s->dep_q - p->gout[s->dep_out].prog_base;
    return p->a.rt->stream_wait_counter(st, c, plane_gdep_dev(p, c), value);
  }
  plane_chan_t *d = &p->out[s->dep_out];
  return wait_on(p, st, d, plane_produced(p, d, s->dep_q - 1), s->dep_q);
}

/* A wide step takes split numbers i and i + 1 (stage pieces i % S and the
 * one after it, past the last into the stage's room), as it takes two
 * slots; only the last one's staged counter is written and waited on.
 * rst NULL: the reduction is a resident kernel's (launch_runs), launched
 * already; only the copy lane's part is enqueued here. */
static ncclResult_t enqueue_split(hetccl_plane_t *p, const plane_step_t *s, void *st,
                                  void *rst) {
  plane_chan_t *in = &p->in[s->in];
  uint64_t depth = (uint64_t)p->stage_pieces, i = in->split_next, end = i + s->span;
  in->split_next = end;
  volatile uint64_t *staged = plane_staged(p, s->in, end - 1), *reduced = plane_reduced(p, s->in);
  char *piece = in->split_stage + (i % depth) * p->a.piece;
  HETCCL_CHECK(wait_arrived(p, st, s));
  if (end > depth) HETCCL_CHECK(wait_local(p, st, reduced, end - depth));
  HETCCL_CHECK(p->a.rt->memcpy_async(piece, plane_slot_host(p, in, s->in_q), s->bytes, st));
  HETCCL_CHECK(mark_read(p, st, s));
  HETCCL_CHECK(write_local(p, st, staged, end));
  if (!rst) return ncclSuccess;
  HETCCL_CHECK(wait_dep(p, rst, s));
  HETCCL_CHECK(wait_local(p, rst, staged, end));
  HETCCL_CHECK(reduce_with(p, s, piece, s->bytes / hetccl_dtype_size(s->op->dtype), rst));
  return write_local(p, rst, reduced, end);
}

/* A SCALE step that changes its data (a unary kernel), rather than a copy. */
static int scale_kernel(const plane_step_t *s) {
  return ((s->flags & HETCCL_REDUCE_SCALE_A) && s->op->premul) ||
         ((s->flags & HETCCL_REDUCE_FINISH) && s->op->average && s->op->nranks > 1);
}

/* rst: the lane's reduction stream where the split path may be taken;
 * `resident`: its reductions are a resident kernel's, launched already. */
static ncclResult_t enqueue_step(hetccl_plane_t *p, const plane_step_t *s, void *st, void *rst,
                                 int resident) {
  const hetccl_runtime_t *rt = p->a.rt;
  if (rst && split_path(p, s)) return enqueue_split(p, s, st, resident ? NULL : rst);
  plane_chan_t *in = s->ic, *out = s->oc;
  if (in) HETCCL_CHECK(wait_arrived(p, st, s));
  if (out) HETCCL_CHECK(wait_free(p, st, s));
  HETCCL_CHECK(wait_dep(p, st, s));
  switch (s->kind) {
    case STEP_SEND:
      if (s->op && s->op->premul) /* scaled on the way: a kernel, not the copy engine */
        HETCCL_CHECK(rt->reduce_async(s->op, plane_slot_dev(p, out, s->out_q), s->src, NULL,
                                      s->bytes / hetccl_dtype_size(s->op->dtype),
                                      HETCCL_REDUCE_SCALE_A, st));
      else
        HETCCL_CHECK(rt->memcpy_async(plane_slot_host(p, out, s->out_q), s->src, s->bytes, st));
      break;
    case STEP_RECV:
      HETCCL_CHECK(rt->memcpy_async(s->dst, plane_slot_host(p, in, s->in_q), s->bytes, st));
      break;
    case STEP_COPY:
      if (s->dst != s->src) HETCCL_CHECK(rt->memcpy_async(s->dst, s->src, s->bytes, st));
      break;
    case STEP_REDUCE: HETCCL_CHECK(reduce_step(p, s, st, 0)); break;
    case STEP_SCALE:
      if (scale_kernel(s))
        HETCCL_CHECK(rt->reduce_async(s->op, s->dst, s->src, NULL,
                                      s->bytes / hetccl_dtype_size(s->op->dtype), s->flags, st));
      else if (s->dst != s->src)
        HETCCL_CHECK(rt->memcpy_async(s->dst, s->src, s->bytes, st));
      break;
  }
  if (in) HETCCL_CHECK(mark_read(p, st, s));
  if (out) HETCCL_CHECK(mark_written(p, st, s));
  return ncclSuccess;
}

static ncclResult_t enqueue_lane(hetccl_plane_t *p, const plane_lane_t *lane, void *st) {
  for (int i = 0; i < lane->n; i++) HETCCL_CHECK(enqueue_step(p, &lane->steps[i], st, NULL, 0));
  return ncclSuccess;
}

/* --- the resident path -------------------------------------------------------
 * With args.resident_blocks, a receiving lane's split reductions are not a
 * kernel per piece behind a stream wait: they are cut into runs (pieces
 * of one reduction, one after another in the buffers and the stage ring),
 * and each run is one launch of the resident kernel (runtime.h,
 * hetccl_reduce_run_t) on the lane's reduction stream, before any of the
 * lane's copies are enqueued. Its blocks stay on the device, wait for each
 * piece's staged counter (and its dep) themselves, reduce it, and set
 * `reduced`, so a piece is reduced as it lands, not when a new kernel finds
 * SMs behind the application's; the copy lane is as on the split path. */

/* Does step s (split number i) continue run r as its step k? */
static int run_continues(const hetccl_reduce_run_t *r, const plane_step_t *first,
                         const plane_step_t *s, uint64_t i) {
  uint64_t k = r->steps, elem = hetccl_dtype_size(s->op->dtype), off = k * r->per * elem;
  if (s->op != first->op || s->flags != first->flags || s->swap != first->swap ||
      s->in != first->in || s->dep_out != first->dep_out || s->span > r->span ||
      s->bytes / elem > r->per ||
      r->last_span != r->span || r->count != k * r->per) /* the run's last step was cut short */
    return 0;
  if ((char *)s->dst != (char *)r->dst + off ||
      (const char *)s->src != (const char *)r->local + off || i != r->first + k * r->span)
    return 0;
  return s->dep_out < 0 || s->dep_q == r->dep_first + k * r->span + s->span;
}

/* Launch lane's split reductions as runs on rst; numbers them from the
 * channel's split_next as enqueue_split will. */
static ncclResult_t launch_runs(hetccl_plane_t *p, const plane_lane_t *lane, void *rst) {
  hetccl_reduce_run_t r;
  const plane_step_t *first = NULL;
  uint64_t next = 0;
  for (int n = 0; n <= lane->n; n++) {
    const plane_step_t *s = n < lane->n ? &lane->steps[n] : NULL;
    if (s && !split_path(p, s)) continue;
    if (s && !first) next = p->in[s->in].split_next;
    if (first && s && run_continues(&r, first, s, next)) {
      uint64_t elem = hetccl_dtype_size(s->op->dtype);
      r.count += s->bytes / elem;
      r.last_span = s->span;
      r.steps++;
      next += s->span;
      continue;
    }
    if (first) HETCCL_CHECK(p->a.rt->reduce_run_async(first->op, reduce_flags(first), &r, rst));
    if (!s) break;
    plane_chan_t *in = &p->in[s->in];
    uint64_t elem = hetccl_dtype_size(s->op->dtype);
    r = (hetccl_reduce_run_t){
        .dst = s->dst, .local = s->src, .stage = in->split_stage, .count = s->bytes / elem,
        .per = s->bytes / elem, .steps = 1, .swap = s->swap, .first = next, .span = s->span,
        .last_span = s->span, .depth = (uint64_t)p->stage_pieces, .slot_bytes = p->a.piece,
        .staged = plane_ctr_dev(p, plane_staged(p, s->in, 0)),
        .reduced = plane_ctr_dev(p, plane_reduced(p, s->in)), .arrive = in->arrive,
        .seen = (volatile uint64_t *)((char *)in->arrive + ARRIVE_SEEN),
        .blocks = p->a.resident_blocks};
    if (s->dep_out >= 0) {
      plane_chan_t *d = &p->out[s->dep_out];
      r.dep = plane_counter_dev(d, &d->hdr->produced[0]);
      r.dep_first = s->dep_q - s->span;
      r.dep_slots = (uint64_t)p->a.slots;
    }
    first = s;
    next += s->span;
  }
  return ncclSuccess;
}

/* Several lanes: each on its streams, forked from and joined to the
 * caller's. Their steps are enqueued round-robin (step i of every lane,
 * then step i + 1): where two lane streams end up on one hardware queue,
 * the queue then holds them in an order that a single lane could run
 * without waiting for itself (every lane's piece i before any piece i + 1),
 * instead of one lane's whole wait ahead of the other's work. */
static ncclResult_t enqueue_lanes(hetccl_plane_t *p, const plane_phase_t *ph, void *stream) {
  const hetccl_runtime_t *rt = p->a.rt;
  int nl = ph->nlanes, k = p->lane_streams, longest = 0;
  void *st[nl * k], *rst[nl];
  for (int i = 0; i < nl * k; i++) st[i] = NULL;
  HETCCL_CHECK(rt->event_record(p->fork_event, stream));
  for (int l = 0; l < nl; l++) {
    const plane_lane_t *lane = &ph->lanes[l];
    rst[l] = NULL;
    for (int i = 0; i < lane->n; i++) {
      const plane_step_t *s = &lane->steps[i];
      int idx = l * k + lane_sub(p, l, s);
      if (!st[idx]) {
        HETCCL_CHECK(lane_stream(p, idx, &st[idx]));
        HETCCL_CHECK(rt->stream_wait_event(st[idx], p->fork_event));
      }
      if (!rst[l] && split_path(p, s)) {
        HETCCL_CHECK(reduce_stream(p, l, &rst[l]));
        HETCCL_CHECK(rt->stream_wait_event(rst[l], p->fork_event));
      }
    }
    if (lane->n > longest) longest = lane->n;
  }
  int resident = p->a.resident_blocks > 0;
  for (int l = 0; l < nl && resident; l++)
    if (rst[l]) HETCCL_CHECK(launch_runs(p, &ph->lanes[l], rst[l]));
  for (int i = 0; i < longest; i++)
    for (int l = 0; l < nl; l++)
      if (i < ph->lanes[l].n) {
        const plane_step_t *s = &ph->lanes[l].steps[i];
        HETCCL_CHECK(enqueue_step(p, s, st[l * k + lane_sub(p, l, s)], rst[l], resident));
      }
  for (int i = 0; i < nl * k; i++) {
    if (!st[i]) continue;
    HETCCL_CHECK(rt->event_record(p->lane_event[i], st[i]));
    HETCCL_CHECK(rt->stream_wait_event(stream, p->lane_event[i]));
  }
  for (int l = 0; l < nl; l++) {
    if (!rst[l]) continue;
    HETCCL_CHECK(rt->event_record(p->reduce_event[l], rst[l]));
    HETCCL_CHECK(rt->stream_wait_event(stream, p->reduce_event[l]));
  }
  return ncclSuccess;
}

/* A small phase whose lanes can run one after another on the caller's
 * stream, sends first: each of its channels carries at most `slots` of its
 * pieces, so no send waits for a slot that this phase's own receives (on
 * either side) free, only for earlier programs' (already enqueued), and
 * every receive then finds its piece coming. That saves the fork and join
 * (an event record and a stream wait per lane each way): below
 * SERIAL_MAX_BYTES they cost more than running the lanes' copies in turn. */
#define SERIAL_MAX_BYTES (512u << 10)

static int phase_serial(const hetccl_plane_t *p, const plane_phase_t *ph) {
  int n = p->a.nranks, per_out[n];
  size_t bytes = 0;
  for (int q = 0; q < n; q++) per_out[q] = 0;
  for (int l = 0; l < ph->nlanes; l++)
    for (int i = 0; i < ph->lanes[l].n; i++) {
      const plane_step_t *s = &ph->lanes[l].steps[i];
      bytes += s->bytes;
      if (s->out >= 0 && (per_out[s->out] += s->span) > p->a.slots) return 0;
    }
  return bytes <= SERIAL_MAX_BYTES;
}

static ncclResult_t enqueue_serial(hetccl_plane_t *p, const plane_phase_t *ph, void *stream) {
  for (int pass = 0; pass < 2; pass++) /* sending lanes, then the rest */
    for (int l = 0; l < ph->nlanes; l++) {
      const plane_lane_t *lane = &ph->lanes[l];
      int sends = lane->n && lane->steps[0].kind == STEP_SEND && lane->steps[0].in < 0;
      if (lane->n && sends == (pass == 0)) HETCCL_CHECK(enqueue_lane(p, lane, stream));
    }
  return ncclSuccess;
}

/* How a phase goes onto the streams; *only: the one lane of PHASE_ONE. */
typedef enum { PHASE_EMPTY, PHASE_ONE, PHASE_SERIAL, PHASE_LANES } phase_mode_t;

static phase_mode_t phase_mode(const hetccl_plane_t *p, const plane_phase_t *ph, int *only) {
  int used = 0;
  for (int l = 0; l < ph->nlanes; l++)
    if (ph->lanes[l].n) used++, *only = l;
  return used == 0 ? PHASE_EMPTY : used == 1 ? PHASE_ONE
         : phase_serial(p, ph)               ? PHASE_SERIAL
                                             : PHASE_LANES;
}

static ncclResult_t enqueue_phase(hetccl_plane_t *p, const plane_phase_t *ph, void *stream) {
  int only = -1;
  switch (phase_mode(p, ph, &only)) {
    case PHASE_EMPTY: return ncclSuccess;
    case PHASE_ONE: return enqueue_lane(p, &ph->lanes[only], stream);
    case PHASE_SERIAL: return enqueue_serial(p, ph, stream);
    case PHASE_LANES: break;
  }
  return enqueue_lanes(p, ph, stream);
}

/* The kernels the program's steps use, loaded, and the stages its
 * reductions read, made, before any of its work is enqueued: loading or
 * allocating may wait for the context's running work, which, for two
 * ranks of one process on one GPU, would wait for the other rank's launch,
 * not made yet. Consecutive steps of one kind ask once. */
static ncclResult_t load_kernels(hetccl_plane_t *p, const plane_prog_t *prog, void *stream) {
  const hetccl_redop_t *last_op = NULL;
  int last_kind = -1;
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next) {
    int only, lanes = phase_mode(p, ph, &only) == PHASE_LANES;
    for (int l = 0; l < ph->nlanes; l++)
      for (int i = 0; i < ph->lanes[l].n; i++) {
        const plane_step_t *s = &ph->lanes[l].steps[i];
        if (s->kind == STEP_REDUCE)
          HETCCL_CHECK(chan_stage(p, s->ic, lanes && split_path(p, s), stream));
        int kind = s->kind == STEP_REDUCE ? (int)s->flags * 2 + s->swap
                   : s->kind == STEP_SEND && s->op && s->op->premul ? -2
                   : s->kind == STEP_SCALE && scale_kernel(s)       ? -3 - (int)s->flags
                                                                   : -1;
        if (kind == -1 || (s->op == last_op && kind == last_kind)) continue;
        last_op = s->op, last_kind = kind;
        if (s->kind == STEP_REDUCE) HETCCL_CHECK(reduce_step(p, s, stream, 1));
        else HETCCL_CHECK(p->a.rt->reduce_async(s->op, (void *)s->src, s->src, NULL, 0,
                                                s->kind == STEP_SCALE ? s->flags
                                                                      : HETCCL_REDUCE_SCALE_A,
                                                stream));
      }
  }
  return ncclSuccess;
}

ncclResult_t plane_exec_stream(hetccl_plane_t *p, const plane_prog_t *prog, void *stream) {
  HETCCL_CHECK(load_kernels(p, prog, stream));
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    HETCCL_CHECK(enqueue_phase(p, ph, stream));
  return ncclSuccess;
}
