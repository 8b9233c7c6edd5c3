/* Argument checks that need no communicator (checks.h). */
#include "api/checks.h"

#include <string.h>

#include "util/log.h"

ncclResult_t check_null(const char *fn, const char *name) {
  WARN("%s: %s is NULL", fn, name);
  return ncclInvalidArgument;
}

ncclResult_t check_dtype(const char *fn, ncclDataType_t dtype) {
  if ((int)dtype >= 0 && (int)dtype < ncclNumTypes) return ncclSuccess;
  WARN("%s: invalid datatype %d", fn, (int)dtype);
  return ncclInvalidArgument;
}

ncclResult_t check_count(const char *fn, const char *name, int value, int min) {
  if (value >= min) return ncclSuccess;
  WARN("%s: %s %d must be >= %d", fn, name, value, min);
  return ncclInvalidArgument;
}

ncclResult_t check_init(const char *fn, ncclComm_t *newcomm, int nranks, int rank) {
  if (!newcomm) return check_null(fn, "newcomm");
  *newcomm = NULL; /* as NCCL: no stale handle on failure */
  ncclResult_t res = check_count(fn, "nranks", nranks, 1);
  if (res == ncclSuccess && (rank < 0 || rank >= nranks)) {
    WARN("%s: rank %d out of range [0, %d)", fn, rank, nranks);
    res = ncclInvalidArgument;
  }
  return res;
}

ncclResult_t check_color(int color) {
  if (color >= 0 || color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  WARN("ncclCommSplit: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
  return ncclInvalidArgument;
}

ncclResult_t check_shrink(const int *exclude, int nexclude, int flags) {
  if (nexclude < 0 || (nexclude > 0 && !exclude)) {
    WARN("ncclCommShrink: bad exclude list (%p, %d)", (const void *)exclude, nexclude);
    return ncclInvalidArgument;
  }
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT) {
    WARN("ncclCommShrink: flags 0x%x must be NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT", flags);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t check_grow(ncclComm_t comm, const ncclUniqueId *id) {
  if (comm || id) return ncclSuccess;
  WARN("ncclCommGrow: a joining rank (no communicator) needs the unique id");
  return ncclInvalidArgument;
}

ncclResult_t check_sim_info(const ncclSimInfo_t *info) {
  if (info->magic == 0x74685283u) return ncclSuccess;
  WARN("ncclGroupSimulateEnd: simInfo not initialised with NCCL_SIM_INFO_INITIALIZER");
  return ncclInvalidArgument;
}

ncclResult_t check_signal_descs(int ndesc, const ncclWaitSignalDesc_t *descs) {
  if (ndesc >= 0 && (ndesc == 0 || descs)) return ncclSuccess;
  WARN("ncclWaitSignal: %d descriptors at %p", ndesc, (const void *)descs);
  return ncclInvalidArgument;
}

ncclResult_t check_param_out(const void *out, int max_len) {
  if (out || max_len == 0) return ncclSuccess;
  return check_null("ncclParamGet", "out");
}

/* --- operations ----------------------------------------------------------- */

static ncclResult_t check_config(const hetccl_op_t *op) {
  const ncclCollConfig_t *c = op->config;
  if (!c) return ncclSuccess;
  if (c->magic != NCCL_API_MAGIC) {
    WARN("%s: ncclCollConfig_t not initialised with NCCL_COLLCONFIG_INITIALIZER", op->fn);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* A buffer every rank needs (a root-only one is the core's to check). */
static int needs_everywhere(const hetccl_op_t *op, int send) {
  switch (op->kind) {
    case HETCCL_OP_Send: return send;
    case HETCCL_OP_Recv: return !send;
    case HETCCL_OP_Broadcast: case HETCCL_OP_Bcast: return !send;
    case HETCCL_OP_Reduce: case HETCCL_OP_Gather: return send;
    case HETCCL_OP_Scatter: return !send;
    default: return 1;
  }
}

ncclResult_t check_op(const hetccl_op_t *op) {
  ncclResult_t res = check_dtype(op->fn, op->dtype);
  if (res != ncclSuccess) return res;
  if (op->redop != HETCCL_NO_REDOP && (int)op->redop < 0) {
    WARN("%s: invalid reduction operator %d", op->fn, (int)op->redop);
    return ncclInvalidArgument;
  }
  if (op->root != HETCCL_NO_ROOT && op->root < 0) {
    WARN("%s: root %d is negative", op->fn, op->root);
    return ncclInvalidArgument;
  }
  if (op->peer != HETCCL_NO_PEER && op->peer < 0) {
    WARN("%s: peer %d is negative", op->fn, op->peer);
    return ncclInvalidArgument;
  }
  if (op->count) {
    if (needs_everywhere(op, 1) && !op->sendbuf) return check_null(op->fn, "sendbuff");
    if (needs_everywhere(op, 0) && !op->recvbuf) return check_null(op->fn, "recvbuff");
  }
  return check_config(op);
}

ncclResult_t check_named(const char *fn, ncclResult_t res) {
  if (res != ncclInvalidArgument && res != ncclInvalidUsage) return res;
  const char *last = hetccl_last_error();
  if (last[0] && !strstr(last, fn)) hetccl_last_error_prefix("%s", fn);
  return res;
}
