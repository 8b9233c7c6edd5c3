/* Transport layer: moving bytes between two ranks' host buffers.
 *
 * A transport knows no collective and no communicator. It is given, at
 * context creation, who it is (rank, nranks, a 64-bit communicator id used in
 * every frame it sends) and, at connection time, the address blobs that the
 * peers published (exchanged by the caller over the bootstrap).
 *
 * Threads: all slots but ctx_create/connect/destroy run on the one thread
 * that currently drives the communicator (the API caller for blocking host
 * operations, or the communicator's proxy thread); a context is never used
 * by two threads at once, so transports take no locks on the data path.
 * Nothing here may block indefinitely: every wait is bounded by
 * args->timeout_ms and by *args->abort_flag.
 *
 * Messages. isend/irecv enqueue one message each; per endpoint and
 * direction, messages are matched strictly in posting order (the nth send on
 * A->B meets the nth recv B<-A). Each message travels with a header that
 * carries a magic, the communicator id, the sender rank, a per-direction
 * sequence number, the byte count and the caller's 64-bit tag (the
 * operation signature). The receiver checks all of them: a frame that does
 * not fit (other communicator, wrong sequence, size or tag differing from
 * the posted receive) is an error (ncclInvalidUsage for size/tag mismatch,
 * naming both values and the peer; ncclSystemError for corrupt framing),
 * never data. A tag of 0 on the receive side accepts any tag.
 *
 * Receives may "consume" instead of copy: if req->consume is set, the
 * transport calls consume(ctx, dst, src, n) for each piece it receives,
 * where dst = req->buf + offset and src points to the received bytes
 * (transport-owned staging: valid only during the call). This is how
 * receive-and-reduce runs straight out of a shared-memory slot. Pieces are
 * always whole multiples of 8 bytes except possibly the last of a message.
 */
#ifndef HETCCL_TRANSPORT_H
#define HETCCL_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define HETCCL_TRANSPORT_ADDR_BYTES 128 /* published per rank per transport */

typedef void (*hetccl_consume_fn)(void *ctx, void *dst, const void *src, size_t bytes);

/* Why a rank gave up, as its peers learn it. The engine of the rank that
 * fails hands its note to ep_fail on every endpoint; a transport that finds
 * a peer's note fails the call in progress (hetccl_fail_note_received) and
 * keeps the first note it saw in *args->peer_note, so that the engine
 * relays the original cause, not "my peer gave up". */
#define HETCCL_FAIL_TEXT 504
typedef struct hetccl_fail_note {
  int32_t code;                /* ncclResult_t of the first failure; 0 = no note */
  int32_t origin;              /* the rank where it happened, as the communicator numbers it
                                * (a receiver prints it through its own user_ranks) */
  char text[HETCCL_FAIL_TEXT]; /* that rank's message, NUL-terminated */
} hetccl_fail_note_t;

/* The first receive that met a frame of another operation (its tag, i.e.
 * signature, differs from the posted one), kept for the message that
 * explains it (the engine reads the signatures back). */
typedef struct hetccl_tag_mismatch {
  int seen;            /* 0 until a transport records one */
  int peer;            /* who sent the frame */
  uint64_t theirs, mine;
} hetccl_tag_mismatch_t;

/* One posted message. Owned by the caller, which must keep it alive and
 * untouched until `done` is set (or an error is returned). */
typedef struct hetccl_req {
  void *buf;                 /* send source or receive destination */
  size_t bytes;              /* message size */
  uint64_t tag;              /* operation signature (see above) */
  hetccl_consume_fn consume; /* receive only; NULL = plain copy */
  void *consume_ctx;
  int pull_ok;               /* send only: the matching receive copies (no consume), so
                              * the receiver may pull the bytes from buf itself */
  int device_src;            /* send only: buf is device memory that ctx_reaches said this
                              * transport's hardware reads itself; no CPU may read it, so the
                              * transport moves it that way whatever its size, or fails */
  int device_dst;            /* receive only: buf is device memory that ctx_reaches said this
                              * transport's hardware writes itself for this size; no CPU may
                              * write it, so the bytes land that way, or the receive fails */
  /* set by the transport */
  volatile int done;         /* 1 when the buffer may be reused / holds the data */
  size_t progress;           /* bytes moved so far */
  /* the engine's, for the trace (trace/trace.h); transports leave them */
  uint64_t trace_t0;         /* when posted; 0: not traced, or reported */
  int32_t trace_peer;        /* the engine's peer index */
  int32_t trace_send;
  /* transport-private */
  struct hetccl_req *next;
  uint64_t priv[6];
} hetccl_req_t;

