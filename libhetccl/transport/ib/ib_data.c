/* RDMA verbs transport: the data path (protocol in ib.h).
 *
 * Threads: the one thread that drives the communicator (transport.h); no
 * locks. Nothing here blocks: posting a work request and polling the
 * completion queue return at once.
 *
 * Send: each piece is copied into its send slot behind its header and
 * posted as one SEND; a send request is done when the SEND of its last
 * piece completed, i.e. the peer's adapter acknowledged it, so that a rank
 * that finishes and closes its queue pair never takes undelivered data
 * with it. Receive: pieces are delivered in arrival order to the oldest
 * posted receive (strict posting order per direction), each checked first,
 * so a message that does not fit is reported before any of its bytes is
 * delivered or consumed. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "transport/ib/ib.h"
#include "util/check.h"
#include "util/log.h"

static uint8_t *send_slot(const hetccl_ep_t *ep, uint64_t k) {
  return ep->buf + (size_t)(k % (uint64_t)ep->slots) * ep->stride;
}

static uint8_t *recv_slot(const hetccl_ep_t *ep, uint32_t slot) {
  return ep->buf + ((size_t)ep->slots + slot) * ep->stride;
}

/* Length of the piece that starts at `offset` in a message of `bytes`. */
static size_t piece_len(const hetccl_ep_t *ep, size_t bytes, uint64_t offset) {
  size_t left = bytes - (size_t)offset;
  return left < ep->chunk ? left : ep->chunk;
}

ncclResult_t hetccl_ib_ep_error(hetccl_ep_t *ep, ncclResult_t res) {
  if (ep->err == ncclSuccess) ep->err = res;
  return ep->err;
}

static const char *wr_kind_str(int kind) {
  switch (kind) {
  case IB_WR_SEND: return "send";
  case IB_WR_RECV: case IB_WR_XRECV: return "receive";
  case IB_WR_CREDIT: return "credit write";
  case IB_WR_WRITE: case IB_WR_WRITE_IMM: case IB_WR_STAGED: case IB_WR_STAGED_IMM:
    return "rendezvous write";
  case IB_WR_CTS: return "clear-to-send write";
  default: return "work request";
  }
}

int hetccl_ib_ep_piece_room(const hetccl_ep_t *ep, uint64_t credits) {
  uint64_t slots = (uint64_t)ep->slots;
  return ep->sposted - ep->sdone < slots && ep->sposted - credits < slots;
}

