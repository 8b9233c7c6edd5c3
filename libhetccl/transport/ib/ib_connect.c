/* RDMA verbs transport: how a pair connects (the handshake over TCP), at
 * init for every pair (connect) or when the engine first needs the pair
 * (ep_open, ep_ready, ctx_poll, ctx_fail: connections on first use,
 * transport.h). Both are the same steps, driven by one state machine
 * (hs_step); connect only opens every pair at once and drives them all
 * until they are ready.
 *
 * Contract. The lower rank initiates: its endpoint (QP in INIT, every
 * receive slot posted; ib.c) connects to the higher rank's listener and
 * sends its hello:
 *   lower -> higher: hello (comm id, secret, rank, QP number, PSN, credit
 *                    block address and key, clear-to-send ring address,
 *                    the other QPs' numbers, where each rail beyond the
 *                    first is; the same size whatever is used of it)
 *   higher: takes it from its listener (ctx_poll, through the inbox,
 *           base/inbox.h: a foreign hello is dropped and waited past) and
 *           parks it under the lower rank until that peer's endpoint
 *           collects it, opened or not yet; then brings its QP to RTR and
 *           RTS and answers with its own hello
 *   lower: checks the answer, brings its QP to RTR and RTS, sends READY;
 *          ready (the higher QP can receive since it answered)
 *   higher: ready once READY is in (the lower QP can receive).
 * Nothing waits on the peer: every step after the lower's connect reads
 * only what is already there. The pair's TCP connection stays as its note
 * line (ib.h).
 *
 * Failures. A lower rank that finds nothing listening (the higher is gone)
 * fails naming it. Whatever is on the line where an answer or READY should
 * be, or its end, is the peer's note or its exit (hetccl_ib_ep_lost reads
 * the note). A rank that fails (ctx_fail) leaves its note on the line of
 * every lower rank that came but was not served, and answers every later
 * arrival with it; a lower rank that fails before it connected opens an
 * endpoint only to leave its note there (ep_fail; lower_connects in the
 * table), which the higher reads where READY should be.
 *
 * The listener stays open until every lower rank has come and this rank
 * has said hello to every higher one (connect: until connect returns),
 * or, after ctx_fail, until ctx_destroy, which answers the last arrivals.
 * Not before: while a higher rank waits for this one's hello on first use,
 * it probes this listener (base/probe.h) to tell a rank killed on another
 * host, whose kernel refuses the probe, from a slow one (ep_probe).
 *
 * Threads: connect on the thread that creates the communicator; the rest
 * on the one thread that drives it (transport.h). No locks. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "transport/ib/ib.h"
#include "util/check.h"
#include "util/log.h"

#define IB_HELLO_MAGIC 0x494248454c4c4f33ull /* "IBHELLO3" */
#define IB_READY_MAGIC 0x4942524541445931ull /* "IBREADY1" */
#define IB_CONNECT_POLL_MS 1                 /* connect: longest sleep between rounds */

typedef struct ib_hello {
  hetccl_hello_t id;
  uint32_t qpn, psn;
  uint64_t credit_addr;
  uint32_t credit_rkey;
  uint32_t xqps;     /* queue pairs beyond the first (HETCCL_IB_QPS * rails - 1) */
  uint64_t cts_addr; /* our clear-to-send ring, in the credit block */
  uint32_t xqpn[IB_QPS_MAX - 1]; /* their numbers: the first xqps are used */
  ib_rail_addr_t xrail[IB_RAILS_MAX - 1]; /* rails 1..: the pair's rails - 1 are used */
} ib_hello_t;

/* Every hello has the same size: a listener reads it before it knows whose. */
#define IB_HELLO_BYTES sizeof(ib_hello_t)

/* A lower rank's connection that arrived before its endpoint collected it. */
struct ib_parked {
  int fd; /* -1: none waiting */
  int came; /* its connection arrived (taken or waiting) */
  ib_hello_t hello;
};

/* Where a pair's handshake stands (ep->hs). */
enum {
  IB_HS_HELLO = 0, /* higher: waits for the lower rank's hello */
  IB_HS_ANSWER,    /* lower: hello sent, waits for the answer */
  IB_HS_READY,     /* higher: answered, waits for READY */
  IB_HS_DONE,      /* isend/irecv may be used */
};

