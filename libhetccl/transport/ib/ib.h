/* RDMA verbs transport, private to transport/ib: the libibverbs entry
 * points (ib_verbs.c), the device a context uses (ib_dev.c), and the
 * context and endpoint that ib.c (set-up, teardown, liveness) builds,
 * ib_connect.c (the handshake, at init or on first use) connects and
 * ib_data.c (data path) drives.
 *
 * One RC queue pair per peer pair (HETCCL_IB_QPS of them, below), with its
 * own completion queue. Each endpoint owns one registered staging buffer:
 *
 *   send slot 0..slots-1    ib_piece_t (64 bytes) then `chunk` payload bytes
 *   recv slot 0..slots-1    same layout; a receive WR is posted on each
 *
 * and a small registered credit block that the peer writes into. A message
 * is cut in pieces of at most `chunk` bytes (at least one piece, so an empty
 * message still carries its header); piece k of the direction is copied
 * into send slot k % slots and goes out as one SEND, which lands in the
 * receiver's kth posted receive WR, i.e. recv slot k % slots. The receiver
 * checks every piece's header, copies (or consumes) the payload, reposts
 * the slot and counts it; that count is RDMA-written into the sender's
 * credit block. A sender posts piece k only when k < slots + credits (the
 * receiver has a WR posted for it) and send slot k % slots is free (its
 * previous SEND completed). Credits are an optimisation only: a SEND can
 * land only in a posted receive, so a stale credit value makes the sender
 * wait, never overwrite.
 *
 * Messages of at least HETCCL_IB_ZCOPY_THRESHOLD bytes whose source is
 * registered memory (ib_mem.h) go by rendezvous instead (ib_rdv.c): one
 * payload-free piece asks, the receiver answers in the sender's
 * clear-to-send ring (below), and the bytes go by RDMA WRITE.
 *
 * With HETCCL_IB_QPS = N > 1 a pair has N queue pairs per rail, all
 * brought up by the one handshake. Queue pair 0 carries everything above:
 * every piece, credit and clear-to-send. The others carry only rendezvous
 * writes, striped by chunk (ib_rdv.c), and hold a few zero-byte receive
 * WRs for the immediates that end them.
 *
 * Rails. A context opens every device (port) that NCCL_IB_HCA allows with
 * an active port, HETCCL_IB_RAILS of them at most, in the verbs list's
 * order: rail 0, 1, ... each with its own protection domain, in which every
 * registered range is registered (ib_reg.c). A pair uses R = the smaller of
 * the two ranks' rail counts, so R * N queue pairs: queue pair q lives on
 * rail q % R on both sides, with a completion queue per rail, and connects
 * rail i of one rank to rail i of the other (as a rail-optimised fabric
 * wires NIC i of every host to switch i). Queue pair 0, and so every piece
 * and the staging, stays on rail 0; a rendezvous write goes out on its
 * queue pair's rail with that rail's keys on both sides (the clear-to-send
 * carries the receiver's key per rail).
 *
 * Beside the queue pair each pair keeps the TCP connection that carried the
 * handshake as its note line (base/note_line.c): it carries nothing more
 * while all is well, a failure note when a rank gives up, and its end (EOF)
 * tells a waiting rank that its peer process is gone. */
#ifndef HETCCL_TRANSPORT_IB_H
#define HETCCL_TRANSPORT_IB_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/base/inbox.h"
#include "transport/base/probe.h"
#include "transport/transport.h"
#include "util/net.h"

/* ---- libibverbs, loaded at run time (ib_verbs.c) -------------------------- */

/* The exported functions we call, taken with dlsym from the one handle of
 * libibverbs.so.1; the data path (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq) is static inline in verbs.h and goes through the context's
 * own ops, so it needs no symbol. verbs.h turns ibv_query_port into an
 * inline wrapper around the exported ibv_query_port (which takes the
 * compat port struct) and ibv_reg_mr into one around the exported
 * ibv_reg_mr: the members below are those exported functions. */
typedef struct hetccl_ib_verbs {
  struct ibv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *dev);
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  int (*close_device)(struct ibv_context *ctx);
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
                              struct ibv_comp_channel *channel, int vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*destroy_qp)(struct ibv_qp *qp);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  const char *(*wc_status_str)(enum ibv_wc_status status);
  /* optional (rdma-core 32+): GID type, to prefer RoCE v2; NULL if absent */
  int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
  /* optional (rdma-core 34+): device memory by dma-buf; NULL if absent */
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                  int fd, int access);
} hetccl_ib_verbs_t;

