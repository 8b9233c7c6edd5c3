/* Socket transport: TCP, several streams per peer pair.
 *
 * Threads: ctx_create/connect/destroy run on the thread that creates the
 * communicator; isend/irecv/progress/ep_close on the one thread that drives
 * it (transport.h). No locks; nothing here blocks except connect (bounded by
 * timeout_ms and the abort flag).
 *
 * Connection set-up. Each rank listens (ctx_create) and publishes the
 * address. For every pair the lower rank connects nstreams times to the
 * higher rank's listener and sends a handshake_t per stream; the higher rank
 * accepts until every expected (peer, stream) has arrived, dropping (INFO)
 * anything that does not present this communicator's id and secret, and
 * then closes its listener: after connect no port of the context is open.
 *
 * Connections on first use (transport.h; the default). The listener stays
 * open until every lower rank has connected here and this rank has
 * connected to every higher one (or the context goes): while a higher rank
 * may still wait for this one, the open port is its proof of life. ep_open
 * on the lower rank makes the pair's nstreams + 1 connections at once (a
 * refused connect is the peer's end) and sends each its handshake: the
 * endpoint is ready, since whatever it sends waits in the streams behind
 * the handshakes. On the higher rank the endpoint is ready once its
 * connections have arrived: ctx_poll takes them through the inbox
 * (base/inbox.h), reading exactly the handshake, and parks each fd under
 * (peer, stream) until that peer's endpoint collects it, whether or not it
 * was opened yet. Meanwhile the higher rank probes the lower one's listener
 * every HETCCL_PROBE_EVERY_MS (base/probe.h): a refusal means the process
 * is gone (killed on another host leaves no note and no pid to look at),
 * and the wait fails naming it. After ctx_fail, an arriving note
 * line gets the note and every arrival is closed: a lower rank that comes
 * to a failed one learns why, as if they had been connected.
 *
 * Wire format of one message (per direction, FIFO): the payload is cut in
 * pieces of `chunk` bytes (HETCCL_SOCKET_CHUNK, a multiple of 64); piece i
 * travels on stream i % nstreams, and every stream carries its pieces in
 * message order. The frame header (hetccl_frame_hdr_t) travels once per
 * message, on stream 0, just before piece 0. A message no larger than a
 * chunk therefore uses stream 0 alone. Streams 1.. do not touch a receive
 * until stream 0 has read and checked its header, so a message that does
 * not fit is reported before any of its bytes is delivered or consumed.
 *
 * Receives with consume == NULL read straight into the destination; with
 * consume, into a per-stream bounce buffer of one chunk, handed to consume
 * in 8-byte multiples as they arrive (the last bytes of a message may not
 * be a multiple of 8).
 *
 * Failure notes. Each pair has one more connection, the note line
 * (handshake stream number nstreams), that carries nothing while all is
 * well. A rank that gives up writes its note there (ep_fail;
 * base/note_line.c), shuts it and closes everything. A peer that then
 * finds a data stream closed reads the note line before it reports
 * anything: the note, if there is one, is its answer; a rank that died
 * without a word closed the line empty. The data streams cannot carry the
 * note: the failing rank may be in the middle of a piece.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transport/base/inbox.h"
#include "transport/base/probe.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/net.h"

#define SOCK_ADDR_MAGIC 0x534f434b41444452ull /* "SOCKADDR" */
#define SOCK_HS_MAGIC 0x534f434b48414e44ull   /* "SOCKHAND" */
#define SOCK_NOTE_WAIT_MS 200 /* how long a closed stream waits for the note behind it */
#define SOCK_PROGRESS_BUDGET (8u << 20)        /* bytes per stream per progress call */
#define SOCK_BUF_BYTES (1 << 20)               /* SO_SNDBUF / SO_RCVBUF, see stream_setup */

typedef struct addr_blob {
  uint64_t magic;
  hetccl_net_wire_addr_t addr;
} addr_blob_t;
_Static_assert(sizeof(addr_blob_t) <= HETCCL_TRANSPORT_ADDR_BYTES, "address blob");

typedef struct handshake {
  hetccl_hello_t id;
  int32_t stream, nstreams;
} handshake_t;

/* What a request keeps in req->priv. */
typedef struct req_priv {
  uint64_t seq;
  uint64_t npieces;
  uint32_t streams_left; /* streams still moving part of this message */
  uint32_t hdr_ok;       /* receive: stream 0 checked the header */
} req_priv_t;
_Static_assert(sizeof(req_priv_t) <= sizeof(((hetccl_req_t *)0)->priv), "request private");

