/* The NIC's writes into device memory, made visible before a receive says
 * done: a read back through the NIC.
 *
 * A NIC writing a GPU's memory over PCIe may complete the write (and the
 * receiver see the write with immediate) while the last bytes are still on
 * their way into the device: PCIe lets a later transaction pass them under
 * relaxed ordering. A read of the same memory through the same NIC cannot
 * complete before the writes ahead of it have landed. So where the device
 * runtime has no call that flushes those writes (HIP; CUDA has
 * cuFlushGPUDirectRDMAWrites, runtime/cuda.c, called by core before the
 * stage says done), each receive that landed in device memory
 * (req->device_dst) is read back before it is marked done:
 *
 *   when                               what
 *   ep_alloc, ctx->flush_read          per rail of the pair, a queue pair on the
 *                                      endpoint's CQ connected to itself (it reads
 *                                      its own host's memory), and a sink word per
 *                                      rail, registered there
 *   the receive's last write landed     an RDMA READ of its first bytes (at most 4)
 *   (ib_rdv.c, hetccl_ib_rdv_landed)   into the sink, on every rail of the pair
 *                                      (a rail's writes are ordered only with reads
 *                                      through its own NIC); the receive leaves the
 *                                      receive queue for ep->flushq
 *   each read's completion (ib_data.c)  a receive whose reads have all completed is
 *                                      marked done, oldest first
 *
 * At most IB_FLUSH_MAX reads per rail are in flight: a landing beyond that
 * waits in its slot (the caller retries on its next progress). Device
 * memory registered through the table (ib_reg.c) allows remote reads for
 * this. ctx->flushes counts the receives read back (INFO at destroy; the
 * tests read it). HETCCL_IB_GDR_FLUSH: auto (read back where the runtime
 * has no flush call), read (always, also on CUDA), off (never: for a
 * platform known to order the writes).
 *
 * Threads: the endpoint's (whoever progresses it). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ib/ib.h"
#include "util/check.h"
#include "util/log.h"

#define IB_FLUSH_MAX 8     /* reads in flight per rail */
#define IB_FLUSH_BYTES 4u  /* read back from the start of each receive */

int hetccl_ib_flush_cqes(const hetccl_tctx_t *ctx) { return ctx->flush_read ? IB_FLUSH_MAX : 0; }

ncclResult_t hetccl_ib_flush_open(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  if (!ctx->flush_read) return ncclSuccess;
  ep->flush_sink = calloc(IB_RAILS_MAX, sizeof(uint64_t));
  if (ep->flush_sink == NULL) {
    WARN("ib: out of memory for the read-back sink of rank %d", ep->peer_user);
    return ncclSystemError;
  }
  for (int r = 0; r < ep->rails; r++) {
    ep->flush_mr[r] = ep->v->reg_mr(ctx->rail[r].pd, ep->flush_sink,
                                    IB_RAILS_MAX * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE);
    if (ep->flush_mr[r] == NULL)
      return hetccl_ib_verbs_fail(ep, r, "ibv_reg_mr (read-back sink)", errno);
    HETCCL_CHECK(hetccl_ib_qp_create(ep, r, IB_FLUSH_MAX, 1, IBV_ACCESS_REMOTE_READ,
                                     &ep->flush_qp[r]));
    ib_rail_addr_t self;
    hetccl_ib_rail_addr(&ctx->rail[r].dev, &self);
    HETCCL_CHECK(hetccl_ib_qp_connect(ep, ep->flush_qp[r], r, &self, ep->flush_qp[r]->qp_num,
                                      0, 0));
  }
  return ncclSuccess;
}

int hetccl_ib_flush_wanted(const hetccl_ep_t *ep, const hetccl_req_t *r) {
  return r->device_dst && ep->flush_qp[0] != NULL;
}

static uint64_t done_on_all(const hetccl_ep_t *ep) {
  uint64_t least = ep->flush_done[0];
  for (int r = 1; r < ep->rails; r++)
    if (ep->flush_done[r] < least) least = ep->flush_done[r];
  return least;
}

int hetccl_ib_flush_room(const hetccl_ep_t *ep) {
  return ep->flush_posted - done_on_all(ep) < IB_FLUSH_MAX;
}

ncclResult_t hetccl_ib_flush_post(hetccl_ep_t *ep, hetccl_req_t *r) {
  ib_req_priv_t *p = ib_req_priv(r);
  uint32_t len = r->bytes < IB_FLUSH_BYTES ? (uint32_t)r->bytes : IB_FLUSH_BYTES;
  for (int rail = 0; rail < ep->rails; rail++) {
    uint32_t lkey, rkey;
    if (!hetccl_ib_reg_find(ep->ctx->rail[rail].pd, r->buf, len, &lkey, &rkey)) {
      WARN("ib: rank %d: a receive from rank %d landed in device memory at %p that is not "
           "registered on %s: it cannot be read back", ep->ctx->rank_user, ep->peer_user,
           r->buf, ep->ctx->rail[rail].dev.name);
      return hetccl_ib_ep_error(ep, ncclInternalError);
    }
    struct ibv_sge sge = {.addr = (uintptr_t)&ep->flush_sink[rail], .length = len,
                          .lkey = ep->flush_mr[rail]->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = IB_WR_ID_QP(IB_WR_FLUSH, rail, 0);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)r->buf;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(ep->flush_qp[rail], &wr, &bad);
    if (rc != 0) {
      WARN("ib: rank %d: posting the read back of a receive from rank %d on %s failed: %s",
           ep->ctx->rank_user, ep->peer_user, ep->ctx->rail[rail].dev.name, strerror(rc));
      return hetccl_ib_ep_error(ep, ncclSystemError);
    }
  }
  p->end = ep->flush_posted++;
  p->lkey |= IB_REQ_FLUSH;
  r->next = NULL;
  if (ep->flushq.last) ep->flushq.last->next = r;
  else ep->flushq.first = r;
  ep->flushq.last = r;
  __atomic_add_fetch(&ep->ctx->flushes, 1, __ATOMIC_RELAXED);
  return ncclSuccess;
}

void hetccl_ib_flush_completed(hetccl_ep_t *ep, int rail) {
  ep->flush_done[rail]++;
  uint64_t all = done_on_all(ep);
  while (ep->flushq.first && ib_req_priv(ep->flushq.first)->end < all) {
    hetccl_req_t *r = ep->flushq.first;
    ep->flushq.first = r->next;
    if (ep->flushq.first == NULL) ep->flushq.last = NULL;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE); /* last: the caller may reuse r at once */
  }
}

void hetccl_ib_flush_close(hetccl_ep_t *ep) {
  for (int r = 0; r < IB_RAILS_MAX; r++) {
    if (ep->flush_qp[r] && ep->v->destroy_qp(ep->flush_qp[r]) != 0)
      INFO(HETCCL_NET, "ib: destroying the read-back queue pair to rank %d failed",
           ep->peer_user);
    ep->flush_qp[r] = NULL;
    if (ep->flush_mr[r]) ep->v->dereg_mr(ep->flush_mr[r]);
    ep->flush_mr[r] = NULL;
  }
  free(ep->flush_sink);
  ep->flush_sink = NULL;
}
