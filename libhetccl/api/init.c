/* Communicator entry points: unique ids, init, split/shrink, teardown and
 * queries. Validation here; the work is in core/init.c.
 *
 * Thread: the API caller. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "core/group.h"
#include "core/hier.h"
#include "core/init.h"
#include "core/proxy.h"
#include "util/knobs.h"

#define CHECK_COMM(comm, fn)                                                   \
  do {                                                                         \
    ncclResult_t r_ = hetccl_comm_check(comm, fn);                             \
    if (r_ != ncclSuccess) return r_;                                          \
  } while (0)

#define CHECK_PTR(ptr, fn)                                                     \
  HETCCL_ARGCHECK((ptr) != NULL, ncclInvalidArgument, "%s: %s is NULL", fn, #ptr)

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  HETCCL_REENTRY(GetUniqueId, uniqueId);
  CHECK_PTR(uniqueId, "ncclGetUniqueId");
  HETCCL_CHECK(hetccl_knobs_check());
  return hetccl_bootstrap_root_create(uniqueId);
}

/* Shared by every init entry point. */
static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *config, const char *fn) {
  CHECK_PTR(newcomm, fn);
  *newcomm = NULL;
  HETCCL_ARGCHECK(nranks >= 1, ncclInvalidArgument, "%s: nranks %d must be >= 1", fn, nranks);
  HETCCL_ARGCHECK(rank >= 0 && rank < nranks, ncclInvalidArgument,
                  "%s: rank %d out of range [0, %d)", fn, rank, nranks);
  HETCCL_CHECK(hetccl_bootstrap_id_check(id));
  ncclComm_t comm = NULL;
  HETCCL_CHECK(hetccl_comm_create(nranks, rank, config, &comm));
  ncclResult_t res;
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
  hetccl_comm_abort(comm);
  return res;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId,
         int rank);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  HETCCL_REENTRY(CommInitRank, comm, nranks, commId, rank);
  return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks,
         ncclUniqueId commId, int rank, ncclConfig_t *config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  HETCCL_REENTRY(CommInitRankConfig, comm, nranks, commId, rank, config);
  return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank,
         int nId, ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config) {
  CHECK_PTR(commIds, "ncclCommInitRankScalable");
  HETCCL_ARGCHECK(nId >= 1, ncclInvalidArgument, "ncclCommInitRankScalable: nId %d < 1", nId);
  /* One root serves every rank here; the ids past the first are accepted
   * (every rank passes the same list) and their roots time out unused. */
  return init_rank(newcomm, nranks, &commIds[0], myrank, config, "ncclCommInitRankScalable");
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  CHECK_PTR(comms, "ncclCommInitAll");
  HETCCL_ARGCHECK(ndev >= 1, ncclInvalidArgument, "ncclCommInitAll: ndev %d must be >= 1", ndev);
  memset(comms, 0, ndev * sizeof(*comms));
  ncclUniqueId id;
  HETCCL_CHECK(ncclGetUniqueId(&id));
  hetccl_dev_kind_t kind = hetccl_process_dev_kind();
  const hetccl_runtime_t *rt = hetccl_runtime_get(kind);
  int saved_dev = -1;
  char busid[32];
  if (kind != HETCCL_DEV_HOST && rt) rt->current_device(&saved_dev, busid, sizeof(busid));
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

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  HETCCL_REENTRY(CommFinalize, comm);
  CHECK_COMM(comm, "ncclCommFinalize");
  return hetccl_api_ret(comm, hetccl_comm_finalize(comm));
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  HETCCL_REENTRY(CommDestroy, comm);
  if (comm == NULL) return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
  CHECK_COMM(comm, "ncclCommDestroy");
  return hetccl_comm_destroy(comm);
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  HETCCL_REENTRY(CommAbort, comm);
  if (comm == NULL) return ncclSuccess;
  CHECK_COMM(comm, "ncclCommAbort");
  return hetccl_comm_abort(comm);
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  HETCCL_REENTRY(CommRevoke, comm, revokeFlags);
  CHECK_COMM(comm, "ncclCommRevoke");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommRevoke, comm->vcomm, revokeFlags);
  HETCCL_ARGCHECK(revokeFlags == NCCL_REVOKE_DEFAULT, ncclInvalidArgument,
                  "ncclCommRevoke: flags 0x%x must be NCCL_REVOKE_DEFAULT", revokeFlags);
  /* Stop what is in flight: blocked waits see the flag and fail; the
   * communicator may then only be destroyed, split or shrunk. */
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
  hetccl_proxy_drain(comm);
  hetccl_comm_set_error(comm, ncclInvalidUsage);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  HETCCL_REENTRY(CommSplit, comm, color, key, newcomm, config);
  CHECK_COMM(comm, "ncclCommSplit");
  CHECK_PTR(newcomm, "ncclCommSplit");
  HETCCL_ARGCHECK(color >= 0 || color == NCCL_SPLIT_NOCOLOR, ncclInvalidArgument,
                  "ncclCommSplit: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_split(comm, color, key, newcomm, config);
  hetccl_comm_leave(comm);
  return hetccl_api_ret(comm, res);
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList,
         int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  HETCCL_REENTRY(CommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  CHECK_COMM(comm, "ncclCommShrink");
  CHECK_PTR(newcomm, "ncclCommShrink");
  HETCCL_ARGCHECK(excludeRanksCount >= 0 && (excludeRanksCount == 0 || excludeRanksList),
                  ncclInvalidArgument, "ncclCommShrink: bad exclude list (%p, %d)",
                  (void *)excludeRanksList, excludeRanksCount);
  HETCCL_ARGCHECK(shrinkFlags == NCCL_SHRINK_DEFAULT || shrinkFlags == NCCL_SHRINK_ABORT,
                  ncclInvalidArgument,
                  "ncclCommShrink: flags 0x%x must be NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT",
                  shrinkFlags);
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_shrink(comm, excludeRanksList, excludeRanksCount, newcomm,
                                        config, shrinkFlags);
  hetccl_comm_leave(comm);
  return hetccl_api_ret(comm, res);
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  HETCCL_REENTRY(CommGetAsyncError, comm, asyncError);
  CHECK_COMM(comm, "ncclCommGetAsyncError");
  CHECK_PTR(asyncError, "ncclCommGetAsyncError");
  if (comm->vendor) {
    /* A vendor split's child whose handle has not arrived yet has its
     * parent's state (hetccl_comm_split). */
    ncclComm_t vc = __atomic_load_n(&comm->vcomm, __ATOMIC_ACQUIRE);
    if (!vc && comm->vparent) {
      HETCCL_CHECK(HETCCL_VENDOR_CALL(comm->vendor, CommGetAsyncError, comm->vparent, asyncError));
      if (*asyncError != ncclSuccess) return ncclSuccess;
      vc = __atomic_load_n(&comm->vcomm, __ATOMIC_ACQUIRE);
      if (!vc) {
        WARN("ncclCommGetAsyncError: the vendor's split finished without a communicator");
        *asyncError = ncclInternalError;
        return ncclSuccess;
      }
    }
    if (vc) return HETCCL_VENDOR_CALL(comm->vendor, CommGetAsyncError, vc, asyncError);
  }
  /* A job that fails on the proxy thread sets the error before it returns
   * and leaves its message on the communicator as it returns: until then a
   * nonblocking communicator's answer is "in progress", so that once the
   * error shows, ncclGetLastError(comm) has its message. A blocking one
   * says "in progress" only while it initialises: the jobs it has queued
   * are stream-ordered device operations (core/devpath.h), which a
   * watchdog polling here must not take for an unfinished init. */
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
  if (!comm->blocking && hetccl_proxy_pending(comm) > 0) err = ncclInProgress;
  if (err == ncclSuccess) err = hetccl_hier_error(comm); /* a phase failing on the stream */
  *asyncError = err;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  HETCCL_REENTRY(CommCount, comm, count);
  CHECK_COMM(comm, "ncclCommCount");
  CHECK_PTR(count, "ncclCommCount");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommCount, comm->vcomm, count);
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  HETCCL_REENTRY(CommUserRank, comm, rank);
  CHECK_COMM(comm, "ncclCommUserRank");
  CHECK_PTR(rank, "ncclCommUserRank");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommUserRank, comm->vcomm, rank);
  *rank = comm->rank;
  return ncclSuccess;
}