typedef struct sock_stream {
  int fd;
  /* send cursor: message, piece index, offset in piece, header state */
  hetccl_req_t *scur;
  uint64_t spiece;
  size_t soff;
  hetccl_frame_hdr_t shdr;
  size_t shdr_off;
  /* receive cursor */
  hetccl_req_t *rcur;
  uint64_t rpiece;
  size_t roff;
  hetccl_frame_hdr_t rhdr;
  size_t rhdr_off;
  char *bounce;
  size_t consumed; /* bytes of the current piece handed to consume */
} sock_stream_t;

struct hetccl_ep {
  hetccl_tctx_t *ctx;
  int peer;
  int peer_user; /* the peer as the user numbers it, for messages */
  hetccl_sockaddr_t paddr;
  int nstreams;
  size_t chunk;
  sock_stream_t *st;
  int note_fd; /* the note line (see the top of this file) */
  hetccl_req_t *shead, *stail;
  hetccl_req_t *rhead, *rtail;
  uint64_t sseq, rseq;
  ncclResult_t err; /* sticky */
  int ready;        /* connections on first use: every stream is in place */
  /* higher rank, waiting for a lower one to connect: is it still there? */
  hetccl_probe_t probe;
  int64_t wait_ms;  /* when the wait began (ep_open) */
};

struct hetccl_tctx {
  hetccl_transport_args_t args;
  int rank_user; /* args.rank as the user numbers it, for messages */
  int lfd;
  hetccl_sockaddr_t laddr;
  int nstreams;
  size_t chunk;
  /* while connecting */
  const uint8_t *use;
  hetccl_ep_t **eps;
  int accepted, expected;
  /* connections on first use */
  hetccl_inbox_t *inbox;  /* made by the first ctx_poll */
  int *parked;            /* nranks x (nstreams + 1) fds from lower ranks, -1: none */
  int lower_in;           /* lower ranks whose every connection arrived */
  int higher_out;         /* higher ranks this rank connected to (ep_open) */
  int probes_busy;        /* endpoints with a probe in flight (ep_probe) */
  int failed;             /* ctx_fail: arrivals get `note` */
  hetccl_fail_note_t note;
};

static req_priv_t *priv_of(hetccl_req_t *r) { return (req_priv_t *)r->priv; }

static size_t piece_len(const hetccl_ep_t *ep, const hetccl_req_t *r, uint64_t piece) {
  size_t off = (size_t)piece * ep->chunk;
  return r->bytes - off < ep->chunk ? r->bytes - off : ep->chunk;
}

/* Does stream s carry part of a message of npieces pieces? */
static int stream_involved(int s, uint64_t npieces) { return s == 0 || (uint64_t)s < npieces; }

static const char *ep_addr(const hetccl_ep_t *ep, char *buf, size_t len) {
  return hetccl_net_addr_str(&ep->paddr, buf, len);
}

static ncclResult_t ep_fail(hetccl_ep_t *ep, ncclResult_t res) {
  if (ep->err == ncclSuccess) ep->err = res;
  return ep->err;
}

/* A recv/send result that is neither data nor "try later". */
static ncclResult_t ep_io_error(hetccl_ep_t *ep, int s, const char *dir, ssize_t k, int err) {
  char a[HETCCL_NET_ADDR_STRLEN];
  if (k == 0 || err == ECONNRESET || err == EPIPE) {
    hetccl_fail_note_t note;
    if (hetccl_note_line_read(ep->note_fd, SOCK_NOTE_WAIT_MS, &note))
      return ep_fail(ep, hetccl_fail_note_received(&note, "socket", ep->peer, &ep->ctx->args));
    WARN("socket: connection to rank %d (%s) closed (stream %d, during %s)", ep->peer_user,
         ep_addr(ep, a, sizeof(a)), s, dir);
    return ep_fail(ep, ncclRemoteError);
  }
  WARN("socket: %s on stream %d to rank %d (%s): %s", dir, s, ep->peer_user,
       ep_addr(ep, a, sizeof(a)), strerror(err));
  return ep_fail(ep, ncclSystemError);
}

/* ---- send side ----------------------------------------------------------- */

/* Point stream s's send cursor at r or, skipping messages it has no part
 * in, the first later one it has (NULL: none posted yet). */
static void send_cursor_set(hetccl_ep_t *ep, int s, hetccl_req_t *r) {
  sock_stream_t *st = &ep->st[s];
  while (r && !stream_involved(s, priv_of(r)->npieces)) r = r->next;
  st->scur = r;
  st->spiece = (uint64_t)s;
  st->soff = 0;
  st->shdr_off = s == 0 ? 0 : sizeof(st->shdr);
  if (r && s == 0)
    hetccl_frame_fill(&st->shdr, ep->ctx->args.comm_id, ep->ctx->args.rank, priv_of(r)->seq,
                      r->tag, r->bytes);
}

