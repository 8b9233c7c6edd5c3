/* RDMA verbs transport: the rendezvous, zero-copy RDMA WRITE for large
 * messages on registered memory (docs/transports.md; ib.h has the eager
 * protocol it rides on, ib_reg.c the registrations).
 *
 * Threads: the one thread that drives the communicator, as ib_data.c; no
 * locks here (the registration table takes its own). Nothing blocks.
 *
 * Which messages. The sender chooses, at isend: a message of at least
 * HETCCL_IB_ZCOPY_THRESHOLD bytes whose whole source lies in a range the
 * user registered (ncclMemAlloc, ncclCommRegister, a device rank's
 * staging) goes by rendezvous; every other goes eager, as before, but a
 * source in device memory (req->device_src: registered device memory the
 * NIC reads itself, ib_devmem.c), which goes by rendezvous at every size
 * and asks with IB_RDV_MUST. The receiver takes what it is asked, and
 * chooses where the bytes land:
 *
 *   its receive                              lands in            then (CPU)
 *   copies, destination registered           the destination     nothing
 *   reduces (consume), or destination not    its bounce buffer   the reduction
 *     registered, message <= HETCCL_IB_BOUNCE   (registered, one    reads it / one
 *                                              per endpoint)       copy out
 *   copies, asked with IB_RDV_MUST           the destination,    nothing
 *                                              registered for
 *                                              this message
 *   anything else                            declined: eager pieces, as before
 *                                              (IB_RDV_MUST and reducing: an error)
 *
 * So a reduction of registered sources costs no CPU copy on either side
 * (the sender's bytes no longer go through its slots), and a plain
 * destination costs the receiver's one copy instead of one on each side.
 * The bounce buffer is made on first need (HETCCL_IB_BOUNCE bytes) and
 * holds one message: the next rendezvous request of the direction is
 * answered only after this one was delivered. Ranks may set the threshold
 * differently.
 *
 * Per message, in the order of the direction's other messages:
 *
 *   sender                          wire                    receiver
 *   request piece: the frame,  --- SEND (recv slot) -->  checks the frame as
 *     offset IB_PIECE_RDV, no                            for any piece
 *     payload                                            (sizes, tags)
 *   polls cts_in[seq % ring]   <-- RDMA WRITE (64 B) --  clear-to-send: accept,
 *                                                        address, rkey, size
 *   accept: writes of at most --- RDMA WRITE x n ---->   (nothing: the NIC
 *     `chunk` bytes, `slots`                              places the bytes)
 *     in flight,
 *     the last with immediate --- WRITE_WITH_IMM ---->   its receive WR completes
 *     (seq): takes a recv slot                           with imm = seq: done
 *   decline: eager pieces      --- SEND x n --------->   copied out of slots
 *
 * Offers: a receiver that would accept does not wait for the request. When
 * a receive of at least its threshold heads the direction's queue and
 * nothing of it has landed, it writes the accepting record at once
 * (hetccl_ib_rdv_offer; IB_REQ_OFFERED), and the request, when it comes,
 * is only checked. A sender that goes eager never reads that record: its
 * first piece voids the offer (hetccl_ib_rdv_offer_unused) and the message
 * is received eager. One that would decline offers nothing
 * (IB_REQ_NO_OFFER) and answers the request as it comes.
 *
 * Offers ahead: the receives behind the head, up to HETCCL_IB_OFFER of
 * them from the head on (IB_CTS_RING at most), are offered too, but only
 * into their own registered buffers (IB_REQ_AHEAD; the bounce buffer is
 * the head's). So a sender with several messages queued (the data plane's
 * bridges keep a receive per slot posted, a group posts many) writes each
 * as soon as the last of the one before is posted, where an offer of the
 * head alone cost a round trip per message: the next record was written
 * only once this message had landed. When such a receive becomes the head
 * it is LANDING (hetccl_ib_rdv_head), as if offered then. Its record's
 * ring slot (seq % IB_CTS_RING) is free: every message before the head is
 * complete here, so the sender read that message's record or never will;
 * and a record is not written again while its source's write is in
 * flight (cts_busy).
 *
 * Ordering: RC places a queue pair's writes in posting order, so when the
 * immediate's receive WR completes every earlier write of the message has
 * landed. A send is done when its last write completed locally (the peer
 * acknowledged it), so the caller may reuse the source then. The sender
 * posts nothing of its next message before the last write of this one, so
 * the receiver sees the immediate before any later piece; clear-to-send
 * records outstanding per direction are at most the ring's
 * IB_CTS_RING.
 *
 * Staged writes (HETCCL_IB_STAGED_WRITE). A message of at least the
 * threshold from memory that is not registered goes eager, but if, when
 * it is about to start, the receiver's accepting offer into its own
 * buffer (the record says `direct`) is already in the ring, the sender
 * takes it (hetccl_ib_rdv_staged): its request piece says IB_RDV_STAGED,
 * and each chunk is copied into the next chunk of a registered staging
 * ring (`slots` chunks, made on first need) and RDMA-written from there,
 * `slots` in flight, the last with immediate. So the message costs the
 * sender's one CPU copy where eager pieces cost one on each side. All of
 * it goes on queue pair 0, whose completions come in order (so a ring
 * chunk is free once stdone has passed it), and the receiver, told by
 * the request, expects that one immediate. An offer into a bounce buffer
 * is not taken (the receiver would copy it out again), and none is waited
 * for: a send that finds no offer goes eager, as before, and voids the
 * offer that comes later.
 *
 * Receives into device memory (HETCCL_IB_GDR_RECV). A receive the NIC
 * writes straight into device memory (req->device_dst: registered device
 * memory of a rank whose context took a GPUDirect branch, ib_devmem.c)
 * can take no eager piece, since a CPU copies those. So such a rank
 * publishes ask_min (its threshold; ib_addr_t), core hands the transport
 * only receives of at least ask_min bytes that way (ctx_reaches), and a
 * sender to it asks first for every message of that size or more: from a
 * registered source (or device memory) as above; from any other with
 * IB_RDV_ASK, taking whatever the receiver accepts (its own buffer or its
 * bounce buffer) as a staged write, or going eager if it declines. The
 * receiver accepts a device destination only into that buffer, never
 * declines it, and fails the message if an eager piece reaches it
 * anyway. The sender's wait is the request's round trip, which an offer
 * (above) hides when the receive was posted first: NCCL's network
 * protocol waits for the receiver's buffer every time.
 *
 * Several queue pairs (HETCCL_IB_QPS * rails = N > 1, ib.h). Write k of a
 * message (bytes k*chunk..) goes on queue pair k % N, with the source's and
 * the destination's keys on that queue pair's rail (a message goes by
 * rendezvous only if its source is registered on every rail of the pair,
 * and is accepted into its destination only if that is), and the last write on each
 * queue pair that carries one is a WRITE_WITH_IMM: on QP 0 it takes a
 * receive slot as above, on QP q > 0 one of its zero-byte receive WRs. RC
 * orders writes only within a queue pair, so the receiver completes the
 * message when QP 0's immediate is delivered and every other expected one
 * (min(N, writes) - 1, from the size and chunk) is in, whichever came
 * first. The sender places nothing of its next message on QP 0 before
 * every write of this one is posted, and each queue pair delivers its
 * immediates in message order, so the receiver keeps only the latest per
 * extra queue pair: a message has all of its there once that is its own
 * or a later message's. Only messages cleared to send have writes in
 * flight, at most IB_CTS_RING of them, and each extra queue pair keeps as
 * many zero-byte receives posted (IB_XQP_RECVS). A send is done once its
 * writes completed on every queue pair. With N = 1 all of this is the
 * protocol above, byte for byte.
 *
 * Window: writes of HETCCL_IB_CHUNK bytes, HETCCL_IB_SLOTS of them in
 * flight, the bytes the eager path keeps in flight. Between two Soft-RoCE
 * VMs, writes of 512 KiB, 8 in flight (4 MiB) waited out RC retransmission
 * timeouts (then 67 ms, shorter than the queue behind such a window: the
 * peer had the packets), 0.7 of eager's speed at 1-4 MiB, against parity
 * with this window (docs/transports.md; NCCL_IB_TIMEOUT is 20 since).
 *
 * The clear-to-send record is RDMA-written into the sender's registered
 * credit block (ib.h: ib_cts_t). The sender takes it only when its head
 * and its tail both say this message (seq + 1), read with acquire order:
 * a record of an earlier message, or one still being placed, is never
 * taken. CPU copies: none on either side for a message accepted into its
 * destination (the copied-bytes counter stays 0), the copy out of the
 * bounce buffer for a plain destination, the sender's copy into its ring
 * for a staged one; a declined one counts as eager. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>

#include "transport/ib/ib.h"
#include "util/check.h"
#include "util/log.h"

/* The keys of [buf, buf + bytes) on each rail of the pair: 1 if it is
 * registered on every one (lkeys / rkeys may be NULL). */
