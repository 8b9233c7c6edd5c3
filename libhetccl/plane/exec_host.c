/* The host executor: a program run by one CPU thread (plane_impl.h).
 *
 * For host ranks, and for a GPU rank's tasks on host buffers. The lanes
 * are swept round-robin: a lane's first step runs as soon as the counters
 * it waits on allow, so that lanes progress together as a GPU rank's
 * streams would. An idle sweep looks at the peers and the timeout
 * (plane_check), spins a little, then sleeps. Each sweep also moves the
 * bridges to other hosts (bridge.c), which nothing else drives meanwhile.
 *
 * Thread: the caller's (API or proxy); never two at once on one plane. */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "plane/plane_impl.h"
#include "runtime/reduce.h"
#include "util/check.h"
#include "util/log.h"

#define SPIN_SWEEPS 2000

/* The counters of step s's pieces, a wide one's too (plane_impl.h). */
static int ready(const hetccl_plane_t *p, const plane_step_t *s) {
  uint64_t slots = (uint64_t)p->a.slots, span = s->span;
  if (s->in >= 0 && __atomic_load_n(plane_produced(p, &p->in[s->in], s->in_q + span - 1),
                                    __ATOMIC_ACQUIRE) < s->in_q + span)
    return 0;
  for (uint64_t q = s->out_q; s->out >= 0 && q < s->out_q + span; q++)
    if (q + 1 > slots &&
        __atomic_load_n(plane_consumed(p, &p->out[s->out], q), __ATOMIC_ACQUIRE) < q + 1 - slots)
      return 0;
  if (s->dep_out >= 0 && __atomic_load_n(plane_produced(p, &p->out[s->dep_out], s->dep_q - 1),
                                         __ATOMIC_ACQUIRE) < s->dep_q)
    return 0;
  return 1;
}

/* dst = FIN(OP(PRE_A(x), PRE_B(y))), as the device kernels compute it. */
static void reduce(hetccl_plane_t *p, const plane_step_t *s, void *dst, const void *x,
                   const void *y, unsigned flags) {
  const hetccl_redop_t *op = s->op;
  size_t count = s->bytes / hetccl_dtype_size(op->dtype);
  char *scratch = p->scratch;
  if (op->premul && (flags & HETCCL_REDUCE_SCALE_A)) {
    hetccl_reduce_prepare(op, scratch, x, count);
    x = scratch;
  }
  if (op->premul && (flags & HETCCL_REDUCE_SCALE_B)) {
    hetccl_reduce_prepare(op, scratch + 2 * p->a.piece, y, count);
    y = scratch + 2 * p->a.piece;
  }
  hetccl_reduce(op, dst, x, y, count);
  if (flags & HETCCL_REDUCE_FINISH) hetccl_reduce_finish(op, dst, count);
}