static ncclResult_t send_stream(hetccl_ep_t *ep, int s, size_t *moved) {
  sock_stream_t *st = &ep->st[s];
  size_t budget = SOCK_PROGRESS_BUDGET;
  while (st->scur && budget > 0) {
    hetccl_req_t *r = st->scur;
    req_priv_t *p = priv_of(r);
    struct iovec iov[2];
    int n = 0;
    if (st->shdr_off < sizeof(st->shdr))
      iov[n++] = (struct iovec){(char *)&st->shdr + st->shdr_off, sizeof(st->shdr) - st->shdr_off};
    if (st->spiece < p->npieces) {
      size_t len = piece_len(ep, r, st->spiece);
      iov[n++] = (struct iovec){(char *)r->buf + st->spiece * ep->chunk + st->soff,
                                len - st->soff};
    }
    if (n > 0) {
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n};
      ssize_t k = sendmsg(st->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclSuccess;
        return ep_io_error(ep, s, "send", k, errno);
      }
      size_t left = (size_t)k;
      *moved += left;
      budget = left < budget ? budget - left : 0;
      size_t h = sizeof(st->shdr) - st->shdr_off;
      if (h > left) h = left;
      st->shdr_off += h;
      left -= h;
      if (left > 0) {
        st->soff += left;
        r->progress += left;
        hetccl_copied_add(&ep->ctx->args, left); /* the kernel copied it into the socket */
      }
      if (st->spiece < p->npieces && st->soff == piece_len(ep, r, st->spiece)) {
        st->spiece += (uint64_t)ep->nstreams;
        st->soff = 0;
      }
      if (st->shdr_off < sizeof(st->shdr) || st->spiece < p->npieces) continue;
    }
    p->streams_left--;
    send_cursor_set(ep, s, r->next);
  }
  return ncclSuccess;
}

/* ---- receive side -------------------------------------------------------- */

static void recv_cursor_set(hetccl_ep_t *ep, int s, hetccl_req_t *r) {
  sock_stream_t *st = &ep->st[s];
  while (r && !stream_involved(s, priv_of(r)->npieces)) r = r->next;
  st->rcur = r;
  st->rpiece = (uint64_t)s;
  st->roff = 0;
  st->consumed = 0;
  st->rhdr_off = s == 0 ? 0 : sizeof(st->rhdr);
}

static ncclResult_t recv_header(hetccl_ep_t *ep, sock_stream_t *st, hetccl_req_t *r, int *ready,
                                size_t *moved) {
  *ready = 0;
  ssize_t k = recv(st->fd, (char *)&st->rhdr + st->rhdr_off, sizeof(st->rhdr) - st->rhdr_off,
                   MSG_DONTWAIT);
  if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
  if (k <= 0) return ep_io_error(ep, 0, "receive", k, errno);
  *moved += (size_t)k;
  st->rhdr_off += (size_t)k;
  if (st->rhdr_off < sizeof(st->rhdr)) return ncclSuccess;
  ncclResult_t res = hetccl_frame_check(&st->rhdr, "socket", &ep->ctx->args, ep->peer,
                                        priv_of(r)->seq, r->tag, r->bytes);
  if (res != ncclSuccess) return ep_fail(ep, res);
  priv_of(r)->hdr_ok = 1;
  *ready = 1;
  return ncclSuccess;
}

static ncclResult_t recv_stream(hetccl_ep_t *ep, int s, size_t *moved) {
  sock_stream_t *st = &ep->st[s];
  size_t budget = SOCK_PROGRESS_BUDGET;
  while (st->rcur && budget > 0) {
    hetccl_req_t *r = st->rcur;
    req_priv_t *p = priv_of(r);
    if (st->rhdr_off < sizeof(st->rhdr)) {
      int ready;
      HETCCL_CHECK(recv_header(ep, st, r, &ready, moved));
      if (!ready) return ncclSuccess;
    }
    if (!p->hdr_ok) return ncclSuccess; /* stream 0 has not vouched for it yet */
    if (st->rpiece < p->npieces) {
      size_t len = piece_len(ep, r, st->rpiece);
      size_t base = (size_t)st->rpiece * ep->chunk;
      char *dst;
      if (r->consume) {
        if (st->bounce == NULL && (st->bounce = malloc(ep->chunk)) == NULL) {
          WARN("socket: out of memory for a %zu-byte receive buffer (rank %d)", ep->chunk,
               ep->peer_user);
          return ep_fail(ep, ncclSystemError);
        }
        dst = st->bounce + st->roff;
      } else {
        dst = (char *)r->buf + base + st->roff;
      }
      ssize_t k = recv(st->fd, dst, len - st->roff, MSG_DONTWAIT);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ncclSuccess;
      if (k <= 0) return ep_io_error(ep, s, "receive", k, errno);
      *moved += (size_t)k;
      hetccl_copied_add(&ep->ctx->args, (size_t)k); /* the kernel copied it out */
      budget = (size_t)k < budget ? budget - (size_t)k : 0;
      st->roff += (size_t)k;
      r->progress += (size_t)k;
      if (r->consume) {
        size_t upto = st->roff == len ? len : (st->roff & ~(size_t)7);
        if (upto > st->consumed) {
          r->consume(r->consume_ctx, (char *)r->buf + base + st->consumed,
                     st->bounce + st->consumed, upto - st->consumed);
          st->consumed = upto;
        }
      }
      if (st->roff < len) continue;
      st->rpiece += (uint64_t)ep->nstreams;
      st->roff = 0;
      st->consumed = 0;
      if (st->rpiece < p->npieces) continue;
    }
    p->streams_left--;
    recv_cursor_set(ep, s, r->next);
  }
  return ncclSuccess;
}