/* Loads libibverbs once per process (any thread). ncclSystemError with a
 * WARN naming the library or the missing symbol if it cannot; the library
 * is never unloaded. */
ncclResult_t hetccl_ib_verbs_load(const hetccl_ib_verbs_t **out);
/* The same without a message: NULL if libibverbs cannot be loaded. */
const hetccl_ib_verbs_t *hetccl_ib_verbs_try(void);

/* ---- the device a context uses (ib_dev.c) --------------------------------- */

typedef struct hetccl_ib_dev {
  struct ibv_context *vctx; /* NULL until opened */
  char name[64];
  uint8_t port;
  uint8_t link_layer;       /* IBV_LINK_LAYER_* */
  uint8_t mtu;              /* enum ibv_mtu, the port's active MTU */
  uint16_t lid;
  int gid_index;
  union ibv_gid gid;
  int distance;             /* from the rank's GPU on the PCI tree (ib_near.c), -1 unknown */
  int path;                 /* HETCCL_IB_PATH_* from the rank's GPU (ib_near.h), -1 unknown */
} hetccl_ib_dev_t;

/* Opens the devices NCCL_IB_HCA allows (HETCCL_IB_HCA wins; ib_hca.c),
 * each on its first allowed active port, at most `max` of them, in the
 * verbs list's order or, for a GPU rank (`busid`, its PCI bus id; "" or
 * NULL for a host rank), the nearest its GPU (ib_near.c), and picks each
 * one's GID (HETCCL_IB_GID_INDEX, else a RoCE v2 IPv4-mapped GID if the
 * port has one, else index 0). *n = how many (>= 1). ncclSystemError with
 * a WARN listing what was found if none fits; `rank`, as the user numbers
 * it, only names the caller in messages. */
ncclResult_t hetccl_ib_devs_open(const hetccl_ib_verbs_t *v, int rank, const char *busid,
                                 hetccl_ib_dev_t *devs, int max, int *n);
void hetccl_ib_dev_close(const hetccl_ib_verbs_t *v, hetccl_ib_dev_t *dev);
/* 1 if hetccl_ib_devs_open would find a device with an active port (the
 * same choice, HETCCL_IB_HCA honoured), without a message: the ib table's
 * `usable`. */
int hetccl_ib_dev_usable(void);

/* ---- context and endpoint -------------------------------------------------- */

/* Rails per context at most (HETCCL_IB_RAILS caps it lower). */
#define IB_RAILS_MAX 4

/* One device port a context uses, with its protection domain. */
typedef struct ib_rail {
  hetccl_ib_dev_t dev;
  struct ibv_pd *pd;
  int attached; /* pd is in the registration table (ib_reg.c) */
} ib_rail_t;

/* Where a rail is, for the peer's queue pairs on it: rail 0 in the
 * address blob, the others in the hello (ib_connect.c). */
typedef struct ib_rail_addr {
  uint8_t gid[16];
  uint16_t lid;
  uint8_t port, link_layer, mtu, gid_index;
  uint8_t pad[2];
} ib_rail_addr_t;
_Static_assert(sizeof(ib_rail_addr_t) == 24, "rail address");

#define IB_PIECE_HDR 64

/* In front of every piece. The frame is the message's (same for every
 * piece of it) and is checked on every piece. */
typedef struct ib_piece {
  hetccl_frame_hdr_t frame;
  uint64_t offset; /* of this piece in the message */
  uint64_t len;    /* payload bytes that follow */
} ib_piece_t;
_Static_assert(sizeof(ib_piece_t) == IB_PIECE_HDR, "piece header is one cache line");

/* The offset of a rendezvous request piece (ib_rdv.c): no payload. Its
 * len is IB_RDV_MAY, or IB_RDV_MUST for a source no CPU may read
 * (req->device_src): the receiver may not decline it. */
#define IB_PIECE_RDV UINT64_MAX
#define IB_RDV_MAY 0
#define IB_RDV_MUST 1
/* A source that is not registered, written from the sender's staging ring
 * (ib_rdv.c, "Staged writes"): sent only to take an accepting offer into
 * the receiver's own buffer. */
#define IB_RDV_STAGED 2
/* A source that is not registered, to a receiver that asked to be asked
 * (its ask_min, ib_rdv.c "Receives into device memory"): written from the
 * sender's staging ring wherever the receiver accepts, eager pieces if it
 * declines. */
#define IB_RDV_ASK 3

/* GPUDirect branches (ib_devmem.c) */
enum { IB_GDR_NONE = 0, IB_GDR_DMABUF = 1, IB_GDR_PEERMEM = 2 };