static int keys_find(const hetccl_ep_t *ep, const void *buf, size_t bytes, uint32_t *lkeys,
                     uint32_t *rkeys) {
  for (int rail = 0; rail < ep->rails; rail++) {
    uint32_t lkey, rkey;
    if (!hetccl_ib_reg_find(ep->ctx->rail[rail].pd, buf, bytes, &lkey, &rkey)) return 0;
    if (lkeys) lkeys[rail] = lkey;
    if (rkeys) rkeys[rail] = rkey;
  }
  return 1;
}

static int wstage_ready(hetccl_ep_t *ep);

ncclResult_t hetccl_ib_rdv_choose(hetccl_ep_t *ep, hetccl_req_t *r) {
  uint32_t lkeys[IB_RAILS_MAX];
  ib_req_priv_t *p = ib_req_priv(r);
  if (r->bytes == 0) return ncclSuccess;
  /* The receiver may land it in device memory: it must be asked. */
  int ask = ep->pub.ask_min && r->bytes >= ep->pub.ask_min;
  if (!r->device_src && !ask && r->bytes < ep->ctx->zcopy_min) return ncclSuccess;
  if (keys_find(ep, r->buf, r->bytes, lkeys, NULL)) {
    p->lkey = IB_REQ_RDV | lkeys[0];
    return ncclSuccess;
  }
  if (r->device_src) {
    WARN("ib: rank %d: a send of %zu bytes of device memory at %p to rank %d is not registered "
         "on every rail of the pair (deregistered after the call was made?)", ep->ctx->rank_user,
         r->bytes, r->buf, ep->peer_user);
    return ncclInvalidUsage;
  }
  if (!ask) return ncclSuccess;
  if (!wstage_ready(ep)) {
    WARN("ib: rank %d cannot send %zu bytes from unregistered memory to rank %d, which may take "
         "them into device memory and so must be asked first: no registered staging ring to "
         "write them from (raise RLIMIT_MEMLOCK, register the buffer with ncclCommRegister, or "
         "set HETCCL_IB_GDR_RECV=0 on rank %d)", ep->ctx->rank_user, r->bytes, ep->peer_user,
         ep->peer_user);
    return ncclSystemError;
  }
  p->lkey = IB_REQ_RDV | IB_REQ_STAGED | IB_REQ_ASK;
  return ncclSuccess;
}

