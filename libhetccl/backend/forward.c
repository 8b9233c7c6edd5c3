/* The forwarding backend (comm/backend.h): one island, every call handed
 * to the vendor's library (NCCL, RCCL) on the vendor's communicator
 * (comm->forward.vendor, comm->forward.vcomm), one indirect call each.
 *
 * backend/ holds the two implementations of the backend table: this one
 * and the engine's (engine.c), and the route both ask which form an
 * operation takes (route.h: one table of rules). They run on the thread
 * that called the entry point (start: where init runs) and may use every
 * layer below them (comm/, exec/, hier/ and the vendor table); nothing
 * below includes them: a communicator reaches them through the table it
 * holds.
 *
 * Thread: the API caller's, one at a time per communicator (NCCL's rule);
 * async_error, last_error and describe on any thread. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "backend/route.h"
#include "comm/backend.h"
#include "comm/identity.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "util/check.h"
#include "util/log.h"

#define VENDOR(comm) ((comm)->forward.vendor)
/* The vendor's function `slot` on comm's vendor. */
#define VCALL(comm, slot, ...) HETCCL_VENDOR_CALL(VENDOR(comm), slot, __VA_ARGS__)

/* --- life ------------------------------------------------------------------------ */

/* The vendor's communicator, its unique id from rank 0 over our bootstrap;
 * the vendor has its own bootstrap from here on. */
static ncclResult_t forward_start(ncclComm_t comm, const ncclUniqueId *id) {
  (void)id;
  const hetccl_vendor_t *v = NULL;
  hetccl_vendor_id_t vid;
  if (!hetccl_dev_vendor(comm->dev_kind, &vid)) {
    WARN("vendor: rank %d is a %s rank, which has no vendor library", comm->rank,
         hetccl_dev_kind_name(comm->dev_kind));
    return ncclInternalError;
  }
  HETCCL_CHECK(hetccl_vendor_load(vid, &v));
  struct {
    int32_t status;
    ncclUniqueId id;
  } msg;
  memset(&msg, 0, sizeof(msg));
  if (comm->rank == 0) msg.status = HETCCL_VENDOR_CALL(v, GetUniqueId, &msg.id);
  HETCCL_CHECK(hetccl_bootstrap_bcast(comm->boot.links, &msg, sizeof(msg), 0));
  if (msg.status != ncclSuccess) {
    WARN("vendor %s: rank 0 could not create a unique id (%d): %s", v->name, msg.status,
         comm->rank == 0 ? hetccl_last_error() : "see rank 0's log");
    return (ncclResult_t)msg.status;
  }
  ncclComm_t vcomm = NULL;
  ncclResult_t res;
  if (comm->has_user_config) {
    res = HETCCL_VENDOR_CALL(v, CommInitRankConfig, &vcomm, comm->nranks, msg.id, comm->rank,
                             (ncclConfig_t *)comm->user_config);
  } else {
    res = HETCCL_VENDOR_CALL(v, CommInitRank, &vcomm, comm->nranks, msg.id, comm->rank);
  }
  if (res == ncclInProgress) {
    /* A nonblocking vendor init: we are already off the API thread, wait. */
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress && !__atomic_load_n(&comm->state.abort_flag, __ATOMIC_ACQUIRE)) {
      if (HETCCL_VENDOR_CALL(v, CommGetAsyncError, vcomm, &st) != ncclSuccess) break;
      if (st == ncclInProgress) sched_yield();
    }
    res = st;
  }
  if (res != ncclSuccess) {
    WARN("vendor %s: ncclCommInitRank (rank %d of %d) failed: %s", v->name, comm->rank,
         comm->nranks, HETCCL_VENDOR_CALL(v, GetErrorString, res));
    return res;
  }
  comm->forward.vcomm = vcomm;
  comm->forward.vendor = v;
  hetccl_backend_publish(comm, &hetccl_backend_forward); /* after vendor and vcomm */
  INFO(HETCCL_INIT | HETCCL_VENDOR, "rank %d of %d: one island, forwarding to %s %d (%s)",
       comm->rank, comm->nranks, v->name, v->version, v->path);
  hetccl_bootstrap_destroy(comm->boot.links);
  comm->boot.links = NULL;
  return ncclSuccess;
}