/* ---- posting and progress ------------------------------------------------ */

static ncclResult_t req_init(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t seq, const char *what) {
  if (r == NULL || (r->bytes > 0 && r->buf == NULL)) {
    WARN("socket: %s to rank %d with a NULL request or buffer", what, ep->peer_user);
    return ncclInvalidArgument;
  }
  req_priv_t *p = priv_of(r);
  memset(p, 0, sizeof(*p));
  p->seq = seq;
  p->npieces = (r->bytes + ep->chunk - 1) / ep->chunk;
  p->streams_left = p->npieces > (uint64_t)ep->nstreams ? (uint32_t)ep->nstreams
                    : p->npieces > 0                    ? (uint32_t)p->npieces
                                                        : 1;
  r->done = 0;
  r->progress = 0;
  r->next = NULL;
  return ncclSuccess;
}

/* Pop finished requests in posting order. A request is marked done last:
 * the caller may reuse it at once. */
static void retire(hetccl_req_t **head, hetccl_req_t **tail) {
  while (*head && priv_of(*head)->streams_left == 0) {
    hetccl_req_t *r = *head;
    *head = r->next;
    if (*head == NULL) *tail = NULL;
    r->progress = r->bytes;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  }
}

static ncclResult_t sock_isend(hetccl_ep_t *ep, hetccl_req_t *r) {
  if (ep->err) return ep->err;
  HETCCL_CHECK(req_init(ep, r, ep->sseq, "send"));
  ep->sseq++;
  if (ep->stail) ep->stail->next = r; else ep->shead = r;
  ep->stail = r;
  for (int s = 0; s < ep->nstreams; s++)
    if (ep->st[s].scur == NULL) send_cursor_set(ep, s, r);
  /* Small messages leave at once. */
  size_t moved = 0;
  HETCCL_CHECK(send_stream(ep, 0, &moved));
  retire(&ep->shead, &ep->stail);
  return ncclSuccess;
}

static ncclResult_t sock_irecv(hetccl_ep_t *ep, hetccl_req_t *r) {
  if (ep->err) return ep->err;
  HETCCL_CHECK(req_init(ep, r, ep->rseq, "receive"));
  ep->rseq++;
  if (ep->rtail) ep->rtail->next = r; else ep->rhead = r;
  ep->rtail = r;
  for (int s = 0; s < ep->nstreams; s++)
    if (ep->st[s].rcur == NULL) recv_cursor_set(ep, s, r);
  return ncclSuccess;
}

static ncclResult_t sock_progress(hetccl_ep_t *ep, int *idle) {
  size_t moved = 0;
  if (idle) *idle = 1;
  if (ep->err) return ep->err;
  /* Stream 0 first on the receive side: it unlocks the others. */
  for (int s = 0; s < ep->nstreams; s++) {
    HETCCL_CHECK(recv_stream(ep, s, &moved));
    HETCCL_CHECK(send_stream(ep, s, &moved));
  }
  if (ep->nstreams > 1 && ep->st[0].rcur) HETCCL_CHECK(recv_stream(ep, 0, &moved));
  retire(&ep->shead, &ep->stail);
  retire(&ep->rhead, &ep->rtail);
  if (idle) *idle = moved == 0;
  return ncclSuccess;
}

/* ---- set-up -------------------------------------------------------------- */

static int sock_can_connect(const hetccl_peer_locality_t *me, const hetccl_peer_locality_t *peer) {
  (void)me;
  (void)peer;
  return 1;
}