int hetccl_ib_ctx_reaches(const hetccl_tctx_t *ctx, const void *buf, size_t bytes, int recv) {
  if (ctx->gdr == IB_GDR_NONE || bytes == 0) return 0;
  if (recv && (ctx->ask_min == 0 || bytes < ctx->ask_min)) return 0;
  /* A staging block: below the threshold, host staging and the slots
   * cost less than a copy on the GPU and a rendezvous. */
  if (!buf) return ctx->gdr_staging && bytes >= ctx->zcopy_min;
  uint32_t lkey, rkey;
  for (int rail = 0; rail < ctx->rails; rail++)
    if (!hetccl_ib_reg_find(ctx->rail[rail].pd, buf, bytes, &lkey, &rkey)) return 0;
  return 1;
}

/* ---- send side ----------------------------------------------------------- */

static ncclResult_t request_post(hetccl_ep_t *ep, hetccl_req_t *r) {
  hetccl_tctx_t *ctx = ep->ctx;
  ib_req_priv_t *p = ib_req_priv(r);
  uint64_t slots = (uint64_t)ep->slots;
  ib_piece_t *pc = (ib_piece_t *)(ep->buf + (size_t)(ep->sposted % slots) * ep->stride);
  hetccl_frame_fill(&pc->frame, ctx->args.comm_id, ctx->args.rank, p->seq, r->tag, r->bytes);
  pc->offset = IB_PIECE_RDV;
  pc->len = r->device_src            ? IB_RDV_MUST
            : (p->lkey & IB_REQ_ASK)    ? IB_RDV_ASK
            : (p->lkey & IB_REQ_STAGED) ? IB_RDV_STAGED
                                        : IB_RDV_MAY;
  HETCCL_CHECK(hetccl_ib_ep_send_slot(ep, pc, IB_PIECE_HDR, "rendezvous request"));
  ep->srdv = IB_RDV_ASKED;
  return ncclSuccess;
}

/* Message seq's clear-to-send record, if it is in the ring whole (head
 * and tail both say seq + 1), else NULL. */
static const ib_cts_t *cts_here(const hetccl_ep_t *ep, uint64_t seq) {
  const ib_cts_t *c = &ep->credit->cts_in[seq % IB_CTS_RING];
  uint64_t want = seq + 1;
  if (__atomic_load_n(&c->head, __ATOMIC_ACQUIRE) != want ||
      __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE) != want)
    return NULL;
  return c;
}

