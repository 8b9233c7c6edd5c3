/* Shared-memory transport, data path: isend, irecv and progress over the
 * single-producer single-consumer rings of shm.h.
 *
 * Threads: the one thread that drives the communicator (transport.h). Never
 * blocks: a full ring or an empty one ends the call; the longest thing done
 * in one call is a ring's worth of memcpy or one CMA piece.
 *
 * Ring protocol. The producer fills slot tail % nslots (header, then
 * payload) and publishes it with a release store of tail + 1; the consumer
 * sees it with an acquire load of tail, uses the slot in place, and hands
 * it back with a release store of head + 1. Each side keeps the other's
 * counter cached and reloads it only when the ring looks full / empty, so a
 * streaming pair touches the remote line once per ring turn, not per slot.
 *
 * Messages. A message no larger than one slot is one FIRST slot; larger
 * ones are a FIRST slot and NEXT slots of `chunk` bytes, so the copy in and
 * the copy out run at once on two cores. The frame header rides in the
 * FIRST slot and is checked before any byte is delivered or consumed. With
 * CMA on (shm.c), a message above two slots is one RNDV slot carrying the
 * sender's address: the receiver pulls it with process_vm_readv straight
 * into the destination (or into a bounce buffer, then consume) in pieces of
 * SHM_CMA_PIECE (through an L2-sized bounce buffer when it reduces, or
 * stores with streaming stores: HETCCL_SHM_CMA_STREAM), and releases the
 * slot only when it has everything; the
 * sender's request completes when it sees head pass that slot, so its
 * buffer is never reused while being read.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transport/shm/shm.h"
#include "util/check.h"
#include "util/log.h"
#include "util/proc.h"

#define SHM_CMA_PIECE (2u << 20)   /* bytes per process_vm_readv call */
#define SHM_BOUNCE_BYTES (256u << 10) /* CMA then consume: L2-sized staging */
#define SHM_IDLE_CLOCK_MASK 63        /* read the clock every 64 idle polls */

static inline shm_slot_hdr_t *slot_at(const shm_ring_map_t *m, uint64_t i) {
  return (shm_slot_hdr_t *)(m->slots + (size_t)(i % m->nslots) * m->stride);
}

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Append a freshly posted request (its transport fields reset). */
static void queue_push(shm_req_queue_t *q, hetccl_req_t *req) {
  memset(req->priv, 0, sizeof(req->priv));
  req->next = NULL;
  req->done = 0;
  req->progress = 0;
  if (q->last) q->last->next = req;
  else q->first = req;
  q->last = req;
}

/* Retire the oldest request; setting done is the last touch, the caller
 * may reuse it from there. */
static void queue_complete(shm_req_queue_t *q) {
  hetccl_req_t *r = q->first;
  q->first = r->next;
  if (!q->first) q->last = NULL;
  r->done = 1;
}

static ncclResult_t ep_fail(hetccl_ep_t *ep, ncclResult_t res) {
  if (ep->failed == ncclSuccess) ep->failed = res;
  return res;
}

/* --- send ------------------------------------------------------------------- */

/* Put pieces of the posted sends into free slots, oldest first; at most a
 * ring's worth per call, so that one endpoint streaming to a fast consumer
 * does not keep its caller from the others. */
static void tx_place(hetccl_ep_t *ep, int *moved) {
  shm_ring_map_t *m = &ep->tx;
  hetccl_req_t *r;
  for (uint32_t budget = m->nslots; budget && (r = ep->sq_place) != NULL; budget--) {
    if (ep->tx_tail - ep->tx_head >= m->nslots) {
      ep->tx_head = atomic_load_explicit(&m->ctrl->head, memory_order_acquire);
      if (ep->tx_tail - ep->tx_head >= m->nslots) return;
    }
    shm_slot_hdr_t *h = slot_at(m, ep->tx_tail);
    shm_req_priv_t *pv = shm_req_priv(r);
    if (!pv->started) {
      pv->started = 1;
      hetccl_frame_fill(&h->frame, ep->args.comm_id, ep->args.rank, ep->tx_seq++, r->tag,
                        r->bytes);
      if (r->bytes > ep->cma_min && r->pull_ok) {
        h->kind = SHM_PIECE_RNDV;
        h->len = 0;
        h->addr = (uint64_t)(uintptr_t)r->buf;
        pv->rndv = 1;
        pv->rndv_slot = ep->tx_tail;
        atomic_store_explicit(&m->ctrl->tail, ++ep->tx_tail, memory_order_release);
        ep->sq_place = r->next;
        *moved = 1;
        continue;
      }
      h->kind = SHM_PIECE_FIRST;
    } else {
      h->kind = SHM_PIECE_NEXT;
    }
    size_t n = min_size(m->chunk, r->bytes - r->progress);
    if (n) memcpy((uint8_t *)h + SHM_SLOT_HDR, (const uint8_t *)r->buf + r->progress, n);
    hetccl_copied_add(&ep->args, n);
    h->len = (uint32_t)n;
    r->progress += n;
    atomic_store_explicit(&m->ctrl->tail, ++ep->tx_tail, memory_order_release);
    *moved = 1;
    if (r->progress == r->bytes) ep->sq_place = r->next;
  }
}