static ncclResult_t sock_ctx_create(const hetccl_transport_args_t *args, hetccl_tctx_t **out,
                                    void *addr) {
  ncclResult_t res;
  hetccl_tctx_t *ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL) {
    WARN("socket: out of memory for a context (rank %d)",
         hetccl_user_rank(args->user_ranks, args->rank));
    return ncclSystemError;
  }
  ctx->args = *args;
  ctx->rank_user = hetccl_user_rank(args->user_ranks, args->rank);
  ctx->lfd = -1;
  ctx->nstreams = (int)hetccl_knob_int(HETCCL_KNOB_SOCKET_NSTREAMS);
  ctx->chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_SOCKET_CHUNK) & ~(size_t)63;
  if (ctx->chunk < 512) ctx->chunk = 512;
  HETCCL_CHECK_GOTO(hetccl_net_local_addr(args->ifname, &ctx->laddr, NULL, 0), res, fail);
  HETCCL_CHECK_GOTO(hetccl_net_listen(&ctx->laddr, 0, &ctx->lfd), res, fail);
  addr_blob_t b;
  memset(&b, 0, sizeof(b));
  b.magic = SOCK_ADDR_MAGIC;
  hetccl_net_addr_to_wire(&ctx->laddr, &b.addr);
  memset(addr, 0, HETCCL_TRANSPORT_ADDR_BYTES);
  memcpy(addr, &b, sizeof(b));
  *out = ctx;
  return ncclSuccess;
fail:
  hetccl_net_close(&ctx->lfd);
  free(ctx);
  return res;
}

static void sock_ep_close(hetccl_ep_t *ep) {
  if (ep == NULL) return;
  hetccl_probe_stop(&ep->probe, &ep->ctx->probes_busy);
  hetccl_net_close(&ep->note_fd);
  if (ep->st)
    for (int s = 0; s < ep->nstreams; s++) {
      hetccl_net_close(&ep->st[s].fd);
      free(ep->st[s].bounce);
    }
  free(ep->st);
  free(ep);
}

/* Leave the note on the note line, then close as ep_close does. */
static void sock_ep_fail(hetccl_ep_t *ep, const hetccl_fail_note_t *why) {
  if (ep == NULL) return;
  hetccl_note_line_send(ep->note_fd, why, "socket", ep->peer_user);
  sock_ep_close(ep);
}

static ncclResult_t sock_ctx_poll(hetccl_tctx_t *ctx);

static void sock_ctx_destroy(hetccl_tctx_t *ctx) {
  if (ctx == NULL) return;
  if (ctx->failed) (void)sock_ctx_poll(ctx); /* the last who came learn why */
  hetccl_inbox_destroy(ctx->inbox);
  if (ctx->parked)
    for (int i = 0; i < ctx->args.nranks * (ctx->nstreams + 1); i++)
      hetccl_net_close(&ctx->parked[i]);
  free(ctx->parked);
  hetccl_net_close(&ctx->lfd);
  free(ctx);
}

static ncclResult_t ep_new_at(hetccl_tctx_t *ctx, int peer, const uint8_t *blob,
                              hetccl_ep_t **out) {
  addr_blob_t b;
  memcpy(&b, blob, sizeof(b));
  int peer_user = hetccl_user_rank(ctx->args.user_ranks, peer);
  hetccl_ep_t *ep = calloc(1, sizeof(*ep));
  if (ep == NULL || (ep->st = calloc(ctx->nstreams, sizeof(sock_stream_t))) == NULL) {
    free(ep);
    WARN("socket: out of memory for the endpoint to rank %d", peer_user);
    return ncclSystemError;
  }
  ep->ctx = ctx;
  ep->peer = peer;
  ep->peer_user = peer_user;
  ep->nstreams = ctx->nstreams;
  ep->chunk = ctx->chunk;
  ep->note_fd = -1;
  hetccl_probe_init(&ep->probe, 0);
  for (int s = 0; s < ep->nstreams; s++) ep->st[s].fd = -1;
  if (b.magic != SOCK_ADDR_MAGIC || hetccl_net_addr_from_wire(&b.addr, &ep->paddr) != ncclSuccess) {
    WARN("socket: rank %d published a malformed address blob", peer_user);
    sock_ep_close(ep);
    return ncclInvalidArgument;
  }
  ncclResult_t res = hetccl_net_addr_localize(&ep->paddr, ctx->args.ifname);
  if (res != ncclSuccess) {
    sock_ep_close(ep);
    return res;
  }
  *out = ep;
  return ncclSuccess;
}

static ncclResult_t ep_new(hetccl_tctx_t *ctx, int peer, const uint8_t *addrs, hetccl_ep_t **out) {
  return ep_new_at(ctx, peer, addrs + (size_t)peer * HETCCL_TRANSPORT_ADDR_BYTES, out);
}

static void stream_setup(int fd) {
  /* Measured with tests/c/net/test_socket (16 MiB, 2 processes, loopback,
   * 2 cores): 1 MiB gave 3.1-4.1 GB/s for 1, 2 and 4 streams; kernel
   * autotuning 2.8-3.2, 4 MiB 2.5-3.1 (bigger buffers fall out of cache).
   * The kernel caps it at wmem_max / rmem_max. */
  hetccl_net_set_bufsize(fd, SOCK_BUF_BYTES);
}

/* Where connection number s of a pair goes: data streams 0..nstreams-1,
 * then the note line. */
static int *stream_fd(hetccl_ep_t *ep, int s) {
  return s < ep->nstreams ? &ep->st[s].fd : &ep->note_fd;
}

