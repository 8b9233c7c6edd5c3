/* The host engine's point-to-point plane, as the algorithms see it.
 *
 * An engine is one communicator's set of connected transport endpoints. The
 * algorithms (algo/) post sends and receives to peer ranks and wait on them;
 * they never see which transport carries a peer. Every request posted while
 * an operation runs carries that operation's signature as its tag, so a
 * peer that runs a different operation is detected (transport.h).
 *
 * Threads: an engine is driven by one thread at a time (the API caller for
 * a blocking host call, or the communicator's proxy thread). */
#ifndef HETCCL_P2P_ENGINE_H
#define HETCCL_P2P_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/transport.h"

typedef struct hetccl_engine hetccl_engine_t;

int hetccl_engine_rank(const hetccl_engine_t *e);
int hetccl_engine_nranks(const hetccl_engine_t *e);

/* What an operation stamps on each message it sends (the engine copies it
 * into the request): its signature, which the receiving side checks
 * against its own (0: unchecked; receives take theirs as an argument), and
 * whether the receive that matches may pull the send straight from its
 * buffer. pull_ok 1 where that receive copies (send/recv, gathers,
 * broadcasts, all-to-all); 0 where it consumes as the bytes land
 * (reductions), unless the receiver reduces what it reads (pull_rs.c). A
 * transport pulls (shm: process_vm_readv) only large sends
 * (hetccl_engine_pull_min), which saves a copy but ties the send's
 * completion to the receiver. */
typedef struct hetccl_msg {
  uint64_t tag;
  int pull_ok;
} hetccl_msg_t;

/* Post a send of `bytes` from buf to peer. Never blocks. req is caller-owned
 * and must stay untouched until completed by hetccl_engine_wait. */
ncclResult_t hetccl_engine_isend(hetccl_engine_t *e, int peer, const void *buf, size_t bytes,
                                 hetccl_msg_t m, hetccl_req_t *req);
/* The same for a source in device memory that the pair's transport reads
 * itself (hetccl_engine_reaches said so for these bytes): no CPU reads it. */
ncclResult_t hetccl_engine_isend_device(hetccl_engine_t *e, int peer, const void *buf,
                                        size_t bytes, hetccl_msg_t m, hetccl_req_t *req);
/* 1 if the transport of the pair (me, peer) reads (recv 0) or writes
 * (recv 1) [buf, buf + bytes) of device memory itself (transport.h:
 * ctx_reaches), so that a send from it, or a receive into it, needs no
 * staging; buf NULL: whether it would, for device memory registered for
 * it (a staging block). Any thread. */
int hetccl_engine_reaches(const hetccl_engine_t *e, int peer, const void *buf, size_t bytes,
                          int recv);
/* Post a receive of a message signed `tag`; consume NULL = copy into buf,
 * else consume(ctx, dst, src, n) per received piece (e.g.
 * hetccl_reduce_consume to reduce into buf). */
ncclResult_t hetccl_engine_irecv(hetccl_engine_t *e, int peer, void *buf, size_t bytes,
                                 uint64_t tag, hetccl_consume_fn consume, void *consume_ctx,
                                 hetccl_req_t *req);
/* A plain receive into device memory that the pair's transport writes
 * itself (hetccl_engine_reaches with recv 1 said so for these bytes): no
 * CPU writes it. */
ncclResult_t hetccl_engine_irecv_device(hetccl_engine_t *e, int peer, void *buf, size_t bytes,
                                        uint64_t tag, hetccl_req_t *req);

/* Progress everything until all n requests are done. Bounded by the
 * communicator timeout and abort flag; spins HETCCL_SPIN polls, then yields,
 * then sleeps up to HETCCL_IDLE_NAP microseconds at a time (engine.c).
 * On error, the communicator is marked failed and the error (naming the
 * peer) is returned; later calls return it too. */
ncclResult_t hetccl_engine_wait(hetccl_engine_t *e, hetccl_req_t **reqs, int n);
/* The same until at least one of them is done (at once where none is
 * pending; NULL entries are skipped): for a caller with several requests
 * whose next work depends on whichever finishes first (sched/sched_host.c). */
ncclResult_t hetccl_engine_wait_any(hetccl_engine_t *e, hetccl_req_t **reqs, int n);

/* One sweep over every peer's requests, waiting for none: for a caller
 * that polls requests of its own between other work (the data plane's
 * bridges, plane/bridge.c). *idle: nothing moved. Errors as
 * hetccl_engine_wait (the engine fails; abort is checked too); no timeout
 * here: the caller keeps its own. */