/* A clear-to-send record, one cache line, RDMA-written by a receiver into
 * the sender's ring at slot seq % IB_CTS_RING. `head` and `tail` both hold
 * the message's seq + 1, so a record still being placed, or one of an
 * earlier message, never reads as this message's (ib_rdv.c). */
#define IB_CTS_RING 4
typedef struct ib_cts {
  _Alignas(64) volatile uint64_t head;
  uint64_t addr;       /* where the bytes go (accept) */
  uint64_t bytes;      /* how many: the message's size */
  uint32_t rkey;       /* rail 0's */
  uint32_t accept;     /* 1: RDMA WRITE to addr/rkey; 0: send it as eager pieces */
  uint32_t xrkey[IB_RAILS_MAX - 1]; /* rails 1..: the same destination's key there */
  uint32_t direct;     /* accept: addr is the receive's own buffer (not its bounce buffer) */
  uint32_t pad[5 - (IB_RAILS_MAX - 1)];
  volatile uint64_t tail;
} ib_cts_t;
_Static_assert(sizeof(ib_cts_t) == 64, "a clear-to-send record is one cache line");

/* The registered block the peer writes into: our credits, and the
 * clear-to-send records of our rendezvous sends; beside them the sources
 * of our own writes of both to the peer. */
typedef struct ib_credit {
  _Alignas(64) volatile uint64_t in; /* peer: pieces of ours it consumed */
  _Alignas(64) uint64_t out;         /* source of our credit writes to the peer */
  ib_cts_t cts_in[IB_CTS_RING];      /* peer: clear to send our message seq */
  ib_cts_t cts_out[IB_CTS_RING];     /* sources of our clear-to-send writes */
} ib_credit_t;

/* What landed in a receive slot: a piece, or the immediate of the last
 * RDMA WRITE of a rendezvous message (no bytes in the slot). */
typedef struct ib_landed {
  uint32_t len;
  uint32_t imm;
  int with_imm;
} ib_landed_t;

/* Rendezvous state of the message at the head of one direction. */
enum {
  IB_RDV_NONE = 0,  /* not a rendezvous, or not started */
  IB_RDV_ASKED,     /* send: the request piece is out, waiting for the clear-to-send */
  IB_RDV_WRITING,   /* send: accepted, RDMA WRITEs being posted */
  IB_RDV_EAGER,     /* both: the receiver declined; eager pieces follow */
  IB_RDV_LANDING,   /* receive: accepted, waiting for the write with immediate */
};

/* Queue pairs per connection at most (HETCCL_IB_QPS), and the zero-byte
 * receive WRs each extra one keeps posted: a message takes at most one on
 * each, and only messages cleared to send have writes in flight, which
 * are at most the IB_CTS_RING receives from the head of the direction on
 * (ib_rdv.c, "Offers"). */
#define IB_QPS_MAX 16
#define IB_XQP_RECVS 4
_Static_assert(IB_XQP_RECVS >= IB_CTS_RING, "an immediate per extra queue pair per cleared message");

/* The rail of queue pair q. */
#define IB_QP_RAIL(ep, q) ((q) % (ep)->rails)

/* What a rank publishes (HETCCL_TRANSPORT_ADDR_BYTES at most). */
typedef struct ib_addr {
  uint64_t magic;
  hetccl_net_wire_addr_t tcp; /* handshake listener */
  ib_rail_addr_t rail0;
  uint16_t qps;               /* per rail; must match between peers, as chunk and slots */
  uint8_t rails;              /* the pair uses the smaller count */
  uint8_t pad;
  uint32_t chunk, slots;      /* must match between peers */
  char dev[32];               /* rail 0's, for messages */
  /* 0, or: this rank may take a receive of at least ask_min bytes into
   * device memory by RDMA WRITE, so its peers ask first (a rendezvous
   * request) for every such message, whatever its source (ib_rdv.c) */
  uint64_t ask_min;
} ib_addr_t;
_Static_assert(sizeof(ib_addr_t) <= HETCCL_TRANSPORT_ADDR_BYTES, "address blob");

