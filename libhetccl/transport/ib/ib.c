/* RDMA verbs transport: set-up, teardown, liveness and the table (ib.h
 * describes the protocol; ib_data.c moves the data).
 *
 * Threads: ctx_create/connect/ctx_destroy run on the thread that creates
 * the communicator; ep_close/ep_fail and the liveness checks on the one
 * thread that drives it (transport.h). No locks; nothing here blocks
 * except connect (bounded by timeout_ms and the abort flag) and the short
 * bounded wait for a failure note behind a lost connection.
 *
 * Connection set-up. Each rank opens the device, allocates a protection
 * domain, listens on TCP (ctx_create) and publishes ib_addr_t: its TCP
 * address, LID, GID, port, MTU and staging geometry. connect makes every
 * endpoint's QP (state INIT, every receive slot posted), then for each pair:
 *   lower rank -> higher: hello (comm id, secret, rank, QP number, PSN,
 *                         credit block address and key, clear-to-send
 *                         ring address)
 *   higher: checks it (a foreign connection is dropped and waited past),
 *           brings its QP to RTR and RTS, answers with its own hello
 *   lower: brings its QP to RTR and RTS, sends READY
 *   higher: waits for READY; only then may data flow (the lower QP is
 *           ready to receive).
 * Every hello is sent before any rank waits for an answer, so the order
 * cannot deadlock. The listener closes once connect is done; the pair's
 * TCP connection stays as its note line (ib.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "transport/ib/ib.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

#define IB_ADDR_MAGIC 0x4942414444523031ull  /* "IBADDR01" */
#define IB_HELLO_MAGIC 0x494248454c4c4f32ull /* "IBHELLO2" */
#define IB_READY_MAGIC 0x4942524541445931ull /* "IBREADY1" */
#define IB_NOTE_WAIT_MS 200 /* how long a lost connection waits for the note behind it */
#define IB_LIVENESS_MS 50   /* how often a waiting endpoint looks at its TCP line */
/* RC retransmission: 4.096 us * 2^14 = 67 ms per try, 7 retries; a peer
 * whose QP is gone fails our sends in about half a second. */
#define IB_QP_TIMEOUT 14
#define IB_QP_RETRY 7
#define IB_QP_RNR_RETRY 7 /* infinite; credits keep receive slots posted ahead */
#define IB_QP_MIN_RNR 12  /* 0.64 ms */

typedef struct ib_hello {
  hetccl_hello_t id;
  uint32_t qpn, psn;
  uint64_t credit_addr;
  uint32_t credit_rkey;
  uint32_t pad;
  uint64_t cts_addr;      /* our clear-to-send ring, in the credit block */
} ib_hello_t;

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

static void ib_ep_close(hetccl_ep_t *ep) {
  if (ep == NULL) return;
  const hetccl_ib_verbs_t *v = ep->v;
  /* QP before CQ and memory: it may still reference both. */
  if (ep->qp && v->destroy_qp(ep->qp) != 0)
    INFO(HETCCL_NET, "ib: destroying the QP to rank %d failed", ep->peer_user);
  if (ep->cq && v->destroy_cq(ep->cq) != 0)
    INFO(HETCCL_NET, "ib: destroying the CQ of rank %d failed", ep->peer_user);
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
  ib_ep_close(ep);
}

