/* Shared-memory transport, private to transport/shm: the segment layout
 * that both processes of a pair read, and the endpoint that shm.c (set-up,
 * liveness) builds and shm_ring.c (data path) drives.
 *
 * Layout of the segment a rank creates (one per rank per communicator):
 *
 *   page 0            shm_seg_hdr_t: who made it, its geometry, and where to
 *                     find the CMA probe word in the creator's memory
 *   ring i            one receive ring per potential sender s (i = s, or
 *                     s - 1 above the creator's own rank), ring_bytes each,
 *                     page aligned so that an endpoint maps its ring alone:
 *     control page    shm_ring_ctrl_t: head, tail and flags
 *     slot 0..slots-1 shm_slot_hdr_t (64 bytes) then `chunk` payload bytes
 *
 * The creator of the segment is the consumer of every ring in it; the
 * sender s is the only producer of ring s. */
#ifndef HETCCL_TRANSPORT_SHM_H
#define HETCCL_TRANSPORT_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"
#include "transport/shm/shm_coop.h"
#include "transport/shm/shm_helper.h"

#define SHM_SEG_MAGIC 0x484554434d53484dull   /* "HETCMSHM" */
#define SHM_CMA_PROBE 0x434d412070726f62ull   /* read across processes to test CMA */
#define SHM_SLOT_HDR 64                       /* slot header bytes, payload follows */
#define SHM_NAME_MAX 96
#define SHM_STREAM_MIN (1u << 20)             /* receives this large copy out with streaming stores */
#define SHM_LIVENESS_NS 100000000LL           /* idle time before we look at the peer */
/* Single copy by default on hosts of at least SHM_CMA_MIN_CPUS CPUs where
 * process_vm_readv moves at least SHM_CMA_RATIO of what our streaming copy
 * does (shm.c: cma_default). */
#define SHM_CMA_MIN_CPUS 8
#define SHM_CMA_RATIO 0.3

/* What the creator writes in page 0 before publishing the name. */
typedef struct shm_seg_hdr {
  uint64_t magic;
  uint64_t comm_id;
  int32_t rank, nranks;
  int32_t pid, slots;
  uint64_t chunk;          /* payload bytes per slot, multiple of 64 */
  uint64_t ring_bytes;     /* bytes per ring, page multiple */
  uint64_t hdr_bytes;      /* offset of ring 0 */
  uint64_t cma_probe_addr; /* address of SHM_CMA_PROBE in the creator */
  uint64_t pidns;          /* inode of the creator's pid namespace, 0 = unknown */
} shm_seg_hdr_t;

/* Values of shm_ring_ctrl_t.tx_closed / rx_closed. */
enum {
  SHM_OPEN = 0,
  SHM_CLOSED = 1, /* the endpoint was closed */
  SHM_FAILED = 2, /* closed after a failure; the side's note says why */
};

/* One ring's control page. Each line has one writer. A side that fails
 * writes its note, then its closed flag (release): the flag is read with
 * acquire before the note. */
typedef struct shm_ring_ctrl {
  _Alignas(64) _Atomic uint64_t tail; /* producer: slots published */
  _Alignas(64) _Atomic uint64_t head; /* consumer: slots released */
  _Alignas(64) _Atomic uint32_t attached; /* producer: it mapped this ring */
  _Atomic uint32_t tx_closed;             /* producer: SHM_OPEN / CLOSED / FAILED */
  _Alignas(64) _Atomic uint32_t rx_ready; /* consumer: cma_ok below is final */
  _Atomic uint32_t cma_ok;                /* consumer: it can process_vm_readv the producer */
  _Atomic uint32_t rx_closed;             /* consumer: SHM_OPEN / CLOSED / FAILED */
  _Alignas(64) hetccl_fail_note_t tx_note; /* producer: why it failed */
  _Alignas(64) hetccl_fail_note_t rx_note; /* consumer: why it failed */
} shm_ring_ctrl_t;

/* Piece kinds in shm_slot_hdr_t.kind. */
enum {
  SHM_PIECE_FIRST = 1, /* first piece of a message: frame is valid */
  SHM_PIECE_NEXT = 2,  /* later piece */
  SHM_PIECE_RNDV = 3,  /* whole message by CMA: frame valid, addr = sender's buffer;
                        * the consumer releases the slot only after reading */
};

typedef struct shm_slot_hdr {
  hetccl_frame_hdr_t frame; /* FIRST and RNDV only */
  uint32_t kind;
  uint32_t len;             /* payload bytes in this slot */
  uint64_t addr;            /* RNDV: source address in the sender */
} shm_slot_hdr_t;
_Static_assert(sizeof(shm_slot_hdr_t) == SHM_SLOT_HDR, "slot header is one cache line");

