/* The engine backend (comm/backend.h): a communicator hetccl runs itself,
 * over its transports (comm/transports.h), with the data plane
 * (exec/dataplane.h) and the hierarchy (hier/hier.h) where they apply.
 * The device API's slots are in engine_device.c.
 *
 * Thread: the API caller's, one at a time per communicator (NCCL's rule);
 * start where init runs; async_error, last_error and describe on any
 * thread. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/engine_impl.h"
#include "backend/route.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "comm/transports.h"
#include "comm/window.h"
#include "exec/dataplane.h"
#include "exec/devpath.h"
#include "exec/enqueue.h"
#include "exec/group.h"
#include "hier/hier.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/log.h"

/* --- life ------------------------------------------------------------------------ */

/* The transports of every pair and the engine over them, then the data
 * plane and the hierarchy where they apply (each decided alike on every
 * rank from the published table). */
static ncclResult_t engine_start(ncclComm_t comm, const ncclUniqueId *id) {
  HETCCL_CHECK(hetccl_transports_connect(comm, hetccl_bootstrap_id_secret(id)));
  HETCCL_CHECK(hetccl_dataplane_setup(comm));
  HETCCL_CHECK(hetccl_hier_setup(comm));
  uint64_t msgs, bytes;
  hetccl_bootstrap_stats(comm->boot.links, &msgs, &bytes);
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d stats: %llu messages, %llu bytes", comm->rank,
       (unsigned long long)msgs, (unsigned long long)bytes);
  return ncclSuccess;
}

static ncclResult_t engine_finalize(ncclComm_t comm) {
  hetccl_proxy_drain(comm);
  hetccl_hier_finalize(comm);
  comm->engine.finalized = 1;
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  return err == ncclInProgress ? ncclSuccess : err;
}

/* Abort: a call blocked in a hierarchical phase returns, and streams
 * waiting on the data plane move on. */
static ncclResult_t engine_shutdown(ncclComm_t comm, int abort) {
  if (abort) {
    hetccl_hier_set_abort(comm);
    hetccl_dataplane_abort(comm);
  }
  return ncclSuccess;
}

/* The communicator's own count of payload bytes its CPU copied, per
 * transport (hetcclCommCopiedBytes adds the internal ones), at INFO. */
static void log_copied(ncclComm_t comm) {
  if (!comm->engine.p2p || !HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_INIT | HETCCL_NET)) return;
  char line[192] = "";
  size_t used = 0;
  for (int t = 0; t < HETCCL_COPIED_PATHS && used < sizeof(line); t++)
    used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%s %llu", t ? ", " : "",
                             hetccl_copied_path_name(t),
                             (unsigned long long)__atomic_load_n(&comm->engine.copied[t],
                                                                 __ATOMIC_RELAXED));
  INFO(HETCCL_INIT | HETCCL_NET, "rank %d of %d: payload bytes copied by the CPU: %s",
       hetccl_user_rank(comm->user_ranks, comm->rank), comm->nranks, line);
}

/* The internal communicators first, then the proxy (the staging and the
 * data plane are freed only once it has stopped), then the engine. */
static void engine_release(ncclComm_t comm, int abort) {
  log_copied(comm);
  hetccl_hier_release(comm, abort);
  hetccl_proxy_stop(comm);
  hetccl_devpath_destroy(comm);
  hetccl_dataplane_destroy(comm);
  hetccl_engine_destroy(comm->engine.p2p);
  comm->engine.p2p = NULL;
}

/* Stop what is in flight: blocked waits see the flag and fail; the
 * communicator may then only be destroyed, split or shrunk. */
static ncclResult_t engine_revoke(ncclComm_t comm, int flags) {
  HETCCL_ARGCHECK(flags == NCCL_REVOKE_DEFAULT, ncclInvalidArgument,
                  "ncclCommRevoke: flags 0x%x must be NCCL_REVOKE_DEFAULT", flags);
  __atomic_store_n(&comm->state.abort_flag, 1, __ATOMIC_RELEASE);
  hetccl_proxy_drain(comm);
  hetccl_comm_set_error(comm, ncclInvalidUsage);
  return ncclSuccess;
}