typedef struct hetccl_transport_args {
  int rank, nranks;            /* this communicator's numbering: indices, frames, handshakes */
  /* How the user numbers this communicator's ranks, for messages only:
   * NULL = as the communicator does, else rank r is the user's
   * user_ranks[r] (an island or leaders communicator of a hierarchical
   * one). nranks entries, the caller's, valid until every context and
   * endpoint made with these args is gone. */
  const int32_t *user_ranks;
  uint64_t comm_id;            /* goes into every frame header */
  uint64_t secret;             /* proves a connection belongs to this communicator */
  int timeout_ms;              /* bound on every wait */
  volatile int *abort_flag;    /* non-zero: return ncclInternalError / abort promptly */
  const char *ifname;          /* NCCL_SOCKET_IFNAME-style selection, may be "" */
  hetccl_fail_note_t *peer_note; /* where the first note from a peer goes; may be NULL */
  hetccl_tag_mismatch_t *mismatch; /* where the first signature mismatch goes; may be NULL */
  int local_ranks;             /* ranks of the communicator on this host, this one included */
  /* Payload bytes this rank's CPU copied for this transport (memcpy into
   * or out of staging, the kernel's copy in a socket send or receive,
   * process_vm_readv; not the reads of a consume, which is the reduction
   * itself), added with hetccl_copied_add; may be NULL. Each transport's
   * context gets its own counter (the communicator's, read by
   * hetcclCommCopiedBytes). */
  uint64_t *copied;
  /* The device runtime of this rank's buffers (runtime/runtime.h) when
   * they are device memory, NULL for a host rank: a transport that can
   * hand device memory to its hardware (ib: GPUDirect) asks it at
   * ctx_create. Transports move host bytes, which is what core hands them
   * (it stages device buffers through pinned host memory), except a send
   * whose source, or a receive whose destination, ctx_reaches accepted
   * (req->device_src, req->device_dst). */
  const struct hetccl_runtime *device;
  /* This rank's GPU's PCI bus id ("0000:1b:00.0"), "" for a host rank:
   * where it sits, for a transport that picks the hardware nearest it
   * (ib: HETCCL_IB_NEAR). */
  const char *busid;
} hetccl_transport_args_t;

static inline void hetccl_copied_add(const hetccl_transport_args_t *args, size_t bytes) {
  if (args->copied && bytes) __atomic_fetch_add(args->copied, (uint64_t)bytes, __ATOMIC_RELAXED);
}

/* Rank r (0 <= r < nranks) of a communicator as the user numbers it
 * (args->user_ranks): every message that names a rank prints this, never r
 * itself. A number a peer sent is looked up only once it is checked
 * against nranks. */
static inline int hetccl_user_rank(const int32_t *user_ranks, int r) {
  return user_ranks ? user_ranks[r] : r;
}

typedef struct hetccl_tctx hetccl_tctx_t; /* per communicator, per transport */
typedef struct hetccl_ep hetccl_ep_t;     /* one connected peer */

/* Blob a rank publishes: transport-specific address data plus what every
 * transport needs to judge locality. */
typedef struct hetccl_peer_locality {
  uint64_t host_hash; /* same value <=> same host (and same IPC namespace) */
  int pid;
} hetccl_peer_locality_t;

/* --- slot types --------------------------------------------------------- */

/* Can this rank serve the transport at all (ib: a verbs device with an
 * active port, as HETCCL_IB_HCA allows)? Asked at init, before any
 * context, on the thread that creates the communicator; the answer is
 * published, so that both ends of a pair choose alike (comm/transports.c). Only
 * looks, logs nothing above TRACE. Optional: a transport without it is
 * always usable. */