struct hetccl_tctx {
  hetccl_transport_args_t args;
  int rank_user;           /* args.rank as the user numbers it, for messages */
  const hetccl_ib_verbs_t *v;
  ib_rail_t rail[IB_RAILS_MAX];
  int rails;               /* opened (ib_dev.c) */
  int lfd;                 /* handshake listener (ib_connect.c says how long it stays) */
  hetccl_sockaddr_t laddr;
  size_t chunk;
  int slots;
  int qps;                 /* HETCCL_IB_QPS: queue pairs per connection and rail */
  size_t zcopy_min;        /* HETCCL_IB_ZCOPY_THRESHOLD: smallest rendezvous message */
  int offer;               /* HETCCL_IB_OFFER: receives at the head of a direction that
                            * are cleared to send before asked (ib_rdv.c, "Offers") */
  int staged_write;        /* HETCCL_IB_STAGED_WRITE: unregistered sources take offers */
  uint8_t qp_timeout;      /* NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT (ib.c) */
  uint8_t qp_retry;
  int gdr;                 /* IB_GDR_*: how device memory reaches this device (ib_devmem.c) */
  size_t bounce_max;       /* HETCCL_IB_BOUNCE: largest message landed in a bounce buffer */
  size_t ask_min;          /* published (ib_addr_t): receives of at least this many bytes may
                            * land in device memory; 0: none (ib_devmem.c decides) */
  int gdr_staging;         /* core may stage device buffers in registered device memory
                            * (HETCCL_IB_GDR_STAGING, with a GPUDirect branch) */
  int flush_read;          /* receives into device memory are flushed by a read back
                            * through the NIC (ib_flush.c, HETCCL_IB_GDR_FLUSH) */
  uint64_t flushes;        /* such receives flushed so far (atomic: INFO at destroy) */
  uint64_t offers_landed;  /* rendezvous receives that landed on an offer (atomic: INFO at
                            * destroy)... */
  uint64_t offers_ahead;   /* ...of them offered before they headed their direction */
  /* connecting (ib_connect.c) */
  const uint8_t *use;      /* connect: the lower ranks that may come; NULL: any */
  hetccl_inbox_t *inbox;   /* arrivals on lfd, made by the first ctx_poll */
  struct ib_parked *parked; /* nranks: each lower rank's arrival, until its endpoint takes it */
  int lower_in;            /* lower ranks whose endpoint took its connection */
  int higher_out;          /* higher ranks this one connected to (said hello) */
  int probes_busy;         /* endpoints with a probe in flight (ib_connect.c) */
  int failed;              /* ctx_fail: arrivals get `note` */
  hetccl_fail_note_t note;
};

/* Posted requests of one direction, oldest first (linked through req->next). */
typedef struct ib_req_queue {
  hetccl_req_t *first, *last;
} ib_req_queue_t;

struct hetccl_ep {
  hetccl_tctx_t *ctx;
  const hetccl_ib_verbs_t *v;
  int peer;
  int peer_user;            /* the peer as the user numbers it, for messages */
  hetccl_sockaddr_t paddr;  /* the peer's handshake address, for messages */
  ib_addr_t pub;            /* what the peer published */
  int fd;                   /* the TCP line: handshake, then notes and liveness */
  int hs;                   /* where the handshake stands (ib_connect.c) */
  hetccl_probe_t probe;     /* higher rank waiting for the lower one: is it alive? */
  int64_t wait_ms;          /* when that wait began */
  uint32_t psn;             /* our first send PSN, on every queue pair */
  int rails;                /* the pair's: the smaller of both ranks' counts */
  struct ibv_cq *cq[IB_RAILS_MAX]; /* of the queue pairs on each rail */
  int qps;                  /* ctx->qps per rail, so ctx->qps * rails */
  struct ibv_qp *qp[IB_QPS_MAX]; /* 0: everything; 1..qps-1: rendezvous writes only;
                                  * q on rail IB_QP_RAIL(ep, q) */
  ib_rail_addr_t peer_rail[IB_RAILS_MAX]; /* 0 from the blob, the others from the hello */
  uint8_t *buf;             /* send slots, then recv slots */
  struct ibv_mr *mr;
  ib_credit_t *credit;
  struct ibv_mr *credit_mr;
  uint32_t peer_qpn[IB_QPS_MAX], peer_psn; /* from the peer's hello */
  uint64_t peer_credit_addr;
  uint32_t peer_credit_rkey;   /* covers the peer's clear-to-send ring too */
  uint64_t peer_cts_addr;
  size_t chunk, stride;     /* stride = IB_PIECE_HDR + chunk */
  int slots;

