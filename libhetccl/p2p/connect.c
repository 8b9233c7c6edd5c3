/* Connections on first use (docs/scale.md).
 *
 * Contract. Init connects no data transport that can connect one pair at a
 * time (transport.h, ep_open); a pair connects when an operation first
 * posts a send or a receive between them. So a ring AllReduce connects a
 * rank to its two neighbours, a tree to its parent and children, and only
 * AlltoAll-like operations (or send/recv to every peer) connect them all.
 * The engine opens the endpoint and keeps the requests posted to it, in
 * order per direction, until the transport says it is ready; the progress
 * sweep advances every pending connection with the connected peers, so an
 * operation never waits on one pair while another needs it. The two ends
 * agree without a third party: the lower rank of a pair initiates, the
 * higher takes what arrives (each transport says how).
 *
 * Failures. A peer on this host that exits before its connection is made
 * is ncclRemoteError naming it (looked at every LIVENESS_MS while one is
 * pending); a lower rank that comes to a higher one that is gone finds
 * nothing listening (socket, ib) or its segment gone (shm), also naming
 * it. When this engine fails, every context is told (ctx_fail), so that a
 * peer that was never connected and comes later reads the note, as a
 * connected one would. A higher rank on another host waiting for a lower
 * one that was killed is told by the transport, which probes the lower
 * rank's listener (socket: transport/base/probe.h); the engine cannot, as
 * the address is the transport's. What remains: a lower rank that lives
 * but is wedged (stopped, or in a loop that never calls us) is waited for
 * until HETCCL_TIMEOUT, as a connected one would be.
 *
 * HETCCL_RUNTIME_CONNECT=0 (or NCCL_RUNTIME_CONNECT=0) makes init connect
 * every pair as before (core/init.c); then nothing here runs.
 *
 * Thread: whichever thread drives the engine (engine.h); no locks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "p2p/engine_impl.h"
#include "util/check.h"
#include "util/log.h"
#include "util/proc.h"

#define LIVENESS_MS 100

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int hetccl_engine_tid(const hetccl_engine_t *e, int peer) {
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (hetccl_transport_get((hetccl_transport_id_t)t) == e->tp[peer]) return t;
  return 0;
}

ncclResult_t hetccl_engine_conn_init(hetccl_engine_t *e, const hetccl_engine_args_t *a) {
  int n = a->nranks, lazy = 0;
  if (!a->peer_addrs || !a->localities || !a->transports) return ncclSuccess;
  for (int p = 0; p < n; p++)
    lazy |= p != a->rank && !e->eps[p] && e->tp[p] && e->tp[p]->ep_open;
  if (!lazy) return ncclSuccess;
  e->peers = calloc(n, sizeof(*e->peers));
  e->addrs = malloc((size_t)n * HETCCL_TRANSPORT_ADDR_BYTES);
  e->locs = malloc((size_t)n * sizeof(*e->locs));
  e->connecting = malloc((size_t)n * sizeof(int));
  if (!e->peers || !e->addrs || !e->locs || !e->connecting) {
    WARN("engine: out of memory for %d peers connected on first use", n);
    hetccl_engine_conn_free(e);
    return ncclSystemError;
  }
  memcpy(e->addrs, a->peer_addrs, (size_t)n * HETCCL_TRANSPORT_ADDR_BYTES);
  memcpy(e->locs, a->localities, (size_t)n * sizeof(*e->locs));
  for (int p = 0; p < n; p++) {
    e->peers[p].lazy = p != a->rank && !e->eps[p] && e->tp[p] && e->tp[p]->ep_open;
    e->peers[p].state = e->eps[p] ? HETCCL_PEER_READY : HETCCL_PEER_NONE;
  }
  return ncclSuccess;
}

void hetccl_engine_conn_free(hetccl_engine_t *e) {
  free(e->peers);
  free(e->addrs);
  free(e->locs);
  free(e->connecting);
  e->peers = NULL;
  e->addrs = NULL;
  e->locs = NULL;
  e->connecting = NULL;
  e->nconnecting = 0;
}

int hetccl_engine_conn_lazy(const hetccl_engine_t *e, int peer) {
  return e->peers && e->peers[peer].lazy;
}

static int user_rank(const hetccl_engine_t *e, int r) { return hetccl_user_rank(e->user_ranks, r); }

static ncclResult_t conn_open(hetccl_engine_t *e, int peer) {
  hetccl_engine_peer_t *pp = &e->peers[peer];
  int t = hetccl_engine_tid(e, peer);
  hetccl_ep_t *ep = NULL;
  TRACE(HETCCL_INIT | HETCCL_NET, "engine: rank %d connects to rank %d (%s) on first use",
        user_rank(e, e->rank), user_rank(e, peer), e->tp[peer]->name);
  HETCCL_CHECK(e->tp[peer]->ep_open(e->ctxs[t], peer,
                                    e->addrs + (size_t)peer * HETCCL_TRANSPORT_ADDR_BYTES,
                                    &e->locs[peer], &ep));
  e->eps[peer] = ep;
  pp->state = HETCCL_PEER_CONNECTING;
  pp->since_ms = pp->checked_ms = now_ms();
  e->connecting[e->nconnecting++] = peer;
  return ncclSuccess;
}

ncclResult_t hetccl_engine_conn_queue(hetccl_engine_t *e, int peer, hetccl_req_t *req,
                                      int is_send) {
  hetccl_engine_peer_t *pp = &e->peers[peer];
  if (pp->state == HETCCL_PEER_NONE) HETCCL_CHECK(conn_open(e, peer));
  req->next = NULL;
  hetccl_req_t **first = is_send ? &pp->sfirst : &pp->rfirst;
  hetccl_req_t **last = is_send ? &pp->slast : &pp->rlast;
  if (*last) (*last)->next = req;
  else *first = req;
  *last = req;
  return ncclSuccess;
}

/* Ready: the queued requests go to the endpoint, each direction in order. */
static ncclResult_t conn_ready(hetccl_engine_t *e, int peer) {
  hetccl_engine_peer_t *pp = &e->peers[peer];
  pp->state = HETCCL_PEER_READY;
  e->active[e->nactive++] = peer;
  e->nconnected++;
  INFO(HETCCL_NET, "engine: rank %d connected to rank %d (%s) on first use, after %lld ms; "
       "%d peers connected", user_rank(e, e->rank), user_rank(e, peer), e->tp[peer]->name,
       (long long)(now_ms() - pp->since_ms), e->nconnected);
  for (hetccl_req_t *r = pp->sfirst, *next; r; r = next) {
    next = r->next;
    HETCCL_CHECK(e->tp[peer]->isend(e->eps[peer], r));
  }
  for (hetccl_req_t *r = pp->rfirst, *next; r; r = next) {
    next = r->next;
    HETCCL_CHECK(e->tp[peer]->irecv(e->eps[peer], r));
  }
  pp->sfirst = pp->slast = pp->rfirst = pp->rlast = NULL;
  return ncclSuccess;
}