static ncclResult_t forward_finalize(ncclComm_t comm) {
  return VCALL(comm, CommFinalize, comm->forward.vcomm);
}

/* A split's child whose handle the vendor has not written yet has nothing
 * to destroy. */
static ncclResult_t forward_shutdown(ncclComm_t comm, int abort) {
  if (!comm->forward.vcomm) return ncclSuccess;
  return abort ? VCALL(comm, CommAbort, comm->forward.vcomm)
               : VCALL(comm, CommDestroy, comm->forward.vcomm);
}

static void forward_release(ncclComm_t comm, int abort) {
  (void)comm; /* the vendor's communicator went in shutdown */
  (void)abort;
}

static ncclResult_t forward_revoke(ncclComm_t comm, int flags) {
  return VCALL(comm, CommRevoke, comm->forward.vcomm, flags);
}

/* --- operations ------------------------------------------------------------------- */

#define OPCALL(slot, ...) HETCCL_VENDOR_CALL(v, slot, __VA_ARGS__)
/* The *Config form where the caller gave a config and the vendor has it. */
#define OPCALL_CFG(slot, ...)                                                  \
  (op->config && HETCCL_VENDOR_HAS(v, slot##Config)                           \
       ? OPCALL(slot##Config, __VA_ARGS__, op->config)                         \
       : OPCALL(slot, __VA_ARGS__))

static ncclResult_t forward_dispatch(ncclComm_t comm, const hetccl_op_t *op) {
  const hetccl_vendor_t *v = comm->forward.vendor;
  ncclComm_t vc = comm->forward.vcomm;
  const void *s = op->sendbuf;
  void *r = op->recvbuf, *st = op->stream;
  size_t n = op->count;
  ncclDataType_t t = op->dtype;
  TRACE(HETCCL_CALL, "%s rank %d -> %s", op->fn, comm->rank, v->name);
  hetccl_route(comm, op, NULL); /* its first row, decided at init: said, not walked */
  if (op->config && !HETCCL_VENDOR_HAS(v, AllReduceConfig) && op->config->algSelection &&
      op->config->algSelection[0] && op->config->forceAlgSelection) {
    WARN("%s: %s (version %d) has no nccl*Config collectives to honour algorithm selection "
         "\"%s\"", op->fn, v->path, v->version, op->config->algSelection);
    return ncclInvalidUsage;
  }
  switch (op->kind) {
    case HETCCL_OP_AllReduce: return OPCALL_CFG(AllReduce, s, r, n, t, op->redop, vc, st);
    case HETCCL_OP_Broadcast: return OPCALL_CFG(Broadcast, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Bcast: return OPCALL(Bcast, r, n, t, op->root, vc, st);
    case HETCCL_OP_Reduce: return OPCALL_CFG(Reduce, s, r, n, t, op->redop, op->root, vc, st);
    case HETCCL_OP_AllGather: return OPCALL_CFG(AllGather, s, r, n, t, vc, st);
    case HETCCL_OP_ReduceScatter: return OPCALL_CFG(ReduceScatter, s, r, n, t, op->redop, vc, st);
    case HETCCL_OP_AlltoAll: return OPCALL_CFG(AlltoAll, s, r, n, t, vc, st);
    case HETCCL_OP_Gather: return OPCALL_CFG(Gather, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Scatter: return OPCALL_CFG(Scatter, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Send: return OPCALL(Send, s, n, t, op->peer, vc, st);
    case HETCCL_OP_Recv: return OPCALL(Recv, r, n, t, op->peer, vc, st);
    default: break;
  }
  WARN("%s: operation kind %d has no vendor function", op->fn, (int)op->kind);
  return ncclInternalError;
}

static ncclResult_t forward_redop_create(ncclComm_t comm, ncclRedOp_t *op, void *scalar,
                                         ncclDataType_t dtype, ncclScalarResidence_t residence) {
  return VCALL(comm, RedOpCreatePreMulSum, op, scalar, dtype, residence, comm->forward.vcomm);
}

static ncclResult_t forward_redop_destroy(ncclComm_t comm, ncclRedOp_t op) {
  return VCALL(comm, RedOpDestroy, op, comm->forward.vcomm);
}

/* --- queries ----------------------------------------------------------------------- */

/* A vendor split's child whose handle has not arrived yet has its parent's
 * state (forward_split). */
static ncclResult_t forward_async_error(ncclComm_t comm, ncclResult_t *err) {
  ncclComm_t vc = __atomic_load_n(&comm->forward.vcomm, __ATOMIC_ACQUIRE);
  if (!vc && comm->forward.vparent) {
    HETCCL_CHECK(VCALL(comm, CommGetAsyncError, comm->forward.vparent, err));
    if (*err != ncclSuccess) return ncclSuccess;
    vc = __atomic_load_n(&comm->forward.vcomm, __ATOMIC_ACQUIRE);
    if (!vc) {
      WARN("ncclCommGetAsyncError: the vendor's split finished without a communicator");
      *err = ncclInternalError;
      return ncclSuccess;
    }
  }
  if (vc) return VCALL(comm, CommGetAsyncError, vc, err);
  /* No vendor communicator and no parent's: the communicator's own state. */
  ncclResult_t e = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  if (!comm->blocking && hetccl_proxy_pending(comm) > 0) e = ncclInProgress;
  *err = e;
  return ncclSuccess;
}

static ncclResult_t forward_count(ncclComm_t comm, int *count) {
  return VCALL(comm, CommCount, comm->forward.vcomm, count);
}

static ncclResult_t forward_user_rank(ncclComm_t comm, int *rank) {
  return VCALL(comm, CommUserRank, comm->forward.vcomm, rank);
}

static ncclResult_t forward_cu_device(ncclComm_t comm, int *device) {
  return VCALL(comm, CommCuDevice, comm->forward.vcomm, device);
}

static ncclResult_t forward_properties(ncclComm_t comm, ncclCommProperties_t *props) {
  return VCALL(comm, CommQueryProperties, comm->forward.vcomm, props);
}

static ncclResult_t forward_mem_stats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  return VCALL(comm, CommMemStats, comm->forward.vcomm, stat, value);
}

static const char *forward_last_error(ncclComm_t comm, char *buf, size_t len) {
  (void)buf;
  (void)len;
  return VCALL(comm, GetLastError, comm->forward.vcomm);
}

static const char *forward_describe(ncclComm_t comm) { return comm->forward.vendor->backend; }

/* --- memory ------------------------------------------------------------------------ */

static ncclResult_t forward_mem_register(ncclComm_t comm, void *buff, size_t size,
                                         void **handle) {
  return VCALL(comm, CommRegister, comm->forward.vcomm, buff, size, handle);
}

static ncclResult_t forward_mem_deregister(ncclComm_t comm, void *handle) {
  return VCALL(comm, CommDeregister, comm->forward.vcomm, handle);
}

static ncclResult_t forward_window_register(ncclComm_t comm, void *buff, size_t size,
                                            ncclWindow_t *win, int flags) {
  return VCALL(comm, CommWindowRegister, comm->forward.vcomm, buff, size, win, flags);
}

static ncclResult_t forward_window_deregister(ncclComm_t comm, ncclWindow_t win) {
  return VCALL(comm, CommWindowDeregister, comm->forward.vcomm, win);
}

static ncclResult_t forward_win_user_ptr(ncclComm_t comm, ncclWindow_t win, void **out) {
  return VCALL(comm, WinGetUserPtr, comm->forward.vcomm, win, out);
}

static ncclResult_t forward_suspend(ncclComm_t comm, int flags) {
  return VCALL(comm, CommSuspend, comm->forward.vcomm, flags);
}

static ncclResult_t forward_resume(ncclComm_t comm) {
  return VCALL(comm, CommResume, comm->forward.vcomm);
}

/* --- communicators made from this one ------------------------------------------------ */

/* The wrapper of a vendor communicator that the vendor's split or shrink is
 * making. With a nonblocking parent the vendor writes the child's handle
 * from its background job, after the call returned: so the vendor is
 * handed &child->forward.vcomm to write, never a variable of ours that goes away.
 * Until it arrives, the child's state is the parent's (forward.vparent; see
 * forward_async_error), and rank and size are asked of the vendor when
 * queried. */
static ncclResult_t vendor_child_create(ncclComm_t parent, ncclComm_t *out) {
  ncclComm_t comm = calloc(1, sizeof(*comm));
  if (!comm) {
    WARN("ncclCommSplit: out of memory");
    return ncclSystemError;
  }
  pthread_mutex_init(&comm->state.lock, NULL);
  comm->magic = HETCCL_COMM_MAGIC;
  comm->rank = -1;
  comm->nranks = -1;
  comm->dev = parent->dev;
  comm->dev_kind = parent->dev_kind;
  comm->ptr_kind = parent->ptr_kind;
  comm->blocking = parent->blocking;
  comm->config = parent->config;
  comm->forward.vendor = parent->forward.vendor;
  comm->forward.vparent = parent->forward.vcomm;
  comm->backend = &hetccl_backend_forward;
  ncclResult_t res = hetccl_comm_register(comm);
  if (res != ncclSuccess) {
    pthread_mutex_destroy(&comm->state.lock);
    free(comm);
    return res;
  }
  *out = comm;
  return ncclSuccess;
}

/* After the vendor's split / shrink returned res into child->forward.vcomm: hand
 * the child out, or drop it if the vendor failed. Success does not mean
 * the handle is there: NCCL returns ncclSuccess from a nonblocking
 * parent's split and writes the handle later. */
static ncclResult_t vendor_child_finish(ncclComm_t child, ncclResult_t res, ncclComm_t *newcomm) {
  if (res != ncclSuccess && res != ncclInProgress) {
    hetccl_comm_unregister(child);
    hetccl_comm_release(child);
    return res;
  }
  *newcomm = child;
  return res;
}

static ncclResult_t forward_split(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  const ncclConfig_t *config) {
  *newcomm = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) /* no child; the vendor may still write NULL later */
    return VCALL(comm, CommSplit, comm->forward.vcomm, color, key, &comm->forward.vnone,
                 (ncclConfig_t *)config);
  ncclComm_t child;
  HETCCL_CHECK(vendor_child_create(comm, &child));
  ncclResult_t res = VCALL(comm, CommSplit, comm->forward.vcomm, color, key, &child->forward.vcomm,
                           (ncclConfig_t *)config);
  return vendor_child_finish(child, res, newcomm);
}

static ncclResult_t forward_shrink(ncclComm_t comm, const int *exclude, int nexclude,
                                   ncclComm_t *newcomm, const ncclConfig_t *config, int flags) {
  *newcomm = NULL;
  ncclComm_t child;
  HETCCL_CHECK(vendor_child_create(comm, &child));
  ncclResult_t res = VCALL(comm, CommShrink, comm->forward.vcomm, (int *)exclude, nexclude,
                           &child->forward.vcomm, (ncclConfig_t *)config, flags);
  return vendor_child_finish(child, res, newcomm);
}

/* Its members have no bootstrap of ours any more (the vendor keeps its
 * own), so the grow id could not reach those that pass NULL. */
static ncclResult_t forward_grow(ncclComm_t comm, int nranks, const ncclUniqueId *id, int rank,
                                 ncclComm_t *newcomm, const ncclConfig_t *config) {
  (void)nranks; (void)id; (void)rank; (void)config;
  *newcomm = NULL;
  WARN("ncclCommGrow: rank %d's communicator is forwarded to %s, and growing one is not "
       "implemented; make the larger communicator with ncclCommInitRank instead",
       comm->rank, comm->forward.vendor->name);
  return ncclInvalidUsage;
}

static ncclResult_t forward_grow_id(ncclComm_t comm, ncclUniqueId *id) {
  (void)comm;
  (void)id;
  return hetccl_unsupported("ncclCommGetUniqueId",
                            "growing a forwarded communicator is not implemented");
}

/* --- the device API ------------------------------------------------------------------ */

static ncclResult_t forward_dev_comm_create(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                                            ncclDevComm_t *out) {
  return VCALL(comm, DevCommCreate, comm->forward.vcomm, reqs, out);
}

static ncclResult_t forward_dev_comm_destroy(ncclComm_t comm, const ncclDevComm_t *dev) {
  return VCALL(comm, DevCommDestroy, comm->forward.vcomm, dev);
}

static ncclResult_t forward_team(ncclComm_t comm, hetccl_team_kind_t kind, ncclCftTeamMode_t mode,
                                 ncclTeam_t *out) {
  switch (kind) {
    case HETCCL_TEAM_WORLD: *out = VCALL(comm, TeamWorld, comm->forward.vcomm); break;
    case HETCCL_TEAM_LSA: *out = VCALL(comm, TeamLsa, comm->forward.vcomm); break;
    case HETCCL_TEAM_RAIL: *out = VCALL(comm, TeamRail, comm->forward.vcomm); break;
    case HETCCL_TEAM_CFT: *out = VCALL(comm, TeamCft, comm->forward.vcomm, mode); break;
    case HETCCL_TEAM_CFT_MULTIMEM: *out = VCALL(comm, TeamCftMultimem, comm->forward.vcomm); break;
  }
  return ncclSuccess;
}

static ncclResult_t forward_team_rank(ncclComm_t comm, ncclTeam_t team, int rank, int lsa,
                                      int *out) {
  *out = lsa ? VCALL(comm, TeamRankToLsa, comm->forward.vcomm, team, rank)
             : VCALL(comm, TeamRankToWorld, comm->forward.vcomm, team, rank);
  return ncclSuccess;
}

static ncclResult_t forward_gin_barrier(ncclComm_t comm, ncclTeam_t team, int nbarriers,
                                        ncclGinBarrierHandle_t *handle,
                                        ncclDevResourceRequirements_t *req) {
  return VCALL(comm, GinBarrierCreateRequirement, comm->forward.vcomm, team, nbarriers, handle,
               req);
}

static ncclResult_t forward_put_signal(ncclComm_t comm, const void *localbuff, size_t count,
                                       ncclDataType_t dtype, int peer, ncclWindow_t peer_win,
                                       size_t peer_win_offset, int sig_idx, int ctx,
                                       unsigned int flags, void *stream) {
  return VCALL(comm, PutSignal, localbuff, count, dtype, peer, peer_win, peer_win_offset, sig_idx,
               ctx, flags, comm->forward.vcomm, stream);
}

static ncclResult_t forward_signal(ncclComm_t comm, int peer, int sig_idx, int ctx,
                                   unsigned int flags, void *stream) {
  return VCALL(comm, Signal, peer, sig_idx, ctx, flags, comm->forward.vcomm, stream);
}

static ncclResult_t forward_wait_signal(ncclComm_t comm, int ndesc, ncclWaitSignalDesc_t *descs,
                                        void *stream) {
  return VCALL(comm, WaitSignal, ndesc, descs, comm->forward.vcomm, stream);
}

const hetccl_backend_ops_t hetccl_backend_forward = {
    .name = "forward",
    .start = forward_start,
    .finalize = forward_finalize,
    .shutdown = forward_shutdown,
    .release = forward_release,
    .revoke = forward_revoke,
    .dispatch = forward_dispatch,
    .submit = forward_dispatch, /* the vendor checks what it is given either way */
    .redop_create = forward_redop_create,
    .redop_destroy = forward_redop_destroy,
    .async_error = forward_async_error,
    .count = forward_count,
    .user_rank = forward_user_rank,
    .cu_device = forward_cu_device,
    .properties = forward_properties,
    .mem_stats = forward_mem_stats,
    .last_error = forward_last_error,
    .describe = forward_describe,
    .mem_register = forward_mem_register,
    .mem_deregister = forward_mem_deregister,
    .window_register = forward_window_register,
    .window_deregister = forward_window_deregister,
    .win_user_ptr = forward_win_user_ptr,
    .suspend = forward_suspend,
    .resume = forward_resume,
    .split = forward_split,
    .shrink = forward_shrink,
    .grow = forward_grow,
    .grow_id = forward_grow_id,
    .dev_comm_create = forward_dev_comm_create,
    .dev_comm_destroy = forward_dev_comm_destroy,
    .team = forward_team,
    .team_rank = forward_team_rank,
    .gin_barrier = forward_gin_barrier,
    .put_signal = forward_put_signal,
    .signal = forward_signal,
    .wait_signal = forward_wait_signal,
};
