/* Communicator bookkeeping: the live set, errors, reduction operators.
 *
 * Any thread. The live set has its own lock; a communicator's last error
 * has the communicator's lock; everything else here is read-only after
 * init. */
#include "comm/comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/check.h"
#include "util/log.h"

/* Live communicators. A handle is checked against this set before anything
 * reads through it, so a destroyed or foreign handle is an error, not a
 * crash. Small and linear: processes hold few communicators. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t *live;
static int nlive, cap_live;

ncclResult_t hetccl_comm_register(ncclComm_t comm) {
  pthread_mutex_lock(&live_lock);
  if (nlive == cap_live) {
    int cap = cap_live ? 2 * cap_live : 16;
    ncclComm_t *n = realloc(live, cap * sizeof(*n));
    if (!n) {
      pthread_mutex_unlock(&live_lock);
      WARN("comm: out of memory registering a communicator");
      return ncclSystemError;
    }
    live = n;
    cap_live = cap;
  }
  live[nlive++] = comm;
  pthread_mutex_unlock(&live_lock);
  return ncclSuccess;
}

void hetccl_comm_unregister(ncclComm_t comm) {
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < nlive; i++) {
    if (live[i] == comm) {
      live[i] = live[--nlive];
      break;
    }
  }
  pthread_mutex_unlock(&live_lock);
}

static int is_live(ncclComm_t comm) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < nlive && !found; i++) found = live[i] == comm;
  pthread_mutex_unlock(&live_lock);
  return found;
}

ncclResult_t hetccl_comm_check(ncclComm_t comm, const char *func) {
  if (comm == NULL) {
    WARN("%s: comm is NULL", func);
    return ncclInvalidArgument;
  }
  if (!is_live(comm)) {
    WARN("%s: comm %p is not a live hetccl communicator (destroyed, aborted, or not created "
         "by hetccl)", func, (void *)comm);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_unsupported(const char *func, const char *why) {
  WARN("%s is not supported here: %s", func, why);
  return ncclInvalidUsage;
}

void hetccl_comm_note_call(ncclComm_t comm, ncclResult_t res) {
  if (!is_live(comm)) return;
  int failed = res != ncclSuccess && res != ncclInProgress;
  pthread_mutex_lock(&comm->state.lock);
  if (failed)
    snprintf(comm->state.last_error, sizeof(comm->state.last_error), "%s", hetccl_last_error());
  else comm->state.last_error[0] = '\0';
  pthread_mutex_unlock(&comm->state.lock);
}

void hetccl_comm_set_error(ncclComm_t comm, ncclResult_t res) {
  __sync_bool_compare_and_swap(&comm->state.error, ncclSuccess, res);
  const char *msg = hetccl_last_error();
  pthread_mutex_lock(&comm->state.lock);
  if (!comm->state.fail_error[0] && msg[0])
    snprintf(comm->state.fail_error, sizeof(comm->state.fail_error), "%s", msg);
  pthread_mutex_unlock(&comm->state.lock);
}

void hetccl_comm_fail_message(ncclComm_t comm, char *buf, size_t len) {
  pthread_mutex_lock(&comm->state.lock);
  snprintf(buf, len, "%s", comm->state.fail_error);
  pthread_mutex_unlock(&comm->state.lock);
}

void hetccl_comm_last_error(ncclComm_t comm, char *buf, size_t len) {
  int failed = __atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE) != ncclSuccess &&
               __atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE) != ncclInProgress;
  pthread_mutex_lock(&comm->state.lock);
  const char *msg = comm->state.last_error[0]             ? comm->state.last_error
                    : failed && comm->state.fail_error[0] ? comm->state.fail_error
                                                          : hetccl_last_error();
  snprintf(buf, len, "%s", msg);
  pthread_mutex_unlock(&comm->state.lock);
}

/* --- reduction operators ------------------------------------------------ */

