/* RDMA verbs transport: endpoints and their queue pairs, contexts,
 * liveness and the table (ib.h describes the protocol; ib_connect.c
 * connects a pair, ib_data.c moves the data).
 *
 * Threads: ctx_create/ctx_destroy run on the thread that creates the
 * communicator; ep_close/ep_fail and the liveness checks on the one thread
 * that drives it (transport.h). No locks; nothing here blocks but the
 * short bounded wait for a failure note behind a lost connection.
 *
 * Each rank opens its devices (rails, ib.h), allocates a protection domain
 * on each, listens on TCP (ctx_create) and publishes ib_addr_t: its TCP
 * address, rail 0's LID, GID, port and MTU, its rail count, staging
 * geometry and queue pairs per connection. An endpoint
 * is made with its QPs in INIT and every receive slot posted
 * (hetccl_ib_ep_new), and brought to RTR and RTS once the peer's hello is
 * in (hetccl_ib_ep_qp_up). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "transport/ib/ib.h"
#include "transport/ib/ib_mem.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

#define IB_ADDR_MAGIC 0x4942414444523032ull  /* "IBADDR02" */
#define IB_NOTE_WAIT_MS 200 /* how long a lost connection waits for the note behind it */
#define IB_LIVENESS_MS 50   /* how often a waiting endpoint looks at its TCP line */
/* RC retransmission: NCCL_IB_TIMEOUT (default 20, NCCL's: 4.096 us * 2^20
 * = 4.3 s per try) and NCCL_IB_RETRY_CNT (7). A shorter timeout resends
 * what was only queued: between two Soft-RoCE VMs, where a round trip
 * takes about 45 ms, 14 (67 ms) resent hundreds of packets the peer already
 * had, and 10 (4 ms) drove rxe to fail a write with "remote invalid
 * request". A dead peer is not found by these timers but by its TCP line
 * (ib.h) or a remote access error on its freed memory. */
#define IB_QP_RNR_RETRY 7 /* infinite; credits keep receive slots posted ahead */
#define IB_QP_MIN_RNR 12  /* 0.64 ms */

static const char *ep_addr(const hetccl_ep_t *ep, char *buf, size_t len) {
  return hetccl_net_addr_str(&ep->paddr, buf, len);
}

/* ---- liveness and failure ------------------------------------------------ */

ncclResult_t hetccl_ib_ep_lost(hetccl_ep_t *ep, const char *why) {
  if (ep->err != ncclSuccess) return ep->err;
  hetccl_fail_note_t note;
  char a[HETCCL_NET_ADDR_STRLEN];
  if (hetccl_note_line_read(ep->fd, IB_NOTE_WAIT_MS, &note)) {
    ep->err = hetccl_fail_note_received(&note, "ib", ep->peer, &ep->ctx->args);
    return ep->err;
  }
  WARN("ib: rank %d: connection to rank %d (%s, %s) lost: %s", ep->ctx->rank_user, ep->peer_user,
       ep_addr(ep, a, sizeof(a)), ep->pub.dev, why);
  ep->err = ncclRemoteError;
  return ep->err;
}