/* The clear-to-send of r, if it is here: 1 and ep->srdv moves on. */
static ncclResult_t cts_take(hetccl_ep_t *ep, hetccl_req_t *r, int *took) {
  ib_req_priv_t *p = ib_req_priv(r);
  const ib_cts_t *c = cts_here(ep, p->seq);
  *took = 0;
  if (c == NULL) return ncclSuccess;
  if (!c->accept && r->device_src) {
    WARN("ib: rank %d: rank %d declined message %" PRIu64 ", whose source is device memory "
         "that only the NIC may read", ep->ctx->rank_user, ep->peer_user, p->seq);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  } else if (!c->accept) {
    ep->srdv = IB_RDV_EAGER;
  } else if (c->bytes != r->bytes) {
    WARN("ib: rank %d: rank %d cleared %" PRIu64 " bytes of message %" PRIu64 " to it, which "
         "has %zu", ep->ctx->rank_user, ep->peer_user, c->bytes, p->seq, r->bytes);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  } else if (p->lkey & IB_REQ_STAGED) { /* hetccl_ib_rdv_staged's offer, or IB_RDV_ASK's answer */
    ep->srdv_addr = c->addr;
    ep->srdv_rkey[0] = c->rkey;
    ep->srdv = IB_RDV_WRITING;
  } else {
    /* Registered on every rail at isend (hetccl_ib_rdv_choose), and the
     * caller keeps it so until the send is done. */
    if (!keys_find(ep, r->buf, r->bytes, ep->srdv_lkey, NULL)) {
      WARN("ib: rank %d: the source of message %" PRIu64 " to rank %d is no longer registered "
           "(deregistered while the send was in flight?)", ep->ctx->rank_user, p->seq,
           ep->peer_user);
      return hetccl_ib_ep_error(ep, ncclInvalidUsage);
    }
    ep->srdv_addr = c->addr;
    ep->srdv_rkey[0] = c->rkey;
    for (int rail = 1; rail < ep->rails; rail++) ep->srdv_rkey[rail] = c->xrkey[rail - 1];
    ep->srdv = IB_RDV_WRITING;
  }
  *took = 1;
  return ncclSuccess;
}

/* Queue pairs that carry a part of an accepted message of `npieces` writes. */
static int qps_used(const hetccl_ep_t *ep, uint64_t npieces) {
  return npieces < (uint64_t)ep->qps ? (int)npieces : ep->qps;
}

int hetccl_ib_rdv_xdone(const hetccl_ep_t *ep, hetccl_req_t *r) {
  ib_req_priv_t *p = ib_req_priv(r);
  if (p->lkey & IB_REQ_STAGED) return 1; /* queue pair 0 alone */
  for (int q = 1; q < qps_used(ep, p->npieces); q++)
    if ((int32_t)(ep->xdone[q] - (uint32_t)p->seq) < 0) return 0;
  return 1;
}

/* One RDMA WRITE of r's next `len` bytes (at its offset in the
 * destination) from `src` on queue pair q, with immediate (the message's
 * seq) if `last`. */
