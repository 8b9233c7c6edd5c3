/* RDMA verbs transport, private to transport/ib: the libibverbs entry
 * points (ib_verbs.c), the device a context uses (ib_dev.c), and the
 * context and endpoint that ib.c (set-up, teardown, liveness) builds and
 * ib_data.c (data path) drives.
 *
 * One RC queue pair per peer pair, with its own completion queue. Each
 * endpoint owns one registered staging buffer:
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
 * Beside the queue pair each pair keeps the TCP connection that carried the
 * handshake as its note line (base/note_line.c): it carries nothing more
 * while all is well, a failure note when a rank gives up, and its end (EOF)
 * tells a waiting rank that its peer process is gone. */
#ifndef HETCCL_TRANSPORT_IB_H
#define HETCCL_TRANSPORT_IB_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

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
} hetccl_ib_dev_t;

/* Opens the device HETCCL_IB_HCA names ("name" or "name:port"), else the
 * first device with an active port, and picks its GID (HETCCL_IB_GID_INDEX,
 * else a RoCE v2 IPv4-mapped GID if the port has one, else index 0).
 * ncclSystemError with a WARN listing what was found if none fits; `rank`,
 * as the user numbers it, only names the caller in messages. */
ncclResult_t hetccl_ib_dev_open(const hetccl_ib_verbs_t *v, int rank, hetccl_ib_dev_t *dev);
void hetccl_ib_dev_close(const hetccl_ib_verbs_t *v, hetccl_ib_dev_t *dev);
/* 1 if hetccl_ib_dev_open would find a device with an active port (the
 * same choice, HETCCL_IB_HCA honoured), without a message: the ib table's
 * `usable`. */
int hetccl_ib_dev_usable(void);

/* ---- context and endpoint -------------------------------------------------- */

#define IB_PIECE_HDR 64

/* In front of every piece. The frame is the message's (same for every
 * piece of it) and is checked on every piece. */
typedef struct ib_piece {
  hetccl_frame_hdr_t frame;
  uint64_t offset; /* of this piece in the message */
  uint64_t len;    /* payload bytes that follow */
} ib_piece_t;
_Static_assert(sizeof(ib_piece_t) == IB_PIECE_HDR, "piece header is one cache line");

/* The registered block the peer writes our credits into. */
typedef struct ib_credit {
  _Alignas(64) volatile uint64_t in; /* peer: pieces of ours it consumed */
  _Alignas(64) uint64_t out;         /* source of our credit writes to the peer */
} ib_credit_t;

/* What a rank publishes (HETCCL_TRANSPORT_ADDR_BYTES at most). */
typedef struct ib_addr {
  uint64_t magic;
  hetccl_net_wire_addr_t tcp; /* handshake listener */
  uint8_t gid[16];
  uint16_t lid;
  uint8_t port, link_layer, mtu, gid_index;
  uint16_t pad;
  uint32_t chunk, slots;      /* must match between peers */
  char dev[32];
} ib_addr_t;
_Static_assert(sizeof(ib_addr_t) <= HETCCL_TRANSPORT_ADDR_BYTES, "address blob");

struct hetccl_tctx {
  hetccl_transport_args_t args;
  int rank_user;           /* args.rank as the user numbers it, for messages */
  const hetccl_ib_verbs_t *v;
  hetccl_ib_dev_t dev;
  struct ibv_pd *pd;
  int lfd;                 /* handshake listener, closed once connected */
  hetccl_sockaddr_t laddr;
  size_t chunk;
  int slots;
  /* while connecting */
  const uint8_t *use;
  hetccl_ep_t **eps;
  int accepted, expected;
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
  uint32_t psn;             /* our first send PSN */
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint8_t *buf;             /* send slots, then recv slots */
  struct ibv_mr *mr;
  ib_credit_t *credit;
  struct ibv_mr *credit_mr;
  uint32_t peer_qpn, peer_psn; /* from the peer's hello */
  uint64_t peer_credit_addr;
  uint32_t peer_credit_rkey;
  size_t chunk, stride;     /* stride = IB_PIECE_HDR + chunk */
  int slots;

  /* send side */
  ib_req_queue_t sq;
  hetccl_req_t *splace;     /* first send not fully posted */
  uint64_t sseq;
  uint64_t sposted, sdone;  /* pieces posted / whose SEND completed */

  /* receive side */
  ib_req_queue_t rq;
  uint64_t rseq;
  uint64_t rarrived, rconsumed; /* pieces landed / delivered and reposted */
  uint32_t *rlen;               /* bytes landed in each recv slot */
  uint64_t credit_sent;         /* rconsumed as last written to the peer */
  int credit_busy;              /* a credit write is in flight */

  /* failure */
  ncclResult_t err;             /* sticky */
  int broken;                   /* a completion failed: the QP is in the error state */
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
} ib_req_priv_t;
_Static_assert(sizeof(ib_req_priv_t) <= sizeof(((hetccl_req_t *)0)->priv), "request private");

static inline ib_req_priv_t *ib_req_priv(hetccl_req_t *r) { return (ib_req_priv_t *)r->priv; }

/* wr_id of a work request: what it is and its slot. */
enum { IB_WR_SEND = 1, IB_WR_RECV = 2, IB_WR_CREDIT = 3 };
#define IB_WR_ID(kind, slot) (((uint64_t)(kind) << 32) | (uint32_t)(slot))
#define IB_WR_KIND(id) ((int)((id) >> 32))
#define IB_WR_SLOT(id) ((uint32_t)(id))

/* ib.c */
/* The endpoint's error when it cannot go on: the peer's note if it left
 * one, else ncclRemoteError naming the peer and `why`. Sticky. */
ncclResult_t hetccl_ib_ep_lost(hetccl_ep_t *ep, const char *why);
/* Called while requests wait and nothing moved: ncclRemoteError (via
 * hetccl_ib_ep_lost) if the QP failed or the peer's TCP line ended or
 * carries a note; looks at the line at most every IB_LIVENESS_MS. */
ncclResult_t hetccl_ib_ep_check_peer(hetccl_ep_t *ep);

/* ib_data.c */
/* Post the receive WR of recv slot `slot`. */
ncclResult_t hetccl_ib_ep_post_recv(hetccl_ep_t *ep, uint32_t slot);
ncclResult_t hetccl_ib_isend(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_ib_irecv(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_ib_progress(hetccl_ep_t *ep, int *idle);

#endif