/* Host ranks have no device: -1. */
NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  HETCCL_REENTRY(CommCuDevice, comm, device);
  CHECK_COMM(comm, "ncclCommCuDevice");
  CHECK_PTR(device, "ncclCommCuDevice");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommCuDevice, comm->vcomm, device);
  *device = comm->dev;
  return ncclSuccess;
}

/* Registration is an optimisation hint. The engine copies through its own
 * staging and needs none, so a host buffer "registers" as itself. */
NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
         void **handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  HETCCL_REENTRY(CommRegister, comm, buff, size, handle);
  CHECK_COMM(comm, "ncclCommRegister");
  CHECK_PTR(handle, "ncclCommRegister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommRegister, comm->vcomm, buff, size, handle);
  HETCCL_ARGCHECK(buff != NULL || size == 0, ncclInvalidArgument,
                  "ncclCommRegister: buffer is NULL with size %zu", size);
  *handle = buff ? buff : (void *)comm;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  HETCCL_REENTRY(CommDeregister, comm, handle);
  CHECK_COMM(comm, "ncclCommDeregister");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommDeregister, comm->vcomm, handle);
  CHECK_PTR(handle, "ncclCommDeregister");
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
         ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags) {
  HETCCL_REENTRY(CommWindowRegister, comm, buff, size, win, winFlags);
  CHECK_COMM(comm, "ncclCommWindowRegister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommWindowRegister, comm->vcomm, buff, size, win,
                              winFlags);
  return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommWindowRegister",
                                                     "symmetric windows need a vendor communicator"));
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  HETCCL_REENTRY(CommWindowDeregister, comm, win);
  CHECK_COMM(comm, "ncclCommWindowDeregister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommWindowDeregister, comm->vcomm, win);
  return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommWindowDeregister",
                                                     "symmetric windows need a vendor communicator"));
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  HETCCL_REENTRY(CommSuspend, comm, flags);
  CHECK_COMM(comm, "ncclCommSuspend");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommSuspend, comm->vcomm, flags);
  return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommSuspend",
                                                     "the engine keeps no releasable device memory"));
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm);
ncclResult_t ncclCommResume(ncclComm_t comm) {
  HETCCL_REENTRY(CommResume, comm);
  CHECK_COMM(comm, "ncclCommResume");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommResume, comm->vcomm);
  return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommResume",
                                                     "the engine keeps no releasable device memory"));
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat,
         uint64_t *value);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  HETCCL_REENTRY(CommMemStats, comm, stat, value);
  CHECK_COMM(comm, "ncclCommMemStats");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommMemStats, comm->vcomm, stat, value);
  return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommMemStats",
                                                     "the engine does not track device memory"));
}