static void run_step(hetccl_plane_t *p, const plane_step_t *s) {
  const plane_chan_t *in = s->in >= 0 ? &p->in[s->in] : NULL;
  const plane_chan_t *out = s->out >= 0 ? &p->out[s->out] : NULL;
  if ((s->kind == STEP_SEND || s->kind == STEP_RECV) && p->a.copied)
    __atomic_fetch_add(p->a.copied, (uint64_t)s->bytes, __ATOMIC_RELAXED);
  switch (s->kind) {
    case STEP_SEND:
      if (s->op && s->op->premul)
        hetccl_reduce_prepare(s->op, plane_slot_host(p, out, s->out_q), s->src,
                              s->bytes / hetccl_dtype_size(s->op->dtype));
      else
        memcpy(plane_slot_host(p, out, s->out_q), s->src, s->bytes);
      break;
    case STEP_RECV: memcpy(s->dst, plane_slot_host(p, in, s->in_q), s->bytes); break;
    case STEP_COPY: if (s->dst != s->src) memmove(s->dst, s->src, s->bytes); break;
    case STEP_SCALE: {
      size_t count = s->bytes / hetccl_dtype_size(s->op->dtype);
      if (s->flags & HETCCL_REDUCE_SCALE_A) hetccl_reduce_prepare(s->op, s->dst, s->src, count);
      else if (s->dst != s->src) memmove(s->dst, s->src, s->bytes);
      if (s->flags & HETCCL_REDUCE_FINISH) hetccl_reduce_finish(s->op, s->dst, count);
      break;
    }
    case STEP_REDUCE: {
      const void *slot = plane_slot_host(p, in, s->in_q);
      void *dst = s->dst ? s->dst : plane_slot_host(p, out, s->out_q);
      unsigned a = s->flags & HETCCL_REDUCE_SCALE_A, b = s->flags & HETCCL_REDUCE_SCALE_B;
      unsigned fin = s->flags & HETCCL_REDUCE_FINISH;
      if (s->swap) /* the slot first: its scaling goes with it */
        reduce(p, s, dst, slot, s->src,
               fin | (b ? HETCCL_REDUCE_SCALE_A : 0) | (a ? HETCCL_REDUCE_SCALE_B : 0));
      else
        reduce(p, s, dst, s->src, slot, s->flags);
      break;
    }
  }
  for (uint64_t q = s->in_q; in && q < s->in_q + s->span; q++)
    __atomic_store_n(plane_consumed(p, in, q), q + 1, __ATOMIC_RELEASE);
  if (out)
    __atomic_store_n(plane_produced(p, out, s->out_q + s->span - 1), s->out_q + s->span,
                     __ATOMIC_RELEASE);
}

/* The peers whose counters the lanes' next steps wait on (a peer that
 * left after its part of the program is no failure of ours). */
static const uint8_t *lanes_wait_on(const hetccl_plane_t *p, const plane_phase_t *ph,
                                    const int *pos, uint8_t *waited) {
  memset(waited, 0, (size_t)p->a.nranks);
  for (int l = 0; l < ph->nlanes; l++) {
    if (pos[l] == ph->lanes[l].n) continue;
    const plane_step_t *s = &ph->lanes[l].steps[pos[l]];
    if (s->in >= 0) waited[s->in] = 1;
    if (s->out >= 0) waited[s->out] = 1;
  }
  return waited;
}

/* Until every step of ph has run and, with bridges, every piece queued
 * before `mark` has crossed (the last phase's wait: a program's last
 * pieces may still be on their way once its steps have run). */
static ncclResult_t run_phase(hetccl_plane_t *p, const plane_phase_t *ph, uint64_t mark) {
  int pos[ph->nlanes];
  memset(pos, 0, sizeof(pos));
  uint8_t waited[p->a.nranks];
  int64_t since = plane_now_ns();
  struct timespec nap = {0, 20000};
  for (long idle = 0;;) {
    int left = 0, moved = 0;
    for (int l = 0; l < ph->nlanes; l++) {
      const plane_lane_t *lane = &ph->lanes[l];
      while (pos[l] < lane->n && ready(p, &lane->steps[pos[l]])) {
        run_step(p, &lane->steps[pos[l]++]);
        moved = 1;
      }
      left += pos[l] < lane->n;
    }
    if (!left && plane_bridge_passed(p, mark)) return ncclSuccess;
    int quiet; /* pieces to and from other hosts move only when asked to */
    HETCCL_CHECK(plane_bridge_progress(p, &quiet));
    moved |= !quiet;
    if (moved) {
      idle = 0;
      since = plane_now_ns();
      continue;
    }
    if ((++idle & 255) == 0)
      HETCCL_CHECK(plane_check(p, since, lanes_wait_on(p, ph, pos, waited)));
    if (idle > SPIN_SWEEPS) nanosleep(&nap, NULL);
    else sched_yield();
  }
}

ncclResult_t plane_exec_host(hetccl_plane_t *p, const plane_prog_t *prog) {
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    HETCCL_CHECK(run_phase(p, ph, ph->next ? 0 : prog->bridge_end));
  return ncclSuccess;
}
