/* Bridges: the data plane's channels to ranks of other hosts (plane_impl.h).
 *
 * A channel between ranks of one host is one shared segment (channel.c).
 * Ranks of two hosts share no memory, so a channel between them is two
 * segments of the same layout, one on each side, and a bridge on each side
 * that carries pieces between them through the caller's wire (plane.h:
 * hetccl_plane_wire_t, the communicator's point-to-point engine: ib, or
 * socket). The executors do not know the difference: they wait on and
 * write the counters of their own segment exactly as on a shared one.
 *
 *   sender (src)                     wire                 receiver (dst)
 *   stream/CPU writes piece q into                       bridge posted a
 *     slot s = q % slots, then                             receive of piece q
 *     produced[s] = q + 1                                  into its slot s once
 *   bridge sees produced[s] > q,                           consumed[s] >=
 *     posts a send of the slot   --- piece q, bytes --->   q + 1 - slots
 *   the send completes: consumed[s]                      the receive completes:
 *     = q + 1 (the slot is free                            produced[s] = q + 1,
 *     for piece q + slots)                                 its stream/CPU reads it
 *
 * So each side's counters keep their one writer per array (the bridge
 * writes the half the remote rank would have written), and a slot holds at
 * most one piece in flight: a request per slot suffices. The wire moves
 * the slot's bytes as any message: over ib a piece of at least
 * HETCCL_IB_ZCOPY_THRESHOLD goes by RDMA WRITE from one segment straight
 * into the other (both are declared with wire.declare, as ncclCommRegister
 * would), so a GPU rank's bytes are moved by its copy engine and the NICs,
 * and by no CPU; smaller pieces go eager (copied by a CPU, counted).
 *
 * Sizes. A receive must name the exact size of its message, and the
 * counters carry none: both sides learn each piece's size from their own
 * program (the peer builds the same one, program.c), which queues (q,
 * bytes) here as it numbers the piece. Pieces cross in q order on each
 * channel, which is the order the wire keeps per pair and direction.
 *
 * The end of a program. Its last pieces may still be on their way once its
 * steps have run (a send's slot is written by then, not sent). Each queued
 * piece gets a number over the whole plane (seq); a program ends at the
 * value seq had after its build, and the watch (GPU ranks) or the host
 * executor keeps the bridges moving until every piece before that mark is
 * done, so the wire is quiet between two programs except for what a peer
 * still has to receive.
 *
 * Failures. The wire's errors (a connection lost, an abort) fail the plane
 * as its own would, and a failed plane posts nothing more. A rank on
 * another host is not watched by its pid (plane.c): its connection is.
 *
 * Threads: queue on the thread that builds a program (API, or a launch
 * thread); progress on the one thread that drives the communicator (the
 * proxy's watch, or the host executor's caller). The queues and counters
 * the two share are guarded by p->bridge_lock. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <errno.h>

#include "plane/plane_impl.h"
#include "util/check.h"
#include "util/log.h"

ncclResult_t plane_bridge_open(hetccl_plane_t *p, int peer, int sending, plane_chan_t *c) {
  c->bridge = calloc(1, sizeof(*c->bridge));
  if (c->bridge) c->bridge->reqs = calloc((size_t)p->a.slots, sizeof(hetccl_req_t));
  if (!c->bridge || !c->bridge->reqs) {
    WARN("plane: out of memory for a bridge to rank %d", plane_user_rank(p, peer));
    return ncclSystemError;
  }
  c->bridge->peer = peer;
  c->bridge->sending = sending;
  void *m = mmap(NULL, p->seg_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    WARN("plane: cannot map %zu bytes for the channel %s rank %d: %s", p->seg_bytes,
         sending ? "to" : "from", plane_user_rank(p, peer), strerror(errno));
    return ncclSystemError;
  }
  c->hdr = m;
  c->bytes = p->seg_bytes;
  c->slots_host = (char *)m + PLANE_HDR_BYTES; /* counters zero, as mapped; no one opens it */
  /* A declaration the wire refuses leaves the pieces on its copy path. */
  if (p->a.wire.declare &&
      p->a.wire.declare(c->hdr, c->bytes, &c->bridge->declared) != ncclSuccess)
    c->bridge->declared = NULL;
  return ncclSuccess;
}

void plane_bridge_close(hetccl_plane_t *p, plane_chan_t *c) {
  plane_bridge_t *b = c->bridge;
  if (!b) return;
  if (b->declared && p->a.wire.retract) p->a.wire.retract(b->declared);
  free(b->ring);
  free(b->reqs);
  free(b);
  c->bridge = NULL;
}