/* One side (tx or rx) of an endpoint: a ring mapped on its own. */
typedef struct shm_ring_map {
  void *base;               /* mmap result, NULL when unmapped */
  size_t bytes;
  shm_ring_ctrl_t *ctrl;
  uint8_t *slots;
  uint32_t nslots;          /* geometry of the ring's creator (the consumer) */
  size_t chunk, stride;     /* stride = SHM_SLOT_HDR + chunk */
} shm_ring_map_t;

/* Posted requests of one direction, oldest first (linked through req->next). */
typedef struct shm_req_queue {
  hetccl_req_t *first, *last;
} shm_req_queue_t;

struct hetccl_ep {
  hetccl_transport_args_t args;  /* the context's, copied: the context may go first */
  int peer, peer_pid;
  int peer_user;                 /* the peer as the user numbers it, for messages */
  unsigned long long peer_start; /* /proc start time of the peer, 0 = unknown */
  int peer_watch;                /* peer_pid means the peer here (same pid namespace) */
  ncclResult_t failed;           /* sticky: once an endpoint fails it stays failed */

  /* Send side: we produce into the peer's ring for us. */
  shm_ring_map_t tx;
  uint64_t tx_tail, tx_head;     /* tx_head: last value read from ctrl->head */
  uint64_t tx_seq;
  size_t cma_min;                /* messages above this go by CMA; SIZE_MAX = never */
  int cma_want;                  /* our HETCCL_SHM_CMA, resolved */
  size_t cma_want_min;           /* HETCCL_SHM_CMA_MIN, for when the pair is ready */
  int cma_stream;                /* HETCCL_SHM_CMA_STREAM: pulls land by streaming stores */
  int push_off;                  /* writing into the peer failed once: help its reads no more */
  shm_req_queue_t sq;
  hetccl_req_t *sq_place;        /* first send not yet fully in the ring */

  /* Receive side: we consume our ring for the peer. */
  shm_ring_map_t rx;
  uint64_t rx_head, rx_tail;     /* rx_tail: last value read from ctrl->tail */
  uint64_t rx_seq;
  shm_req_queue_t rq;
  uint8_t *bounce;               /* CMA into this, then consume; lazily allocated */
  int help_on;                   /* receives may be handed to the helper thread */
  shm_help_t help;               /* the open receive the helper reads (shm_helper.h) */

  /* Liveness: idle polls with work pending, and when the idle stretch began. */
  uint32_t idle_polls;
  int64_t idle_since_ns;
};

/* What a request keeps in req->priv. */
typedef struct shm_req_priv {
  uint64_t rndv_slot; /* send by CMA: ring index of its slot; done once head passes it */
  uint32_t rndv;      /* 1: send by CMA / receive being pulled by CMA */
  uint32_t started;   /* receive: header checked; send: first piece placed */
  uint64_t src_addr;  /* receive by CMA: address in the sender */
  uint32_t coop;      /* receive by CMA: the sender may write pieces too (shm_coop_t);
                       * 2: the helper thread reads pieces too */
} shm_req_priv_t;
_Static_assert(sizeof(shm_req_priv_t) <= sizeof(((hetccl_req_t *)0)->priv), "request private");

static inline shm_req_priv_t *shm_req_priv(hetccl_req_t *r) { return (shm_req_priv_t *)r->priv; }

/* shm.c */
int64_t hetccl_shm_now_ns(void);
/* ncclRemoteError (logged) if the peer process is gone or closed its end
 * while we still wait on it; ncclSuccess otherwise. */
ncclResult_t hetccl_shm_ep_check_peer(hetccl_ep_t *ep);

/* shm_host.c: this host's copy rates, measured once per boot and shared by
 * its ranks (the file says how); 0 for what cannot run here. */
typedef struct hetccl_shm_host {
  double stream_gbps; /* one core, hetccl_shm_copy_stream, 8 MiB */
  double cma_gbps;    /* one core, process_vm_readv of itself, 8 MiB */
} hetccl_shm_host_t;
void hetccl_shm_host_profile(hetccl_shm_host_t *out);
/* Single copy for `local` ranks of a communicator on this host:
 * HETCCL_SHM_CMA where set, else the default (on where the ranks
 * outnumber the CPUs, or with SHM_CMA_MIN_CPUS CPUs or more and
 * process_vm_readv at SHM_CMA_RATIO of the streaming copy or better); `why`
 * says which, with the figures. */
int hetccl_shm_cma_choice(int local, char *why, size_t len);
/* The transport's host_info (transport.h): single copy and the receive
 * helper as a communicator of `local` ranks here would take them. */
void hetccl_shm_host_info(int local, char *buf, size_t len);

/* shm_copy.c: memcpy with streaming stores where the ISA has them, for
 * destinations that will not be read soon (large messages). */
void hetccl_shm_copy_stream(void *dst, const void *src, size_t n);

/* shm_ring.c */
ncclResult_t hetccl_shm_isend(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_shm_irecv(hetccl_ep_t *ep, hetccl_req_t *req);
ncclResult_t hetccl_shm_progress(hetccl_ep_t *ep, int *idle);

#endif