/* --- operations -------------------------------------------------------------------- */

/* Where the route (backend/route.h) sends op: its hierarchical form
 * (inside a group: at the group's end), else an engine task
 * (exec/enqueue.h), which the route then gives the data plane, staging
 * or the host engine from its buffers. */
static ncclResult_t place(ncclComm_t comm, const hetccl_op_t *op) {
  hetccl_route_t r = hetccl_route(comm, op, NULL);
  if (r.form == HETCCL_FORM_HIERARCHICAL)
    return hetccl_group_depth() > 0 ? hetccl_hier_defer(comm, op, r.how)
                                    : hetccl_hier_run(comm, op, r.how);
  /* Otherwise the route needs the task (HETCCL_ROUTE_NEEDS_TASK): its
   * rows from here on serve every operation. */
  hetccl_task_t *t;
  HETCCL_CHECK(hetccl_enqueue_task_make(comm, op, &t));
  t->form = hetccl_route(comm, op, t).form;
  if (t->captured) {
    ncclResult_t res = hetccl_dataplane_capture_check(comm, op->fn, t);
    if (res != ncclSuccess) {
      free(t);
      return res;
    }
  }
  return hetccl_enqueue_task(comm, t);
}

/* A user's operation: checked against comm once, here; what hier/ derives
 * from it comes back through engine_submit. */
static ncclResult_t engine_dispatch(ncclComm_t comm, const hetccl_op_t *op) {
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_usable(comm, op->fn);
  if (res == ncclSuccess) res = hetccl_op_validate(comm, op);
  if (res == ncclSuccess) res = place(comm, op);
  hetccl_comm_leave(comm);
  if (res != ncclSuccess && res != ncclInProgress) hetccl_group_note_error(res);
  return res;
}

static ncclResult_t engine_submit(ncclComm_t comm, const hetccl_op_t *op) {
  hetccl_comm_enter(comm);
  ncclResult_t res = place(comm, op);
  hetccl_comm_leave(comm);
  if (res != ncclSuccess && res != ncclInProgress) hetccl_group_note_error(res);
  return res;
}

/* The engine reduces on the host: a device-resident scalar would have to
 * be read at run time from device memory it does not manage. */
static ncclResult_t engine_redop_create(ncclComm_t comm, ncclRedOp_t *op, void *scalar,
                                        ncclDataType_t dtype, ncclScalarResidence_t residence) {
  if (residence != ncclScalarHostImmediate)
    return hetccl_unsupported("ncclRedOpCreatePreMulSum",
                              "ncclScalarDevice needs a vendor communicator; use "
                              "ncclScalarHostImmediate on host ranks");
  return hetccl_comm_redop_create(comm, op, scalar, dtype);
}

/* --- queries ------------------------------------------------------------------------- */

/* A job that fails on the proxy thread sets the error before it returns
 * and leaves its message on the communicator as it returns: until then a
 * nonblocking communicator's answer is "in progress", so that once the
 * error shows, ncclGetLastError(comm) has its message. A blocking one says
 * "in progress" only while it initialises: the jobs it has queued are
 * stream-ordered device operations (exec/devpath.h), which a watchdog
 * polling here must not take for an unfinished init. */
static ncclResult_t engine_async_error(ncclComm_t comm, ncclResult_t *err) {
  ncclResult_t e = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  if (!comm->blocking && hetccl_proxy_pending(comm) > 0) e = ncclInProgress;
  if (e == ncclSuccess) e = hetccl_hier_error(comm); /* a phase failing on the stream */
  *err = e;
  return ncclSuccess;
}

static ncclResult_t engine_count(ncclComm_t comm, int *count) {
  *count = comm->nranks;
  return ncclSuccess;
}

static ncclResult_t engine_user_rank(ncclComm_t comm, int *rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

/* Host ranks have no device: -1. */
static ncclResult_t engine_cu_device(ncclComm_t comm, int *device) {
  *device = comm->dev;
  return ncclSuccess;
}

static ncclResult_t engine_mem_stats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  (void)comm; (void)stat; (void)value;
  return hetccl_unsupported("ncclCommMemStats", "the engine does not track device memory");
}

