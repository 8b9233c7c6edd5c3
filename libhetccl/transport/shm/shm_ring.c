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
 *
 * Two cores on one message. A receiver that copies (no consume, no
 * streaming stores) a message of at least two pieces opens it to its
 * sender (shm_coop_t, in the RNDV slot): it reads pieces from the front,
 * and a sender that waits on nothing else from that peer writes pieces
 * from the back with process_vm_writev (the same permission as the
 * receiver's reads, checked by our own probe of the peer); the receiver
 * releases the slot once every byte has landed. Where the sender would
 * idle (the root of a broadcast, a rank whose receives are done) the
 * message moves on two cores; where both sides have receives of their own
 * to do, nothing changes. A sender whose write fails gives its piece back
 * and helps that peer no more.
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
/* Two cores on one message: pieces of this many slots' payload (1 MiB at
 * the default geometry: a few microseconds of syscall against hundreds of
 * copying, and small enough to balance a message of a few MiB); a small
 * HETCCL_SHM_CHUNK makes them small, so that tests reach many pieces. */
#define SHM_COOP_PIECE_SLOTS 2

static inline shm_slot_hdr_t *slot_at(const shm_ring_map_t *m, uint64_t i) {
  return (shm_slot_hdr_t *)(m->slots + (size_t)(i % m->nslots) * m->stride);
}

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* The cooperation record of RNDV slot i (shm.h: a slot's payload holds it). */
static inline shm_coop_t *coop_at(const shm_ring_map_t *m, uint64_t i) {
  return (shm_coop_t *)((uint8_t *)slot_at(m, i) + SHM_SLOT_HDR);
}

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
        /* closed to our help until the receiver opens it (a slot's old payload) */
        atomic_store_explicit(&coop_at(m, ep->tx_tail)->open, 0, memory_order_relaxed);
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

/* Write [off, off + n) of a send straight into its receiver's destination;
 * 0 if the kernel refuses (a sandbox may allow reads and not writes). */
static int tx_write(hetccl_ep_t *ep, const hetccl_req_t *r, const shm_coop_t *co, size_t off,
                    size_t n) {
  for (size_t at = 0; at < n;) {
    struct iovec local = {(uint8_t *)r->buf + off + at, n - at};
    struct iovec remote = {(void *)(uintptr_t)(co->dst + off + at), n - at};
    ssize_t got = process_vm_writev(ep->peer_pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      INFO(HETCCL_SHM, "shm: process_vm_writev into rank %d (pid %d): %s; it reads our sends "
           "alone from now on", ep->peer_user, ep->peer_pid, got < 0 ? strerror(errno) : "wrote nothing");
      return 0;
    }
    at += (size_t)got;
    hetccl_copied_add(&ep->args, (size_t)got);
  }
  return 1;
}

/* One piece, from the back, of the oldest of our single-copy sends that
 * its receiver opened (shm_coop_t); only while we wait on nothing else
 * from that peer, so that a rank with reads of its own keeps to them. The
 * permission is the one our own probe checked: reading the peer. */
static void tx_help(hetccl_ep_t *ep, int *moved) {
  if (ep->push_off || ep->rq.first ||
      !atomic_load_explicit(&ep->rx.ctrl->cma_ok, memory_order_relaxed))
    return;
  for (hetccl_req_t *r = ep->sq.first; r && r != ep->sq_place; r = r->next) {
    shm_req_priv_t *pv = shm_req_priv(r);
    uint32_t i;
    /* A slot that head passed is done, and may hold another message by now. */
    if (!pv->rndv || ep->tx_head > pv->rndv_slot) continue;
    shm_coop_t *co = coop_at(&ep->tx, pv->rndv_slot);
    if (atomic_load_explicit(&co->open, memory_order_acquire) != 1 || !shm_coop_claim(co, 1, &i))
      continue;
    size_t off = (size_t)i * co->piece, n = min_size(co->piece, r->bytes - off);
    if (!tx_write(ep, r, co, off, n)) { /* the piece back to the receiver: ours is the last */
      atomic_fetch_sub_explicit(&co->claims, (uint64_t)1 << 32, memory_order_relaxed);
      ep->push_off = 1;
      return;
    }
    atomic_fetch_add_explicit(&co->done, n, memory_order_release);
    *moved = 1;
    return;
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

/* One process_vm_readv of n bytes at offset off of the sender's buffer
 * into dst; *got 0 when a signal interrupted it (read again). */
static ncclResult_t cma_read(hetccl_ep_t *ep, hetccl_req_t *r, void *dst, size_t off, size_t n,
                             size_t *got) {
  shm_req_priv_t *pv = shm_req_priv(r);
  struct iovec local = {dst, n};
  struct iovec remote = {(void *)(uintptr_t)(pv->src_addr + off), n};
  ssize_t g = process_vm_readv(ep->peer_pid, &local, 1, &remote, 1, 0);
  *got = 0;
  if (g < 0 && errno == EINTR) return ncclSuccess;
  /* A peer that dies while we read its buffer shows as ESRCH, or as a
   * fault once its memory is being torn down: either way, it is gone. */
  if (g < 0 && (errno == ESRCH ||
                (ep->peer_watch && !hetccl_proc_alive(ep->peer_pid, ep->peer_start)))) {
    WARN("shm: peer rank %d (pid %d) exited while its send buffer was being read",
         ep->peer_user, ep->peer_pid);
    return ncclRemoteError;
  }
  if (g <= 0) {
    WARN("shm: process_vm_readv of %zu bytes at offset %zu of rank %d's send buffer (pid %d, "
         "address 0x%llx): %s", n, off, ep->peer_user, ep->peer_pid,
         (unsigned long long)pv->src_addr, g < 0 ? strerror(errno) : "read nothing");
    return ncclSystemError;
  }
  *got = (size_t)g;
  hetccl_copied_add(&ep->args, *got);
  return ncclSuccess;
}

/* Pull one piece of a rendezvous message from the sender's memory. */
static ncclResult_t rx_cma(hetccl_ep_t *ep, hetccl_req_t *r, int *moved) {
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
  size_t g;
  HETCCL_CHECK(cma_read(ep, r, dst, r->progress, n, &g));
  if (g == 0) return ncclSuccess;
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

/* Open a rendezvous message that lands by plain copy (no consume, no
 * streaming stores) and has two pieces or more to its sender's help;
 * 0 when it is read as one. */
static int rx_coop_open(hetccl_ep_t *ep, hetccl_req_t *r) {
  size_t piece = SHM_COOP_PIECE_SLOTS * ep->rx.chunk;
  int stream = ep->cma_stream && r->bytes >= SHM_STREAM_MIN;
  if (r->consume || stream || r->bytes < 2 * piece || r->bytes / piece >= UINT32_MAX / 2)
    return 0;
  shm_coop_t *co = coop_at(&ep->rx, ep->rx_head);
  atomic_store_explicit(&co->claims, 0, memory_order_relaxed);
  atomic_store_explicit(&co->done, 0, memory_order_relaxed);
  co->dst = (uint64_t)(uintptr_t)r->buf;
  co->piece = piece;
  co->npieces = (uint32_t)((r->bytes + piece - 1) / piece);
  if (ep->help_on) {
    shm_help_t *h = &ep->help;
    h->co = co;
    h->pid = ep->peer_pid;
    h->src = shm_req_priv(r)->src_addr;
    h->bytes = r->bytes;
    h->args = &ep->args;
    h->peer_user = ep->peer_user;
    if (hetccl_shm_help_post(h)) {
      atomic_store_explicit(&co->open, 2, memory_order_release);
      return 2;
    }
  }
  atomic_store_explicit(&co->open, 1, memory_order_release);
  return 1;
}

/* An open message: read the next piece from the front, or wait for the
 * sender's (or the helper thread's); complete once every byte has landed. */
static ncclResult_t rx_coop(hetccl_ep_t *ep, hetccl_req_t *r, int *moved) {
  shm_coop_t *co = coop_at(&ep->rx, ep->rx_head);
  shm_req_priv_t *pv = shm_req_priv(r);
  if (pv->coop == 2 && atomic_load_explicit(&ep->help.failed, memory_order_acquire)) {
    hetccl_shm_help_retire(&ep->help);
    WARN("%s", ep->help.message);
    return ep->help.res;
  }
  uint64_t done = atomic_load_explicit(&co->done, memory_order_acquire);
  uint32_t i;
  if (done < r->bytes && shm_coop_claim(co, 0, &i)) {
    size_t off = (size_t)i * co->piece, n = min_size(co->piece, r->bytes - off);
    for (size_t at = 0, g = 0; at < n; at += g)
      HETCCL_CHECK(cma_read(ep, r, (uint8_t *)r->buf + off + at, off + at, n - at, &g));
    done = atomic_fetch_add_explicit(&co->done, n, memory_order_acq_rel) + n;
    *moved = 1;
  }
  r->progress = done;
  if (done == r->bytes) {
    if (pv->coop == 2) hetccl_shm_help_retire(&ep->help); /* before the slot is reused */
    rx_release(ep); /* tells the sender its buffer is free */
    queue_complete(&ep->rq);
    *moved = 1;
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
      HETCCL_CHECK(pv->coop ? rx_coop(ep, r, moved) : rx_cma(ep, r, moved));
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
        pv->coop = (uint32_t)rx_coop_open(ep, r);
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
  tx_help(ep, &moved);
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
