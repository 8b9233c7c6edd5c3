/* The engine's transports for a communicator (transports.h): the choice
 * per pair, its log lines, and connecting them. Thread: where init runs. */
#include "comm/transports.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/transport.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

/* How long a host rank's idle wait yields before it sleeps, HETCCL_IDLE_YIELD
 * unset, where the host has a CPU for each of its ranks (a GPU rank's: the
 * knob's 1 ms, which covers a small collective of the GPU, 100-250 us on
 * the H100). A host rank's peers are CPUs, and the threads beside it
 * (torch's compute under DDP) want the core its wait holds while it
 * yields. DDP step against gloo, paired medians of 3 launches, 1000 / 200
 * us: 16-core machine n = 4 1.08 / 1.14, n = 8 1.06 / 1.07; 2-core machine
 * n = 2 1.21 / 1.26; the C library's operations of 1 KiB-1 MiB at 8 and 16
 * ranks (16 cores) and at 2 (2 cores) within each other's spread
 * (docs/measurements.md, "Yielding for 200 us"). With more ranks than
 * CPUs, where a yield is what lets the awaited peer run, 200 us made 1 KiB
 * operations at 3 and 4 ranks on 2 cores 4-14 % slower (12 alternations),
 * so those keep 1 ms. 0 (sleep at once) made two ranks on 2 cores sleep in
 * turn on every small operation (30-50 us for 16 KiB, against 1-3). */
enum { HOST_IDLE_YIELD_US = 200 };

int hetccl_transports_ib_wanted(void) {
  return hetccl_knob_enum(HETCCL_KNOB_TRANSPORT) == HETCCL_KNOB_TRANSPORT_auto &&
         !hetccl_knob_int(HETCCL_KNOB_IB_DISABLE);
}

int hetccl_transports_ib_usable(void) {
  const hetccl_transport_t *ib = hetccl_transport_get(HETCCL_TRANSPORT_ib);
  return ib && (!ib->usable || ib->usable());
}

/* HETCCL_TRANSPORT: the transport it names, HETCCL_TRANSPORT_COUNT for
 * auto. Every transport is a word of the knob (a transport added to
 * HETCCL_TRANSPORTS without one does not compile). */
static hetccl_transport_id_t transport_forced(void) {
  switch (hetccl_knob_enum(HETCCL_KNOB_TRANSPORT)) {
#define TRANSPORT_WORD(name, sym)                                              \
  case HETCCL_KNOB_TRANSPORT_##name: return HETCCL_TRANSPORT_##name;
    HETCCL_TRANSPORTS(TRANSPORT_WORD)
#undef TRANSPORT_WORD
    default: return HETCCL_TRANSPORT_COUNT;
  }
}

/* The transport of the pair (a, b): a pure function of what both
 * published, so both ends choose alike. Forced (HETCCL_TRANSPORT=name):
 * that one for every pair, and init fails where it cannot serve (ib's
 * ctx_create names what it found). auto: shm on one host; else ib where
 * both have an active port (fill_info asks only when ib is wanted), else
 * socket. */
static hetccl_transport_id_t pair_transport(const hetccl_peer_info_t *a,
                                            const hetccl_peer_info_t *b,
                                            hetccl_transport_id_t forced) {
  if (forced != HETCCL_TRANSPORT_COUNT) return forced;
  if (a->host_hash == b->host_hash) return HETCCL_TRANSPORT_shm;
  return a->ib_usable && b->ib_usable ? HETCCL_TRANSPORT_ib : HETCCL_TRANSPORT_socket;
}

/* One INFO line per communicator (rank 0's): how many pairs each
 * transport serves, and under auto the ranks on another host than some
 * peer that had no active ib port, whose pairs went to socket. */
static void log_pairs(ncclComm_t comm, hetccl_transport_id_t forced) {
  if (comm->rank != 0 || !HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_INIT | HETCCL_NET)) return;
  int n = comm->nranks, pairs[HETCCL_TRANSPORT_COUNT] = {0};
  char line[256] = "", noib[160] = "";
  size_t used = 0, nused = 0;
  int nnoib = 0;
  for (int a = 0; a < n; a++) {
    int remote = 0;
    for (int b = 0; b < n; b++) {
      remote |= comm->boot.peers[a].host_hash != comm->boot.peers[b].host_hash;
      if (b > a) pairs[pair_transport(&comm->boot.peers[a], &comm->boot.peers[b], forced)]++;
    }
    if (forced == HETCCL_TRANSPORT_COUNT && hetccl_transports_ib_wanted() && remote &&
        !comm->boot.peers[a].ib_usable) {
      if (nnoib++ < 8 && nused < sizeof(noib))
        nused += (size_t)snprintf(noib + nused, sizeof(noib) - nused, "%s%d",
                                  nnoib > 1 ? "," : "", hetccl_user_rank(comm->user_ranks, a));
      else if (nnoib == 9 && nused < sizeof(noib))
        nused += (size_t)snprintf(noib + nused, sizeof(noib) - nused, ",...");
    }
  }
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT && used < sizeof(line); t++)
    used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%s %d", t ? ", " : "",
                             hetccl_transport_get((hetccl_transport_id_t)t)->name, pairs[t]);
  int disabled = forced == HETCCL_TRANSPORT_COUNT && hetccl_knob_int(HETCCL_KNOB_IB_DISABLE);
  INFO(HETCCL_INIT | HETCCL_NET,
       "comm %016llx of %d ranks: pairs by transport: %s (HETCCL_TRANSPORT=%s%s%s%s)",
       (unsigned long long)comm->comm_id, n, line, hetccl_knob_str(HETCCL_KNOB_TRANSPORT),
       disabled ? ", NCCL_IB_DISABLE=1" : "", nnoib ? "; no active ib port on ranks " : "",
       nnoib ? noib : "");
}