static ncclResult_t post_recv(hetccl_ep_t *ep, int q, struct ibv_recv_wr *wr) {
  struct ibv_recv_wr *bad = NULL;
  int rc = ibv_post_recv(ep->qp[q], wr, &bad);
  if (rc != 0) {
    WARN("ib: rank %d: ibv_post_recv on QP %d for rank %d: %s", ep->ctx->rank_user, q,
         ep->peer_user, strerror(rc));
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  return ncclSuccess;
}

ncclResult_t hetccl_ib_ep_post_recv(hetccl_ep_t *ep, uint32_t slot) {
  struct ibv_sge sge = {.addr = (uintptr_t)recv_slot(ep, slot), .length = (uint32_t)ep->stride,
                        .lkey = ep->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = IB_WR_ID(IB_WR_RECV, slot), .sg_list = &sge, .num_sge = 1};
  return post_recv(ep, 0, &wr);
}

ncclResult_t hetccl_ib_ep_post_xrecv(hetccl_ep_t *ep, int q) {
  /* No scatter list: only a write's immediate lands here, never bytes. */
  struct ibv_recv_wr wr = {.wr_id = IB_WR_ID_QP(IB_WR_XRECV, q, 0), .sg_list = NULL,
                           .num_sge = 0};
  return post_recv(ep, q, &wr);
}

ncclResult_t hetccl_ib_ep_post_send(hetccl_ep_t *ep, int q, struct ibv_send_wr *wr,
                                    const char *what) {
  struct ibv_send_wr *bad = NULL;
  int rc = ibv_post_send(ep->qp[q], wr, &bad);
  if (rc != 0) {
    WARN("ib: rank %d: ibv_post_send (%s) to rank %d: %s", ep->ctx->rank_user, what,
         ep->peer_user, strerror(rc));
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  return ncclSuccess;
}

ncclResult_t hetccl_ib_ep_send_slot(hetccl_ep_t *ep, void *pc, uint32_t bytes, const char *what) {
  struct ibv_sge sge = {.addr = (uintptr_t)pc, .length = bytes, .lkey = ep->mr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = IB_WR_ID(IB_WR_SEND, ep->sposted % (uint64_t)ep->slots);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  HETCCL_CHECK(hetccl_ib_ep_post_send(ep, 0, &wr, what));
  ep->sposted++;
  return ncclSuccess;
}

/* ---- completions ----------------------------------------------------------- */

/* A failed completion puts the QP in the error state, and every later work
 * request is flushed. That is an error only for requests still waiting
 * (hetccl_ib_ep_check_peer): a peer that finished and closed fails our
 * last credit write, and must not fail us. */
static void wc_failed(hetccl_ep_t *ep, const struct ibv_wc *wc) {
  /* The cause, not the flushes it brings: those of the receive queue may
   * be polled before the send that failed. */
  if (ep->broken && (ep->broken != IBV_WC_WR_FLUSH_ERR || wc->status == IBV_WC_WR_FLUSH_ERR))
    return;
  ep->broken = (int)wc->status;
  if (wc->status != IBV_WC_WR_FLUSH_ERR) /* the cause; the error names the first failure seen */
    INFO(HETCCL_NET, "ib: rank %d: %s on a %s to rank %d (QP %d, status %d, vendor error 0x%x)",
         ep->ctx->rank_user, ep->v->wc_status_str(wc->status),
         wr_kind_str(IB_WR_KIND(wc->wr_id)), ep->peer_user, IB_WR_QP(wc->wr_id),
         (int)wc->status, wc->vendor_err);
  snprintf(ep->broken_why, sizeof(ep->broken_why), "%s on a %s (status %d, vendor error 0x%x)",
           ep->v->wc_status_str(wc->status), wr_kind_str(IB_WR_KIND(wc->wr_id)),
           (int)wc->status, wc->vendor_err);
}

/* An immediate on extra queue pair q: the latest is kept, and a message
 * has all of its on q once the latest is its own or a later message's
 * (each queue pair's come in message order; hetccl_ib_rdv_landed); its
 * receive WR goes back. */
static ncclResult_t xrecv_landed(hetccl_ep_t *ep, const struct ibv_wc *wc) {
  int q = IB_WR_QP(wc->wr_id);
  uint32_t imm = ntohl(wc->imm_data);
  int again = (ep->xin & (1u << q)) && (int32_t)(imm - ep->ximm[q]) <= 0;
  if (q < 1 || q >= ep->qps || wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || again) {
    WARN("ib: rank %d: unexpected %s on queue pair %d from rank %d", ep->ctx->rank_user,
         wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM ? "receive"
                                                 : "immediate (of a message already in, or "
                                                   "out of order)",
         q, ep->peer_user);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  ep->xin |= 1u << q;
  ep->ximm[q] = imm;
  return ep->broken ? ncclSuccess : hetccl_ib_ep_post_xrecv(ep, q);
}

/* Every completion of one rail's queue pairs. Rail 0's carry every piece,
 * in order on queue pair 0; the others' only rendezvous writes and their
 * immediates, which are matched by message, not by order. */
static ncclResult_t cq_drain_rail(hetccl_ep_t *ep, int rail, size_t *moved) {
  struct ibv_wc wc[16];
  for (;;) {
    int n = ibv_poll_cq(ep->cq[rail], 16, wc);
    if (n < 0) {
      WARN("ib: rank %d: ibv_poll_cq for rank %d failed on %s (%d)", ep->ctx->rank_user,
           ep->peer_user, ep->ctx->rail[rail].dev.name, n);
      return hetccl_ib_ep_error(ep, ncclSystemError);
    }
    if (n == 0) return ncclSuccess;
    *moved += (size_t)n;
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        wc_failed(ep, &wc[i]);
        continue;
      }
      switch (IB_WR_KIND(wc[i].wr_id)) {
      case IB_WR_SEND: ep->sdone++; break;
      case IB_WR_WRITE: ep->wdone++; break;
      case IB_WR_WRITE_IMM: /* on QP 0 it took a receive slot: a piece */
        ep->wdone++;
        if (IB_WR_QP(wc[i].wr_id) == 0) ep->sdone++;
        else ep->xdone[IB_WR_QP(wc[i].wr_id)] = IB_WR_SLOT(wc[i].wr_id);
        break;
      case IB_WR_STAGED: ep->stdone++; break;
      case IB_WR_STAGED_IMM: ep->stdone++, ep->sdone++; break; /* a piece, as above */
      case IB_WR_XRECV: HETCCL_CHECK(xrecv_landed(ep, &wc[i])); break;
      case IB_WR_CTS: ep->cts_busy &= ~(1u << IB_WR_SLOT(wc[i].wr_id)); break;
      case IB_WR_FLUSH: hetccl_ib_flush_completed(ep, rail); break;
      case IB_WR_CREDIT: ep->credit_busy = 0; break;
      case IB_WR_RECV: {
        uint32_t slot = IB_WR_SLOT(wc[i].wr_id);
        /* Receive WRs complete in posting order, and slots are reposted in order. */
        if (slot != ep->rarrived % (uint64_t)ep->slots) {
          WARN("ib: rank %d: receive from rank %d completed in slot %u, expected %" PRIu64,
               ep->ctx->rank_user, ep->peer_user, slot, ep->rarrived % (uint64_t)ep->slots);
          return hetccl_ib_ep_error(ep, ncclInternalError);
        }
        int imm = wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM;
        ep->landed[slot] = (ib_landed_t){.len = wc[i].byte_len,
                                         .imm = imm ? ntohl(wc[i].imm_data) : 0,
                                         .with_imm = imm};
        ep->rarrived++;
        break;
      }
      default:
        WARN("ib: rank %d: unknown completion 0x%" PRIx64 " from rank %d", ep->ctx->rank_user,
             (uint64_t)wc[i].wr_id, ep->peer_user);
        return hetccl_ib_ep_error(ep, ncclInternalError);
      }
    }
  }
}

static ncclResult_t cq_drain(hetccl_ep_t *ep, size_t *moved) {
  for (int r = 0; r < ep->rails; r++) HETCCL_CHECK(cq_drain_rail(ep, r, moved));
  return ncclSuccess;
}

/* ---- receive side -------------------------------------------------------- */

static ncclResult_t piece_check(hetccl_ep_t *ep, hetccl_req_t *r, const ib_piece_t *pc,
                                uint32_t landed) {
  ib_req_priv_t *p = ib_req_priv(r);
  hetccl_tctx_t *ctx = ep->ctx;
  if (landed < IB_PIECE_HDR) {
    WARN("ib: corrupt piece from rank %d: %u bytes, shorter than its header", ep->peer_user,
         landed);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  ncclResult_t res = hetccl_frame_check(&pc->frame, "ib", &ctx->args, ep->peer, p->seq, r->tag,
                                        r->bytes);
  if (res != ncclSuccess) return hetccl_ib_ep_error(ep, res);
  if (pc->offset == IB_PIECE_RDV) {
    int answered = (p->lkey & IB_REQ_OFFERED) != 0; /* its answer went before it came */
    /* A staged sender only takes an offer into this receive's own buffer. */
    int staged_ok = pc->len == IB_RDV_STAGED && answered && ep->rrdv == IB_RDV_LANDING &&
                    !ep->rbounce;
    if ((ep->rrdv == IB_RDV_NONE || answered) && p->pieces == 0 &&
        (pc->len == IB_RDV_MAY || pc->len == IB_RDV_MUST || pc->len == IB_RDV_ASK ||
         staged_ok) && r->bytes > 0 &&
        landed == IB_PIECE_HDR)
      return ncclSuccess;
    WARN("ib: corrupt rendezvous request from rank %d in message %" PRIu64 " (%u bytes landed, "
         "%" PRIu64 " pieces in)", ep->peer_user, p->seq, landed, p->pieces);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  if (ep->rrdv == IB_RDV_LANDING) {
    WARN("ib: rank %d sent a piece of message %" PRIu64 ", which this rank had cleared for "
         "RDMA WRITE", ep->peer_user, p->seq);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  if (r->device_dst) { /* no CPU may write it; its sender had to ask (ib_rdv.c) */
    WARN("ib: rank %d sent message %" PRIu64 " (%zu bytes) as eager pieces to a receive into "
         "device memory, which only the NIC may write: it did not ask first", ep->peer_user,
         p->seq, r->bytes);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  if (pc->offset != p->offset || pc->len != piece_len(ep, r->bytes, p->offset) ||
      landed != IB_PIECE_HDR + pc->len) {
    WARN("ib: corrupt piece from rank %d in message %" PRIu64 ": offset %" PRIu64 " length %"
         PRIu64 " (%u bytes landed), expected offset %" PRIu64 " length %zu", ep->peer_user,
         p->seq, pc->offset, pc->len, landed, p->offset, piece_len(ep, r->bytes, p->offset));
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  return ncclSuccess;
}

/* Tell the peer how many of its pieces we consumed: one RDMA write at a
 * time, from a word that is not touched while it is in flight. */
static ncclResult_t credit_return(hetccl_ep_t *ep) {
  if (ep->credit_busy || ep->broken || ep->rconsumed == ep->credit_sent) return ncclSuccess;
  ep->credit->out = ep->rconsumed;
  struct ibv_sge sge = {.addr = (uintptr_t)&ep->credit->out, .length = sizeof(uint64_t),
                        .lkey = ep->credit_mr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = IB_WR_ID(IB_WR_CREDIT, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = ep->peer_credit_addr;
  wr.wr.rdma.rkey = ep->peer_credit_rkey;
  HETCCL_CHECK(hetccl_ib_ep_post_send(ep, 0, &wr, "credits"));
  ep->credit_busy = 1;
  ep->credit_sent = ep->rconsumed;
  return ncclSuccess;
}

/* Deliver what landed in `slot` to r: a piece's payload, a rendezvous
 * request (answered; *wait = 1 if the answer must wait) or the immediate
 * that ends a rendezvous message. */
static ncclResult_t slot_deliver(hetccl_ep_t *ep, hetccl_req_t *r, uint32_t slot, size_t *moved,
                                 int *wait) {
  ib_req_priv_t *p = ib_req_priv(r);
  const ib_landed_t *l = &ep->landed[slot];
  *wait = 0;
  if (l->with_imm) return hetccl_ib_rdv_landed(ep, r, l->imm, wait);
  const ib_piece_t *pc = (const ib_piece_t *)recv_slot(ep, slot);
  if (pc->offset != IB_PIECE_RDV) hetccl_ib_rdv_offer_unused(ep, r);
  HETCCL_CHECK(piece_check(ep, r, pc, l->len));
  if (pc->offset == IB_PIECE_RDV) {
    int taken;
    if (pc->len == IB_RDV_STAGED || pc->len == IB_RDV_ASK)
      p->lkey |= IB_REQ_STAGED; /* its writes on QP 0 alone */
    if (p->lkey & IB_REQ_OFFERED) return ncclSuccess; /* answered before it was asked */
    if (pc->len == IB_RDV_MUST) p->lkey |= IB_REQ_MUST;
    HETCCL_CHECK(hetccl_ib_rdv_answer(ep, r, &taken));
    *wait = !taken;
    return ncclSuccess;
  }
  size_t len = (size_t)pc->len;
  if (len > 0 && r->consume)
    r->consume(r->consume_ctx, (char *)r->buf + p->offset, pc + 1, len);
  else if (len > 0) {
    memcpy((char *)r->buf + p->offset, pc + 1, len);
    hetccl_copied_add(&ep->ctx->args, len);
  }
  p->pieces++;
  p->offset += len;
  r->progress = p->offset;
  *moved += len;
  return ncclSuccess;
}

static ncclResult_t recv_deliver(hetccl_ep_t *ep, size_t *moved) {
  while (ep->rq.first && ep->rconsumed < ep->rarrived) {
    hetccl_req_t *r = ep->rq.first;
    ib_req_priv_t *p = ib_req_priv(r);
    uint32_t slot = (uint32_t)(ep->rconsumed % (uint64_t)ep->slots);
    int wait;
    HETCCL_CHECK(slot_deliver(ep, r, slot, moved, &wait));
    if (wait) break;
    /* The slot is free again; a broken QP would only flush it. */
    if (!ep->broken) HETCCL_CHECK(hetccl_ib_ep_post_recv(ep, slot));
    ep->rconsumed++;
    (*moved)++;
    if (p->pieces < p->npieces) continue;
    ep->rq.first = r->next;
    if (ep->rq.first == NULL) ep->rq.last = NULL;
    hetccl_ib_rdv_head(ep); /* a declined rendezvous ended with its last piece */
    if (hetccl_ib_flush_wanted(ep, r)) { /* done once read back (ib_flush.c) */
      HETCCL_CHECK(hetccl_ib_flush_post(ep, r));
      continue;
    }
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE); /* last: the caller may reuse r at once */
  }
  /* The receives now at the head (just posted, or next after one that
   * completed) are cleared to send before their sender asks, if they can be. */
  HETCCL_CHECK(hetccl_ib_rdv_offer(ep, moved));
  return credit_return(ep);
}

/* ---- send side ----------------------------------------------------------- */

static ncclResult_t send_place(hetccl_ep_t *ep, size_t *moved) {
  hetccl_tctx_t *ctx = ep->ctx;
  /* The peer's count only grows; a value beyond what we sent is not one it wrote. */
  uint64_t credits = __atomic_load_n(&ep->credit->in, __ATOMIC_ACQUIRE);
  if (credits > ep->sposted) credits = ep->sposted;
  while (ep->splace && !ep->broken) {
    hetccl_req_t *r = ep->splace;
    ib_req_priv_t *p = ib_req_priv(r);
    if (((p->lkey & IB_REQ_RDV) || hetccl_ib_rdv_staged(ep, r)) && ep->srdv != IB_RDV_EAGER) {
      int placed;
      HETCCL_CHECK(hetccl_ib_rdv_send(ep, r, credits, moved, &placed));
      if (!placed && ep->srdv != IB_RDV_EAGER) break;
      if (placed) ep->splace = r->next;
      continue;
    }
    if (!hetccl_ib_ep_piece_room(ep, credits)) break;
    size_t len = piece_len(ep, r->bytes, p->offset);
    ib_piece_t *pc = (ib_piece_t *)send_slot(ep, ep->sposted);
    hetccl_frame_fill(&pc->frame, ctx->args.comm_id, ctx->args.rank, p->seq, r->tag, r->bytes);
    pc->offset = p->offset;
    pc->len = len;
    if (len > 0) memcpy(pc + 1, (const char *)r->buf + p->offset, len);
    hetccl_copied_add(&ctx->args, len);
    HETCCL_CHECK(hetccl_ib_ep_send_slot(ep, pc, (uint32_t)(IB_PIECE_HDR + len), "data"));
    p->pieces++;
    p->offset += len;
    *moved += len + 1;
    if (p->pieces == p->npieces) {
      p->end = ep->sposted;
      ep->splace = r->next;
      ep->srdv = IB_RDV_NONE; /* a declined rendezvous ends with its last piece */
    }
  }
  return ncclSuccess;
}

static void send_retire(hetccl_ep_t *ep) {
  while (ep->sq.first) {
    hetccl_req_t *r = ep->sq.first;
    ib_req_priv_t *p = ib_req_priv(r);
    if (p->pieces < p->npieces || ep->sdone < p->end) return;
    if ((p->lkey & IB_REQ_WROTE) && !hetccl_ib_rdv_xdone(ep, r)) return;
    ep->sq.first = r->next;
    if (ep->sq.first == NULL) ep->sq.last = NULL;
    r->progress = r->bytes;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  }
}

/* ---- posting and progress ------------------------------------------------ */

static ncclResult_t req_init(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t seq, const char *what) {
  if (r == NULL || (r->bytes > 0 && r->buf == NULL)) {
    WARN("ib: %s to rank %d with a NULL request or buffer", what, ep->peer_user);
    return ncclInvalidArgument;
  }
  ib_req_priv_t *p = ib_req_priv(r);
  memset(p, 0, sizeof(*p));
  p->seq = seq;
  p->npieces = r->bytes == 0 ? 1 : (r->bytes + ep->chunk - 1) / ep->chunk;
  r->done = 0;
  r->progress = 0;
  r->next = NULL;
  return ncclSuccess;
}

static void enqueue(ib_req_queue_t *q, hetccl_req_t *r) {
  if (q->last) q->last->next = r; else q->first = r;
  q->last = r;
}

ncclResult_t hetccl_ib_isend(hetccl_ep_t *ep, hetccl_req_t *r) {
  if (ep->err) return ep->err;
  HETCCL_CHECK(req_init(ep, r, ep->sseq, "send"));
  HETCCL_CHECK(hetccl_ib_rdv_choose(ep, r));
  ep->sseq++;
  enqueue(&ep->sq, r);
  if (ep->splace == NULL) ep->splace = r;
  size_t moved = 0;
  return send_place(ep, &moved); /* what credits allow leaves at once */
}

ncclResult_t hetccl_ib_irecv(hetccl_ep_t *ep, hetccl_req_t *r) {
  if (ep->err) return ep->err;
  HETCCL_CHECK(req_init(ep, r, ep->rseq, "receive"));
  ep->rseq++;
  enqueue(&ep->rq, r);
  return ncclSuccess;
}

ncclResult_t hetccl_ib_progress(hetccl_ep_t *ep, int *idle) {
  size_t moved = 0;
  if (idle) *idle = 1;
  if (ep->err) return ep->err;
  HETCCL_CHECK(cq_drain(ep, &moved));
  HETCCL_CHECK(recv_deliver(ep, &moved));
  HETCCL_CHECK(send_place(ep, &moved));
  send_retire(ep);
  if (moved == 0 && (ep->sq.first || ep->rq.first)) HETCCL_CHECK(hetccl_ib_ep_check_peer(ep));
  if (idle) *idle = moved == 0;
  return ncclSuccess;
}