  /* send side */
  ib_req_queue_t sq;
  hetccl_req_t *splace;     /* first send not fully posted */
  uint64_t sseq;
  uint64_t sposted, sdone;  /* pieces posted / whose SEND completed (a rendezvous
                             * message's last write counts: it takes a receive WR) */
  uint64_t wposted, wdone;  /* RDMA WRITEs of rendezvous messages posted / completed */
  uint32_t xdone[IB_QPS_MAX]; /* extra queue pair q: (uint32_t) seq of the message whose
                               * last write on it completed last */
  int srdv;                 /* IB_RDV_* of splace */
  uint64_t srdv_addr;       /* its destination, once accepted */
  uint32_t srdv_rkey[IB_RAILS_MAX]; /* the destination's key on each rail */
  uint32_t srdv_lkey[IB_RAILS_MAX]; /* the source's */
  uint8_t *wstage;          /* staged writes' ring: `slots` chunks, registered on rail 0;
                             * NULL until needed (ib_rdv.c) */
  struct ibv_mr *wstage_mr;
  int wstage_failed;        /* making it failed once (INFO): eager from now on */
  uint64_t stposted, stdone; /* staged writes posted / completed (all on queue pair 0) */

  /* receive side */
  ib_req_queue_t rq;
  uint64_t rseq;
  uint64_t rarrived, rconsumed; /* pieces landed / delivered and reposted */
  ib_landed_t *landed;          /* what landed in each recv slot */
  uint64_t credit_sent;         /* rconsumed as last written to the peer */
  int credit_busy;              /* a credit write is in flight */
  int rrdv;                     /* IB_RDV_* of rq.first */
  int rbounce;                  /* rq.first lands in `bounce`, not in its buffer */
  uint8_t *bounce;              /* registered landing place for messages that reduce, or
                                 * whose buffer is not registered (ib_rdv.c); NULL until needed */
  struct ibv_mr *bounce_mr[IB_RAILS_MAX]; /* on each rail of the pair */
  int bounce_failed;            /* making it failed once (INFO): decline from now on */
  /* rq.first's own buffer, registered for the one message a sender may
   * not have declined (IB_RDV_MUST) that fits nowhere registered; dropped
   * when it has landed, or at ep_close */
  struct ibv_mr *once_mr[IB_RAILS_MAX];
  uint32_t cts_busy;            /* bit seq % IB_CTS_RING: that clear-to-send record's write
                                 * is in flight (its source is not touched) */
  uint32_t xin;                 /* extra queue pairs an immediate came on (bit q)... */
  uint32_t ximm[IB_QPS_MAX];    /* ...and what the latest said (its message's seq: each
                                 * queue pair's come in message order) */
  /* flushing the NIC's writes into device memory (ib_flush.c); flush_qp[0]
   * NULL: this endpoint does not */
  struct ibv_qp *flush_qp[IB_RAILS_MAX]; /* on each rail, connected to itself */
  uint64_t *flush_sink;         /* where the reads land: a word per rail, registered... */
  struct ibv_mr *flush_mr[IB_RAILS_MAX]; /* ...on each rail */
  ib_req_queue_t flushq;        /* receives landed whose read back is in flight, in order */
  uint64_t flush_posted;        /* reads posted per rail (one per receive on each rail)... */
  uint64_t flush_done[IB_RAILS_MAX]; /* ...and completed, per rail */

  /* failure */
  ncclResult_t err;             /* sticky */
  int broken;                   /* the failed completion's ibv_wc_status (0: none): the QP is
                                 * in the error state */
  char broken_why[192];
  int64_t checked_ms;           /* last look at the TCP line */
};

/* What a request keeps in req->priv. */
typedef struct ib_req_priv {
  uint64_t seq;
  uint64_t npieces;  /* at least 1 */
  uint64_t pieces;   /* posted (send) or delivered (receive) so far */
  uint64_t offset;   /* bytes posted / delivered so far */
  uint64_t end;      /* send: sposted after its last piece */
  uint64_t lkey;     /* send: IB_REQ_RDV | the source's lkey for a rendezvous; 0 eager;
                      * receive: IB_REQ_* flags below (0: none) */
} ib_req_priv_t;
#define IB_REQ_RDV (1ull << 63)
#define IB_REQ_WROTE (1ull << 62) /* send: the rendezvous was accepted (its writes went) */
#define IB_REQ_OFFERED (1ull << 61) /* receive: cleared to send before the sender asked */
#define IB_REQ_NO_OFFER (1ull << 60) /* receive: would decline, so no offer is made */
#define IB_REQ_MUST (1ull << 59) /* receive: its sender asked with IB_RDV_MUST */
#define IB_REQ_STAGED (1ull << 58) /* both: the writes come from the sender's staging ring,
                                    * on queue pair 0 alone (IB_RDV_STAGED, IB_RDV_ASK) */
