/* Communicator life cycle, the beginning (init.h): create a communicator,
 * then init it in three steps: publish what this rank is (bootstrap),
 * decide the islands from what everyone published (every rank reaches the
 * same answer from the same table), then hand it to the backend that
 * serves it (backend.h): the vendor's library for one island, hetccl's
 * engine otherwise. Teardown is in teardown.c.
 *
 * Thread: create runs on the API thread (it captures the caller's device);
 * init where the caller puts it (the API thread, or a proxy for grouped
 * and nonblocking inits). */
#include "comm/init.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/backend.h"
#include "comm/identity.h"
#include "comm/islands.h"
#include "comm/transports.h"
#include "trace/trace.h"
#include "util/check.h"
#include "util/knob_check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- create ----------------------------------------------------------------- */

static ncclResult_t config_resolve(ncclComm_t comm, const ncclConfig_t *config) {
  ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  comm->config = def;
  comm->blocking = 1;
  if (!config) return ncclSuccess;
  if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize)) {
    WARN("ncclConfig_t not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x, size %zu)",
         config->magic, config->size);
    return ncclInvalidArgument;
  }
  /* Older callers pass a smaller struct: copy what they have. */
  size_t n = config->size < sizeof(ncclConfig_t) ? config->size : sizeof(ncclConfig_t);
  memcpy(&comm->config, config, n);
  if (config->size <= sizeof(comm->user_config)) {
    memcpy(comm->user_config, config, config->size);
    comm->has_user_config = 1;
  }
  comm->config.size = sizeof(ncclConfig_t);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (config->blocking != 0 && config->blocking != 1) {
      WARN("ncclConfig_t.blocking = %d: must be 0 or 1", config->blocking);
      return ncclInvalidArgument;
    }
    comm->blocking = config->blocking;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_comm_create(int nranks, int rank, const ncclConfig_t *config,
                                hetccl_dev_kind_t kind, ncclComm_t *out) {
  ncclResult_t res = hetccl_knobs_check();
  if (res == ncclSuccess) res = hetccl_trace_setup();
  if (res != ncclSuccess) return res;
  ncclComm_t comm = calloc(1, sizeof(*comm));
  if (!comm) {
    WARN("ncclCommInitRank: out of memory");
    return ncclSystemError;
  }
  pthread_mutex_init(&comm->state.lock, NULL);
  comm->magic = HETCCL_COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->dev = -1;
  HETCCL_CHECK_GOTO(config_resolve(comm, config), res, fail);
  comm->dev_kind = kind == HETCCL_DEV_AUTO ? hetccl_process_dev_kind() : kind;
  comm->ptr_kind = comm->dev_kind;
  if (comm->ptr_kind == HETCCL_DEV_HOST) comm->ptr_kind = hetccl_host_pointer_kind();
  if (comm->dev_kind != HETCCL_DEV_HOST) {
    /* The runtime (or the registry, for a missing table) WARNed the cause
     * (a library missing, no device); this adds where, not a second line. */
    const hetccl_runtime_t *rt = hetccl_runtime_get(comm->dev_kind);
    res = rt ? rt->current_device(&comm->dev, comm->busid, sizeof(comm->busid))
             : ncclInternalError;
    if (res != ncclSuccess) {
      hetccl_last_error_prefix("ncclCommInitRank: cannot read the current %s device",
                               hetccl_dev_kind_name(comm->dev_kind));
      goto fail;
    }
  }
  /* Until init decides, the engine's table answers (backend.h). */
  comm->backend = hetccl_backend_get(HETCCL_BACKEND_engine);
  if (!comm->backend) { /* the check WARNed which slot is missing */
    res = ncclInternalError;
    goto fail;
  }
  HETCCL_CHECK_GOTO(hetccl_comm_register(comm), res, fail);
  *out = comm;
  return ncclSuccess;
fail:
  pthread_mutex_destroy(&comm->state.lock);
  free(comm);
  return res;
}

/* --- init ----------------------------------------------------------------- */

static ncclResult_t fill_info(ncclComm_t comm, hetccl_peer_info_t *me) {
  memset(me, 0, sizeof(*me));
  me->rank = comm->rank;
  me->pid = (int32_t)getpid();
  me->host_hash = hetccl_host_hash(me->hostname, sizeof(me->hostname));
  me->dev_kind = comm->dev_kind;
  me->dev = comm->dev;
  me->blocking = comm->blocking;
  me->user_rank = comm->boot.island_forced ? comm->self_user_rank : comm->rank;
  me->stages = comm->ptr_kind != HETCCL_DEV_HOST;
  me->ib_usable = hetccl_transports_ib_wanted() && hetccl_transports_ib_usable();
  if (comm->dev_kind != HETCCL_DEV_HOST) {
    /* Peers tell devices apart by bus id: never publish an empty one. */
    const hetccl_runtime_t *rt = hetccl_runtime_get(comm->dev_kind);
    int dev = -1;
    ncclResult_t res = rt ? rt->current_device(&dev, me->bus_id, sizeof(me->bus_id))
                          : ncclInternalError;
    if (res != ncclSuccess) {
      hetccl_last_error_prefix("rank %d: cannot read the bus id of its %s device %d", comm->rank,
                               hetccl_dev_kind_name(comm->dev_kind), comm->dev);
      return res;
    }
    hetccl_vendor_id_t vid;
    if (hetccl_dev_vendor(comm->dev_kind, &vid) && hetccl_knob_int(HETCCL_KNOB_VENDOR)) {
      const hetccl_vendor_t *v = NULL;
      if (hetccl_vendor_load(vid, &v) == ncclSuccess && v)
        me->vendor_version = v->version;
      else
        snprintf(me->vendor_err, sizeof(me->vendor_err), "%s", hetccl_last_error());
    }
  }
  if (comm->boot.island_forced || comm->boot.island_inherited) {
    me->island = comm->boot.island_force_id;
    return ncclSuccess;
  }
  return hetccl_islands_forced(comm, &me->island);
}