static ncclResult_t ep_verbs_fail(hetccl_ep_t *ep, const char *call, int err) {
  WARN("ib: rank %d: %s for rank %d on %s: %s%s", ep->ctx->rank_user, call, ep->peer_user,
       ep->ctx->dev.name, strerror(err),
       err == ENOMEM || err == EPERM ? " (locked memory limit, ulimit -l?)" : "");
  return ncclSystemError;
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
  ep->mr = v->reg_mr(ctx->pd, ep->buf, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (ep->mr == NULL) return ep_verbs_fail(ep, "ibv_reg_mr (staging)", errno);
  ep->credit_mr = v->reg_mr(ctx->pd, ep->credit, sizeof(ib_credit_t),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (ep->credit_mr == NULL) return ep_verbs_fail(ep, "ibv_reg_mr (credits)", errno);
  int send_wr = IB_SEND_WRS(ep->slots), recv_wr = ep->slots;
  ep->cq = v->create_cq(ctx->dev.vctx, send_wr + recv_wr, NULL, NULL, 0);
  if (ep->cq == NULL) return ep_verbs_fail(ep, "ibv_create_cq", errno);
  struct ibv_qp_init_attr qa;
  memset(&qa, 0, sizeof(qa));
  qa.send_cq = ep->cq;
  qa.recv_cq = ep->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = (uint32_t)send_wr;
  qa.cap.max_recv_wr = (uint32_t)recv_wr;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  ep->qp = v->create_qp(ctx->pd, &qa);
  if (ep->qp == NULL) return ep_verbs_fail(ep, "ibv_create_qp", errno);
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = ctx->dev.port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  int rc = v->modify_qp(ep->qp, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return ep_verbs_fail(ep, "ibv_modify_qp to INIT", rc);
  for (int s = 0; s < ep->slots; s++) HETCCL_CHECK(hetccl_ib_ep_post_recv(ep, (uint32_t)s));
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ep->psn = ((uint32_t)ts.tv_nsec ^ ep->qp->qp_num * 2654435761u) & 0xffffff;
  return ncclSuccess;
}

static ncclResult_t ep_new(hetccl_tctx_t *ctx, int peer, const uint8_t *addrs, hetccl_ep_t **out) {
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
  ep->slots = ctx->slots;
  ep->chunk = ctx->chunk;
  ep->stride = IB_PIECE_HDR + ctx->chunk;
  memcpy(&ep->pub, addrs + (size_t)peer * HETCCL_TRANSPORT_ADDR_BYTES, sizeof(ep->pub));
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
  HETCCL_CHECK_GOTO(hetccl_net_addr_localize(&ep->paddr, ctx->args.ifname), res, fail);
  HETCCL_CHECK_GOTO(ep_alloc(ep), res, fail);
  *out = ep;
  return ncclSuccess;
fail:
  ib_ep_close(ep);
  return res;
}

static void hello_take(hetccl_ep_t *ep, const ib_hello_t *h) {
  ep->peer_qpn = h->qpn;
  ep->peer_psn = h->psn;
  ep->peer_credit_addr = h->credit_addr;
  ep->peer_credit_rkey = h->credit_rkey;
  ep->peer_cts_addr = h->cts_addr;
}

/* INIT -> RTR -> RTS, once the peer's hello is in. */
static ncclResult_t ep_qp_up(hetccl_ep_t *ep) {
  const hetccl_ib_dev_t *dev = &ep->ctx->dev;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)(dev->mtu < ep->pub.mtu ? dev->mtu : ep->pub.mtu);
  a.dest_qp_num = ep->peer_qpn;
  a.rq_psn = ep->peer_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = IB_QP_MIN_RNR;
  /* RoCE always routes by GID; InfiniBand by LID within a subnet. */
  a.ah_attr.is_global = dev->link_layer == IBV_LINK_LAYER_ETHERNET || ep->pub.lid == 0;
  memcpy(a.ah_attr.grh.dgid.raw, ep->pub.gid, sizeof(ep->pub.gid));
  a.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.dlid = ep->pub.lid;
  a.ah_attr.port_num = dev->port;
  int rc = ep->v->modify_qp(ep->qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return ep_verbs_fail(ep, "ibv_modify_qp to RTR", rc);
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = IB_QP_TIMEOUT;
  a.retry_cnt = IB_QP_RETRY;
  a.rnr_retry = IB_QP_RNR_RETRY;
  a.sq_psn = ep->psn;
  a.max_rd_atomic = 1;
  rc = ep->v->modify_qp(ep->qp, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return ep_verbs_fail(ep, "ibv_modify_qp to RTS", rc);
  return ncclSuccess;
}

static ib_hello_t hello_of(const hetccl_ep_t *ep) {
  const hetccl_transport_args_t *args = &ep->ctx->args;
  return (ib_hello_t){.id = hetccl_hello_make(IB_HELLO_MAGIC, args), .qpn = ep->qp->qp_num,
                      .psn = ep->psn, .credit_addr = (uintptr_t)&ep->credit->in,
                      .credit_rkey = ep->credit_mr->rkey,
                      .cts_addr = (uintptr_t)ep->credit->cts_in};
}

/* ---- handshake ----------------------------------------------------------- */

static long hs_on_header(void *arg, const void *hdr, const hetccl_sockaddr_t *from,
                         hetccl_net_reply_t *reply) {
  hetccl_tctx_t *ctx = arg;
  ib_hello_t h;
  char a[HETCCL_NET_ADDR_STRLEN];
  (void)reply; /* real ranks past the bootstrap connect here: a refusal is logged, not told */
  memcpy(&h, hdr, sizeof(h));
  const char *why = hetccl_hello_refusal(&h.id, IB_HELLO_MAGIC, &ctx->args, ctx->use);
  if (!why && ctx->eps[h.id.rank]->fd >= 0) why = "duplicate connection";
  if (why) {
    INFO(HETCCL_NET, "ib rank %d: dropping connection from %s: %s", ctx->rank_user,
         hetccl_net_addr_str(from, a, sizeof(a)), why);
    return -1;
  }
  return 0;
}

static int hs_on_frame(void *arg, int fd, const void *hdr, const void *payload,
                       const hetccl_sockaddr_t *from, hetccl_net_reply_t *reply) {
  hetccl_tctx_t *ctx = arg;
  ib_hello_t h;
  (void)payload;
  (void)from;
  (void)reply;
  memcpy(&h, hdr, sizeof(h));
  hetccl_ep_t *ep = ctx->eps[h.id.rank];
  if (ep->fd >= 0) return 0;
  ep->fd = fd;
  hello_take(ep, &h);
  ctx->accepted++;
  return 1;
}

static int hs_done(void *arg) {
  hetccl_tctx_t *ctx = arg;
  return ctx->accepted == ctx->expected;
}

static void what_of(const hetccl_ep_t *ep, char *what, size_t len) {
  char a[HETCCL_NET_ADDR_STRLEN];
  snprintf(what, len, "ib rank %d: connection to rank %d (%s)", ep->ctx->rank_user,
           ep->peer_user, ep_addr(ep, a, sizeof(a)));
}

/* Lower rank, first step: connect to the higher rank and say hello. */
static ncclResult_t hello_send(hetccl_tctx_t *ctx, hetccl_ep_t *ep, int64_t deadline) {
  char what[160];
  what_of(ep, what, sizeof(what));
  HETCCL_CHECK(hetccl_net_connect(&ep->paddr, deadline, ctx->args.abort_flag, what, &ep->fd));
  ib_hello_t h = hello_of(ep);
  return hetccl_net_send_all(ep->fd, &h, sizeof(h), deadline, ctx->args.abort_flag, what);
}

/* Higher rank: the lower one's hello is in; get ready and answer. */
static ncclResult_t hello_answer(hetccl_tctx_t *ctx, hetccl_ep_t *ep, int64_t deadline) {
  char what[160];
  what_of(ep, what, sizeof(what));
  HETCCL_CHECK(ep_qp_up(ep));
  ib_hello_t h = hello_of(ep);
  return hetccl_net_send_all(ep->fd, &h, sizeof(h), deadline, ctx->args.abort_flag, what);
}

/* Lower rank: the higher one's answer; get ready and say so. */
static ncclResult_t answer_take(hetccl_tctx_t *ctx, hetccl_ep_t *ep, int64_t deadline) {
  char what[160];
  ib_hello_t h;
  what_of(ep, what, sizeof(what));
  HETCCL_CHECK(hetccl_net_recv_all(ep->fd, &h, sizeof(h), deadline, ctx->args.abort_flag, what));
  if (h.id.magic != IB_HELLO_MAGIC || h.id.comm_id != ctx->args.comm_id ||
      h.id.secret != ctx->args.secret || h.id.rank != ep->peer) {
    int says = h.id.rank >= 0 && h.id.rank < ctx->args.nranks
                   ? hetccl_user_rank(ctx->args.user_ranks, h.id.rank) : h.id.rank;
    WARN("%s: the answer is not rank %d's of this communicator (magic 0x%016" PRIx64
         ", rank %d)", what, ep->peer_user, h.id.magic, says);
    return ncclSystemError;
  }
  hello_take(ep, &h);
  HETCCL_CHECK(ep_qp_up(ep));
  uint64_t ready = IB_READY_MAGIC;
  return hetccl_net_send_all(ep->fd, &ready, sizeof(ready), deadline, ctx->args.abort_flag, what);
}

/* Higher rank: the lower one's QP is ready to receive. */
static ncclResult_t ready_take(hetccl_tctx_t *ctx, hetccl_ep_t *ep, int64_t deadline) {
  char what[160];
  uint64_t ready = 0;
  what_of(ep, what, sizeof(what));
  HETCCL_CHECK(hetccl_net_recv_all(ep->fd, &ready, sizeof(ready), deadline,
                                   ctx->args.abort_flag, what));
  if (ready != IB_READY_MAGIC) {
    WARN("%s: expected READY, got 0x%016" PRIx64, what, ready);
    return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t accept_lower(hetccl_tctx_t *ctx, const uint8_t *use, hetccl_ep_t **eps,
                                 int64_t deadline) {
  int me = ctx->args.rank;
  ctx->use = use;
  ctx->eps = eps;
  ctx->accepted = 0;
  ctx->expected = 0;
  for (int p = 0; p < me; p++) ctx->expected += eps[p] != NULL;
  ncclResult_t res = ncclSuccess;
  if (ctx->expected > 0) {
    char a[HETCCL_NET_ADDR_STRLEN], what[160];
    snprintf(what, sizeof(what), "ib rank %d (%s): waiting for %d connections from lower ranks",
             ctx->rank_user, hetccl_net_addr_str(&ctx->laddr, a, sizeof(a)), ctx->expected);
    hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(ib_hello_t), .max_payload = 0,
                                  .on_header = hs_on_header, .on_frame = hs_on_frame,
                                  .done = hs_done};
    res = hetccl_net_accept_hellos(ctx->lfd, &ops, ctx, deadline, ctx->args.abort_flag, what);
  }
  ctx->use = NULL;
  ctx->eps = NULL;
  return res;
}

static ncclResult_t ib_connect(hetccl_tctx_t *ctx, const uint8_t *use, const uint8_t *addrs,
                               const hetccl_peer_locality_t *localities, hetccl_ep_t **eps) {
  ncclResult_t res = ncclSuccess;
  int me = ctx->args.rank, n = ctx->args.nranks;
  (void)localities;
  int64_t deadline = hetccl_net_deadline(ctx->args.timeout_ms);
  for (int p = 0; p < n; p++) eps[p] = NULL;
  for (int p = 0; p < n; p++)
    if (use[p] && p != me) HETCCL_CHECK_GOTO(ep_new(ctx, p, addrs, &eps[p]), res, fail);
  /* The order of the top comment: no step waits on a step that waits on it. */
  for (int p = me + 1; p < n; p++)
    if (eps[p]) HETCCL_CHECK_GOTO(hello_send(ctx, eps[p], deadline), res, fail);
  HETCCL_CHECK_GOTO(accept_lower(ctx, use, eps, deadline), res, fail);
  for (int p = 0; p < me; p++)
    if (eps[p]) HETCCL_CHECK_GOTO(hello_answer(ctx, eps[p], deadline), res, fail);
  for (int p = me + 1; p < n; p++)
    if (eps[p]) HETCCL_CHECK_GOTO(answer_take(ctx, eps[p], deadline), res, fail);
  for (int p = 0; p < me; p++)
    if (eps[p]) HETCCL_CHECK_GOTO(ready_take(ctx, eps[p], deadline), res, fail);
  /* Every expected connection is in: the port closes now, not at ctx_destroy. */
  hetccl_net_close(&ctx->lfd);
  INFO(HETCCL_NET, "ib rank %d: connected on %s port %d, GID index %d (%d slots of %zu bytes "
       "per peer; RDMA WRITE from registered memory from %zu bytes)", ctx->rank_user,
       ctx->dev.name, ctx->dev.port, ctx->dev.gid_index, ctx->slots, ctx->chunk, ctx->zcopy_min);
  return ncclSuccess;
fail:
  for (int p = 0; p < n; p++) {
    ib_ep_close(eps[p]);
    eps[p] = NULL;
  }
  return res;
}

/* ---- context ------------------------------------------------------------- */

static int ib_can_connect(const hetccl_peer_locality_t *me, const hetccl_peer_locality_t *peer) {
  (void)me;
  (void)peer;
  return 1; /* the device decides, at connect time */
}

static void ib_ctx_destroy(hetccl_tctx_t *ctx) {
  if (ctx == NULL) return;
  hetccl_net_close(&ctx->lfd);
  if (ctx->pd && ctx->attached) hetccl_ib_reg_detach(ctx->pd);
  if (ctx->pd && ctx->v->dealloc_pd(ctx->pd) != 0)
    INFO(HETCCL_NET, "ib: releasing the protection domain of rank %d failed", ctx->rank_user);
  if (ctx->v) hetccl_ib_dev_close(ctx->v, &ctx->dev);
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
  ctx->zcopy_min = (size_t)hetccl_knob_int(HETCCL_KNOB_IB_ZCOPY_THRESHOLD);
  ctx->bounce_max = (size_t)hetccl_knob_int(HETCCL_KNOB_IB_BOUNCE);
  HETCCL_CHECK_GOTO(hetccl_ib_verbs_load(&ctx->v), res, fail);
  HETCCL_CHECK_GOTO(hetccl_ib_dev_open(ctx->v, ctx->rank_user, &ctx->dev), res, fail);
  ctx->pd = ctx->v->alloc_pd(ctx->dev.vctx);
  if (ctx->pd == NULL) {
    WARN("ib: rank %d: ibv_alloc_pd on %s: %s", ctx->rank_user, ctx->dev.name, strerror(errno));
    res = ncclSystemError;
    goto fail;
  }
  HETCCL_CHECK_GOTO(hetccl_ib_reg_attach(ctx->v, ctx->pd, ctx->rank_user), res, fail);
  ctx->attached = 1;
  if (args->device) hetccl_ib_devmem_decide(ctx);
  HETCCL_CHECK_GOTO(hetccl_net_local_addr(args->ifname, &ctx->laddr, NULL, 0), res, fail);
  HETCCL_CHECK_GOTO(hetccl_net_listen(&ctx->laddr, 0, &ctx->lfd), res, fail);
  ib_addr_t b;
  memset(&b, 0, sizeof(b));
  b.magic = IB_ADDR_MAGIC;
  hetccl_net_addr_to_wire(&ctx->laddr, &b.tcp);
  memcpy(b.gid, ctx->dev.gid.raw, sizeof(b.gid));
  b.lid = ctx->dev.lid;
  b.port = ctx->dev.port;
  b.link_layer = ctx->dev.link_layer;
  b.mtu = ctx->dev.mtu;
  b.gid_index = (uint8_t)ctx->dev.gid_index;
  b.chunk = (uint32_t)ctx->chunk;
  b.slots = (uint32_t)ctx->slots;
  snprintf(b.dev, sizeof(b.dev), "%.*s", (int)sizeof(b.dev) - 1, ctx->dev.name);
  memset(addr, 0, HETCCL_TRANSPORT_ADDR_BYTES);
  memcpy(addr, &b, sizeof(b));
  INFO(HETCCL_NET | HETCCL_INIT, "ib rank %d: %s port %d (%s), GID index %d", ctx->rank_user,
       ctx->dev.name, ctx->dev.port,
       ctx->dev.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", ctx->dev.gid_index);
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
    .connect = ib_connect,
    .isend = hetccl_ib_isend,
    .irecv = hetccl_ib_irecv,
    .progress = hetccl_ib_progress,
    .ep_close = ib_ep_close,
    .ctx_destroy = ib_ctx_destroy,
    .ep_fail = ib_ep_fail,
    .usable = hetccl_ib_dev_usable,
};