typedef int (*hetccl_transport_usable_fn)(void);

/* What the transport would choose on this host for a communicator with
 * `local_ranks` ranks here, knobs included, as one line of text in buf
 * (for `hetccl info`: hetcclTransportHostInfo). It may measure what it
 * would measure at init. Optional. */
typedef void (*hetccl_transport_host_info_fn)(int local_ranks, char *buf, size_t len);

/* May this transport connect me to peer? Pure function of the localities. */
typedef int (*hetccl_transport_can_connect_fn)(const hetccl_peer_locality_t *me,
                                               const hetccl_peer_locality_t *peer);

/* Create the per-communicator context: listening sockets, receive segments.
 * Writes up to HETCCL_TRANSPORT_ADDR_BYTES into addr for the peers. Blocks
 * only briefly (no peer interaction). */
typedef ncclResult_t (*hetccl_transport_ctx_create_fn)(const hetccl_transport_args_t *args,
                                                       hetccl_tctx_t **ctx, void *addr);

/* Connect to every peer p with use[p] != 0, given every rank's published
 * addr (addrs + p * HETCCL_TRANSPORT_ADDR_BYTES) and locality. Every rank
 * calls this collectively with a symmetric `use` (use[p] on rank r equals
 * use[r] on rank p). Fills eps[p] for those peers. Blocking, bounded by
 * timeout_ms; a peer that presents the wrong communicator id or secret is
 * dropped and waited past. */
typedef ncclResult_t (*hetccl_transport_connect_fn)(hetccl_tctx_t *ctx, const uint8_t *use,
                                                    const uint8_t *addrs,
                                                    const hetccl_peer_locality_t *localities,
                                                    hetccl_ep_t **eps);

/* Enqueue a message. Never blocks; may move some bytes at once. */
typedef ncclResult_t (*hetccl_transport_post_fn)(hetccl_ep_t *ep, hetccl_req_t *req);

/* Move whatever can move now on this endpoint, both directions, without
 * blocking; set req->done on completed requests (in order). Returns an error
 * if the peer is gone (ncclRemoteError, naming the peer rank) or a frame does
 * not fit. *idle = 1 if nothing at all moved (lets the caller back off). */
typedef ncclResult_t (*hetccl_transport_progress_fn)(hetccl_ep_t *ep, int *idle);

/* Close one endpoint / the context. Never block on the peer; safe after
 * errors and on half-built objects. A context outlives its endpoints: it is
 * destroyed only after every endpoint made from it was closed. */
typedef void (*hetccl_transport_ep_close_fn)(hetccl_ep_t *ep);
typedef void (*hetccl_transport_ctx_destroy_fn)(hetccl_tctx_t *ctx);

/* Close the endpoint as ep_close does, first leaving `why` where the peer
 * will find it while it waits on us (best effort, never blocking).
 * Optional: a transport without it only closes, and its peers learn that
 * this rank left, not why. */
typedef void (*hetccl_transport_ep_fail_fn)(hetccl_ep_t *ep, const hetccl_fail_note_t *why);

/* The size above which a send with pull_ok set is read by the receiver
 * straight from the sender's buffer (one copy, made by the receiver)
 * rather than copied through the transport. SIZE_MAX: never. Fixed once
 * connected. Optional: a transport without it never pulls. */
typedef size_t (*hetccl_transport_pull_min_fn)(const hetccl_ep_t *ep);

/* Does this context's hardware read (recv 0: for a send) or write (recv
 * 1: for a receive of exactly `bytes`) [buf, buf + bytes) of device
 * memory itself, whichever peer it serves (ib: GPUDirect RDMA, the range
 * registered on every device of the context; a receive also needs a size
 * its senders are bound to ask about first)? Then core hands the send or
 * receive to the transport unstaged, with req->device_src or
 * req->device_dst set. buf NULL asks whether it would for device memory
 * declared for RDMA (mem_register) and whether core should stage a message of
 * that size there rather than in host memory (ib: from
 * HETCCL_IB_ZCOPY_THRESHOLD bytes, unless HETCCL_IB_GDR_STAGING=0); core
 * then asks again with the staging block's address. Any thread (core asks
 * on the caller's at enqueue while another drives the context): reads
 * only what ctx_create fixed and tables with locks of their own.
 * Optional: a transport without it is given host memory only. */