static const char *ep_addr(const hetccl_ep_t *ep, char *buf, size_t len) {
  return hetccl_net_addr_str(&ep->paddr, buf, len);
}

static void what_of(const hetccl_ep_t *ep, char *what, size_t len) {
  char a[HETCCL_NET_ADDR_STRLEN];
  snprintf(what, len, "ib rank %d: connection to rank %d (%s)", ep->ctx->rank_user,
           ep->peer_user, ep_addr(ep, a, sizeof(a)));
}

static ib_hello_t hello_of(const hetccl_ep_t *ep) {
  const hetccl_transport_args_t *args = &ep->ctx->args;
  ib_hello_t h = {.id = hetccl_hello_make(IB_HELLO_MAGIC, args), .qpn = ep->qp[0]->qp_num,
                  .psn = ep->psn, .credit_addr = (uintptr_t)&ep->credit->in,
                  .credit_rkey = ep->credit_mr->rkey, .xqps = (uint32_t)ep->qps - 1,
                  .cts_addr = (uintptr_t)ep->credit->cts_in};
  for (int q = 1; q < ep->qps; q++) h.xqpn[q - 1] = ep->qp[q]->qp_num;
  for (int r = 1; r < ep->rails; r++) hetccl_ib_rail_addr(&ep->ctx->rail[r].dev, &h.xrail[r - 1]);
  return h;
}

/* Both ranks published the same HETCCL_IB_QPS and their rail counts
 * (hetccl_ib_ep_new), so a hello with another count is not one of this
 * communicator's. */
