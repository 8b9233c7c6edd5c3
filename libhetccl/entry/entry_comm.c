/* The core half of the communicator entry points (entry/dispatch.h): unique
 * ids, init, split/shrink/grow, teardown and queries. The api layer has
 * checked what it can without a communicator; the life cycle is in comm/
 * (comm/init.h), and what differs between a forwarded and an engine
 * communicator in its backend's slots (comm/backend.h).
 *
 * Thread: the API caller. */
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/comm.h"
#include "comm/identity.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "entry/dispatch.h"
#include "exec/group.h"
#include "trace/trace.h"
#include "util/check.h"
#include "util/knob_check.h"
#include "util/knobs.h"
#include "util/log.h"

#define CHECK_COMM(comm, fn) HETCCL_CHECK(hetccl_comm_check(comm, fn))
/* comm's backend (checked live first). */
#define BACKEND(comm) hetccl_backend_of(comm)

ncclResult_t hetccl_GetUniqueId(ncclUniqueId *uniqueId) {
  HETCCL_CHECK(hetccl_knobs_check());
  return hetccl_bootstrap_root_create(uniqueId);
}

/* Shared by every init entry point (newcomm, nranks and rank checked). */
static ncclResult_t init_rank_ids(ncclComm_t *newcomm, int nranks, const ncclUniqueId *ids,
                                  int nids, int rank, const ncclConfig_t *config,
                                  hetccl_dev_kind_t kind, const char *fn) {
  const ncclUniqueId *id = &ids[0];
  *newcomm = NULL;
  for (int i = 0; i < nids; i++) HETCCL_CHECK(hetccl_bootstrap_id_check(&ids[i]));
  ncclComm_t comm = NULL;
  HETCCL_CHECK(hetccl_comm_create(nranks, rank, config, kind, &comm));
  ncclResult_t res;
  if (nids > 1) { /* the ids past the first wait on the communicator (init.c) */
    comm->boot.ids = malloc((size_t)(nids - 1) * sizeof(*ids));
    if (!comm->boot.ids) {
      WARN("%s: out of memory for %d unique ids", fn, nids);
      res = ncclSystemError;
      goto fail;
    }
    memcpy(comm->boot.ids, &ids[1], (size_t)(nids - 1) * sizeof(*ids));
    comm->boot.nids = nids;
  }
  if (hetccl_group_depth() > 0) {
    /* Several ranks from one thread: they must join concurrently, so the
     * group end runs every deferred init on its communicator's proxy. */
    res = hetccl_group_defer_init(comm, id);
    if (res == ncclSuccess) {
      *newcomm = comm;
      return ncclSuccess;
    }
  } else if (!comm->blocking) {
    ncclUniqueId *heap = malloc(sizeof(*heap));
    if (!heap) {
      WARN("%s: out of memory", fn);
      res = ncclSystemError;
    } else {
      *heap = *id;
      res = hetccl_proxy_post(comm, hetccl_comm_init_job, heap, NULL, NULL);
      if (res == ncclSuccess) {
        *newcomm = comm;
        return ncclInProgress;
      }
    }
  } else {
    res = hetccl_comm_init(comm, id);
    if (res == ncclSuccess) {
      *newcomm = comm;
      return ncclSuccess;
    }
  }
fail:
  hetccl_comm_abort(comm);
  return res;
}

static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *config, const char *fn) {
  return init_rank_ids(newcomm, nranks, id, 1, rank, config, HETCCL_DEV_AUTO, fn);
}

ncclResult_t hetccl_CommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

ncclResult_t hetccl_CommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                       ncclConfig_t *config) {
  return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t hetccl_CommInitRankAs(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank,
                                   ncclConfig_t *config, hetcclDevice_t device) {
  static const hetccl_dev_kind_t kinds[] = {
      [hetcclDeviceAuto] = HETCCL_DEV_AUTO, [hetcclDeviceHost] = HETCCL_DEV_HOST,
      [hetcclDeviceCuda] = HETCCL_DEV_CUDA, [hetcclDeviceHip] = HETCCL_DEV_HIP};
  if ((unsigned)device >= sizeof(kinds) / sizeof(kinds[0])) {
    WARN("hetcclCommInitRankAs: device %d is none of hetcclDeviceAuto (0), Host (1), Cuda (2) "
         "and Hip (3)", (int)device);
    return ncclInvalidArgument;
  }
  return init_rank_ids(newcomm, nranks, &commId, 1, rank, config, kinds[device],
                       "hetcclCommInitRankAs");
}

ncclResult_t hetccl_CommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config) {
  /* Each id's root serves one group of ranks (comm/bootstrap.h). */
  if (nId < 1 || nId > nranks || commIds == NULL) {
    WARN("ncclCommInitRankScalable: nId %d with nranks %d (1 <= nId <= nranks, and commIds "
         "not NULL)", nId, nranks);
    return ncclInvalidArgument;
  }
  return init_rank_ids(newcomm, nranks, commIds, nId, myrank, config, HETCCL_DEV_AUTO,
                       "ncclCommInitRankScalable");
}