typedef int (*hetccl_transport_ctx_reaches_fn)(const hetccl_tctx_t *ctx, const void *buf,
                                               size_t bytes, int recv);

/* --- connections on first use (optional; docs/scale.md) -------------------
 *
 * A transport with these slots can connect one pair at a time, when the
 * engine first needs it, instead of every pair in `connect` at init. Both
 * ends call ep_open for each other (the engine does, when an operation
 * first names the peer), and only then does the pair become ready: the
 * lower rank initiates, the higher rank takes what arrives (ctx_poll), so
 * the two agree without a third party. Nothing here blocks on the peer. A
 * context that serves lazy endpoints keeps its listener (if any) open while
 * a peer may still connect to it or wait for it to connect (at most until
 * it is destroyed): a higher rank that waits may probe a lower rank's
 * listener to learn whether it still lives (base/probe.h), and must find it
 * open for as long as it does. */

/* Start connecting to peer (addr: what it published; loc: its locality).
 * Never waits on the peer; *ep exists from now on and is closed with
 * ep_close / ep_fail like any other. */
typedef ncclResult_t (*hetccl_transport_ep_open_fn)(hetccl_tctx_t *ctx, int peer,
                                                    const uint8_t *addr,
                                                    const hetccl_peer_locality_t *loc,
                                                    hetccl_ep_t **ep);
/* Advance the connection without blocking; *ready = 1 once isend/irecv
 * may be used. An error names the peer (it is gone, or it left a failure
 * note: hetccl_fail_note_received). */
typedef ncclResult_t (*hetccl_transport_ep_ready_fn)(hetccl_ep_t *ep, int *ready);
/* Take what arrived for the context (connections from lower ranks) and
 * hand it to their endpoints, opened or not yet. Never blocks. After
 * ctx_fail, answers every arrival with the note instead. */
typedef ncclResult_t (*hetccl_transport_ctx_poll_fn)(hetccl_tctx_t *ctx);
/* This rank failed: leave `why` where peers that were never connected
 * will find it if they come (best effort, never blocking), and answer
 * arrivals with it from now on (ctx_poll, ctx_destroy). */
typedef void (*hetccl_transport_ctx_fail_fn)(hetccl_tctx_t *ctx, const hetccl_fail_note_t *why);
/* What pull_min will say for an endpoint of this context once connected,
 * when the peer agrees (the engine needs it before any connection, and
 * every rank must choose the same algorithms). */
typedef size_t (*hetccl_transport_ctx_pull_min_fn)(const hetccl_tctx_t *ctx);

/* --- memory declared for communication (process-wide) --------------------
 *
 * What the user declares (ncclCommRegister, ncclCommWindowRegister on an
 * engine communicator, ncclMemAlloc's blocks) and what core declares for
 * its own staging blocks: memory a transport may use in place (ib: RDMA
 * straight from and into it, docs/transports.md). A hint: a transport that
 * needs none takes the shared no-op stubs below, and core reaches every
 * transport through hetccl_transport_mem_* (base/mem.c), never one by name.
 * These slots know no communicator: a declaration holds for every context
 * of the transport in the process, open now or later. Any thread; a
 * transport's table behind them takes its own lock. Never blocks on a peer. */

/* Declare [base, base + bytes) and return an opaque handle for
 * mem_deregister (bytes 0: nothing declared, a handle all the same). A
 * range the transport cannot use (no room, refused by the hardware) stays
 * declared and on the copy path: INFO, not an error; an error is only a
 * failure to record it (out of memory), with a WARN. */
