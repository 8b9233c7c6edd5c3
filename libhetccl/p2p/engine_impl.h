/* The engine's state, shared by its two files (p2p/ only; not an
 * interface): engine.c posts, waits and fails; connect.c makes the
 * connections that were not made at init, on first use.
 *
 * Thread: whichever thread drives the engine (engine.h). */
#ifndef HETCCL_P2P_ENGINE_IMPL_H
#define HETCCL_P2P_ENGINE_IMPL_H

#include "p2p/engine.h"

enum { HETCCL_PEER_NONE = 0, HETCCL_PEER_CONNECTING, HETCCL_PEER_READY };

/* A peer connected on first use: its state and the requests posted to it
 * before its endpoint was ready (each direction in posting order, linked
 * through req->next until handed to the transport). */
typedef struct hetccl_engine_peer {
  uint8_t state;
  uint8_t lazy;          /* its transport connects on first use */
  hetccl_req_t *sfirst, *slast, *rfirst, *rlast;
  int64_t since_ms;      /* when connecting began */
  int64_t checked_ms;    /* last look at whether the peer still runs */
} hetccl_engine_peer_t;

struct hetccl_engine {
  int rank, nranks;
  const int32_t *user_ranks; /* for messages (engine.h) */
  hetccl_ep_t **eps;
  const hetccl_transport_t **tp;
  hetccl_tctx_t *ctxs[HETCCL_TRANSPORT_COUNT];
  int *active;       /* peers with an endpoint, for the progress sweep */
  int nactive;
  int timeout_ms;
  int spin;
  int nap_us; /* HETCCL_IDLE_NAP: the longest sleep of an idle wait; 0 yields only */
  int64_t yield_ns; /* HETCCL_IDLE_YIELD: how long an idle wait yields before it sleeps */
  volatile int *abort_flag;
  volatile int *comm_error;
  hetccl_fail_note_t *peer_note; /* the first note a peer left us (transports write it) */
  hetccl_tag_mismatch_t *mismatch; /* the first signature mismatch (transports write it) */
  void (*describe_tag)(uint64_t tag, char *buf, size_t len);
  hetccl_req_t tok_send, tok_recv; /* the signature ring (hetccl_engine_token_*) */
  int tok_posted;
  ncclResult_t failed;
  void *scratch;
  size_t scratch_bytes;
  size_t pipeline_chunk, small_bytes;
  size_t pull_min; /* hetccl_engine_pull_min */
  /* Connections on first use (connect.c): peers whose transport can
   * connect one pair at a time start without an endpoint. */
  hetccl_engine_peer_t *peers;     /* per peer; NULL when every peer was connected at init */
  uint8_t *addrs;                  /* per peer: the blob it published for its transport */
  hetccl_peer_locality_t *locs;    /* per rank */
  int *connecting;                 /* peers whose endpoint is not ready yet */
  int nconnecting;
  int nconnected;                  /* peers with a ready endpoint (debug counter) */
  /* The trace: when the last message on each lane (peer x send, receive)
   * was seen done, so that messages in flight together are drawn one after
   * the other; allocated at the first traced message. */
  uint64_t *trace_lane_end;
};

/* connect.c */
/* The transport id of peer's transport (its context is e->ctxs[id]). */
int hetccl_engine_tid(const hetccl_engine_t *e, int peer);
/* Copies the lazy part of args; every peer with a NULL endpoint whose
 * transport has ep_open waits for its first use. */
ncclResult_t hetccl_engine_conn_init(hetccl_engine_t *e, const hetccl_engine_args_t *a);
void hetccl_engine_conn_free(hetccl_engine_t *e);
/* Whether peer is one to connect on first use (and not failed). */
int hetccl_engine_conn_lazy(const hetccl_engine_t *e, int peer);
/* A request for a peer without a ready endpoint: start connecting if not
 * yet, and queue it (send or receive) until the endpoint is ready. */
ncclResult_t hetccl_engine_conn_queue(hetccl_engine_t *e, int peer, hetccl_req_t *req,
                                      int is_send);
/* Advance every pending connection; hand queued requests to endpoints that
 * became ready. *idle = 0 if one did. An error names the peer. */
ncclResult_t hetccl_engine_conn_progress(hetccl_engine_t *e, int *idle);
/* The engine failed: every context learns why (ctx_fail), for peers that
 * were never connected. */
void hetccl_engine_conn_fail(hetccl_engine_t *e, const hetccl_fail_note_t *note);

#endif