static ncclResult_t conn_check_peer(hetccl_engine_t *e, int peer) {
  hetccl_engine_peer_t *pp = &e->peers[peer];
  int64_t t = now_ms();
  if (t - pp->checked_ms < LIVENESS_MS) return ncclSuccess;
  pp->checked_ms = t;
  /* Pids mean something only on this host (same host hash: same IPC and
   * boot, and in practice the same pid namespace). */
  if (e->locs[peer].host_hash != e->locs[e->rank].host_hash ||
      hetccl_proc_alive(e->locs[peer].pid, 0))
    return ncclSuccess;
  WARN("engine: rank %d (pid %d) exited before its connection to rank %d was made (%lld ms "
       "after rank %d began to connect)", user_rank(e, peer), e->locs[peer].pid,
       user_rank(e, e->rank), (long long)(t - pp->since_ms), user_rank(e, e->rank));
  return ncclRemoteError;
}

ncclResult_t hetccl_engine_conn_progress(hetccl_engine_t *e, int *idle) {
  for (int i = 0; i < e->nconnecting;) {
    int peer = e->connecting[i], ready = 0;
    HETCCL_CHECK(e->tp[peer]->ep_ready(e->eps[peer], &ready));
    if (!ready) {
      HETCCL_CHECK(conn_check_peer(e, peer));
      i++;
      continue;
    }
    e->connecting[i] = e->connecting[--e->nconnecting];
    *idle = 0;
    HETCCL_CHECK(conn_ready(e, peer));
  }
  return ncclSuccess;
}

/* This rank failed before it made its connections to some higher ranks:
 * where the lower rank connects (transport.h, lower_connects), it connects
 * now only to leave its note, so that a higher rank waiting for it hears
 * why at once, as a connected one would, instead of when this process
 * exits. Best effort: a peer that cannot be reached (it failed and left
 * too) is logged and left alone, and this thread's last error stays the
 * failure's own. */
static void conn_fail_notify(hetccl_engine_t *e, const hetccl_fail_note_t *note) {
  char kept[1024];
  snprintf(kept, sizeof(kept), "%s", hetccl_last_error());
  for (int p = e->rank + 1; p < e->nranks; p++) {
    const hetccl_transport_t *tp = e->tp[p];
    if (!e->peers[p].lazy || e->eps[p] || !tp || !tp->lower_connects || !tp->ep_fail) continue;
    hetccl_ep_t *ep = NULL;
    int t = hetccl_engine_tid(e, p);
    if (tp->ep_open(e->ctxs[t], p, e->addrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
                    &e->locs[p], &ep) != ncclSuccess || !ep)
      continue;
    tp->ep_fail(ep, note);
  }
  hetccl_last_error_set(kept);
}

void hetccl_engine_conn_fail(hetccl_engine_t *e, const hetccl_fail_note_t *note) {
  if (!e->peers) return;
  e->nconnecting = 0;
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    const hetccl_transport_t *tp = hetccl_transport_get((hetccl_transport_id_t)t);
    if (e->ctxs[t] && tp && tp->ctx_fail) tp->ctx_fail(e->ctxs[t], note);
  }
  if (note) conn_fail_notify(e, note);
  for (int p = 0; p < e->nranks; p++) {
    e->peers[p].lazy = 0; /* nothing connects any more: peer_check refuses */
    e->peers[p].sfirst = e->peers[p].slast = e->peers[p].rfirst = e->peers[p].rlast = NULL;
  }
}