#define IB_REQ_ASK (1ull << 57) /* send: staged, and asked first because the receiver said
                                 * so (IB_RDV_ASK): it may decline */
#define IB_REQ_FLUSH (1ull << 56) /* receive: landed in device memory, done once the read
                                   * back numbered priv->end has completed on every rail */
#define IB_REQ_AHEAD (1ull << 55) /* receive: OFFERED before it headed its direction, into
                                   * its own buffer (ib_rdv.c, "Offers") */
#define IB_REQ_NOT_AHEAD (1ull << 54) /* receive: its buffer is not registered: offered, if
                                       * at all, only once it heads its direction */
_Static_assert(sizeof(ib_req_priv_t) <= sizeof(((hetccl_req_t *)0)->priv), "request private");

static inline ib_req_priv_t *ib_req_priv(hetccl_req_t *r) { return (ib_req_priv_t *)r->priv; }

/* wr_id of a work request: what it is, its queue pair (0 but for
 * rendezvous writes and IB_WR_XRECV) and its slot (the message's seq for
 * IB_WR_WRITE_IMM on an extra queue pair). */
enum { IB_WR_SEND = 1, IB_WR_RECV = 2, IB_WR_CREDIT = 3, IB_WR_WRITE = 4, IB_WR_WRITE_IMM = 5,
       IB_WR_CTS = 6, IB_WR_XRECV = 7 /* zero-byte receive on an extra queue pair */,
       IB_WR_STAGED = 8, IB_WR_STAGED_IMM = 9 /* staged writes (queue pair 0); the last
                                                 takes a receive slot: a piece */,
       IB_WR_FLUSH = 10 /* a read back through the loopback queue pair (ib_flush.c) */ };
/* Send WRs a queue pair holds at most: a SEND per slot, as many
 * rendezvous writes, the credit write, the clear-to-send writes. */
#define IB_SEND_WRS(slots) (2 * (slots) + 1 + IB_CTS_RING)
#define IB_WR_ID(kind, slot) (((uint64_t)(kind) << 32) | (uint32_t)(slot))
#define IB_WR_ID_QP(kind, q, slot) (IB_WR_ID(kind, slot) | ((uint64_t)(q) << 40))
#define IB_WR_KIND(id) ((int)(((id) >> 32) & 0xff))
#define IB_WR_QP(id) ((int)(((id) >> 40) & 0xff))
#define IB_WR_SLOT(id) ((uint32_t)(id))

/* ib.c: endpoints and their queue pairs, liveness */
/* A reliable-connected queue pair on rail `rail` (its domain, the
 * endpoint's CQ of that rail), in INIT, granting `access` (IBV_ACCESS_*)
 * to the queue pair it will be connected to. */
ncclResult_t hetccl_ib_qp_create(hetccl_ep_t *ep, int rail, int send_wr, int recv_wr,
                                 int access, struct ibv_qp **out);
/* qp (on rail `rail`) to RTR and RTS, connected to queue pair dest_qpn at
 * `peer`, whose first PSN is rq_psn; ours is sq_psn. */
ncclResult_t hetccl_ib_qp_connect(hetccl_ep_t *ep, struct ibv_qp *qp, int rail,
                                  const ib_rail_addr_t *peer, uint32_t dest_qpn,
                                  uint32_t rq_psn, uint32_t sq_psn);
/* WARN that `call` failed with err (an errno) for the endpoint on rail
 * `rail`, naming the peer and the locked-memory limit where it may be
 * why; ncclSystemError. */
ncclResult_t hetccl_ib_verbs_fail(hetccl_ep_t *ep, int rail, const char *call, int err);
/* What the peer needs of one of our rails. */
void hetccl_ib_rail_addr(const hetccl_ib_dev_t *dev, ib_rail_addr_t *out);
/* The endpoint to peer, from what it published (addr): QP in INIT with
 * every receive slot posted, no connection yet (hs 0). ncclInvalidArgument
 * naming the peer if addr is malformed or its staging geometry differs. */
ncclResult_t hetccl_ib_ep_new(hetccl_tctx_t *ctx, int peer, const uint8_t *addr,
                              hetccl_ep_t **out);
/* Every queue pair INIT -> RTR -> RTS, once the peer's hello (peer_qpn,
 * peer_psn) is in. */
ncclResult_t hetccl_ib_ep_qp_up(hetccl_ep_t *ep);
/* The table's ep_close; safe on half-built endpoints and NULL. */
void hetccl_ib_ep_close(hetccl_ep_t *ep);
/* The endpoint's error when it cannot go on: the peer's note if it left
 * one, else ncclRemoteError naming the peer and `why`. Sticky. */