/* HETCCL_RUNTIME_CONNECT, else NCCL_RUNTIME_CONNECT (the same meaning). */
static int runtime_connect(void) {
  return (int)hetccl_knob_int(
      hetccl_knob_or_nccl(HETCCL_KNOB_RUNTIME_CONNECT, HETCCL_KNOB_NCCL_RUNTIME_CONNECT));
}

static hetccl_transport_id_t transport_id_of(const hetccl_transport_t *tp) {
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (hetccl_transport_get((hetccl_transport_id_t)t) == tp) return (hetccl_transport_id_t)t;
  return HETCCL_TRANSPORT_COUNT;
}

ncclResult_t hetccl_transports_connect(ncclComm_t comm, uint64_t secret) {
  uint64_t comm_id = comm->comm_id;
  int n = comm->nranks, me = comm->rank;
  ncclResult_t res = ncclSuccess;
  hetccl_transport_id_t forced = transport_forced();
  uint8_t *use = calloc((size_t)HETCCL_TRANSPORT_COUNT * n, 1);
  uint8_t *addrs = calloc((size_t)n * HETCCL_TRANSPORT_COUNT, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *mine = calloc(HETCCL_TRANSPORT_COUNT, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *taddrs = calloc(n, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *peer_addrs = calloc(n, HETCCL_TRANSPORT_ADDR_BYTES);
  hetccl_peer_locality_t *loc = calloc(n, sizeof(*loc));
  hetccl_ep_t **eps = calloc(n, sizeof(*eps));
  hetccl_ep_t **teps = calloc(n, sizeof(*teps));
  const hetccl_transport_t **tps = calloc(n, sizeof(*tps));
  hetccl_tctx_t *ctx[HETCCL_TRANSPORT_COUNT] = {0};
  int used[HETCCL_TRANSPORT_COUNT] = {0};
  if (!use || !addrs || !mine || !taddrs || !peer_addrs || !loc || !eps || !teps || !tps) {
    WARN("engine init: out of memory for %d ranks", n);
    res = ncclSystemError;
    goto out;
  }
  for (int p = 0; p < n; p++) {
    loc[p].host_hash = comm->boot.peers[p].host_hash;
    loc[p].pid = comm->boot.peers[p].pid;
  }
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    hetccl_transport_id_t t = pair_transport(&comm->boot.peers[me], &comm->boot.peers[p], forced);
    const hetccl_transport_t *tp = hetccl_transport_get(t);
    if (!tp) { /* the registry logged which slot is missing */
      res = ncclInternalError;
      goto out;
    }
    if (!tp->can_connect(&loc[me], &loc[p])) {
      WARN("transport %s cannot connect rank %d (%s) to rank %d (%s)", tp->name, me,
           comm->boot.peers[me].hostname, p, comm->boot.peers[p].hostname);
      res = ncclInvalidUsage;
      goto out;
    }
    use[t * n + p] = 1;
    used[t] = 1;
    tps[p] = tp;
  }
  log_pairs(comm, forced);
  /* More ranks of ours on this host than CPUs: the CPUs, not the memory,
   * are what the ranks wait on (see the spin and HETCCL_SHM_CMA defaults). */
  int local = 0;
  for (int p = 0; p < n; p++)
    local += comm->boot.peers[p].host_hash == comm->boot.peers[me].host_hash;
  long ncpu = hetccl_host_cpus();
  int oversubscribed = ncpu > 0 && local > ncpu;
  hetccl_transport_args_t args = {
      .rank = me, .nranks = n, .comm_id = comm_id, .secret = secret,
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000,
      .abort_flag = &comm->state.abort_flag,
      .ifname = hetccl_knob_str(HETCCL_KNOB_SOCKET_IFNAME), .peer_note = &comm->engine.peer_note,
      .mismatch = &comm->engine.mismatch,
      .local_ranks = local,
      .user_ranks = comm->user_ranks,
      .device = comm->ptr_kind == HETCCL_DEV_HOST ? NULL : hetccl_runtime_get(comm->ptr_kind),
      .busid = comm->busid};
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    if (!used[t]) continue;
    args.copied = &comm->engine.copied[t];
    HETCCL_CHECK_GOTO(hetccl_transport_get(t)->ctx_create(&args, &ctx[t],
                                                          mine + t * HETCCL_TRANSPORT_ADDR_BYTES),
                      res, out);
  }
  size_t blob = (size_t)HETCCL_TRANSPORT_COUNT * HETCCL_TRANSPORT_ADDR_BYTES;
  HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(comm->boot.links, mine, addrs, blob), res, out);
  /* Connections on first use (p2p/connect.c): a transport that can make
   * them connects nothing here; the engine keeps each peer's address. */
  int lazy = runtime_connect();
  for (int p = 0; p < n; p++)
    if (tps[p])
      memcpy(taddrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
             addrs + p * blob + (size_t)transport_id_of(tps[p]) * HETCCL_TRANSPORT_ADDR_BYTES,
             HETCCL_TRANSPORT_ADDR_BYTES);
  if (lazy) memcpy(peer_addrs, taddrs, (size_t)n * HETCCL_TRANSPORT_ADDR_BYTES);
  /* Same order on every rank, so no rank waits on a transport its peer has
   * not reached yet. */
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    if (!used[t] || (lazy && hetccl_transport_get(t)->ep_open)) continue;
    for (int p = 0; p < n; p++)
      memcpy(taddrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
             addrs + p * blob + (size_t)t * HETCCL_TRANSPORT_ADDR_BYTES, HETCCL_TRANSPORT_ADDR_BYTES);
    memset(teps, 0, n * sizeof(*teps));
    HETCCL_CHECK_GOTO(hetccl_transport_get(t)->connect(ctx[t], use + t * n, taddrs, loc, teps),
                      res, out);
    for (int p = 0; p < n; p++)
      if (use[t * n + p]) eps[p] = teps[p];
  }
  /* Oversubscribed: a spinning rank only delays the peer it waits for, so
   * yield at once unless HETCCL_SPIN says otherwise. */
  int spin = (int)hetccl_knob_int(HETCCL_KNOB_SPIN);
  if (oversubscribed && !hetccl_knob_is_set(HETCCL_KNOB_SPIN)) spin = 0;
  int idle_yield_us = (int)hetccl_knob_int(HETCCL_KNOB_IDLE_YIELD);
  if (comm->dev_kind == HETCCL_DEV_HOST && !oversubscribed &&
      !hetccl_knob_is_set(HETCCL_KNOB_IDLE_YIELD))
    idle_yield_us = HOST_IDLE_YIELD_US;
  hetccl_engine_args_t eargs = {
      .rank = me, .nranks = n, .eps = eps, .transports = tps,
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_TIMEOUT) * 1000, .spin = spin,
      .idle_yield_us = idle_yield_us,
      .abort_flag = &comm->state.abort_flag, .comm_error = &comm->state.error, .ctxs = ctx,
      .peer_note = &comm->engine.peer_note, .mismatch = &comm->engine.mismatch,
      .describe_tag = hetccl_comm_tag_describe, .user_ranks = comm->user_ranks,
      .peer_addrs = lazy ? peer_addrs : NULL, .localities = loc};
  HETCCL_CHECK_GOTO(hetccl_engine_create(&eargs, &comm->engine.p2p), res, out);
  int stages = (int)hetccl_knob_int(HETCCL_KNOB_STAGE_PIECE_HOST);
  for (int p = 0; p < n; p++) stages |= comm->boot.peers[p].stages;
  comm->engine.stage_piece = stages ? (size_t)hetccl_knob_int(HETCCL_KNOB_STAGE_PIECE) : 0;
  /* The engine owns endpoints and contexts now. */
  memset(eps, 0, n * sizeof(*eps));
  memset(ctx, 0, sizeof(ctx));
  char mine_line[128] = "";
  size_t mused = 0;
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT && mused < sizeof(mine_line); t++) {
    int k = 0;
    for (int p = 0; p < n; p++) k += use[t * n + p];
    mused += (size_t)snprintf(mine_line + mused, sizeof(mine_line) - mused, "%s%s %d",
                              t ? ", " : "",
                              hetccl_transport_get((hetccl_transport_id_t)t)->name, k);
  }
  INFO(HETCCL_INIT,
       "rank %d of %d: engine ready (peers by transport: %s; %s; an idle wait polls %d times, "
       "yields %d us, then sleeps)",
       me, n, mine_line, lazy ? "pairs connect on first use" : "every pair connected at init",
       spin, idle_yield_us);
out:
  for (int p = 0; p < n && eps; p++)
    if (eps[p]) tps[p]->ep_close(eps[p]);
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (ctx[t]) hetccl_transport_get(t)->ctx_destroy(ctx[t]);
  free(use); free(addrs); free(mine); free(taddrs); free(peer_addrs); free(loc); free(eps);
  free(teps); free(tps);
  return res;
}