static ncclResult_t write_post(hetccl_ep_t *ep, hetccl_req_t *r, int q, uint64_t id,
                               const void *src, uint32_t lkey, size_t len, int last,
                               const char *what) {
  ib_req_priv_t *p = ib_req_priv(r);
  struct ibv_sge sge = {.addr = (uintptr_t)src, .length = (uint32_t)len, .lkey = lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl((uint32_t)p->seq);
  wr.wr.rdma.remote_addr = ep->srdv_addr + p->offset;
  wr.wr.rdma.rkey = ep->srdv_rkey[IB_QP_RAIL(ep, q)];
  return hetccl_ib_ep_post_send(ep, q, &wr, what);
}

/* ---- staged writes -------------------------------------------------------- */

/* The staging ring: `slots` chunks, registered on rail 0, made on first
 * need: 1 if it is there. A failure only keeps messages eager (INFO once). */
static int wstage_ready(hetccl_ep_t *ep) {
  size_t bytes = (size_t)ep->slots * ep->chunk;
  if (ep->wstage) return 1;
  if (ep->wstage_failed) return 0;
  ep->wstage = malloc(bytes);
  if (ep->wstage)
    ep->wstage_mr = ep->v->reg_mr(ep->ctx->rail[0].pd, ep->wstage, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (ep->wstage_mr) return 1;
  INFO(HETCCL_NET, "ib rank %d: no staging ring of %zu bytes for rank %d (%s): messages from "
       "unregistered memory stay eager", ep->ctx->rank_user, bytes, ep->peer_user,
       ep->wstage ? strerror(errno) : "out of memory");
  free(ep->wstage);
  ep->wstage = NULL;
  ep->wstage_failed = 1;
  return 0;
}

int hetccl_ib_rdv_staged(hetccl_ep_t *ep, hetccl_req_t *r) {
  ib_req_priv_t *p = ib_req_priv(r);
  if (!ep->ctx->staged_write || r->device_src || p->lkey || p->pieces > 0 ||
      ep->srdv != IB_RDV_NONE || r->bytes == 0 || r->bytes < ep->ctx->zcopy_min)
    return 0;
  const ib_cts_t *c = cts_here(ep, p->seq);
  if (c == NULL || !c->accept || !c->direct || c->bytes != r->bytes || !wstage_ready(ep))
    return 0; /* no offer (yet), or into a bounce buffer: eager, which voids it */
  p->lkey = IB_REQ_RDV | IB_REQ_STAGED;
  return 1;
}

/* A staged message's writes, all on queue pair 0, where the receiver
 * looks for its one immediate: each chunk copied into the ring's next
 * chunk (the CPU's one copy of it) and written from there, `slots` in
 * flight; the last with immediate, taking a receive slot like a piece.
 * Completions on one queue pair come in posting order, so a chunk is free
 * again once stdone has passed it. */
static ncclResult_t staged_writes_post(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t credits,
                                       size_t *moved) {
  ib_req_priv_t *p = ib_req_priv(r);
  while (p->offset < r->bytes && ep->stposted - ep->stdone < (uint64_t)ep->slots) {
    size_t len = r->bytes - (size_t)p->offset;
    if (len > ep->chunk) len = ep->chunk;
    int last = p->offset + len == r->bytes;
    if (last && !hetccl_ib_ep_piece_room(ep, credits)) break;
    uint8_t *at = ep->wstage + (size_t)(ep->stposted % (uint64_t)ep->slots) * ep->chunk;
    memcpy(at, (const char *)r->buf + p->offset, len);
    hetccl_copied_add(&ep->ctx->args, len);
    HETCCL_CHECK(write_post(ep, r, 0, IB_WR_ID(last ? IB_WR_STAGED_IMM : IB_WR_STAGED, 0), at,
                            ep->wstage_mr->lkey, len, last, "staged write"));
    ep->stposted++;
    if (last) ep->sposted++;
    p->offset += len;
    *moved += len;
  }
  return ncclSuccess;
}

/* ---- writes from registered sources -------------------------------------- */

static ncclResult_t writes_post(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t credits,
                                size_t *moved) {
  ib_req_priv_t *p = ib_req_priv(r);
  uint64_t nq = (uint64_t)ep->qps;
  if (p->lkey & IB_REQ_STAGED) return staged_writes_post(ep, r, credits, moved);
  while (p->offset < r->bytes && ep->wposted - ep->wdone < (uint64_t)ep->slots) {
    size_t len = r->bytes - (size_t)p->offset;
    if (len > ep->chunk) len = ep->chunk;
    uint64_t k = p->offset / ep->chunk;
    int q = (int)(k % nq);
    int last = k + nq >= p->npieces; /* the last write on queue pair q */
    /* On QP 0 it takes a receive slot; elsewhere a receive WR always posted. */
    if (last && q == 0 && !hetccl_ib_ep_piece_room(ep, credits)) break;
    uint64_t id = IB_WR_ID_QP(last ? IB_WR_WRITE_IMM : IB_WR_WRITE, q,
                              last && q > 0 ? (uint32_t)p->seq : 0);
    HETCCL_CHECK(write_post(ep, r, q, id, (const char *)r->buf + p->offset,
                            ep->srdv_lkey[IB_QP_RAIL(ep, q)], len, last, "rendezvous write"));
    ep->wposted++;
    if (last && q == 0) ep->sposted++;
    p->offset += len;
    *moved += len;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_ib_rdv_send(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t credits,
                                size_t *moved, int *placed) {
  ib_req_priv_t *p = ib_req_priv(r);
  int took = 0;
  *placed = 0;
  if (ep->srdv == IB_RDV_NONE) {
    if (!hetccl_ib_ep_piece_room(ep, credits)) return ncclSuccess;
    HETCCL_CHECK(request_post(ep, r));
    (*moved)++;
  }
  if (ep->srdv == IB_RDV_ASKED) {
    HETCCL_CHECK(cts_take(ep, r, &took));
    *moved += took;
  }
  if (ep->srdv != IB_RDV_WRITING) return ncclSuccess;
  HETCCL_CHECK(writes_post(ep, r, credits, moved));
  r->progress = p->offset;
  if (p->offset < r->bytes) return ncclSuccess;
  p->pieces = p->npieces;
  p->end = ep->sposted; /* done when QP 0's last write, counted as a piece, completed */
  p->lkey |= IB_REQ_WROTE; /* and those of the other queue pairs (hetccl_ib_rdv_xdone) */
  ep->srdv = IB_RDV_NONE;
  *placed = 1;
  return ncclSuccess;
}

/* ---- receive side -------------------------------------------------------- */

/* The registration of rq.first's buffer for one message, if made. */
static void once_drop(hetccl_ep_t *ep) {
  for (int rail = 0; rail < IB_RAILS_MAX; rail++) {
    if (ep->once_mr[rail]) ep->v->dereg_mr(ep->once_mr[rail]);
    ep->once_mr[rail] = NULL;
  }
}

/* Register r's own buffer on every rail of the pair for this one message
 * (a sender that may not be declined, and nowhere registered to put it):
 * 1 and its remote keys, or 0 after the WARN. */
static int once_register(hetccl_ep_t *ep, hetccl_req_t *r, uint32_t *rkeys) {
  for (int rail = 0; rail < ep->rails; rail++) {
    ep->once_mr[rail] = ep->v->reg_mr(ep->ctx->rail[rail].pd, r->buf, r->bytes,
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (ep->once_mr[rail] == NULL) {
      WARN("ib: rank %d cannot take message %" PRIu64 " of %zu bytes from rank %d, whose source "
           "is device memory that only the NIC may read: its buffer is not registered, %s, and "
           "ibv_reg_mr of it on %s failed: %s (register it with ncclCommRegister, or raise "
           "RLIMIT_MEMLOCK)", ep->ctx->rank_user, ib_req_priv(r)->seq, r->bytes, ep->peer_user,
           r->consume ? "it reduces" : "it is larger than HETCCL_IB_BOUNCE",
           ep->ctx->rail[rail].dev.name, strerror(errno));
      once_drop(ep);
      return 0;
    }
    rkeys[rail] = ep->once_mr[rail]->rkey;
  }
  return 1;
}

void hetccl_ib_rdv_free(hetccl_ep_t *ep) {
  once_drop(ep);
  if (ep->wstage_mr) ep->v->dereg_mr(ep->wstage_mr);
  ep->wstage_mr = NULL;
  free(ep->wstage);
  ep->wstage = NULL;
  for (int rail = 0; rail < IB_RAILS_MAX; rail++) {
    if (ep->bounce_mr[rail]) ep->v->dereg_mr(ep->bounce_mr[rail]);
    ep->bounce_mr[rail] = NULL;
  }
  free(ep->bounce);
  ep->bounce = NULL;
}

/* The endpoint's bounce buffer, made and registered on each rail on first
 * need: 1 if it is there. A failure only declines (INFO once): the eager
 * path works. */
static int bounce_ready(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  if (ep->bounce) return 1;
  if (ep->bounce_failed) return 0;
  ep->bounce = malloc(ctx->bounce_max);
  int rail = 0;
  for (; ep->bounce && rail < ep->rails; rail++) {
    ep->bounce_mr[rail] = ep->v->reg_mr(ctx->rail[rail].pd, ep->bounce, ctx->bounce_max,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (ep->bounce_mr[rail] == NULL) break;
  }
  if (ep->bounce && rail == ep->rails) return 1;
  INFO(HETCCL_NET, "ib rank %d: no bounce buffer of %zu bytes for rank %d (%s): messages that "
       "reduce, or land in unregistered memory, take the eager path", ctx->rank_user,
       ctx->bounce_max, ep->peer_user, ep->bounce ? strerror(errno) : "out of memory");
  hetccl_ib_rdv_free(ep);
  ep->bounce_failed = 1;
  return 0;
}

/* Write r's clear-to-send record into the sender's ring: accept (where
 * the bytes land) or decline. An offer (before the sender asked) is made
 * only to accept: *taken = 0 and *declined = 1 when it would decline; an
 * offer `ahead` of the head only into r's own buffer, and it leaves the
 * head's state alone. *taken = 0 also while the record's source is still
 * in flight. */
static ncclResult_t cts_post(hetccl_ep_t *ep, hetccl_req_t *r, int offer, int ahead,
                             int *taken, int *declined) {
  ib_req_priv_t *p = ib_req_priv(r);
  uint32_t rkeys[IB_RAILS_MAX];
  uint32_t at = (uint32_t)(p->seq % IB_CTS_RING);
  *taken = *declined = 0;
  if (ep->cts_busy & (1u << at)) return ncclSuccess;
  int direct = r->consume == NULL && keys_find(ep, r->buf, r->bytes, NULL, rkeys);
  if (ahead && !direct) {
    *declined = 1;
    return ncclSuccess;
  }
  if (r->device_dst && !direct) { /* registered when core posted it (ctx_reaches) */
    WARN("ib: rank %d: its receive of message %" PRIu64 " (%zu bytes) from rank %d into device "
         "memory at %p is no longer registered on every rail (deregistered while the receive "
         "was posted?)", ep->ctx->rank_user, p->seq, r->bytes, ep->peer_user, r->buf);
    return hetccl_ib_ep_error(ep, ncclInvalidUsage);
  }
  int bounce = !direct && r->bytes <= ep->ctx->bounce_max && bounce_ready(ep);
  int accept = direct || bounce;
  if (offer && !accept) {
    *declined = 1;
    return ncclSuccess;
  }
  if (!accept && (p->lkey & IB_REQ_MUST)) {
    if (r->consume || !once_register(ep, r, rkeys)) return hetccl_ib_ep_error(ep, ncclSystemError);
    direct = accept = 1;
  }
  ib_cts_t *c = &ep->credit->cts_out[at];
  memset(c, 0, sizeof(*c));
  c->head = c->tail = p->seq + 1;
  c->accept = (uint32_t)accept;
  c->direct = (uint32_t)direct;
  c->bytes = r->bytes;
  if (bounce)
    for (int rail = 0; rail < ep->rails; rail++) rkeys[rail] = ep->bounce_mr[rail]->rkey;
  if (accept) {
    c->addr = (uintptr_t)(direct ? r->buf : ep->bounce);
    c->rkey = rkeys[0];
    for (int rail = 1; rail < ep->rails; rail++) c->xrkey[rail - 1] = rkeys[rail];
  }
  struct ibv_sge sge = {.addr = (uintptr_t)c, .length = sizeof(*c),
                        .lkey = ep->credit_mr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = IB_WR_ID(IB_WR_CTS, at);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = ep->peer_cts_addr + (uint64_t)at * sizeof(ib_cts_t);
  wr.wr.rdma.rkey = ep->peer_credit_rkey;
  HETCCL_CHECK(hetccl_ib_ep_post_send(ep, 0, &wr, "clear to send"));
  ep->cts_busy |= 1u << at;
  if (!ahead) {
    ep->rrdv = accept ? IB_RDV_LANDING : IB_RDV_EAGER;
    ep->rbounce = bounce;
  }
  *taken = 1;
  return ncclSuccess;
}

ncclResult_t hetccl_ib_rdv_answer(hetccl_ep_t *ep, hetccl_req_t *r, int *taken) {
  int declined;
  return cts_post(ep, r, 0, 0, taken, &declined);
}

void hetccl_ib_rdv_head(hetccl_ep_t *ep) {
  hetccl_req_t *r = ep->rq.first;
  /* Offered ahead: accepted into its own buffer, as if offered now. */
  int landing = r && (ib_req_priv(r)->lkey & IB_REQ_AHEAD);
  ep->rrdv = landing ? IB_RDV_LANDING : IB_RDV_NONE;
  ep->rbounce = 0;
}

/* Offer r (not yet offered, nothing of it delivered), if it can be. */
static ncclResult_t offer_one(hetccl_ep_t *ep, hetccl_req_t *r, int ahead, size_t *moved) {
  ib_req_priv_t *p = ib_req_priv(r);
  int taken, declined;
  uint64_t skip = IB_REQ_OFFERED | IB_REQ_NO_OFFER | (ahead ? IB_REQ_NOT_AHEAD : 0);
  if ((p->lkey & skip) || p->pieces > 0 || r->bytes == 0 || r->bytes < ep->ctx->zcopy_min)
    return ncclSuccess;
  HETCCL_CHECK(cts_post(ep, r, 1, ahead, &taken, &declined));
  if (taken) {
    p->lkey |= IB_REQ_OFFERED | (ahead ? IB_REQ_AHEAD : 0);
    (*moved)++;
  } else if (declined) { /* a sender that asks is answered as it asks */
    p->lkey |= ahead ? IB_REQ_NOT_AHEAD : IB_REQ_NO_OFFER;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_ib_rdv_offer(hetccl_ep_t *ep, size_t *moved) {
  hetccl_req_t *head = ep->rq.first;
  if (head == NULL || ep->ctx->offer == 0 || ep->broken) return ncclSuccess;
  /* The head: unless its first piece or request is here (answered as it
   * comes) or it is under way. */
  if (ep->rrdv == IB_RDV_NONE && ep->rconsumed == ep->rarrived)
    HETCCL_CHECK(offer_one(ep, head, 0, moved));
  /* Those behind it, into their own buffers, up to HETCCL_IB_OFFER from
   * the head: their records' ring slots are free, since every message
   * before the head is complete (so its record was read, or never will
   * be). Pieces of theirs may have landed: a request (the sender waits
   * for this record) or eager pieces (the sender went eager, and the
   * record is never read). */
  uint64_t end = ib_req_priv(head)->seq + (uint64_t)ep->ctx->offer;
  for (hetccl_req_t *r = head->next; r && ib_req_priv(r)->seq < end; r = r->next)
    HETCCL_CHECK(offer_one(ep, r, 1, moved));
  return ncclSuccess;
}

void hetccl_ib_rdv_offer_unused(hetccl_ep_t *ep, hetccl_req_t *r) {
  ib_req_priv_t *p = ib_req_priv(r);
  if (!(p->lkey & IB_REQ_OFFERED) || ep->rrdv != IB_RDV_LANDING || p->pieces > 0) return;
  ep->rrdv = IB_RDV_EAGER; /* its record stays in the sender's ring, never taken */
  ep->rbounce = 0;
}

/* Are the immediates of r's writes on the extra queue pairs all in? Each
 * queue pair's come in message order, so r's on q is in once the latest
 * there is r's or a later message's. *bad names an extra queue pair that
 * r does not use whose latest immediate is r's (0: none). */
static int xin_complete(hetccl_ep_t *ep, hetccl_req_t *r, int *bad) {
  ib_req_priv_t *p = ib_req_priv(r);
  int used = (p->lkey & IB_REQ_STAGED) ? 1 : qps_used(ep, p->npieces);
  int all = 1;
  *bad = 0;
  for (int q = 1; q < ep->qps; q++) {
    int in = (ep->xin & (1u << q)) != 0;
    if (q < used) all &= in && (int32_t)(ep->ximm[q] - (uint32_t)p->seq) >= 0;
    else if (in && ep->ximm[q] == (uint32_t)p->seq) *bad = q;
  }
  return all;
}

ncclResult_t hetccl_ib_rdv_landed(hetccl_ep_t *ep, hetccl_req_t *r, uint32_t imm, int *wait) {
  ib_req_priv_t *p = ib_req_priv(r);
  if (hetccl_ib_flush_wanted(ep, r) && !hetccl_ib_flush_room(ep)) {
    *wait = 1; /* its read back would not fit: take it once one completes */
    return ncclSuccess;
  }
  int bad = 0, all = ep->rrdv == IB_RDV_LANDING && xin_complete(ep, r, &bad);
  *wait = 0;
  if (ep->rrdv != IB_RDV_LANDING || imm != (uint32_t)p->seq || bad) {
    WARN("ib: rank %d: a write with immediate %u from rank %d on queue pair %d, expected %s",
         ep->ctx->rank_user, bad ? ep->ximm[bad] : imm, ep->peer_user, bad,
         ep->rrdv == IB_RDV_LANDING ? "the one of the message it was cleared for"
                                    : "a piece (no rendezvous message is in flight)");
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  if (!all) { /* another queue pair's writes are still landing */
    *wait = 1;
    return ncclSuccess;
  }
  if (p->lkey & IB_REQ_OFFERED) {
    __atomic_add_fetch(&ep->ctx->offers_landed, 1, __ATOMIC_RELAXED);
    if (p->lkey & IB_REQ_AHEAD) __atomic_add_fetch(&ep->ctx->offers_ahead, 1, __ATOMIC_RELAXED);
  }
  if (ep->rbounce && r->consume) {
    r->consume(r->consume_ctx, r->buf, ep->bounce, r->bytes);
  } else if (ep->rbounce) {
    memcpy(r->buf, ep->bounce, r->bytes);
    hetccl_copied_add(&ep->ctx->args, r->bytes);
  }
  once_drop(ep);
  ep->rbounce = 0;
  p->pieces = p->npieces;
  p->offset = r->bytes;
  r->progress = r->bytes; /* done: recv_deliver moves the head on (hetccl_ib_rdv_head) */
  return ncclSuccess;
}