/* Complete, in order, the sends that are wholly in the ring; a rendezvous
 * send waits until the receiver has released its slot (it has read it all). */
static void tx_complete(hetccl_ep_t *ep, int *moved) {
  hetccl_req_t *r;
  while ((r = ep->sq.first) != NULL && r != ep->sq_place) {
    shm_req_priv_t *pv = shm_req_priv(r);
    if (pv->rndv) {
      if (ep->tx_head <= pv->rndv_slot) {
        ep->tx_head = atomic_load_explicit(&ep->tx.ctrl->head, memory_order_acquire);
        if (ep->tx_head <= pv->rndv_slot) return;
      }
      r->progress = r->bytes;
    }
    queue_complete(&ep->sq);
    *moved = 1;
  }
}

ncclResult_t hetccl_shm_isend(hetccl_ep_t *ep, hetccl_req_t *req) {
  if (ep->failed != ncclSuccess) return ep->failed;
  queue_push(&ep->sq, req);
  if (!ep->sq_place) ep->sq_place = req;
  int moved = 0;
  tx_place(ep, &moved);
  tx_complete(ep, &moved);
  return ncclSuccess;
}

/* --- receive ---------------------------------------------------------------- */

static void rx_release(hetccl_ep_t *ep) {
  atomic_store_explicit(&ep->rx.ctrl->head, ++ep->rx_head, memory_order_release);
}

/* Pull one piece of a rendezvous message from the sender's memory. */
static ncclResult_t rx_cma(hetccl_ep_t *ep, hetccl_req_t *r, int *moved) {
  shm_req_priv_t *pv = shm_req_priv(r);
  size_t left = r->bytes - r->progress;
  size_t n = min_size(left, SHM_CMA_PIECE);
  uint8_t *dst = (uint8_t *)r->buf + r->progress;
  /* Through the bounce buffer: to reduce from it, or (HETCCL_SHM_CMA_STREAM)
   * to store a large message with streaming stores, which skip the read
   * for ownership that the kernel's copy makes of every destination line
   * (two passes over memory instead of three, where memory is the bound). */
  int stream = !r->consume && ep->cma_stream && r->bytes >= SHM_STREAM_MIN;
  if (r->consume || stream) {
    /* Page aligned, as the sender's buffers usually are: the kernel's copy
     * (rep movsb) slows down by 3x on some cores (AMD Zen, measured) when
     * source and destination differ in their alignment within a line, and
     * malloc's 256 KiB start 16 bytes into a page. */
    if (!ep->bounce && posix_memalign((void **)&ep->bounce, 4096, SHM_BOUNCE_BYTES) != 0)
      ep->bounce = NULL;
    if (!ep->bounce) {
      WARN("shm: out of memory for a %u-byte receive buffer (from rank %d)", SHM_BOUNCE_BYTES,
           ep->peer_user);
      return ncclSystemError;
    }
    n = min_size(n, SHM_BOUNCE_BYTES);
    dst = ep->bounce;
  }
  struct iovec local = {dst, n};
  struct iovec remote = {(void *)(uintptr_t)(pv->src_addr + r->progress), n};
  ssize_t got = process_vm_readv(ep->peer_pid, &local, 1, &remote, 1, 0);
  if (got < 0 && errno == EINTR) return ncclSuccess;
  /* A peer that dies while we read its buffer shows as ESRCH, or as a
   * fault once its memory is being torn down: either way, it is gone. */
  if (got < 0 && (errno == ESRCH ||
                  (ep->peer_watch && !hetccl_proc_alive(ep->peer_pid, ep->peer_start)))) {
    WARN("shm: peer rank %d (pid %d) exited while its send buffer was being read",
         ep->peer_user, ep->peer_pid);
    return ncclRemoteError;
  }
  if (got <= 0) {
    WARN("shm: process_vm_readv of %zu bytes at offset %zu of rank %d's send buffer (pid %d, "
         "address 0x%llx): %s", n, r->progress, ep->peer_user, ep->peer_pid,
         (unsigned long long)pv->src_addr, got < 0 ? strerror(errno) : "read nothing");
    return ncclSystemError;
  }
  size_t g = (size_t)got;
  hetccl_copied_add(&ep->args, g);
  if (r->consume) {
    if (g < left) g &= ~(size_t)7; /* consume sees 8-byte multiples but for the tail */
    if (g == 0) return ncclSuccess;  /* read again next time, from the same offset */
    r->consume(r->consume_ctx, (uint8_t *)r->buf + r->progress, ep->bounce, g);
  } else if (stream) {
    hetccl_shm_copy_stream((uint8_t *)r->buf + r->progress, ep->bounce, g);
  }
  r->progress += g;
  *moved = 1;
  if (r->progress == r->bytes) {
    rx_release(ep); /* tells the sender its buffer is free */
    queue_complete(&ep->rq);
  }
  return ncclSuccess;
}