static long hs_on_header(void *arg, const void *hdr, const hetccl_sockaddr_t *from,
                         hetccl_net_reply_t *reply) {
  hetccl_tctx_t *ctx = arg;
  handshake_t h;
  /* No word back: the peers that should connect here are real ranks past
   * the bootstrap, so a refused one is an outsider or a bug (logged). */
  (void)reply;
  char a[HETCCL_NET_ADDR_STRLEN];
  memcpy(&h, hdr, sizeof(h));
  const char *why = hetccl_hello_refusal(&h.id, SOCK_HS_MAGIC, &ctx->args, ctx->use);
  if (!why && (h.nstreams != ctx->nstreams || h.stream < 0 || h.stream > ctx->nstreams)) {
    WARN("socket: rank %d connects with %d streams, rank %d uses %d (HETCCL_SOCKET_NSTREAMS "
         "differs between ranks)", ctx->eps[h.id.rank]->peer_user, h.nstreams,
         ctx->rank_user, ctx->nstreams);
    return -1;
  }
  if (!why && *stream_fd(ctx->eps[h.id.rank], h.stream) >= 0) why = "duplicate stream";
  if (why) {
    INFO(HETCCL_NET, "socket rank %d: dropping connection from %s: %s",
         ctx->rank_user,
         hetccl_net_addr_str(from, a, sizeof(a)), why);
    return -1;
  }
  return 0;
}

static int hs_on_frame(void *arg, int fd, const void *hdr, const void *payload,
                       const hetccl_sockaddr_t *from, hetccl_net_reply_t *reply) {
  hetccl_tctx_t *ctx = arg;
  handshake_t h;
  (void)payload;
  (void)from;
  (void)reply;
  memcpy(&h, hdr, sizeof(h));
  int *slot = stream_fd(ctx->eps[h.id.rank], h.stream);
  if (*slot >= 0) return 0;
  if (h.stream < ctx->nstreams) stream_setup(fd);
  *slot = fd;
  ctx->accepted++;
  return 1;
}

static int hs_done(void *arg) {
  hetccl_tctx_t *ctx = arg;
  return ctx->accepted == ctx->expected;
}

static ncclResult_t connect_peer(hetccl_tctx_t *ctx, hetccl_ep_t *ep, int64_t deadline, int live) {
  char a[HETCCL_NET_ADDR_STRLEN], what[160];
  snprintf(what, sizeof(what), "socket rank %d: connection to rank %d (%s)",
           ctx->rank_user, ep->peer_user,
           ep_addr(ep, a, sizeof(a)));
  for (int s = 0; s <= ep->nstreams; s++) { /* the data streams, then the note line */
    int *fd = stream_fd(ep, s);
    if (live)
      HETCCL_CHECK(hetccl_net_connect_live(&ep->paddr, deadline, ctx->args.abort_flag, what, fd));
    else
      HETCCL_CHECK(hetccl_net_connect(&ep->paddr, deadline, ctx->args.abort_flag, what, fd));
    if (s < ep->nstreams) stream_setup(*fd);
    handshake_t h = {.id = hetccl_hello_make(SOCK_HS_MAGIC, &ctx->args), .stream = s,
                     .nstreams = ep->nstreams};
    HETCCL_CHECK(hetccl_net_send_all(*fd, &h, sizeof(h), deadline, ctx->args.abort_flag, what));
  }
  return ncclSuccess;
}

static ncclResult_t sock_connect(hetccl_tctx_t *ctx, const uint8_t *use, const uint8_t *addrs,
                                 const hetccl_peer_locality_t *localities, hetccl_ep_t **eps) {
  ncclResult_t res = ncclSuccess;
  int me = ctx->args.rank, n = ctx->args.nranks;
  (void)localities;
  int64_t deadline = hetccl_net_deadline(ctx->args.timeout_ms);
  for (int p = 0; p < n; p++) eps[p] = NULL;
  for (int p = 0; p < n; p++)
    if (use[p] && p != me) HETCCL_CHECK_GOTO(ep_new(ctx, p, addrs, &eps[p]), res, fail);
  /* Lower rank connects: the listener exists since ctx_create, so no
   * ordering between ranks is needed. */
  for (int p = me + 1; p < n; p++)
    if (eps[p]) HETCCL_CHECK_GOTO(connect_peer(ctx, eps[p], deadline, 0), res, fail);
  ctx->use = use;
  ctx->eps = eps;
  ctx->accepted = 0;
  ctx->expected = 0;
  for (int p = 0; p < me; p++)
    if (eps[p]) ctx->expected += ctx->nstreams + 1; /* + the note line */
  if (ctx->expected > 0) {
    char a[HETCCL_NET_ADDR_STRLEN], what[160];
    snprintf(what, sizeof(what), "socket rank %d (%s): waiting for %d connections from lower ranks",
             ctx->rank_user,
             hetccl_net_addr_str(&ctx->laddr, a, sizeof(a)), ctx->expected);
    hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(handshake_t), .max_payload = 0,
                                  .on_header = hs_on_header, .on_frame = hs_on_frame,
                                  .done = hs_done};
    HETCCL_CHECK_GOTO(hetccl_net_accept_hellos(ctx->lfd, &ops, ctx, deadline,
                                               ctx->args.abort_flag, what), res, fail);
  }
  ctx->use = NULL;
  ctx->eps = NULL;
  /* Every expected stream is in: nobody else may connect (connect runs
   * once per context), so the port closes now, not at ctx_destroy. */
  hetccl_net_close(&ctx->lfd);
  INFO(HETCCL_NET, "socket rank %d: connected (%d streams per peer, chunk %zu)",
       ctx->rank_user, ctx->nstreams, ctx->chunk);
  return ncclSuccess;