/* An internal communicator names its ranks in messages as the user does:
 * by their ranks in the communicator it serves. */
static ncclResult_t user_ranks_from_peers(ncclComm_t comm) {
  comm->user_ranks = malloc((size_t)comm->nranks * sizeof(*comm->user_ranks));
  if (!comm->user_ranks) {
    WARN("ncclCommInitRank: out of memory for %d ranks", comm->nranks);
    return ncclSystemError;
  }
  for (int r = 0; r < comm->nranks; r++) comm->user_ranks[r] = comm->boot.peers[r].user_rank;
  return ncclSuccess;
}

/* Several islands, so the engine serves: unless HETCCL_VENDOR=0 says so, a
 * GPU rank whose vendor library did not load is an error (its device
 * buffers would crawl through host memory), named with the library's own
 * reason. */
static ncclResult_t vendors_loaded(ncclComm_t comm) {
  for (int r = 0; r < comm->nranks; r++) {
    hetccl_vendor_id_t vid;
    const hetccl_peer_info_t *p = &comm->boot.peers[r];
    if (hetccl_dev_vendor((hetccl_dev_kind_t)p->dev_kind, &vid) && p->vendor_version == 0 &&
        hetccl_knob_int(HETCCL_KNOB_VENDOR)) {
      WARN("rank %d (%s) is a %s rank but could not load %s: %s. Point %s at a working %s, or "
           "set HETCCL_VENDOR=0 to run on hetccl's engine (device buffers staged through host "
           "memory, far slower than %s)", r, p->hostname,
           hetccl_dev_kind_name((hetccl_dev_kind_t)p->dev_kind), hetccl_vendor_title(vid),
           p->vendor_err, hetccl_knob_desc(hetccl_vendor_knob(vid))->env,
           hetccl_vendor_title(vid), hetccl_vendor_title(vid));
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

ncclResult_t hetccl_comm_init(ncclComm_t comm, const ncclUniqueId *id) {
  int n = comm->nranks;
  hetccl_peer_info_t me;
  HETCCL_CHECK(fill_info(comm, &me));
  comm->boot.peers = calloc(n, sizeof(*comm->boot.peers));
  if (!comm->boot.peers) {
    WARN("ncclCommInitRank: out of memory for %d ranks", n);
    return ncclSystemError;
  }
  comm->comm_id = hetccl_bootstrap_id_comm_id(id);
  hetccl_bootstrap_opts_t opts = {
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000,
      .abort_flag = &comm->state.abort_flag};
  /* Several ids (ncclCommInitRankScalable): id is the first, the rest
   * wait on the communicator. */
  int nids = comm->boot.nids > 1 ? comm->boot.nids : 1;
  ncclUniqueId *ids = &(ncclUniqueId){{0}};
  if (nids > 1) {
    if ((ids = malloc((size_t)nids * sizeof(*ids))) == NULL) {
      WARN("ncclCommInitRankScalable: out of memory for %d ids", nids);
      return ncclSystemError;
    }
    memcpy(&ids[1], comm->boot.ids, (size_t)(nids - 1) * sizeof(*ids));
  }
  ids[0] = *id;
  ncclResult_t bres = hetccl_bootstrap_init(ids, nids, comm->rank, n, &me, sizeof(me),
                                            comm->boot.peers, &opts, &comm->boot.links);
  if (nids > 1) free(ids);
  if (bres != ncclSuccess) return bres;
  for (int r = 0; r < n; r++) {
    if (comm->boot.peers[r].rank != r) {
      WARN("bootstrap: table entry %d claims rank %d", r, comm->boot.peers[r].rank);
      return ncclInternalError;
    }
  }
  if (comm->boot.island_forced) HETCCL_CHECK(user_ranks_from_peers(comm));
  HETCCL_CHECK(hetccl_islands_separate_shared_gpus(comm));
  hetccl_backend_id_t chosen = HETCCL_BACKEND_forward;
  if (!hetccl_islands_one(comm->boot.peers, n)) {
    HETCCL_CHECK(vendors_loaded(comm));
    chosen = HETCCL_BACKEND_engine;
  }
  const hetccl_backend_ops_t *backend = hetccl_backend_get(chosen);
  if (!backend) { /* the check WARNed which slot is missing */
    WARN("ncclCommInitRank: rank %d: the %s backend cannot serve it", comm->rank,
         chosen == HETCCL_BACKEND_engine ? "engine" : "forwarding");
    return ncclInternalError;
  }
  /* The forwarding backend publishes itself once the vendor's
   * communicator exists (backend.h); the engine's is there already. */
  return backend->start(comm, id);
}

ncclResult_t hetccl_comm_init_job(ncclComm_t comm, void *arg) {
  return hetccl_comm_init(comm, (const ncclUniqueId *)arg);
}