ncclResult_t hetccl_engine_progress(hetccl_engine_t *e, int *idle);

/* Convenience: post send to `to` and receive from `from` (both as m says),
 * wait both. Either peer may be -1 (skipped). */
ncclResult_t hetccl_engine_sendrecv(hetccl_engine_t *e, hetccl_msg_t m, int to, const void *sbuf,
                                    size_t sbytes, int from, void *rbuf, size_t rbytes,
                                    hetccl_consume_fn consume, void *consume_ctx);

/* A scratch buffer of at least `bytes`, owned by the engine, reused across
 * operations (valid until the next call to this function). NULL on OOM (a
 * WARN is logged). */
void *hetccl_engine_scratch(hetccl_engine_t *e, size_t bytes);

/* The signature ring, for operations where ranks that disagree might
 * otherwise never meet a receive that checks them (a rooted collective
 * whose ranks name different roots: two "roots" that only send, or only
 * wait). post sends an empty message carrying the operation's signature to
 * rank + 1 and receives one from rank - 1; call it before the operation's
 * own messages, and token_wait after them. Any disagreement between
 * neighbours, hence any at all, fails a receive as ncclInvalidUsage.
 * Nothing is sent when signatures are off (tag 0) or on one rank. */
ncclResult_t hetccl_engine_token_post(hetccl_engine_t *e, uint64_t tag);
ncclResult_t hetccl_engine_token_wait(hetccl_engine_t *e);

/* --- used by the core only (comm.c, group.c) ----------------------------- */

typedef struct hetccl_engine_args {
  int rank, nranks;                     /* the communicator's numbering: peers, indices */
  /* How the user numbers this communicator's ranks, for messages only
   * (as hetccl_transport_args_t.user_ranks, and the same table): NULL =
   * as the communicator does. The owner's, valid until the engine is
   * destroyed; the engine hands it to nothing. */
  const int32_t *user_ranks;
  hetccl_ep_t **eps;                    /* nranks entries, NULL for self */
  const hetccl_transport_t **transports; /* per peer, NULL for self */
  hetccl_tctx_t **ctxs;                 /* per transport id, NULL if unused; the
                                           endpoints use them until closed */
  int timeout_ms;
  int spin;                             /* idle polls before yielding */
  int idle_yield_us;                    /* then how long it yields before sleeping */
  volatile int *abort_flag;
  volatile int *comm_error;             /* sticky error of the owner */
  hetccl_fail_note_t *peer_note;        /* the transports' args->peer_note (owner's) */
  hetccl_tag_mismatch_t *mismatch;      /* the transports' args->mismatch (owner's) */
  /* Reads a message signature back for the mismatch message ("AllReduce(
   * float, sum, count 4096, operation #3)"); the owner knows the layout. */
  void (*describe_tag)(uint64_t tag, char *buf, size_t len);
  /* Connections on first use (p2p/connect.c): a peer with a NULL endpoint
   * whose transport has ep_open is connected when an operation first
   * sends to it or receives from it. peer_addrs: nranks blobs of
   * HETCCL_TRANSPORT_ADDR_BYTES, what each peer published for its
   * transport; localities: nranks entries. Both copied; NULL when every
   * peer is connected already. */
  const uint8_t *peer_addrs;
  const hetccl_peer_locality_t *localities;
} hetccl_engine_args_t;

/* Takes ownership of eps and ctxs (destroy closes every endpoint, then the
 * contexts); copies the arrays. */
ncclResult_t hetccl_engine_create(const hetccl_engine_args_t *args, hetccl_engine_t **out);
void hetccl_engine_destroy(hetccl_engine_t *e);

/* Fail the engine from outside its operations, as its own first error
 * would (connections closed, each peer left a note with `why`): a sibling
 * communicator failed (core/hier.c). On the thread that drives it. */
ncclResult_t hetccl_engine_fail(hetccl_engine_t *e, ncclResult_t res, const char *why);

/* Peers with a ready endpoint (connected at init or on first use). */
int hetccl_engine_connected(const hetccl_engine_t *e);

/* Tuning read from knobs at engine creation. */
size_t hetccl_engine_pipeline_chunk(const hetccl_engine_t *e);
size_t hetccl_engine_small_bytes(const hetccl_engine_t *e);
/* Sends with pull_ok larger than this are pulled by the receiver from every
 * peer (the largest of the transports' pull_min over all peers; SIZE_MAX
 * if some peer never pulls). */
size_t hetccl_engine_pull_min(const hetccl_engine_t *e);

#endif
