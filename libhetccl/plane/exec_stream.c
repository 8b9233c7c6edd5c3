/* The stream executor: a program enqueued on a GPU rank's streams
 * (plane_impl.h).
 *
 * Each step becomes up to three stream waits on channel counters, one copy
 * (the copy engine: device memory to a slot, a slot to device memory) or
 * one reduction, and one or two stream writes of counters. A reduction is
 * a copy of the peer's piece from its slot into the channel's stage in
 * device memory, then a kernel that reads the stage (args.reduce_copy; a
 * kernel reading the slot through its device mapping, the other way,
 * moves host memory at half the copy engine's speed or less). Nothing runs on a CPU after this
 * returns: the streams wait on the counters the peers' streams (or CPUs)
 * write.
 *
 * A phase with one lane runs on the caller's stream itself; a phase with
 * several gives each lane a stream of this plane's, forked from the
 * caller's stream by an event and joined back to it by one event per
 * lane, so that the caller's later work waits for all of them.
 *
 * Thread: the API caller's, with this rank's device current. */
#include <stdlib.h>

#include "plane/plane_impl.h"
#include "runtime/reduce.h"
#include "util/check.h"
#include "util/log.h"

ncclResult_t plane_streams_create(hetccl_plane_t *p) {
  if (p->lane_stream) return ncclSuccess;
  void **s = calloc((size_t)p->nlanes, sizeof(*s)), **e = calloc((size_t)p->nlanes, sizeof(*e));
  if (!s || !e) {
    free(s);
    free(e);
    WARN("plane: out of memory for %d streams", p->nlanes);
    return ncclSystemError;
  }
  p->lane_stream = s;
  p->lane_event = e;
  return p->a.rt->event_create(&p->fork_event);
}

/* Lane l's stream, made on first use: a device has few hardware queues
 * (8 by default), and streams beyond them share one, so only the lanes a
 * program uses get a stream. */
static ncclResult_t lane_stream(hetccl_plane_t *p, int l, void **out) {
  if (!p->lane_stream[l]) {
    HETCCL_CHECK(p->a.rt->stream_create(&p->lane_stream[l], p->a.urgent_streams));
    HETCCL_CHECK(p->a.rt->event_create(&p->lane_event[l]));
  }
  *out = p->lane_stream[l];
  return ncclSuccess;
}