fail:
  ctx->use = NULL;
  ctx->eps = NULL;
  for (int p = 0; p < n; p++) {
    sock_ep_close(eps[p]);
    eps[p] = NULL;
  }
  return res;
}

/* ---- connections on first use -------------------------------------------- */

static int *parked_fd(hetccl_tctx_t *ctx, int peer, int stream) {
  return &ctx->parked[(size_t)peer * (ctx->nstreams + 1) + stream];
}

static int lazy_take(void *arg, int fd, const void *hdr, const hetccl_sockaddr_t *from) {
  hetccl_tctx_t *ctx = arg;
  handshake_t h;
  char a[HETCCL_NET_ADDR_STRLEN];
  memcpy(&h, hdr, sizeof(h));
  const char *why = hetccl_hello_refusal(&h.id, SOCK_HS_MAGIC, &ctx->args, NULL);
  if (!why && (h.nstreams != ctx->nstreams || h.stream < 0 || h.stream > ctx->nstreams))
    why = "a different HETCCL_SOCKET_NSTREAMS";
  if (!why && *parked_fd(ctx, h.id.rank, h.stream) >= 0) why = "duplicate stream";
  if (why) {
    INFO(HETCCL_NET, "socket rank %d: dropping connection from %s: %s", ctx->rank_user,
         hetccl_net_addr_str(from, a, sizeof(a)), why);
    return 0;
  }
  if (ctx->failed) { /* a rank that never connected to us comes: tell it why */
    if (h.stream == ctx->nstreams)
      hetccl_note_line_send(fd, &ctx->note, "socket",
                            hetccl_user_rank(ctx->args.user_ranks, h.id.rank));
    return 0;
  }
  if (h.stream < ctx->nstreams) stream_setup(fd);
  *parked_fd(ctx, h.id.rank, h.stream) = fd;
  return 1;
}

static ncclResult_t sock_ctx_poll(hetccl_tctx_t *ctx) {
  if (ctx->lfd < 0) return ncclSuccess;
  if (ctx->parked == NULL) {
    size_t n = (size_t)ctx->args.nranks * (ctx->nstreams + 1);
    if ((ctx->parked = malloc(n * sizeof(int))) == NULL) {
      WARN("socket: out of memory for %zu connection slots (rank %d)", n, ctx->rank_user);
      return ncclSystemError;
    }
    for (size_t i = 0; i < n; i++) ctx->parked[i] = -1;
  }
  if (ctx->inbox == NULL &&
      (ctx->inbox = hetccl_inbox_create(ctx->lfd, sizeof(handshake_t))) == NULL)
    return ncclSystemError;
  return hetccl_inbox_poll(ctx->inbox, lazy_take, ctx);
}

/* The listener closes once nobody can need it: every lower rank has
 * connected here and this rank has connected to every higher one. Not
 * before: while a higher rank may still wait for this one to connect, the
 * open port is how it tells that this process lives (ep_probe, on its
 * side). A failed context keeps it, to answer arrivals with the note. In a
 * communicator where some peers use another transport (shm on this host)
 * those never come here, and it stays until ctx_destroy. */
static void listener_retire(hetccl_tctx_t *ctx) {
  int me = ctx->args.rank;
  if (ctx->failed || ctx->lfd < 0 || ctx->lower_in < me ||
      ctx->higher_out < ctx->args.nranks - 1 - me)
    return;
  hetccl_inbox_destroy(ctx->inbox);
  ctx->inbox = NULL;
  hetccl_net_close(&ctx->lfd);
}