ncclResult_t hetccl_ib_ep_check_peer(hetccl_ep_t *ep) {
  if (ep->broken) return hetccl_ib_ep_lost(ep, ep->broken_why);
  int64_t now = hetccl_net_now_ms();
  if (now - ep->checked_ms < IB_LIVENESS_MS) return ncclSuccess;
  ep->checked_ms = now;
  char c;
  ssize_t k = recv(ep->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
  if (k > 0) return hetccl_ib_ep_lost(ep, "it left a note that could not be read");
  return hetccl_ib_ep_lost(ep, k == 0 ? "its process closed the connection"
                                      : strerror(errno));
}

/* ---- endpoint ------------------------------------------------------------ */

void hetccl_ib_ep_close(hetccl_ep_t *ep) {
  if (ep == NULL) return;
  const hetccl_ib_verbs_t *v = ep->v;
  hetccl_probe_stop(&ep->probe, &ep->ctx->probes_busy);
  /* QPs before CQ and memory: they may still reference both. */
  hetccl_ib_flush_close(ep);
  for (int q = 0; q < ep->qps; q++)
    if (ep->qp[q] && v->destroy_qp(ep->qp[q]) != 0)
      INFO(HETCCL_NET, "ib: destroying QP %d to rank %d failed", q, ep->peer_user);
  for (int r = 0; r < ep->rails; r++)
    if (ep->cq[r] && v->destroy_cq(ep->cq[r]) != 0)
      INFO(HETCCL_NET, "ib: destroying the CQ of rank %d on rail %d failed", ep->peer_user, r);
  if (ep->mr) v->dereg_mr(ep->mr);
  if (ep->credit_mr) v->dereg_mr(ep->credit_mr);
  hetccl_ib_rdv_free(ep);
  free(ep->buf);
  free(ep->credit);
  free(ep->landed);
  hetccl_net_close(&ep->fd);
  free(ep);
}

/* Leave the note on the TCP line, then close as ep_close does. */
static void ib_ep_fail(hetccl_ep_t *ep, const hetccl_fail_note_t *why) {
  if (ep == NULL) return;
  hetccl_note_line_send(ep->fd, why, "ib", ep->peer_user);
  hetccl_ib_ep_close(ep);
}

ncclResult_t hetccl_ib_verbs_fail(hetccl_ep_t *ep, int rail, const char *call, int err) {
  WARN("ib: rank %d: %s for rank %d on %s: %s%s", ep->ctx->rank_user, call, ep->peer_user,
       ep->ctx->rail[rail].dev.name, strerror(err),
       err == ENOMEM || err == EPERM ? " (locked memory limit, ulimit -l?)" : "");
  return ncclSystemError;
}

ncclResult_t hetccl_ib_qp_create(hetccl_ep_t *ep, int rail, int send_wr, int recv_wr,
                                 int access, struct ibv_qp **out) {
  const ib_rail_t *rl = &ep->ctx->rail[rail];
  const hetccl_ib_verbs_t *v = ep->v;
  struct ibv_qp_init_attr qa;
  memset(&qa, 0, sizeof(qa));
  qa.send_cq = ep->cq[rail];
  qa.recv_cq = ep->cq[rail];
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = (uint32_t)send_wr;
  qa.cap.max_recv_wr = (uint32_t)recv_wr;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  *out = v->create_qp(rl->pd, &qa);
  if (*out == NULL) return hetccl_ib_verbs_fail(ep, rail, "ibv_create_qp", errno);
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = rl->dev.port;
  a.qp_access_flags = (unsigned)access;
  int rc = v->modify_qp(*out, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return hetccl_ib_verbs_fail(ep, rail, "ibv_modify_qp to INIT", rc);
  return ncclSuccess;
}

/* Queue pair q of the endpoint, on its rail's CQ, in INIT. */
static ncclResult_t qp_init(hetccl_ep_t *ep, int q, int send_wr, int recv_wr) {
  return hetccl_ib_qp_create(ep, IB_QP_RAIL(ep, q), send_wr, recv_wr, IBV_ACCESS_REMOTE_WRITE,
                             &ep->qp[q]);
}

static ncclResult_t ep_alloc(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  const hetccl_ib_verbs_t *v = ep->v;
  size_t bytes = 2 * (size_t)ep->slots * ep->stride;
  if (posix_memalign((void **)&ep->buf, 4096, bytes) != 0 ||
      posix_memalign((void **)&ep->credit, 4096, sizeof(ib_credit_t)) != 0 ||
      (ep->landed = calloc((size_t)ep->slots, sizeof(*ep->landed))) == NULL) {
    WARN("ib: rank %d: out of memory for %zu bytes of staging for rank %d", ctx->rank_user,
         bytes, ep->peer_user);
    return ncclSystemError;
  }
  memset(ep->credit, 0, sizeof(*ep->credit));
  /* Staging and credits serve queue pair 0: rail 0. */
  ep->mr = v->reg_mr(ctx->rail[0].pd, ep->buf, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (ep->mr == NULL) return hetccl_ib_verbs_fail(ep, 0, "ibv_reg_mr (staging)", errno);
  ep->credit_mr = v->reg_mr(ctx->rail[0].pd, ep->credit, sizeof(ib_credit_t),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (ep->credit_mr == NULL) return hetccl_ib_verbs_fail(ep, 0, "ibv_reg_mr (credits)", errno);
  /* An extra QP holds at most `slots` writes: that is the window of all. */
  int send_wr = IB_SEND_WRS(ep->slots), recv_wr = ep->slots;
  int xsend_wr = ep->slots, xrecv_wr = IB_XQP_RECVS;
  for (int r = 0; r < ep->rails; r++) {
    int xqps = ep->qps / ep->rails - (r == 0); /* extra queue pairs on rail r */
    ep->cq[r] = v->create_cq(ctx->rail[r].dev.vctx,
                             (r == 0 ? send_wr + recv_wr : 0) + xqps * (xsend_wr + xrecv_wr) +
                                 hetccl_ib_flush_cqes(ctx),
                             NULL, NULL, 0);
    if (ep->cq[r] == NULL) return hetccl_ib_verbs_fail(ep, r, "ibv_create_cq", errno);
  }
  for (int q = 0; q < ep->qps; q++) {
    HETCCL_CHECK(qp_init(ep, q, q == 0 ? send_wr : xsend_wr, q == 0 ? recv_wr : xrecv_wr));
    ep->xdone[q] = UINT32_MAX; /* before message 0 */
  }
  for (int s = 0; s < ep->slots; s++) HETCCL_CHECK(hetccl_ib_ep_post_recv(ep, (uint32_t)s));
  for (int q = 1; q < ep->qps; q++)
    for (int k = 0; k < IB_XQP_RECVS; k++) HETCCL_CHECK(hetccl_ib_ep_post_xrecv(ep, q));
  HETCCL_CHECK(hetccl_ib_flush_open(ep));
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ep->psn = ((uint32_t)ts.tv_nsec ^ ep->qp[0]->qp_num * 2654435761u) & 0xffffff;
  return ncclSuccess;
}

ncclResult_t hetccl_ib_ep_new(hetccl_tctx_t *ctx, int peer, const uint8_t *addr,
                              hetccl_ep_t **out) {
  int peer_user = hetccl_user_rank(ctx->args.user_ranks, peer);
  hetccl_ep_t *ep = calloc(1, sizeof(*ep));
  if (ep == NULL) {
    WARN("ib: out of memory for the endpoint to rank %d", peer_user);
    return ncclSystemError;
  }
  ep->ctx = ctx;
  ep->v = ctx->v;
  ep->peer = peer;
  ep->peer_user = peer_user;
  ep->fd = -1;
  hetccl_probe_init(&ep->probe, 0); /* none in flight (its descriptor is -1) */
  ep->slots = ctx->slots;
  ep->rails = 1; /* until the peer's count is known: ep_close needs it */
  ep->qps = 0;
  ep->chunk = ctx->chunk;
  ep->stride = IB_PIECE_HDR + ctx->chunk;
  memcpy(&ep->pub, addr, sizeof(ep->pub));
  ep->pub.dev[sizeof(ep->pub.dev) - 1] = '\0';
  ncclResult_t res = ncclInvalidArgument;
  if (ep->pub.magic != IB_ADDR_MAGIC ||
      hetccl_net_addr_from_wire(&ep->pub.tcp, &ep->paddr) != ncclSuccess) {
    WARN("ib: rank %d published a malformed address blob", peer_user);
    goto fail;
  }
  if (ep->pub.chunk != ctx->chunk || ep->pub.slots != (uint32_t)ctx->slots) {
    WARN("ib: rank %d stages %u slots of %u bytes, rank %d %d of %zu (HETCCL_IB_SLOTS and "
         "HETCCL_IB_CHUNK must be the same on every rank)", peer_user, ep->pub.slots,
         ep->pub.chunk, ctx->rank_user, ctx->slots, ctx->chunk);
    goto fail;
  }
  if (ep->pub.qps != (uint16_t)ctx->qps) {
    WARN("ib: rank %d opens %u queue pairs per connection, rank %d %d (HETCCL_IB_QPS, else "
         "NCCL_IB_QPS_PER_CONNECTION, must be the same on every rank)", peer_user, ep->pub.qps,
         ctx->rank_user, ctx->qps);
    goto fail;
  }
  if (ep->pub.rails < 1 || ep->pub.rails > IB_RAILS_MAX) {
    WARN("ib: rank %d published %u rails (1 to %d)", peer_user, ep->pub.rails, IB_RAILS_MAX);
    goto fail;
  }
  /* Both ranks' counts are capped at IB_QPS_MAX / qps (ctx_create). */
  ep->rails = ep->pub.rails < ctx->rails ? ep->pub.rails : ctx->rails;
  ep->qps = ctx->qps * ep->rails;
  ep->peer_rail[0] = ep->pub.rail0;
  HETCCL_CHECK_GOTO(hetccl_net_addr_localize(&ep->paddr, ctx->args.ifname), res, fail);
  HETCCL_CHECK_GOTO(ep_alloc(ep), res, fail);
  *out = ep;
  return ncclSuccess;
fail:
  hetccl_ib_ep_close(ep);
  return res;
}

ncclResult_t hetccl_ib_qp_connect(hetccl_ep_t *ep, struct ibv_qp *qp, int rail,
                                  const ib_rail_addr_t *peer, uint32_t dest_qpn,
                                  uint32_t rq_psn, uint32_t sq_psn) {
  const hetccl_ib_dev_t *dev = &ep->ctx->rail[rail].dev;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)(dev->mtu < peer->mtu ? dev->mtu : peer->mtu);
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = IB_QP_MIN_RNR;
  /* RoCE always routes by GID; InfiniBand by LID within a subnet. */
  a.ah_attr.is_global = dev->link_layer == IBV_LINK_LAYER_ETHERNET || peer->lid == 0;
  memcpy(a.ah_attr.grh.dgid.raw, peer->gid, sizeof(peer->gid));
  a.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.dlid = peer->lid;
  a.ah_attr.port_num = dev->port;
  int rc = ep->v->modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return hetccl_ib_verbs_fail(ep, rail, "ibv_modify_qp to RTR", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = ep->ctx->qp_timeout;
  a.retry_cnt = ep->ctx->qp_retry;
  a.rnr_retry = IB_QP_RNR_RETRY;
  a.sq_psn = sq_psn;
  a.max_rd_atomic = 1;
  rc = ep->v->modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return hetccl_ib_verbs_fail(ep, rail, "ibv_modify_qp to RTS", rc);
  return ncclSuccess;
}

/* Queue pair q to RTR and RTS: rail r of this rank to rail r of the peer. */
static ncclResult_t qp_up(hetccl_ep_t *ep, int q) {
  int rail = IB_QP_RAIL(ep, q);
  return hetccl_ib_qp_connect(ep, ep->qp[q], rail, &ep->peer_rail[rail], ep->peer_qpn[q],
                              ep->peer_psn, ep->psn);
}

ncclResult_t hetccl_ib_ep_qp_up(hetccl_ep_t *ep) {
  for (int q = 0; q < ep->qps; q++) HETCCL_CHECK(qp_up(ep, q));
  return ncclSuccess;
}

/* ---- context ------------------------------------------------------------- */

void hetccl_ib_rail_addr(const hetccl_ib_dev_t *dev, ib_rail_addr_t *out) {
  memset(out, 0, sizeof(*out));
  memcpy(out->gid, dev->gid.raw, sizeof(out->gid));
  out->lid = dev->lid;
  out->port = dev->port;
  out->link_layer = dev->link_layer;
  out->mtu = dev->mtu;
  out->gid_index = (uint8_t)dev->gid_index;
}

static int ib_can_connect(const hetccl_peer_locality_t *me, const hetccl_peer_locality_t *peer) {
  (void)me;
  (void)peer;
  return 1; /* the device decides, at connect time */
}

static void ib_ctx_destroy(hetccl_tctx_t *ctx) {
  if (ctx == NULL) return;
  if (ctx->flush_read)
    INFO(HETCCL_NET, "ib rank %d: %llu receives into device memory read back through the NIC "
         "before done", ctx->rank_user,
         (unsigned long long)__atomic_load_n(&ctx->flushes, __ATOMIC_RELAXED));
  uint64_t offered = __atomic_load_n(&ctx->offers_landed, __ATOMIC_RELAXED);
  if (offered)
    INFO(HETCCL_NET, "ib rank %d: %llu rendezvous receives landed on a clear-to-send made "
         "before the sender asked, %llu of them behind the head of their direction",
         ctx->rank_user, (unsigned long long)offered,
         (unsigned long long)__atomic_load_n(&ctx->offers_ahead, __ATOMIC_RELAXED));
  hetccl_ib_ctx_release(ctx);
  for (int r = 0; r < IB_RAILS_MAX; r++) {
    ib_rail_t *rl = &ctx->rail[r];
    if (rl->pd && rl->attached) hetccl_ib_reg_detach(rl->pd);
    if (rl->pd && ctx->v->dealloc_pd(rl->pd) != 0)
      INFO(HETCCL_NET, "ib: releasing the protection domain of rank %d on %s failed",
           ctx->rank_user, rl->dev.name);
    if (ctx->v) hetccl_ib_dev_close(ctx->v, &rl->dev);
  }
  free(ctx);
}

static ncclResult_t ib_ctx_create(const hetccl_transport_args_t *args, hetccl_tctx_t **out,
                                  void *addr) {
  ncclResult_t res;
  hetccl_tctx_t *ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL) {
    WARN("ib: out of memory for a context (rank %d)",
         hetccl_user_rank(args->user_ranks, args->rank));
    return ncclSystemError;
  }
  ctx->args = *args;
  ctx->rank_user = hetccl_user_rank(args->user_ranks, args->rank);
  ctx->lfd = -1;
  ctx->chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_IB_CHUNK) & ~(size_t)63;
  ctx->slots = (int)hetccl_knob_int(HETCCL_KNOB_IB_SLOTS);
  /* Unset, ours is 2 where NCCL's is 1: NCCL moves a pair's p2p traffic
   * over two channels, a queue pair each (docs/transports.md). */
  ctx->qps = (int)hetccl_knob_int(
      hetccl_knob_or_nccl(HETCCL_KNOB_IB_QPS, HETCCL_KNOB_NCCL_IB_QPS_PER_CONNECTION));
  ctx->qp_timeout = (uint8_t)hetccl_knob_int(HETCCL_KNOB_IB_TIMEOUT);
  ctx->qp_retry = (uint8_t)hetccl_knob_int(HETCCL_KNOB_IB_RETRY_CNT);
  ctx->zcopy_min = (size_t)hetccl_knob_int(HETCCL_KNOB_IB_ZCOPY_THRESHOLD);
  ctx->offer = (int)hetccl_knob_int(HETCCL_KNOB_IB_OFFER);
  ctx->staged_write = (int)hetccl_knob_int(HETCCL_KNOB_IB_STAGED_WRITE);
  ctx->bounce_max = (size_t)hetccl_knob_int(HETCCL_KNOB_IB_BOUNCE);
  HETCCL_CHECK_GOTO(hetccl_ib_verbs_load(&ctx->v), res, fail);
  /* A pair opens qps queue pairs per rail, IB_QPS_MAX in all at most. */
  int max_rails = (int)hetccl_knob_int(HETCCL_KNOB_IB_RAILS);
  if (max_rails > IB_QPS_MAX / ctx->qps) max_rails = IB_QPS_MAX / ctx->qps;
  hetccl_ib_dev_t devs[IB_RAILS_MAX];
  HETCCL_CHECK_GOTO(
      hetccl_ib_devs_open(ctx->v, ctx->rank_user, args->busid, devs, max_rails, &ctx->rails), res,
      fail);
  for (int r = 0; r < ctx->rails; r++) ctx->rail[r].dev = devs[r];
  for (int r = 0; r < ctx->rails; r++) {
    ib_rail_t *rl = &ctx->rail[r];
    rl->pd = ctx->v->alloc_pd(rl->dev.vctx);
    if (rl->pd == NULL) {
      WARN("ib: rank %d: ibv_alloc_pd on %s: %s", ctx->rank_user, rl->dev.name, strerror(errno));
      res = ncclSystemError;
      goto fail;
    }
  }
  /* How device memory reaches the NIC decides how the table registers it. */
  if (args->device) hetccl_ib_devmem_decide(ctx);
  for (int r = 0; r < ctx->rails; r++) {
    ib_rail_t *rl = &ctx->rail[r];
    HETCCL_CHECK_GOTO(hetccl_ib_reg_attach(ctx->v, rl->pd, ctx->rank_user,
                                           ctx->gdr == IB_GDR_DMABUF ? args->device : NULL),
                      res, fail);
    rl->attached = 1;
  }
  HETCCL_CHECK_GOTO(hetccl_net_local_addr(args->ifname, &ctx->laddr, NULL, 0), res, fail);
  HETCCL_CHECK_GOTO(hetccl_net_listen(&ctx->laddr, 0, &ctx->lfd), res, fail);
  ib_addr_t b;
  memset(&b, 0, sizeof(b));
  b.magic = IB_ADDR_MAGIC;
  hetccl_net_addr_to_wire(&ctx->laddr, &b.tcp);
  hetccl_ib_rail_addr(&ctx->rail[0].dev, &b.rail0);
  b.rails = (uint8_t)ctx->rails;
  b.chunk = (uint32_t)ctx->chunk;
  b.slots = (uint32_t)ctx->slots;
  b.qps = (uint16_t)ctx->qps;
  b.ask_min = ctx->ask_min;
  snprintf(b.dev, sizeof(b.dev), "%.*s", (int)sizeof(b.dev) - 1, ctx->rail[0].dev.name);
  memset(addr, 0, HETCCL_TRANSPORT_ADDR_BYTES);
  memcpy(addr, &b, sizeof(b));
  for (int r = 0; r < ctx->rails; r++) {
    const hetccl_ib_dev_t *d = &ctx->rail[r].dev;
    INFO(HETCCL_NET | HETCCL_INIT, "ib rank %d: rail %d of %d: %s port %d (%s), GID index %d",
         ctx->rank_user, r, ctx->rails, d->name, d->port,
         d->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", d->gid_index);
  }
  *out = ctx;
  return ncclSuccess;
fail:
  ib_ctx_destroy(ctx);
  return res;
}

const hetccl_transport_t hetccl_transport_ib = {
    .name = "ib",
    .can_connect = ib_can_connect,
    .ctx_create = ib_ctx_create,
    .connect = hetccl_ib_connect,
    .isend = hetccl_ib_isend,
    .irecv = hetccl_ib_irecv,
    .progress = hetccl_ib_progress,
    .ep_close = hetccl_ib_ep_close,
    .ctx_destroy = ib_ctx_destroy,
    .ep_fail = ib_ep_fail,
    .usable = hetccl_ib_dev_usable,
    .ctx_reaches = hetccl_ib_ctx_reaches,
    .ep_open = hetccl_ib_ep_open,
    .ep_ready = hetccl_ib_ep_ready,
    .ctx_poll = hetccl_ib_ctx_poll,
    .ctx_fail = hetccl_ib_ctx_fail,
    .ctx_pull_min = hetccl_ib_ctx_pull_min,
    .mem_register = hetccl_ib_mem_register,
    .mem_deregister = hetccl_ib_mem_deregister,
    .mem_allocated = hetccl_ib_mem_allocated,
    .mem_freed = hetccl_ib_mem_freed,
    .lower_connects = 1,
};