typedef ncclResult_t (*hetccl_transport_mem_register_fn)(void *base, size_t bytes, void **handle);
/* Undo a declaration before returning (every registration of the range is
 * gone when it returns). A handle whose range mem_freed already dropped is
 * accepted; one this transport never returned is ncclInvalidArgument. */
typedef ncclResult_t (*hetccl_transport_mem_deregister_fn)(void *handle);
/* ncclMemAlloc's new block [base, base + bytes): declared as a range with
 * no handle. Cannot fail (a block left undeclared takes the copy path). */
typedef void (*hetccl_transport_mem_allocated_fn)(void *base, size_t bytes);
/* ncclMemFree, before the block at base is returned: drop the block's range
 * and every range declared inside it, so that no registration outlives
 * the memory. */
typedef void (*hetccl_transport_mem_freed_fn)(void *base);

/* The no-op stubs for a transport that uses no declared memory (base/
 * registry.c): register gives a handle that is never NULL and declares
 * nothing; deregister accepts it. The registry puts them in any memory
 * slot a table leaves out. */
ncclResult_t hetccl_transport_mem_register_none(void *base, size_t bytes, void **handle);
ncclResult_t hetccl_transport_mem_deregister_none(void *handle);
void hetccl_transport_mem_allocated_none(void *base, size_t bytes);
void hetccl_transport_mem_freed_none(void *base);

typedef struct hetccl_transport {
  const char *name;
  hetccl_transport_can_connect_fn can_connect;
  hetccl_transport_ctx_create_fn ctx_create;
  hetccl_transport_connect_fn connect;
  hetccl_transport_post_fn isend;
  hetccl_transport_post_fn irecv;
  hetccl_transport_progress_fn progress;
  hetccl_transport_ep_close_fn ep_close;
  hetccl_transport_ctx_destroy_fn ctx_destroy;
  hetccl_transport_ep_fail_fn ep_fail;   /* optional */
  hetccl_transport_pull_min_fn pull_min; /* optional */
  hetccl_transport_usable_fn usable;     /* optional */
  hetccl_transport_ctx_reaches_fn ctx_reaches; /* optional */
  hetccl_transport_host_info_fn host_info;     /* optional */
  /* connections on first use: all five, or none */
  hetccl_transport_ep_open_fn ep_open;
  hetccl_transport_ep_ready_fn ep_ready;
  hetccl_transport_ctx_poll_fn ctx_poll;
  hetccl_transport_ctx_fail_fn ctx_fail;
  hetccl_transport_ctx_pull_min_fn ctx_pull_min;
  /* memory declared for communication: the transport's own, or the shared
   * no-op stubs (a table that names none gets them from the registry) */
  hetccl_transport_mem_register_fn mem_register;
  hetccl_transport_mem_deregister_fn mem_deregister;
  hetccl_transport_mem_allocated_fn mem_allocated;
  hetccl_transport_mem_freed_fn mem_freed;
  /* 1: ep_open on the lower rank makes the connections the higher rank
   * takes in ctx_poll, so a lower rank that fails before it connected may
   * open an endpoint just to leave its note there (ep_fail) for a higher
   * rank that waits for it (p2p/connect.c). */
  int lower_connects;
} hetccl_transport_t;

/* name, table symbol. Order is preference order under HETCCL_TRANSPORT=auto. */
#define HETCCL_TRANSPORTS(X)                                                   \
  X(shm, hetccl_transport_shm)                                                 \
  X(socket, hetccl_transport_socket)                                           \
  X(ib, hetccl_transport_ib)

#define HETCCL_TRANSPORT_DECL(name, sym) extern const hetccl_transport_t sym;
HETCCL_TRANSPORTS(HETCCL_TRANSPORT_DECL)
#undef HETCCL_TRANSPORT_DECL

typedef enum {
#define HETCCL_TRANSPORT_ENUM(name, sym) HETCCL_TRANSPORT_##name,
  HETCCL_TRANSPORTS(HETCCL_TRANSPORT_ENUM)
#undef HETCCL_TRANSPORT_ENUM
  HETCCL_TRANSPORT_COUNT
} hetccl_transport_id_t;