static ncclResult_t sock_ep_open(hetccl_tctx_t *ctx, int peer, const uint8_t *addr,
                                 const hetccl_peer_locality_t *loc, hetccl_ep_t **out) {
  (void)loc;
  hetccl_ep_t *ep = NULL;
  HETCCL_CHECK(ep_new_at(ctx, peer, addr, &ep));
  if (peer > ctx->args.rank) { /* ours to make: ready once made */
    ncclResult_t res = connect_peer(ctx, ep, hetccl_net_deadline(ctx->args.timeout_ms), 1);
    if (res != ncclSuccess) {
      sock_ep_close(ep);
      return res;
    }
    ep->ready = 1;
    ctx->higher_out++;
    listener_retire(ctx);
  } else {
    ep->wait_ms = hetccl_net_now_ms();
    hetccl_probe_init(&ep->probe, ep->wait_ms);
  }
  *out = ep;
  return ncclSuccess;
}

/* Move the peer's parked connections to the endpoint; how many it holds. */
static int ep_collect(hetccl_ep_t *ep) {
  int have = 0;
  for (int s = 0; s <= ep->nstreams; s++) {
    int *slot = stream_fd(ep, s), *park = parked_fd(ep->ctx, ep->peer, s);
    if (*slot < 0 && *park >= 0) {
      *slot = *park;
      *park = -1;
    }
    have += *slot >= 0;
  }
  return have;
}

/* This (higher) rank waits for the lower one to connect: is it still
 * there? On another host a killed rank leaves neither a note nor a pid to
 * look at, but its listener stays open for as long as it may still connect
 * here (listener_retire) and its kernel refuses connections to it once the
 * process is gone (base/probe.h). A refusal that comes after the peer's
 * connections (it connected, then closed its listener) is no verdict:
 * they are looked for once more first. */
static ncclResult_t ep_probe(hetccl_ep_t *ep) {
  hetccl_tctx_t *ctx = ep->ctx;
  hetccl_probe_who_t who = {"socket", ctx->rank_user, ep->peer_user, ep->wait_ms,
                            "for it to connect"};
  int err = 0;
  hetccl_probe_result_t r = hetccl_probe_step(&ep->probe, &ep->paddr, &ctx->probes_busy, &who,
                                              &err);
  if (r == HETCCL_PROBE_UNKNOWN || r == HETCCL_PROBE_ALIVE) return ncclSuccess;
  HETCCL_CHECK(sock_ctx_poll(ctx));
  if (ep_collect(ep) > 0) return ncclSuccess;
  hetccl_probe_gone(&who, &ep->paddr, r, err);
  return ep_fail(ep, ncclRemoteError);
}

static ncclResult_t sock_ep_ready(hetccl_ep_t *ep, int *ready) {
  hetccl_tctx_t *ctx = ep->ctx;
  if (!ep->ready) {
    HETCCL_CHECK(sock_ctx_poll(ctx));
    ep->ready = ep_collect(ep) == ep->nstreams + 1;
    if (ep->ready) {
      hetccl_probe_stop(&ep->probe, &ctx->probes_busy);
      ctx->lower_in++;
      listener_retire(ctx);
    } else {
      HETCCL_CHECK(ep_probe(ep));
    }
  }
  *ready = ep->ready;
  return ncclSuccess;
}

static void sock_ctx_fail(hetccl_tctx_t *ctx, const hetccl_fail_note_t *why) {
  if (ctx == NULL || why == NULL || ctx->failed) return;
  ctx->failed = 1;
  ctx->note = *why;
  if (ctx->parked) /* connections of peers we never served: they hear why */
    for (int p = 0; p < ctx->args.nranks; p++) {
      hetccl_note_line_send(*parked_fd(ctx, p, ctx->nstreams), why, "socket",
                            hetccl_user_rank(ctx->args.user_ranks, p));
      for (int s = 0; s <= ctx->nstreams; s++) hetccl_net_close(parked_fd(ctx, p, s));
    }
  (void)sock_ctx_poll(ctx);
}

static size_t sock_ctx_pull_min(const hetccl_tctx_t *ctx) {
  (void)ctx;
  return SIZE_MAX;
}

const hetccl_transport_t hetccl_transport_socket = {
    .name = "socket",
    .can_connect = sock_can_connect,
    .ctx_create = sock_ctx_create,
    .connect = sock_connect,
    .isend = sock_isend,
    .irecv = sock_irecv,
    .progress = sock_progress,
    .ep_close = sock_ep_close,
    .ctx_destroy = sock_ctx_destroy,
    .ep_fail = sock_ep_fail,
    .ep_open = sock_ep_open,
    .ep_ready = sock_ep_ready,
    .ctx_poll = sock_ctx_poll,
    .ctx_fail = sock_ctx_fail,
    .lower_connects = 1,
    .ctx_pull_min = sock_ctx_pull_min,
    /* socket copies through the kernel: declared memory changes nothing */
    .mem_register = hetccl_transport_mem_register_none,
    .mem_deregister = hetccl_transport_mem_deregister_none,
    .mem_allocated = hetccl_transport_mem_allocated_none,
    .mem_freed = hetccl_transport_mem_freed_none,
};