static ncclResult_t hello_take(hetccl_ep_t *ep, const ib_hello_t *h) {
  if (h->xqps != (uint32_t)ep->qps - 1) {
    WARN("ib: rank %d: the hello of rank %d announces %u queue pairs, this rank opened %d",
         ep->ctx->rank_user, ep->peer_user, h->xqps + 1, ep->qps);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  ep->peer_qpn[0] = h->qpn;
  for (int q = 1; q < ep->qps; q++) ep->peer_qpn[q] = h->xqpn[q - 1];
  for (int r = 1; r < ep->rails; r++) ep->peer_rail[r] = h->xrail[r - 1];
  for (int r = 0; r < ep->rails; r++) {
    const hetccl_ib_dev_t *d = &ep->ctx->rail[r].dev;
    if (ep->peer_rail[r].link_layer == d->link_layer) continue;
    WARN("ib: rank %d: its rail %d (%s) is %s, rank %d's is not: rail i of every rank must be on "
         "one fabric (choose the devices with NCCL_IB_HCA, or HETCCL_IB_RAILS=1)",
         ep->ctx->rank_user, r, d->name,
         d->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
         ep->peer_user);
    return hetccl_ib_ep_error(ep, ncclInvalidUsage);
  }
  ep->peer_psn = h->psn;
  ep->peer_credit_addr = h->credit_addr;
  ep->peer_credit_rkey = h->credit_rkey;
  ep->peer_cts_addr = h->cts_addr;
  return ncclSuccess;
}

/* ---- the line: what the peer sent, read without waiting ------------------ */

/* Take `want` bytes that start with `magic` from the line once all of them
 * are there (*done = 1), else leave everything in place (*done = 0). The
 * line's end, or anything else where they should be (the peer's note),
 * fails the endpoint: hetccl_ib_ep_lost reads the note from the start. */
static ncclResult_t line_take(hetccl_ep_t *ep, void *out, size_t want, uint64_t magic,
                              int *done) {
  uint8_t buf[sizeof(ib_hello_t)];
  *done = 0;
  ssize_t k = recv(ep->fd, buf, want, MSG_PEEK | MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
  if (k <= 0)
    return hetccl_ib_ep_lost(ep, k == 0 ? "its process closed the connection during the "
                                          "handshake" : strerror(errno));
  uint64_t head = 0;
  memcpy(&head, buf, (size_t)k < sizeof(head) ? (size_t)k : sizeof(head));
  if ((size_t)k >= sizeof(head) && head != magic)
    return hetccl_ib_ep_lost(ep, "it sent something other than the handshake");
  if ((size_t)k < want) return ncclSuccess;
  if (recv(ep->fd, out, want, MSG_DONTWAIT) != (ssize_t)want)
    return hetccl_ib_ep_lost(ep, "the handshake could not be read");
  *done = 1;
  return ncclSuccess;
}

/* Say the next step on a fresh line: a few bytes, which its buffer holds. */
static ncclResult_t line_put(hetccl_ep_t *ep, const void *buf, size_t n) {
  if (send(ep->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)n) return ncclSuccess;
  return hetccl_ib_ep_lost(ep, errno == EAGAIN || errno == EWOULDBLOCK
                                   ? "the handshake does not fit its connection"
                                   : strerror(errno));
}

/* ---- the steps ----------------------------------------------------------- */

/* Lower rank, first step: connect to the higher rank and say hello. `live`:
 * the listener was published long before (a refusal is the peer's end). */
static ncclResult_t hello_send(hetccl_ep_t *ep, int live) {
  hetccl_tctx_t *ctx = ep->ctx;
  int64_t deadline = hetccl_net_deadline(ctx->args.timeout_ms);
  char what[160];
  what_of(ep, what, sizeof(what));
  if (live)
    HETCCL_CHECK(hetccl_net_connect_live(&ep->paddr, deadline, ctx->args.abort_flag, what,
                                         &ep->fd));
  else
    HETCCL_CHECK(hetccl_net_connect(&ep->paddr, deadline, ctx->args.abort_flag, what, &ep->fd));
  ib_hello_t h = hello_of(ep);
  HETCCL_CHECK(hetccl_net_send_all(ep->fd, &h, IB_HELLO_BYTES, deadline,
                                   ctx->args.abort_flag, what));
  ep->hs = IB_HS_ANSWER;
  return ncclSuccess;
}

/* The port closes once nobody can need it: every lower rank is in, this
 * rank said hello to every higher one, nothing failed, and it is not
 * connect's (an all-to-all ends with no port of the context open). In a
 * communicator where some peers use another transport those never come
 * here, and it stays until ctx_destroy. */
static void listener_retire(hetccl_tctx_t *ctx) {
  int me = ctx->args.rank;
  if (ctx->lfd < 0 || ctx->failed || ctx->use != NULL || ctx->lower_in < me ||
      ctx->higher_out < ctx->args.nranks - 1 - me)
    return;
  hetccl_inbox_destroy(ctx->inbox);
  ctx->inbox = NULL;
  hetccl_net_close(&ctx->lfd);
}

static void lower_came(hetccl_tctx_t *ctx) {
  ctx->lower_in++;
  listener_retire(ctx);
}

/* Higher rank: the lower one's hello, if it came; get ready and answer. */
static ncclResult_t hello_answer(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  struct ib_parked *pk = ctx->parked ? &ctx->parked[ep->peer] : NULL;
  if (pk == NULL || pk->fd < 0) return ncclSuccess;
  ep->fd = pk->fd;
  pk->fd = -1;
  lower_came(ctx);
  HETCCL_CHECK(hello_take(ep, &pk->hello));
  /* The lower rank says nothing more before our answer, but its note. */
  char c;
  ssize_t k = recv(ep->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    return hetccl_ib_ep_lost(ep, k == 0 ? "its process closed the connection during the "
                                          "handshake" : "it left before the handshake");
  HETCCL_CHECK(hetccl_ib_ep_qp_up(ep));
  ib_hello_t h = hello_of(ep);
  HETCCL_CHECK(line_put(ep, &h, IB_HELLO_BYTES));
  ep->hs = IB_HS_READY;
  return ncclSuccess;
}

/* Lower rank: the higher one's answer, if in; get ready and say so. */
static ncclResult_t answer_take(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  ib_hello_t h;
  int done;
  HETCCL_CHECK(line_take(ep, &h, IB_HELLO_BYTES, IB_HELLO_MAGIC, &done));
  if (!done) return ncclSuccess;
  if (h.id.comm_id != ctx->args.comm_id || h.id.secret != ctx->args.secret ||
      h.id.rank != ep->peer) {
    char what[160];
    int says = h.id.rank >= 0 && h.id.rank < ctx->args.nranks
                   ? hetccl_user_rank(ctx->args.user_ranks, h.id.rank) : h.id.rank;
    what_of(ep, what, sizeof(what));
    WARN("%s: the answer is not rank %d's of this communicator (rank %d)", what, ep->peer_user,
         says);
    return hetccl_ib_ep_error(ep, ncclSystemError);
  }
  HETCCL_CHECK(hello_take(ep, &h));
  HETCCL_CHECK(hetccl_ib_ep_qp_up(ep));
  uint64_t ready = IB_READY_MAGIC;
  HETCCL_CHECK(line_put(ep, &ready, sizeof(ready)));
  ep->hs = IB_HS_DONE;
  return ncclSuccess;
}

/* Higher rank: the lower one's QP can receive once READY is in. */
static ncclResult_t ready_take(hetccl_ep_t *ep) {
  uint64_t ready;
  int done;
  HETCCL_CHECK(line_take(ep, &ready, sizeof(ready), IB_READY_MAGIC, &done));
  if (done) ep->hs = IB_HS_DONE;
  return ncclSuccess;
}

/* As far as the pair can go now. */
static ncclResult_t hs_step(hetccl_ep_t *ep) {
  if (ep->err) return ep->err;
  if (ep->hs == IB_HS_HELLO) HETCCL_CHECK(hello_answer(ep));
  if (ep->hs == IB_HS_ANSWER) HETCCL_CHECK(answer_take(ep));
  if (ep->hs == IB_HS_READY) HETCCL_CHECK(ready_take(ep));
  if (ep->hs == IB_HS_DONE)
    INFO(HETCCL_NET, "ib rank %d: connected to rank %d (QP %u, peer QP %u; %d QPs)",
         ep->ctx->rank_user, ep->peer_user, ep->qp[0]->qp_num, ep->peer_qpn[0], ep->qps);
  return ncclSuccess;
}

/* The endpoint to peer (addr: what it published), its handshake begun. */
static ncclResult_t ep_begin(hetccl_tctx_t *ctx, int peer, const uint8_t *addr, int live,
                             hetccl_ep_t **out) {
  hetccl_ep_t *ep = NULL;
  HETCCL_CHECK(hetccl_ib_ep_new(ctx, peer, addr, &ep));
  ep->hs = IB_HS_HELLO;
  if (peer > ctx->args.rank) {
    ncclResult_t res = hello_send(ep, live);
    if (res != ncclSuccess) {
      hetccl_ib_ep_close(ep);
      return res;
    }
    ctx->higher_out++;
    listener_retire(ctx);
  } else {
    ep->wait_ms = hetccl_net_now_ms();
    hetccl_probe_init(&ep->probe, ep->wait_ms);
  }
  *out = ep;
  return ncclSuccess;
}

/* ---- arrivals ------------------------------------------------------------ */

static int arrival_take(void *arg, int fd, const void *hdr, const hetccl_sockaddr_t *from) {
  hetccl_tctx_t *ctx = arg;
  ib_hello_t h;
  char a[HETCCL_NET_ADDR_STRLEN];
  memset(&h, 0, sizeof(h));
  memcpy(&h, hdr, IB_HELLO_BYTES);
  const char *why = hetccl_hello_refusal(&h.id, IB_HELLO_MAGIC, &ctx->args, ctx->use);
  if (!why && ctx->parked[h.id.rank].came) why = "duplicate connection";
  if (why) {
    INFO(HETCCL_NET, "ib rank %d: dropping connection from %s: %s", ctx->rank_user,
         hetccl_net_addr_str(from, a, sizeof(a)), why);
    return 0;
  }
  if (ctx->failed) { /* a rank that never connected to us comes: tell it why */
    hetccl_note_line_send(fd, &ctx->note, "ib", hetccl_user_rank(ctx->args.user_ranks, h.id.rank));
    return 0;
  }
  ctx->parked[h.id.rank] = (struct ib_parked){.fd = fd, .came = 1, .hello = h};
  return 1;
}

ncclResult_t hetccl_ib_ctx_poll(hetccl_tctx_t *ctx) {
  if (ctx->lfd < 0) return ncclSuccess;
  if (ctx->parked == NULL) {
    int n = ctx->args.nranks;
    if ((ctx->parked = calloc((size_t)n, sizeof(*ctx->parked))) == NULL) {
      WARN("ib: out of memory for %d connection slots (rank %d)", n, ctx->rank_user);
      return ncclSystemError;
    }
    for (int p = 0; p < n; p++) ctx->parked[p].fd = -1;
  }
  if (ctx->inbox == NULL &&
      (ctx->inbox = hetccl_inbox_create(ctx->lfd, IB_HELLO_BYTES)) == NULL)
    return ncclSystemError;
  return hetccl_inbox_poll(ctx->inbox, arrival_take, ctx);
}

void hetccl_ib_ctx_release(hetccl_tctx_t *ctx) {
  if (ctx->failed) (void)hetccl_ib_ctx_poll(ctx); /* the last who came learn why */
  hetccl_inbox_destroy(ctx->inbox);
  ctx->inbox = NULL;
  if (ctx->parked)
    for (int p = 0; p < ctx->args.nranks; p++) hetccl_net_close(&ctx->parked[p].fd);
  free(ctx->parked);
  ctx->parked = NULL;
  hetccl_net_close(&ctx->lfd);
}

/* ---- connections on first use -------------------------------------------- */

ncclResult_t hetccl_ib_ep_open(hetccl_tctx_t *ctx, int peer, const uint8_t *addr,
                               const hetccl_peer_locality_t *loc, hetccl_ep_t **out) {
  (void)loc;
  return ep_begin(ctx, peer, addr, 1, out);
}

/* This (higher) rank waits for the lower one's hello: is it still there?
 * On another host a killed rank leaves neither a note nor a pid to look at,
 * but its listener stays open for as long as it may still come here
 * (listener_retire) and its kernel refuses connections to it once the
 * process is gone (base/probe.h). A refusal that comes after its hello
 * (it came, then closed its listener) is no verdict: arrivals are taken
 * once more first. */
static ncclResult_t ep_probe(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  hetccl_probe_who_t who = {"ib", ctx->rank_user, ep->peer_user, ep->wait_ms, "for its hello"};
  int err = 0;
  hetccl_probe_result_t r = hetccl_probe_step(&ep->probe, &ep->paddr, &ctx->probes_busy, &who,
                                              &err);
  if (r == HETCCL_PROBE_UNKNOWN || r == HETCCL_PROBE_ALIVE) return ncclSuccess;
  HETCCL_CHECK(hetccl_ib_ctx_poll(ctx));
  if (ctx->parked && ctx->parked[ep->peer].came) return ncclSuccess;
  hetccl_probe_gone(&who, &ep->paddr, r, err);
  return hetccl_ib_ep_error(ep, ncclRemoteError);
}

ncclResult_t hetccl_ib_ep_ready(hetccl_ep_t *ep, int *ready) {
  *ready = 0;
  if (ep->hs == IB_HS_HELLO) HETCCL_CHECK(hetccl_ib_ctx_poll(ep->ctx));
  if (ep->hs != IB_HS_DONE) HETCCL_CHECK(hs_step(ep));
  if (ep->hs == IB_HS_HELLO && ep->ctx->use == NULL) {
    HETCCL_CHECK(ep_probe(ep));
  } else {
    hetccl_probe_stop(&ep->probe, &ep->ctx->probes_busy);
  }
  *ready = ep->hs == IB_HS_DONE;
  return ncclSuccess;
}

void hetccl_ib_ctx_fail(hetccl_tctx_t *ctx, const hetccl_fail_note_t *why) {
  if (ctx == NULL || why == NULL || ctx->failed) return;
  ctx->failed = 1;
  ctx->note = *why;
  if (ctx->parked) /* lower ranks that came but were never served hear why */
    for (int p = 0; p < ctx->args.nranks; p++) {
      hetccl_note_line_send(ctx->parked[p].fd, why, "ib",
                            hetccl_user_rank(ctx->args.user_ranks, p));
      hetccl_net_close(&ctx->parked[p].fd);
    }
  (void)hetccl_ib_ctx_poll(ctx);
}

size_t hetccl_ib_ctx_pull_min(const hetccl_tctx_t *ctx) {
  (void)ctx;
  return SIZE_MAX; /* the receiver never reads the sender's buffer (no pull_min) */
}

/* ---- every pair at init -------------------------------------------------- */

/* Sleep until a line or the listener has something, at most a round. */
static void connect_wait(hetccl_tctx_t *ctx, hetccl_ep_t **eps, struct pollfd *pfds) {
  int k = 0;
  if (ctx->lfd >= 0) pfds[k++] = (struct pollfd){.fd = ctx->lfd, .events = POLLIN};
  for (int p = 0; p < ctx->args.nranks; p++)
    if (eps[p] && eps[p]->hs != IB_HS_DONE && eps[p]->fd >= 0)
      pfds[k++] = (struct pollfd){.fd = eps[p]->fd, .events = POLLIN};
  (void)poll(pfds, (nfds_t)k, IB_CONNECT_POLL_MS);
}

static void connect_timeout(hetccl_tctx_t *ctx, hetccl_ep_t **eps) {
  char waiting[256] = "";
  size_t used = 0;
  for (int p = 0; p < ctx->args.nranks && used < sizeof(waiting); p++)
    if (eps[p] && eps[p]->hs != IB_HS_DONE)
      used += (size_t)snprintf(waiting + used, sizeof(waiting) - used, "%s%d", used ? ", " : "",
                               eps[p]->peer_user);
  WARN("ib rank %d: timed out after %d ms connecting to rank(s) %s (HETCCL_CONNECT_TIMEOUT)",
       ctx->rank_user, ctx->args.timeout_ms, waiting);
}

ncclResult_t hetccl_ib_connect(hetccl_tctx_t *ctx, const uint8_t *use, const uint8_t *addrs,
                               const hetccl_peer_locality_t *localities, hetccl_ep_t **eps) {
  ncclResult_t res = ncclSuccess;
  int me = ctx->args.rank, n = ctx->args.nranks;
  struct pollfd *pfds = NULL;
  (void)localities;
  int64_t deadline = hetccl_net_deadline(ctx->args.timeout_ms);
  for (int p = 0; p < n; p++) eps[p] = NULL;
  ctx->use = use;
  if ((pfds = calloc((size_t)n + 1, sizeof(*pfds))) == NULL) {
    WARN("ib: out of memory connecting %d ranks (rank %d)", n, ctx->rank_user);
    res = ncclSystemError;
    goto fail;
  }
  /* Every hello leaves before any rank waits for an answer, and every
   * step after it only reads what is there: no order between ranks. */
  for (int p = 0; p < n; p++)
    if (use[p] && p != me)
      HETCCL_CHECK_GOTO(ep_begin(ctx, p, addrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES, 0,
                                 &eps[p]), res, fail);
  for (;;) {
    int left = 0, ready;
    for (int p = 0; p < n; p++) {
      if (!eps[p]) continue;
      HETCCL_CHECK_GOTO(hetccl_ib_ep_ready(eps[p], &ready), res, fail);
      left += !ready;
    }
    if (left == 0) break;
    if (ctx->args.abort_flag && *ctx->args.abort_flag) {
      WARN("ib rank %d: connect aborted", ctx->rank_user);
      res = ncclInternalError;
      goto fail;
    }
    if (hetccl_net_now_ms() > deadline) {
      connect_timeout(ctx, eps);
      res = ncclTimeout;
      goto fail;
    }
    connect_wait(ctx, eps, pfds);
  }
  /* Every expected connection is in: the port closes now, not at ctx_destroy. */
  ctx->use = NULL;
  hetccl_ib_ctx_release(ctx);
  free(pfds);
  INFO(HETCCL_NET, "ib rank %d: connected on %s port %d, GID index %d, %d rail%s (%d slots of "
       "%zu bytes per peer; RDMA WRITE from registered memory from %zu bytes, %d queue "
       "pair%s per rail)", ctx->rank_user, ctx->rail[0].dev.name, ctx->rail[0].dev.port,
       ctx->rail[0].dev.gid_index, ctx->rails, ctx->rails > 1 ? "s" : "", ctx->slots, ctx->chunk,
       ctx->zcopy_min, ctx->qps, ctx->qps > 1 ? "s" : "");
  return ncclSuccess;
fail:
  ctx->use = NULL;
  free(pfds);
  for (int p = 0; p < n; p++) {
    hetccl_ib_ep_close(eps[p]);
    eps[p] = NULL;
  }
  return res;
}
