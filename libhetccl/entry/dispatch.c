/* Where an operation goes (dispatch.h), and the last error of every call.
 *
 *   forwarded communicator          the vendor's function (its *Config form
 *                                   when the caller gave a config and the
 *                                   vendor has it), one indirect call
 *   hierarchical communicator       the operation's hierarchical form
 *                                   (core/hier_ops.c) where it has one;
 *                                   inside a group, at the group's end
 *   otherwise                       engine tasks (core/enqueue.h); device
 *                                   buffers among them go to the data
 *                                   plane or to staging at the group's end
 *                                   (core/group.c)
 *
 * Thread: the API caller's. */
#include "entry/dispatch.h"

#include "comm/comm.h"
#include "exec/enqueue.h"
#include "exec/group.h"
#include "hier/hier.h"
#include "comm/init.h"
#include "exec/trace_points.h"
#include "util/check.h"
#include "util/log.h"

void hetccl_call_begin(void) { hetccl_last_error_clear(); }

ncclResult_t hetccl_call_end(ncclComm_t comm, ncclResult_t res) {
  if (comm) hetccl_comm_note_call(comm, res);
  return res;
}

/* --- forwarded ---------------------------------------------------------------- */

#define VCALL(slot, ...) HETCCL_VENDOR_CALL(v, slot, __VA_ARGS__)
/* The *Config form where the caller gave a config and the vendor has it. */
#define VCALL_CFG(slot, ...)                                                   \
  (op->config && HETCCL_VENDOR_HAS(v, slot##Config)                           \
       ? VCALL(slot##Config, __VA_ARGS__, op->config)                          \
       : VCALL(slot, __VA_ARGS__))

static ncclResult_t forward_op(ncclComm_t comm, const hetccl_op_t *op) {
  const hetccl_vendor_t *v = comm->vendor;
  ncclComm_t vc = comm->vcomm;
  const void *s = op->sendbuf;
  void *r = op->recvbuf, *st = op->stream;
  size_t n = op->count;
  ncclDataType_t t = op->dtype;
  TRACE(HETCCL_CALL, "%s rank %d -> %s", op->fn, comm->rank, v->name);
  if (op->config && !HETCCL_VENDOR_HAS(v, AllReduceConfig) && op->config->algSelection &&
      op->config->algSelection[0] && op->config->forceAlgSelection) {
    WARN("%s: %s (version %d) has no nccl*Config collectives to honour algorithm selection "
         "\"%s\"", op->fn, v->path, v->version, op->config->algSelection);
    return ncclInvalidUsage;
  }
  switch (op->kind) {
    case HETCCL_OP_AllReduce: return VCALL_CFG(AllReduce, s, r, n, t, op->redop, vc, st);
    case HETCCL_OP_Broadcast: return VCALL_CFG(Broadcast, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Bcast: return VCALL(Bcast, r, n, t, op->root, vc, st);
    case HETCCL_OP_Reduce: return VCALL_CFG(Reduce, s, r, n, t, op->redop, op->root, vc, st);
    case HETCCL_OP_AllGather: return VCALL_CFG(AllGather, s, r, n, t, vc, st);
    case HETCCL_OP_ReduceScatter: return VCALL_CFG(ReduceScatter, s, r, n, t, op->redop, vc, st);
    case HETCCL_OP_AlltoAll: return VCALL_CFG(AlltoAll, s, r, n, t, vc, st);
    case HETCCL_OP_Gather: return VCALL_CFG(Gather, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Scatter: return VCALL_CFG(Scatter, s, r, n, t, op->root, vc, st);
    case HETCCL_OP_Send: return VCALL(Send, s, n, t, op->peer, vc, st);
    case HETCCL_OP_Recv: return VCALL(Recv, r, n, t, op->peer, vc, st);
    default: break;
  }
  WARN("%s: operation kind %d has no vendor function", op->fn, (int)op->kind);
  return ncclInternalError;
}

/* --- hetccl's own ------------------------------------------------------------- */

static ncclResult_t run_op(ncclComm_t comm, const hetccl_op_t *op) {
  hetccl_comm_enter(comm);
  ncclResult_t res = hetccl_comm_usable(comm, op->fn);
  if (res == ncclSuccess) res = hetccl_op_validate(comm, op);
  if (res == ncclSuccess)
    res = !hetccl_hier_applies(comm, op) ? hetccl_enqueue_op(comm, op)
          : hetccl_group_depth() > 0    ? hetccl_hier_defer(comm, op)
                                        : hetccl_hier_run(comm, op);
  hetccl_comm_leave(comm);
  if (res != ncclSuccess && res != ncclInProgress) hetccl_group_note_error(res);
  return res;
}

ncclResult_t hetccl_dispatch(ncclComm_t comm, const hetccl_op_t *op) {
  HETCCL_CHECK(hetccl_comm_check(comm, op->fn));
  uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_call_begin(comm) : 0;
  ncclResult_t res = comm->vendor ? forward_op(comm, op) : run_op(comm, op);
  if (traced) hetccl_comm_trace_call_end(comm, op, traced);
  return res;
}