ncclResult_t hetccl_ib_ep_lost(hetccl_ep_t *ep, const char *why);
/* Called while requests wait and nothing moved: ncclRemoteError (via
 * hetccl_ib_ep_lost) if the QP failed or the peer's TCP line ended or
 * carries a note; looks at the line at most every IB_LIVENESS_MS. */
ncclResult_t hetccl_ib_ep_check_peer(hetccl_ep_t *ep);

/* ib_connect.c: the handshake (its protocol at the top of the file); the
 * table's connect and connections-on-first-use slots */
ncclResult_t hetccl_ib_connect(hetccl_tctx_t *ctx, const uint8_t *use, const uint8_t *addrs,
                               const hetccl_peer_locality_t *localities, hetccl_ep_t **eps);
ncclResult_t hetccl_ib_ep_open(hetccl_tctx_t *ctx, int peer, const uint8_t *addr,
                               const hetccl_peer_locality_t *loc, hetccl_ep_t **out);
ncclResult_t hetccl_ib_ep_ready(hetccl_ep_t *ep, int *ready);
ncclResult_t hetccl_ib_ctx_poll(hetccl_tctx_t *ctx);
void hetccl_ib_ctx_fail(hetccl_tctx_t *ctx, const hetccl_fail_note_t *why);
size_t hetccl_ib_ctx_pull_min(const hetccl_tctx_t *ctx);
/* ctx_destroy's part: answers the last arrivals after ctx_fail, closes the
 * parked connections, the inbox and the listener. */
void hetccl_ib_ctx_release(hetccl_tctx_t *ctx);

/* ib_data.c */
/* Post the receive WR of recv slot `slot` (queue pair 0). */
ncclResult_t hetccl_ib_ep_post_recv(hetccl_ep_t *ep, uint32_t slot);
/* Post one zero-byte receive WR on extra queue pair q (1..qps-1). */
ncclResult_t hetccl_ib_ep_post_xrecv(hetccl_ep_t *ep, int q);
/* ibv_post_send on queue pair q, with a WARN naming `what` and the peer if
 * it fails. */
ncclResult_t hetccl_ib_ep_post_send(hetccl_ep_t *ep, int q, struct ibv_send_wr *wr,
                                    const char *what);
/* SEND the first `bytes` of send slot ep->sposted % slots (at pc, header
 * filled by the caller), signaled, and count the slot posted. */
ncclResult_t hetccl_ib_ep_send_slot(hetccl_ep_t *ep, void *pc, uint32_t bytes, const char *what);
/* The endpoint's first error (sticky), res if none yet. */
ncclResult_t hetccl_ib_ep_error(hetccl_ep_t *ep, ncclResult_t res);
/* May one more piece (or last rendezvous write) take a receive WR of the
 * peer and a send slot of ours now? `credits`: the peer's count. */