static ncclResult_t builtin_op(ncclRedOp_t op, ncclDataType_t dtype, int nranks,
                               hetccl_redop_t *out) {
  memset(out, 0, sizeof(*out));
  out->dtype = dtype;
  out->nranks = nranks;
  switch (op) {
    case ncclSum: out->kind = HETCCL_RED_SUM; break;
    case ncclProd: out->kind = HETCCL_RED_PROD; break;
    case ncclMax: out->kind = HETCCL_RED_MAX; break;
    case ncclMin: out->kind = HETCCL_RED_MIN; break;
    case ncclAvg: out->kind = HETCCL_RED_SUM; out->average = 1; break;
    default: return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_comm_resolve_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dtype,
                                    hetccl_redop_t *out) {
  if ((int)op >= 0 && op < ncclNumOps) return builtin_op(op, dtype, comm->nranks, out);
  int slot = (int)op - (int)ncclNumOps;
  if (slot < 0 || slot >= HETCCL_MAX_USER_REDOPS || !comm->engine.redops[slot].in_use) {
    WARN("invalid reduction operator %d (not built-in, not created on this communicator)",
         (int)op);
    return ncclInvalidArgument;
  }
  if (comm->engine.redops[slot].op.dtype != dtype) {
    WARN("reduction operator %d was created for %s, used with %s", (int)op,
         hetccl_dtype_name(comm->engine.redops[slot].op.dtype), hetccl_dtype_name(dtype));
    return ncclInvalidArgument;
  }
  *out = comm->engine.redops[slot].op;
  return ncclSuccess;
}

ncclResult_t hetccl_comm_redop_create(ncclComm_t comm, ncclRedOp_t *op, const void *scalar,
                                      ncclDataType_t dtype) {
  pthread_mutex_lock(&comm->state.lock);
  int slot = -1;
  for (int i = 0; i < HETCCL_MAX_USER_REDOPS && slot < 0; i++)
    if (!comm->engine.redops[i].in_use) slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&comm->state.lock);
    WARN("ncclRedOpCreatePreMulSum: all %d operator slots of this communicator are in use",
         HETCCL_MAX_USER_REDOPS);
    return ncclInvalidUsage;
  }
  hetccl_redop_t *r = &comm->engine.redops[slot].op;
  memset(r, 0, sizeof(*r));
  r->dtype = dtype;
  r->kind = HETCCL_RED_SUM;
  r->premul = 1;
  r->nranks = comm->nranks;
  switch (dtype) {
    case ncclInt8: r->scalar_i = *(const int8_t *)scalar; break;
    case ncclUint8: r->scalar_u = *(const uint8_t *)scalar; break;
    case ncclInt32: r->scalar_i = *(const int32_t *)scalar; break;
    case ncclUint32: r->scalar_u = *(const uint32_t *)scalar; break;
    case ncclInt64: r->scalar_i = *(const int64_t *)scalar; break;
    case ncclUint64: r->scalar_u = *(const uint64_t *)scalar; break;
    case ncclFloat16: r->scalar_f = hetccl_half_to_float(*(const uint16_t *)scalar); break;
    case ncclFloat32: r->scalar_f = *(const float *)scalar; break;
    case ncclFloat64: r->scalar_f = *(const double *)scalar; break;
    case ncclBfloat16: r->scalar_f = hetccl_bf16_to_float(*(const uint16_t *)scalar); break;
    case ncclFloat8e4m3: r->scalar_f = hetccl_e4m3_to_float(*(const uint8_t *)scalar); break;
    case ncclFloat8e5m2: r->scalar_f = hetccl_e5m2_to_float(*(const uint8_t *)scalar); break;
    default: break;
  }
  comm->engine.redops[slot].in_use = 1;
  pthread_mutex_unlock(&comm->state.lock);
  *op = (ncclRedOp_t)(ncclNumOps + slot);
  return ncclSuccess;
}

ncclResult_t hetccl_comm_redop_destroy(ncclComm_t comm, ncclRedOp_t op) {
  int slot = (int)op - (int)ncclNumOps;
  pthread_mutex_lock(&comm->state.lock);
  int ok = slot >= 0 && slot < HETCCL_MAX_USER_REDOPS && comm->engine.redops[slot].in_use;
  if (ok) comm->engine.redops[slot].in_use = 0;
  pthread_mutex_unlock(&comm->state.lock);
  if (!ok) {
    WARN("ncclRedOpDestroy: operator %d was not created on this communicator (or is built-in)",
         (int)op);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* --- operation signatures --------------------------------------------------
 * Structured so that a hex dump in an error message can be read:
 * [63:60] function+1, [59:56] dtype, [55:52] operator (kind, +8 if premul/avg),
 * [51:40] root, [39:16] low 24 bits of count, [15:0] collective sequence. */
uint64_t hetccl_comm_coll_tag(ncclComm_t comm, const hetccl_coll_t *c) {
  uint64_t op = (uint64_t)c->op.kind | ((c->op.premul || c->op.average) ? 8u : 0u);
  uint64_t seq = comm->engine.op_seq++;
  return ((uint64_t)(c->func + 1) << 60) | ((uint64_t)(c->dtype & 0xf) << 56) |
         ((op & 0xf) << 52) | (((uint64_t)c->root & 0xfff) << 40) |
         (((uint64_t)c->count & 0xffffff) << 16) | (seq & 0xffff);
}

uint64_t hetccl_comm_p2p_tag(size_t bytes) {
  return ((uint64_t)(HETCCL_FUNC_SEND + 1) << 60) | ((uint64_t)bytes & 0xffffffffffull);
}