static const char *engine_last_error(ncclComm_t comm, char *buf, size_t len) {
  hetccl_comm_last_error(comm, buf, len);
  return buf;
}

/* A hierarchical communicator says what serves the inside of its island. */
static const char *engine_describe(ncclComm_t comm) {
  if (comm->hier.enabled) {
    const hetccl_vendor_t *v = comm->hier.island ? comm->hier.island->forward.vendor : NULL;
    return v ? v->hier_backend : "hierarchical:engine";
  }
  return comm->engine.p2p ? "engine" : "initializing";
}

/* --- memory -------------------------------------------------------------------------- */

/* Registration is an optimisation hint, declared to every transport
 * (transport.h: the memory slots): ib writes large messages straight into
 * registered memory, registering the range with every ib device context of
 * the process; the other transports copy through their staging and need
 * none. */
static ncclResult_t engine_mem_register(ncclComm_t comm, void *buff, size_t size, void **handle) {
  (void)comm;
  HETCCL_ARGCHECK(buff != NULL || size == 0, ncclInvalidArgument,
                  "ncclCommRegister: buffer is NULL with size %zu", size);
  HETCCL_ARGCHECK(handle != NULL, ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  return hetccl_transport_mem_register(buff, size, handle);
}

static ncclResult_t engine_mem_deregister(ncclComm_t comm, void *handle) {
  (void)comm;
  HETCCL_ARGCHECK(handle != NULL, ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
  return hetccl_transport_mem_deregister(handle);
}

static ncclResult_t engine_suspend(ncclComm_t comm, int flags) {
  (void)comm; (void)flags;
  return hetccl_unsupported("ncclCommSuspend", "the engine keeps no releasable device memory");
}

static ncclResult_t engine_resume(ncclComm_t comm) {
  (void)comm;
  return hetccl_unsupported("ncclCommResume", "the engine keeps no releasable device memory");
}

/* --- communicators made from this one -------------------------------------------------- */

/* The id for ncclCommGrow: a bootstrap root served by this rank, as
 * ncclGetUniqueId's, until the grown communicator is linked. */
static ncclResult_t engine_grow_id(ncclComm_t comm, ncclUniqueId *id) {
  (void)comm;
  return hetccl_bootstrap_root_create(id);
}

const hetccl_backend_ops_t hetccl_backend_engine = {
    .name = "engine",
    .start = engine_start,
    .finalize = engine_finalize,
    .shutdown = engine_shutdown,
    .release = engine_release,
    .revoke = engine_revoke,
    .dispatch = engine_dispatch,
    .submit = engine_submit,
    .redop_create = engine_redop_create,
    .redop_destroy = hetccl_comm_redop_destroy,
    .async_error = engine_async_error,
    .count = engine_count,
    .user_rank = engine_user_rank,
    .cu_device = engine_cu_device,
    .properties = hetccl_engine_devapi_properties,
    .mem_stats = engine_mem_stats,
    .last_error = engine_last_error,
    .describe = engine_describe,
    .mem_register = engine_mem_register,
    .mem_deregister = engine_mem_deregister,
    .window_register = hetccl_window_register,
    .window_deregister = hetccl_window_deregister,
    .win_user_ptr = hetccl_window_user_ptr,
    .suspend = engine_suspend,
    .resume = engine_resume,
    .split = hetccl_comm_split_engine,
    .shrink = hetccl_comm_shrink_engine,
    .grow = hetccl_comm_grow_engine,
    .grow_id = engine_grow_id,
    .dev_comm_create = hetccl_engine_devapi_dev_comm_create,
    .dev_comm_destroy = hetccl_engine_devapi_dev_comm_destroy,
    .team = hetccl_engine_devapi_team,
    .team_rank = hetccl_engine_devapi_team_rank,
    .gin_barrier = hetccl_engine_devapi_gin_barrier,
    .put_signal = hetccl_engine_devapi_put_signal,
    .signal = hetccl_engine_devapi_signal,
    .wait_signal = hetccl_engine_devapi_wait_signal,
};