void plane_streams_destroy(hetccl_plane_t *p) {
  const hetccl_runtime_t *rt = p->a.rt;
  for (int l = 0; p->lane_stream && l < p->nlanes; l++) {
    if (p->lane_stream[l]) rt->stream_destroy(p->lane_stream[l]);
    if (p->lane_event[l]) rt->event_destroy(p->lane_event[l]);
  }
  if (p->fork_event) rt->event_destroy(p->fork_event);
  free(p->lane_stream);
  free(p->lane_event);
  p->lane_stream = p->lane_event = NULL;
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

/* Channel c's stage in device memory (plane_impl.h), made on first use. */
static ncclResult_t chan_stage(hetccl_plane_t *p, plane_chan_t *c) {
  if (c->stage || !p->a.reduce_copy) return ncclSuccess;
  void *mem = NULL;
  ncclResult_t res = p->a.rt->mem_alloc(&mem, (size_t)p->a.slots * p->a.piece);
  if (res != ncclSuccess) {
    WARN("plane: rank %d: no device memory for a stage of %d pieces of %zu bytes",
         plane_user_rank(p, p->a.rank), p->a.slots, p->a.piece);
    return res;
  }
  c->stage = mem;
  return ncclSuccess;
}

void plane_stages_free(hetccl_plane_t *p) {
  int saved = -1;
  char busid[32];
  for (int q = 0; q < p->a.nranks && p->in; q++) {
    if (!p->in[q].stage) continue;
    if (saved < 0 && p->a.rt->current_device(&saved, busid, sizeof(busid)) == ncclSuccess &&
        saved != p->a.dev)
      (void)p->a.rt->set_device(p->a.dev);
    (void)p->a.rt->mem_free(p->in[q].stage);
    p->in[q].stage = NULL;
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
  const plane_chan_t *in = &p->in[s->in];
  if (!in->stage || s->bytes < STAGE_MIN_BYTES) {
    *operand = plane_slot_dev(p, in, s->in_q);
    return ncclSuccess;
  }
  char *stage = in->stage + (s->in_q % (uint64_t)p->a.slots) * p->a.piece;
  HETCCL_CHECK(p->a.rt->memcpy_async(stage, plane_slot_host(p, in, s->in_q), s->bytes, st));
  *operand = stage;
  return ncclSuccess;
}

/* count 0 (ahead): load the kernel only (runtime.h, reduce_async). */
static ncclResult_t reduce_step(hetccl_plane_t *p, const plane_step_t *s, void *st, int ahead) {
  const void *slot = NULL;
  if (!ahead) HETCCL_CHECK(reduce_operand(p, s, st, &slot));
  else slot = plane_slot_dev(p, &p->in[s->in], s->in_q);
  void *dst = s->dst ? s->dst : plane_slot_dev(p, &p->out[s->out], s->out_q);
  size_t count = ahead ? 0 : s->bytes / hetccl_dtype_size(s->op->dtype);
  unsigned a = s->flags & HETCCL_REDUCE_SCALE_A, b = s->flags & HETCCL_REDUCE_SCALE_B;
  unsigned fin = s->flags & HETCCL_REDUCE_FINISH;
  if (s->swap) /* the slot first: its scaling goes with it */
    return p->a.rt->reduce_async(s->op, dst, slot, s->src, count,
                                 fin | (b ? HETCCL_REDUCE_SCALE_A : 0) |
                                     (a ? HETCCL_REDUCE_SCALE_B : 0), st);
  return p->a.rt->reduce_async(s->op, dst, s->src, slot, count, s->flags, st);
}

static ncclResult_t enqueue_step(hetccl_plane_t *p, const plane_step_t *s, void *st) {
  const hetccl_runtime_t *rt = p->a.rt;
  plane_chan_t *in = s->in >= 0 ? &p->in[s->in] : NULL;
  plane_chan_t *out = s->out >= 0 ? &p->out[s->out] : NULL;
  uint64_t slots = (uint64_t)p->a.slots;
  if (in) HETCCL_CHECK(wait_on(p, st, in, &in->hdr->produced, s->in_q + 1));
  if (out && s->out_q + 1 > slots)
    HETCCL_CHECK(wait_on(p, st, out, &out->hdr->consumed, s->out_q + 1 - slots));
  if (s->dep_out >= 0) {
    plane_chan_t *d = &p->out[s->dep_out];
    HETCCL_CHECK(wait_on(p, st, d, &d->hdr->produced, s->dep_q));
  }
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
  }
  if (in) HETCCL_CHECK(write_to(p, st, in, &in->hdr->consumed, s->in_q + 1));
  if (out) HETCCL_CHECK(write_to(p, st, out, &out->hdr->produced, s->out_q + 1));
  return ncclSuccess;
}

static ncclResult_t enqueue_lane(hetccl_plane_t *p, const plane_lane_t *lane, void *st) {
  for (int i = 0; i < lane->n; i++) HETCCL_CHECK(enqueue_step(p, &lane->steps[i], st));
  return ncclSuccess;
}

/* Several lanes: each on its stream, forked from and joined to the
 * caller's. Their steps are enqueued round-robin (step i of every lane,
 * then step i + 1): where two lane streams end up on one hardware queue,
 * the queue then holds them in an order that a single lane could run
 * without waiting for itself (every lane's piece i before any piece i + 1),
 * instead of one lane's whole wait ahead of the other's work. */
static ncclResult_t enqueue_lanes(hetccl_plane_t *p, const plane_phase_t *ph, void *stream) {
  const hetccl_runtime_t *rt = p->a.rt;
  void *st[ph->nlanes];
  int longest = 0;
  HETCCL_CHECK(rt->event_record(p->fork_event, stream));
  for (int l = 0; l < ph->nlanes; l++) {
    st[l] = NULL;
    if (!ph->lanes[l].n) continue;
    HETCCL_CHECK(lane_stream(p, l, &st[l]));
    HETCCL_CHECK(rt->stream_wait_event(st[l], p->fork_event));
    if (ph->lanes[l].n > longest) longest = ph->lanes[l].n;
  }
  for (int i = 0; i < longest; i++)
    for (int l = 0; l < ph->nlanes; l++)
      if (i < ph->lanes[l].n) HETCCL_CHECK(enqueue_step(p, &ph->lanes[l].steps[i], st[l]));
  for (int l = 0; l < ph->nlanes; l++) {
    if (!st[l]) continue;
    HETCCL_CHECK(rt->event_record(p->lane_event[l], st[l]));
    HETCCL_CHECK(rt->stream_wait_event(stream, p->lane_event[l]));
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
      if (s->out >= 0 && ++per_out[s->out] > p->a.slots) return 0;
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

static ncclResult_t enqueue_phase(hetccl_plane_t *p, const plane_phase_t *ph, void *stream) {
  int used = 0, only = -1;
  for (int l = 0; l < ph->nlanes; l++)
    if (ph->lanes[l].n) used++, only = l;
  if (used == 0) return ncclSuccess;
  if (used == 1) return enqueue_lane(p, &ph->lanes[only], stream);
  if (phase_serial(p, ph)) return enqueue_serial(p, ph, stream);
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
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    for (int l = 0; l < ph->nlanes; l++)
      for (int i = 0; i < ph->lanes[l].n; i++) {
        const plane_step_t *s = &ph->lanes[l].steps[i];
        if (s->kind == STEP_REDUCE) HETCCL_CHECK(chan_stage(p, &p->in[s->in]));
        int kind = s->kind == STEP_REDUCE ? (int)s->flags * 2 + s->swap
                   : s->kind == STEP_SEND && s->op && s->op->premul ? -2
                                                                   : -1;
        if (kind == -1 || (s->op == last_op && kind == last_kind)) continue;
        last_op = s->op, last_kind = kind;
        if (s->kind == STEP_REDUCE) HETCCL_CHECK(reduce_step(p, s, stream, 1));
        else HETCCL_CHECK(p->a.rt->reduce_async(s->op, (void *)s->src, s->src, NULL, 0,
                                                HETCCL_REDUCE_SCALE_A, stream));
      }
  return ncclSuccess;
}

ncclResult_t plane_exec_stream(hetccl_plane_t *p, const plane_prog_t *prog, void *stream) {
  HETCCL_CHECK(load_kernels(p, prog, stream));
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    HETCCL_CHECK(enqueue_phase(p, ph, stream));
  return ncclSuccess;
}