/* The table for id; asserts the required slots are filled (base/), the
 * memory slots a transport leaves out completed with the no-op stubs. */
const hetccl_transport_t *hetccl_transport_get(hetccl_transport_id_t id);

/* Memory declared for communication, to every transport at once (base/
 * mem.c): what core calls for ncclCommRegister / ncclCommDeregister, an
 * engine window, ncclMemAlloc / ncclMemFree and its staging blocks. The
 * handle is core's (a declaration's handles in each transport); deregister
 * takes a handle register returned (one deregistered already is accepted;
 * any other is ncclInvalidArgument, named in a WARN). Any thread. */
ncclResult_t hetccl_transport_mem_register(void *base, size_t bytes, void **handle);
ncclResult_t hetccl_transport_mem_deregister(void *handle);
void hetccl_transport_mem_allocated(void *base, size_t bytes);
void hetccl_transport_mem_freed(void *base);

/* Frame header used by every transport (base/frame.c fills and checks it). */
#define HETCCL_FRAME_MAGIC 0x48455443434c3031ull /* "HETCCL01" */
typedef struct hetccl_frame_hdr {
  uint64_t magic;
  uint64_t comm_id;
  uint64_t tag;
  uint64_t seq;
  uint64_t bytes;
  int32_t src_rank;
  uint32_t flags;
} hetccl_frame_hdr_t;

void hetccl_frame_fill(hetccl_frame_hdr_t *h, uint64_t comm_id, int src_rank, uint64_t seq,
                       uint64_t tag, uint64_t bytes);
/* Checks a received header against what the posted receive expects, from
 * expect_src of the communicator that args describe (comm_id). Logs the
 * exact cause, naming ranks through args->user_ranks; `transport` names
 * the caller. If the tags differ and args->mismatch holds none yet,
 * records the pair there. */
ncclResult_t hetccl_frame_check(const hetccl_frame_hdr_t *h, const char *transport,
                                const hetccl_transport_args_t *args, int expect_src,
                                uint64_t expect_seq, uint64_t expect_tag, uint64_t expect_bytes);

/* A note from `peer` (the rank at the other end of the connection, which
 * may relay another rank's): logs it, naming ranks through
 * args->user_ranks, keeps it in *args->peer_note if that holds none (and
 * is not NULL), and returns what this rank fails with: the origin's
 * ncclInvalidUsage (every rank learns of a usage error as one), else
 * ncclRemoteError. */
ncclResult_t hetccl_fail_note_received(const hetccl_fail_note_t *note, const char *transport,
                                       int peer, const hetccl_transport_args_t *args);

/* The identity that opens every transport connection: the first bytes of
 * each transport's handshake (base/frame.c). */
typedef struct hetccl_hello {
  uint64_t magic; /* the transport's own */
  uint64_t comm_id;
  uint64_t secret;
  int32_t rank, nranks;
} hetccl_hello_t;

hetccl_hello_t hetccl_hello_make(uint64_t magic, const hetccl_transport_args_t *args);
/* Why a listener drops a connection that opens with h, or NULL if it may
 * join: another transport's or nobody's handshake, another communicator, or
 * a rank that does not connect here (only lower ranks p with use[p] set;
 * use NULL: any lower rank). */
const char *hetccl_hello_refusal(const hetccl_hello_t *h, uint64_t magic,
                                 const hetccl_transport_args_t *args, const uint8_t *use);

/* The note line (base/note_line.c), a TCP connection per pair that carries
 * only a failure note. send: leaves `why` on fd without blocking (the line
 * carried nothing before, so it fits the socket buffer), shuts our side
 * and drains the peer's; the caller then closes fd (`peer`, as the user
 * numbers it, only names it in a message). read: 1 and the note
 * in *out if the peer left a whole one, waiting at most wait_ms for it or
 * the line's end; 0 otherwise. */
void hetccl_note_line_send(int fd, const hetccl_fail_note_t *why, const char *transport,
                           int peer);
int hetccl_note_line_read(int fd, int wait_ms, hetccl_fail_note_t *out);

#endif