ncclResult_t hetccl_CommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  memset(comms, 0, ndev * sizeof(*comms));
  ncclUniqueId id;
  HETCCL_CHECK(hetccl_GetUniqueId(&id));
  hetccl_dev_kind_t kind = hetccl_process_dev_kind();
  const hetccl_runtime_t *rt = hetccl_runtime_get(kind);
  int saved_dev = -1;
  char busid[32];
  if (kind != HETCCL_DEV_HOST && rt)
    HETCCL_CHECK(rt->current_device(&saved_dev, busid, sizeof(busid)));
  ncclResult_t res = hetccl_group_start();
  for (int i = 0; i < ndev && res == ncclSuccess; i++) {
    if (kind != HETCCL_DEV_HOST && rt) {
      res = rt->set_device(devlist ? devlist[i] : i);
      if (res != ncclSuccess) break;
    }
    res = init_rank(&comms[i], ndev, &id, i, NULL, "ncclCommInitAll");
  }
  if (res != ncclSuccess) hetccl_group_note_error(res);
  ncclResult_t end = hetccl_group_end();
  if (saved_dev >= 0) rt->set_device(saved_dev);
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess) {
    for (int i = 0; i < ndev; i++) {
      if (comms[i]) hetccl_comm_abort(comms[i]);
      comms[i] = NULL;
    }
  }
  return res;
}

ncclResult_t hetccl_CommFinalize(ncclComm_t comm) {
  CHECK_COMM(comm, "ncclCommFinalize");
  return hetccl_comm_finalize(comm);
}

ncclResult_t hetccl_CommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
  CHECK_COMM(comm, "ncclCommDestroy");
  ncclResult_t res = hetccl_comm_destroy(comm);
  hetccl_trace_flush(); /* the trace's files, as they stand now (trace/trace.h) */
  return res;
}

ncclResult_t hetccl_CommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  CHECK_COMM(comm, "ncclCommAbort");
  ncclResult_t res = hetccl_comm_abort(comm);
  hetccl_trace_flush();
  return res;
}

ncclResult_t hetccl_CommRevoke(ncclComm_t comm, int revokeFlags) {
  CHECK_COMM(comm, "ncclCommRevoke");
  return BACKEND(comm)->revoke(comm, revokeFlags);
}

ncclResult_t hetccl_CommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  CHECK_COMM(comm, "ncclCommSplit");
  hetccl_comm_enter(comm);
  ncclResult_t res = BACKEND(comm)->split(comm, color, key, newcomm, config);
  hetccl_comm_leave(comm);
  return res;
}

ncclResult_t hetccl_CommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  CHECK_COMM(comm, "ncclCommShrink");
  hetccl_comm_enter(comm);
  ncclResult_t res = BACKEND(comm)->shrink(comm, excludeRanksList, excludeRanksCount, newcomm,
                                           config, shrinkFlags);
  hetccl_comm_leave(comm);
  return res;
}

ncclResult_t hetccl_CommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  CHECK_COMM(comm, "ncclCommGetAsyncError");
  return BACKEND(comm)->async_error(comm, asyncError);
}

ncclResult_t hetccl_CommCount(const ncclComm_t comm, int *count) {
  CHECK_COMM(comm, "ncclCommCount");
  return BACKEND(comm)->count(comm, count);
}

ncclResult_t hetccl_CommUserRank(const ncclComm_t comm, int *rank) {
  CHECK_COMM(comm, "ncclCommUserRank");
  return BACKEND(comm)->user_rank(comm, rank);
}

ncclResult_t hetccl_CommCuDevice(const ncclComm_t comm, int *device) {
  CHECK_COMM(comm, "ncclCommCuDevice");
  return BACKEND(comm)->cu_device(comm, device);
}

ncclResult_t hetccl_CommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  CHECK_COMM(comm, "ncclCommRegister");
  return BACKEND(comm)->mem_register(comm, buff, size, handle);
}

ncclResult_t hetccl_CommDeregister(const ncclComm_t comm, void *handle) {
  CHECK_COMM(comm, "ncclCommDeregister");
  return BACKEND(comm)->mem_deregister(comm, handle);
}

ncclResult_t hetccl_CommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags) {
  CHECK_COMM(comm, "ncclCommWindowRegister");
  return BACKEND(comm)->window_register(comm, buff, size, win, winFlags);
}

ncclResult_t hetccl_CommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  CHECK_COMM(comm, "ncclCommWindowDeregister");
  return BACKEND(comm)->window_deregister(comm, win);
}

ncclResult_t hetccl_CommSuspend(ncclComm_t comm, int flags) {
  CHECK_COMM(comm, "ncclCommSuspend");
  return BACKEND(comm)->suspend(comm, flags);
}

ncclResult_t hetccl_CommResume(ncclComm_t comm) {
  CHECK_COMM(comm, "ncclCommResume");
  return BACKEND(comm)->resume(comm);
}

ncclResult_t hetccl_CommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  CHECK_COMM(comm, "ncclCommMemStats");
  return BACKEND(comm)->mem_stats(comm, stat, value);
}

ncclResult_t hetccl_CommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  CHECK_COMM(comm, "ncclCommGetUniqueId");
  return BACKEND(comm)->grow_id(comm, uniqueId);
}

/* Members of comm pass it with rank -1 and keep their ranks; joining ranks
 * pass no communicator, the id and their new rank, and go through
 * ncclCommInitRank's path (groups, nonblocking configs). */
ncclResult_t hetccl_CommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config) {
  if (!comm) {
    return init_rank(newcomm, nRanks, uniqueId, rank, config, "ncclCommGrow");
  }
  CHECK_COMM(comm, "ncclCommGrow");
  hetccl_comm_enter(comm);
  ncclResult_t res = BACKEND(comm)->grow(comm, nRanks, uniqueId, rank, newcomm, config);
  hetccl_comm_leave(comm);
  return res;
}