/* The id for ncclCommGrow: a bootstrap root served by this rank, as
 * ncclGetUniqueId's, until the grown communicator is linked. */
NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  CHECK_COMM(comm, "ncclCommGetUniqueId");
  CHECK_PTR(uniqueId, "ncclCommGetUniqueId");
  if (comm->vendor) {
    return hetccl_api_ret(comm, hetccl_api_unsupported("ncclCommGetUniqueId",
                                                       "growing a forwarded communicator is not "
                                                       "implemented"));
  }
  return hetccl_api_ret(comm, hetccl_bootstrap_root_create(uniqueId));
}

/* Members of comm pass it with rank -1 and keep their ranks; joining ranks
 * pass no communicator, the id and their new rank, and go through
 * ncclCommInitRank's path (groups, nonblocking configs). */
NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
         int rank, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config) {
  CHECK_PTR(newcomm, "ncclCommGrow");
  if (!comm) {
    HETCCL_ARGCHECK(uniqueId != NULL, ncclInvalidArgument,
                    "ncclCommGrow: a joining rank (no communicator) needs the unique id");
    return init_rank(newcomm, nRanks, uniqueId, rank, config, "ncclCommGrow");
  }
  CHECK_COMM(comm, "ncclCommGrow");
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_grow(comm, nRanks, uniqueId, rank, newcomm, config);
  hetccl_comm_leave(comm);
  return hetccl_api_ret(comm, res);
}