ncclResult_t plane_bridge_queue(hetccl_plane_t *p, plane_chan_t *c, uint64_t q, size_t bytes) {
  plane_bridge_t *b = c->bridge;
  pthread_mutex_lock(&p->bridge_lock);
  if (b->queued - b->done == b->cap) { /* full: double, keeping each entry at its index mod cap */
    size_t cap = b->cap ? 2 * b->cap : 256;
    bridge_piece_t *ring = malloc(cap * sizeof(*ring));
    if (!ring) {
      pthread_mutex_unlock(&p->bridge_lock);
      WARN("plane: out of memory queueing pieces for rank %d", plane_user_rank(p, b->peer));
      return ncclSystemError;
    }
    for (uint64_t i = b->done; i < b->queued; i++) ring[i % cap] = b->ring[i % b->cap];
    free(b->ring);
    b->ring = ring;
    b->cap = cap;
  }
  b->ring[b->queued % b->cap] = (bridge_piece_t){.q = q, .seq = p->bridge_seq++, .bytes = bytes};
  b->queued++;
  pthread_mutex_unlock(&p->bridge_lock);
  return ncclSuccess;
}

uint64_t plane_bridge_mark(hetccl_plane_t *p) {
  pthread_mutex_lock(&p->bridge_lock);
  uint64_t seq = p->bridge_seq;
  pthread_mutex_unlock(&p->bridge_lock);
  return seq;
}

/* *ctr = v unless it is past v already: a failure may release the
 * counters (PLANE_RELEASED, hetccl_plane_fail, any thread) while a request
 * completes here, and must not be undone. */
static void raise_to(volatile uint64_t *ctr, uint64_t v) {
  uint64_t cur = __atomic_load_n(ctr, __ATOMIC_ACQUIRE);
  while (cur < v &&
         !__atomic_compare_exchange_n(ctr, &cur, v, 0, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
}

/* Completions, then new posts, of one bridge (the lock held). */
static ncclResult_t bridge_step(hetccl_plane_t *p, plane_chan_t *c, int *moved) {
  plane_bridge_t *b = c->bridge;
  uint64_t slots = (uint64_t)p->a.slots;
  while (b->done < b->posted) {
    const bridge_piece_t *x = &b->ring[b->done % b->cap];
    if (!__atomic_load_n(&b->reqs[x->q % slots].done, __ATOMIC_ACQUIRE)) break;
    /* sending: the slot is free again; receiving: the piece is in it */
    raise_to(b->sending ? plane_consumed(p, c, x->q) : plane_produced(p, c, x->q), x->q + 1);
    b->done++;
    *moved = 1;
  }
  while (b->posted < b->queued && !p->failed) {
    const bridge_piece_t *x = &b->ring[b->posted % b->cap];
    hetccl_req_t *req = &b->reqs[x->q % slots];
    ncclResult_t res;
    if (b->sending) {
      if (__atomic_load_n(plane_produced(p, c, x->q), __ATOMIC_ACQUIRE) < x->q + 1) break;
      res = p->a.wire.isend(p->a.wire.ctx, b->peer, plane_slot_host(p, c, x->q), x->bytes, req);
    } else {
      if (x->q + 1 > slots &&
          __atomic_load_n(plane_consumed(p, c, x->q), __ATOMIC_ACQUIRE) < x->q + 1 - slots)
        break;
      res = p->a.wire.irecv(p->a.wire.ctx, b->peer, plane_slot_host(p, c, x->q), x->bytes, req);
    }
    if (res != ncclSuccess) return res;
    b->posted++;
    *moved = 1;
  }
  return ncclSuccess;
}

ncclResult_t plane_bridge_progress(hetccl_plane_t *p, int *idle) {
  *idle = 1;
  if (!p->bridges) return ncclSuccess;
  int moved = 0;
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&p->bridge_lock);
  for (int q = 0; q < p->a.nranks && res == ncclSuccess; q++) {
    if (p->out[q].bridge) res = bridge_step(p, &p->out[q], &moved);
    if (res == ncclSuccess && p->in[q].bridge) res = bridge_step(p, &p->in[q], &moved);
  }
  pthread_mutex_unlock(&p->bridge_lock);
  int wire_idle = 1;
  if (res == ncclSuccess) res = p->a.wire.poll(p->a.wire.ctx, &wire_idle);
  *idle = !moved && wire_idle;
  return res;
}

int plane_bridge_passed(hetccl_plane_t *p, uint64_t mark) {
  if (!p->bridges || mark == 0) return 1;
  int passed = 1;
  pthread_mutex_lock(&p->bridge_lock);
  for (int q = 0; q < p->a.nranks && passed; q++) {
    plane_bridge_t *bs[2] = {p->out[q].bridge, p->in[q].bridge};
    for (int i = 0; i < 2 && passed; i++) {
      const plane_bridge_t *b = bs[i];
      if (b && b->done < b->queued) passed = b->ring[b->done % b->cap].seq >= mark;
    }
  }
  pthread_mutex_unlock(&p->bridge_lock);
  return passed;
}
