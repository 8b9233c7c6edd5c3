/* The core half of the communicator entry points (core/dispatch.h): unique
 * ids, init, split/shrink/grow, teardown and queries. The api layer has
 * checked what it can without a communicator; the work is in core/init.c.
 *
 * Thread: the API caller. */
#include <stdlib.h>
#include <string.h>

#include "entry/dispatch.h"
#include "comm/comm.h"
#include "exec/group.h"
#include "hier/hier.h"
#include "comm/init.h"
#include "comm/window.h"
#include "comm/proxy.h"
#include "trace/trace.h"
#include "transport/ib/ib_mem.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

#define CHECK_COMM(comm, fn) HETCCL_CHECK(hetccl_comm_check(comm, fn))

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
    comm->boot_ids = malloc((size_t)(nids - 1) * sizeof(*ids));
    if (!comm->boot_ids) {
      WARN("%s: out of memory for %d unique ids", fn, nids);
      res = ncclSystemError;
      goto fail;
    }
    memcpy(comm->boot_ids, &ids[1], (size_t)(nids - 1) * sizeof(*ids));
    comm->boot_nids = nids;
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
  /* Each id's root serves one group of ranks (core/bootstrap.h). */
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

ncclResult_t hetccl_CommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  CHECK_COMM(comm, "ncclCommSplit");
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_split(comm, color, key, newcomm, config);
  hetccl_comm_leave(comm);
  return res;
}

ncclResult_t hetccl_CommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  CHECK_COMM(comm, "ncclCommShrink");
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_shrink(comm, excludeRanksList, excludeRanksCount, newcomm,
                                        config, shrinkFlags);
  hetccl_comm_leave(comm);
  return res;
}

ncclResult_t hetccl_CommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  CHECK_COMM(comm, "ncclCommGetAsyncError");
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

ncclResult_t hetccl_CommCount(const ncclComm_t comm, int *count) {
  CHECK_COMM(comm, "ncclCommCount");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommCount, comm->vcomm, count);
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t hetccl_CommUserRank(const ncclComm_t comm, int *rank) {
  CHECK_COMM(comm, "ncclCommUserRank");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommUserRank, comm->vcomm, rank);
  *rank = comm->rank;
  return ncclSuccess;
}

/* Host ranks have no device: -1. */
ncclResult_t hetccl_CommCuDevice(const ncclComm_t comm, int *device) {
  CHECK_COMM(comm, "ncclCommCuDevice");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommCuDevice, comm->vcomm, device);
  *device = comm->dev;
  return ncclSuccess;
}

/* Registration is an optimisation hint: the ib transport writes large
 * messages straight into registered memory (transport/ib/ib_mem.h, which
 * registers the range with every ib device context of the process); the
 * other transports copy through their staging and need none. */
ncclResult_t hetccl_CommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  CHECK_COMM(comm, "ncclCommRegister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommRegister, comm->vcomm, buff, size, handle);
  HETCCL_ARGCHECK(buff != NULL || size == 0, ncclInvalidArgument,
                  "ncclCommRegister: buffer is NULL with size %zu", size);
  HETCCL_ARGCHECK(handle != NULL, ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  return hetccl_ib_mem_register(buff, size, handle);
}

ncclResult_t hetccl_CommDeregister(const ncclComm_t comm, void *handle) {
  CHECK_COMM(comm, "ncclCommDeregister");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommDeregister, comm->vcomm, handle);
  HETCCL_ARGCHECK(handle != NULL, ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
  return hetccl_ib_mem_deregister(handle);
}

ncclResult_t hetccl_CommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags) {
  CHECK_COMM(comm, "ncclCommWindowRegister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommWindowRegister, comm->vcomm, buff, size, win,
                              winFlags);
  return hetccl_window_register(comm, buff, size, win, winFlags);
}

ncclResult_t hetccl_CommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  CHECK_COMM(comm, "ncclCommWindowDeregister");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommWindowDeregister, comm->vcomm, win);
  return hetccl_window_deregister(comm, win);
}

ncclResult_t hetccl_CommSuspend(ncclComm_t comm, int flags) {
  CHECK_COMM(comm, "ncclCommSuspend");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommSuspend, comm->vcomm, flags);
  return hetccl_unsupported("ncclCommSuspend", "the engine keeps no releasable device memory");
}

ncclResult_t hetccl_CommResume(ncclComm_t comm) {
  CHECK_COMM(comm, "ncclCommResume");
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommResume, comm->vcomm);
  return hetccl_unsupported("ncclCommResume", "the engine keeps no releasable device memory");
}

ncclResult_t hetccl_CommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  CHECK_COMM(comm, "ncclCommMemStats");
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommMemStats, comm->vcomm, stat, value);
  return hetccl_unsupported("ncclCommMemStats", "the engine does not track device memory");
}

/* The id for ncclCommGrow: a bootstrap root served by this rank, as
 * ncclGetUniqueId's, until the grown communicator is linked. */
ncclResult_t hetccl_CommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  CHECK_COMM(comm, "ncclCommGetUniqueId");
  if (comm->vendor) {
    return hetccl_unsupported("ncclCommGetUniqueId", "growing a forwarded communicator is not " "implemented");
  }
  return hetccl_bootstrap_root_create(uniqueId);
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
  ncclResult_t res = hetccl_comm_grow(comm, nRanks, uniqueId, rank, newcomm, config);
  hetccl_comm_leave(comm);
  return res;
}