int hetccl_ib_ep_piece_room(const hetccl_ep_t *ep, uint64_t credits);
ncclResult_t hetccl_ib_isend(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_ib_irecv(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_ib_progress(hetccl_ep_t *ep, int *idle);

/* ib_rdv.c: the rendezvous (its protocol at the top of the file) */
/* rq.first changed: the rendezvous state of the receive now at the head. */
void hetccl_ib_rdv_head(hetccl_ep_t *ep);
/* At isend: does message r go by rendezvous? Sets its priv lkey if so. A
 * device source (r->device_src) always does; one not registered on every
 * rail of the pair is ncclInvalidUsage. */
ncclResult_t hetccl_ib_rdv_choose(hetccl_ep_t *ep, hetccl_req_t *r);
/* When eager message r is about to start: does it take the receiver's
 * accepting offer into its own buffer, written from the staging ring?
 * Sets its priv lkey if so (then it is a rendezvous message). */
int hetccl_ib_rdv_staged(hetccl_ep_t *ep, hetccl_req_t *r);
/* ctx_reaches (transport.h): a GPUDirect branch was taken (ctx->gdr),
 * [buf, buf + bytes) is registered on every rail of the context, and for a
 * receive the peers ask first at this size (ctx->ask_min); buf NULL: the
 * same but for the registration, from ctx->zcopy_min bytes, if
 * ctx->gdr_staging. */
int hetccl_ib_ctx_reaches(const hetccl_tctx_t *ctx, const void *buf, size_t bytes, int recv);
/* Send side, for splace (a rendezvous message): post its request piece,
 * take the clear-to-send, post its writes, as far as room allows. *placed
 * = 1 once nothing of it is left to post (then or through eager pieces,
 * which the caller posts while ep->srdv is IB_RDV_EAGER). */
ncclResult_t hetccl_ib_rdv_send(hetccl_ep_t *ep, hetccl_req_t *r, uint64_t credits,
                                size_t *moved, int *placed);
/* Receive side: a request piece (checked by the caller) met r: answer it.
 * *taken = 0 if it must wait (every clear-to-send source busy). */
ncclResult_t hetccl_ib_rdv_answer(hetccl_ep_t *ep, hetccl_req_t *r, int *taken);
/* Receive side: clear the head receive to send before its sender asks,
 * when it may come by rendezvous and nothing of it has landed yet. */
ncclResult_t hetccl_ib_rdv_offer(hetccl_ep_t *ep, size_t *moved);
/* Receive side: a piece of r's payload came (the sender went eager): an
 * accepting offer made for r is void, and r is received eager. */
void hetccl_ib_rdv_offer_unused(hetccl_ep_t *ep, hetccl_req_t *r);
/* Receive side: the write with immediate `imm` landed on queue pair 0 for
 * r (the head). *wait = 1 while an extra queue pair's immediate of it is
 * still to come (then nothing was delivered). */
ncclResult_t hetccl_ib_rdv_landed(hetccl_ep_t *ep, hetccl_req_t *r, uint32_t imm, int *wait);
/* Send side: have the writes of r (accepted) on every extra queue pair
 * completed? */
int hetccl_ib_rdv_xdone(const hetccl_ep_t *ep, hetccl_req_t *r);
/* At ep_close, before the domain goes: the bounce buffer and the staging
 * ring, if made. */
void hetccl_ib_rdv_free(hetccl_ep_t *ep);

/* ib_devmem.c: how a device rank's buffers reach the NIC */
/* At ctx_create of a device rank (args.device), once its protection
 * domains exist and before they join the registration table: decide, log
 * once at INFO, and keep in ctx->gdr how device memory reaches the NIC
 * and in ctx->ask_min from what size receives may land there. Never fails
 * the context: every answer leaves at least the staged path. */
void hetccl_ib_devmem_decide(hetccl_tctx_t *ctx);

/* ib_flush.c: the NIC's writes into device memory made visible before a
 * receive says done (its contract at the top of the file) */
/* At ep_alloc, after the CQs: the loopback queue pairs and the sink, if
 * ctx->flush_read. */
ncclResult_t hetccl_ib_flush_open(hetccl_ep_t *ep);
/* How many completions the flush adds to each rail's CQ (0 without it). */
int hetccl_ib_flush_cqes(const hetccl_tctx_t *ctx);
/* Receive r (device_dst) has landed: 1 if it must be read back first. */
int hetccl_ib_flush_wanted(const hetccl_ep_t *ep, const hetccl_req_t *r);
/* Room for one more read back now? */
int hetccl_ib_flush_room(const hetccl_ep_t *ep);
/* Post r's read back on every rail (r: landed, taken off the receive
 * queue; it goes on ep->flushq and is marked done when its reads are). */
ncclResult_t hetccl_ib_flush_post(hetccl_ep_t *ep, hetccl_req_t *r);
/* A read back completed on `rail`: mark done every receive whose reads
 * all have. */
void hetccl_ib_flush_completed(hetccl_ep_t *ep, int rail);
/* At ep_close, before the CQs go. */
void hetccl_ib_flush_close(hetccl_ep_t *ep);

/* ib_reg.c: the registration table (ib_mem.h is the user's side) */
/* A context's domain joins the table: every declared range is registered
 * with it now, and each one declared later when it is. dmabuf: the device
 * runtime whose memory registers on pd through dma-buf (ctx->gdr is
 * IB_GDR_DMABUF), else NULL: a range that ibv_reg_mr refuses is then tried
 * as that runtime's device memory. */
ncclResult_t hetccl_ib_reg_attach(const hetccl_ib_verbs_t *v, struct ibv_pd *pd, int rank_user,
                                  const struct hetccl_runtime *dmabuf);
/* Before the domain is deallocated: its regions are deregistered. */
void hetccl_ib_reg_detach(struct ibv_pd *pd);
/* 1 and the region's keys if [buf, buf + bytes) lies in one declared range
 * registered with pd; 0 otherwise. */
int hetccl_ib_reg_find(struct ibv_pd *pd, const void *buf, size_t bytes, uint32_t *lkey,
                       uint32_t *rkey);

#endif