static ncclResult_t rx_corrupt(hetccl_ep_t *ep, const shm_slot_hdr_t *h, const hetccl_req_t *r,
                               const char *why) {
  WARN("shm: corrupt slot from rank %d (kind %u, %u bytes, message %zu of %zu bytes): %s",
       ep->peer_user, h->kind, h->len, r->progress, r->bytes, why);
  return ncclSystemError;
}

/* Deliver the published slots to the posted receives, oldest first; at
 * most a ring's worth per call (see tx_place). */
static ncclResult_t rx_drain(hetccl_ep_t *ep, int *moved) {
  shm_ring_map_t *m = &ep->rx;
  hetccl_req_t *r;
  for (uint32_t budget = m->nslots; budget && (r = ep->rq.first) != NULL; budget--) {
    shm_req_priv_t *pv = shm_req_priv(r);
    if (pv->rndv) {
      HETCCL_CHECK(rx_cma(ep, r, moved));
      if (ep->rq.first == r) return ncclSuccess; /* one piece per call */
      continue;
    }
    if (ep->rx_head == ep->rx_tail) {
      ep->rx_tail = atomic_load_explicit(&m->ctrl->tail, memory_order_acquire);
      if (ep->rx_head == ep->rx_tail) return ncclSuccess;
    }
    const shm_slot_hdr_t *h = slot_at(m, ep->rx_head);
    if (!pv->started) {
      if (h->kind != SHM_PIECE_FIRST && h->kind != SHM_PIECE_RNDV)
        return rx_corrupt(ep, h, r, "a message does not start here");
      HETCCL_CHECK(hetccl_frame_check(&h->frame, "shm", &ep->args, ep->peer, ep->rx_seq,
                                      r->tag, r->bytes));
      ep->rx_seq++;
      pv->started = 1;
      if (h->kind == SHM_PIECE_RNDV) {
        pv->rndv = 1;
        pv->src_addr = h->addr;
        continue; /* the slot stays ours until the last byte is read */
      }
    } else if (h->kind != SHM_PIECE_NEXT) {
      return rx_corrupt(ep, h, r, "expected the next piece of a message");
    }
    size_t n = h->len;
    if (n > m->chunk || n > r->bytes - r->progress ||
        (n % 8 && r->progress + n != r->bytes))
      return rx_corrupt(ep, h, r, "piece size does not fit the message");
    const uint8_t *src = (const uint8_t *)h + SHM_SLOT_HDR;
    uint8_t *dst = (uint8_t *)r->buf + r->progress;
    if (r->consume) {
      if (n) r->consume(r->consume_ctx, dst, src, n);
    } else if (r->bytes >= SHM_STREAM_MIN) {
      hetccl_shm_copy_stream(dst, src, n);
      hetccl_copied_add(&ep->args, n);
    } else if (n) {
      memcpy(dst, src, n);
      hetccl_copied_add(&ep->args, n);
    }
    r->progress += n;
    rx_release(ep);
    *moved = 1;
    if (r->progress == r->bytes) queue_complete(&ep->rq);
  }
  return ncclSuccess;
}

ncclResult_t hetccl_shm_irecv(hetccl_ep_t *ep, hetccl_req_t *req) {
  if (ep->failed != ncclSuccess) return ep->failed;
  queue_push(&ep->rq, req);
  if (ep->rq.first != req) return ncclSuccess; /* earlier receives drain first */
  int moved = 0;
  ncclResult_t res = rx_drain(ep, &moved);
  return res == ncclSuccess ? res : ep_fail(ep, res);
}

/* --- progress --------------------------------------------------------------- */

ncclResult_t hetccl_shm_progress(hetccl_ep_t *ep, int *idle) {
  if (ep->failed != ncclSuccess) return ep->failed;
  int moved = 0;
  ncclResult_t res = rx_drain(ep, &moved);
  if (res != ncclSuccess) return ep_fail(ep, res);
  tx_place(ep, &moved);
  tx_complete(ep, &moved);
  *idle = !moved;
  if (moved || (!ep->sq.first && !ep->rq.first)) {
    ep->idle_polls = 0;
    ep->idle_since_ns = 0;
    return ncclSuccess;
  }
  /* Waiting on the peer: look at it now and then. */
  if ((++ep->idle_polls & SHM_IDLE_CLOCK_MASK) != 0) return ncclSuccess;
  int64_t now = hetccl_shm_now_ns();
  if (ep->idle_since_ns == 0) {
    ep->idle_since_ns = now;
  } else if (now - ep->idle_since_ns > SHM_LIVENESS_NS) {
    ep->idle_since_ns = now;
    res = hetccl_shm_ep_check_peer(ep);
    if (res != ncclSuccess) return ep_fail(ep, res);
  }
  return ncclSuccess;
}
