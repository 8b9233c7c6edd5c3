/* Version, errors, memory, reduction operators, and hetccl's own entry
 * points (include/hetccl.h).
 *
 * Thread: the API caller. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "hetccl.h"
#include "core/init.h"
#include "util/knobs.h"

/* The vendor library this process forwards to: the loaded one, else, in a
 * GPU process, the one it would load at its first communicator. */
static const hetccl_vendor_t *process_vendor(void) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  hetccl_vendor_id_t vid;
  if (!v && hetccl_knob_int(HETCCL_KNOB_VENDOR) &&
      hetccl_dev_vendor(hetccl_process_dev_kind(), &vid))
    hetccl_vendor_load(vid, &v);
  return v;
}

ncclResult_t hetccl_api_unsupported(const char *func, const char *why) {
  WARN("%s is not supported here: %s", func, why);
  return ncclInvalidUsage;
}

/* The vendor's version when this process forwards to one (so programs gate
 * features on what will really serve them), else the API version hetccl
 * implements. */
NCCL_API(ncclResult_t, ncclGetVersion, int *version);
ncclResult_t ncclGetVersion(int *version) {
  HETCCL_REENTRY(GetVersion, version);
  HETCCL_ARGCHECK(version != NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
  const hetccl_vendor_t *v = process_vendor();
  *version = v ? v->version : NCCL_VERSION_CODE;
  return ncclSuccess;
}

#define HETCCL_RESULTS(X)                                                      \
  X(ncclSuccess, "no error")                                                   \
  X(ncclUnhandledCudaError, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)") \
  X(ncclSystemError, "unhandled system error (run with NCCL_DEBUG=INFO for details)") \
  X(ncclInternalError, "internal error - please report this issue to the hetccl developers") \
  X(ncclInvalidArgument, "invalid argument (run with NCCL_DEBUG=WARN for details)") \
  X(ncclInvalidUsage, "invalid usage (run with NCCL_DEBUG=WARN for details)")  \
  X(ncclRemoteError, "remote process exited or there was a network error")    \
  X(ncclInProgress, "NCCL operation in progress")                              \
  X(ncclTimeout, "operation timed out waiting on a peer")

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result);
const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
#define RESULT_CASE(code, text) case code: return text;
    HETCCL_RESULTS(RESULT_CASE)
#undef RESULT_CASE
    default: return "unknown result code";
  }
}

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm);
const char *ncclGetLastError(ncclComm_t comm) {
  HETCCL_REENTRY(GetLastError, comm);
  /* The communicator's message may be rewritten by its proxy thread at any
   * time: the caller gets its own copy, taken under the lock. */
  static __thread char copy[HETCCL_ERRMSG_BYTES];
  if (comm && hetccl_comm_check(comm, "ncclGetLastError") == ncclSuccess) {
    if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, GetLastError, comm->vcomm);
    pthread_mutex_lock(&comm->lock);
    int has = comm->last_error[0] != '\0';
    if (has) memcpy(copy, comm->last_error, sizeof(copy));
    pthread_mutex_unlock(&comm->lock);
    if (has) return copy;
  }
  return hetccl_last_error();
}

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size);
ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  HETCCL_REENTRY(MemAlloc, ptr, size);
  HETCCL_ARGCHECK(ptr != NULL, ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  const hetccl_vendor_t *v = process_vendor();
  if (v) return HETCCL_VENDOR_CALL(v, MemAlloc, ptr, size);
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  return rt->mem_alloc(ptr, size);
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr);
ncclResult_t ncclMemFree(void *ptr) {
  HETCCL_REENTRY(MemFree, ptr);
  const hetccl_vendor_t *v = process_vendor();
  if (v) return HETCCL_VENDOR_CALL(v, MemFree, ptr);
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  return rt->mem_free(ptr);
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  HETCCL_REENTRY(RedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclRedOpCreatePreMulSum"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, RedOpCreatePreMulSum, op, scalar, datatype, residence,
                              comm->vcomm);
  ncclResult_t res = ncclSuccess;
  if (!op || !scalar) {
    WARN("ncclRedOpCreatePreMulSum: %s is NULL", op ? "scalar" : "op");
    res = ncclInvalidArgument;
  } else if ((int)datatype < 0 || (int)datatype >= ncclNumTypes) {
    WARN("ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
    res = ncclInvalidArgument;
  } else if (residence != ncclScalarHostImmediate) {
    /* The engine reduces on the host: a device-resident scalar would have
     * to be read at run time from device memory it does not manage. */
    res = hetccl_api_unsupported("ncclRedOpCreatePreMulSum",
                                 "ncclScalarDevice needs a vendor communicator; use "
                                 "ncclScalarHostImmediate on host ranks");
  } else {
    res = hetccl_comm_redop_create(comm, op, scalar, datatype);
  }
  return hetccl_api_ret(comm, res);
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  HETCCL_REENTRY(RedOpDestroy, op, comm);
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclRedOpDestroy"));
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, RedOpDestroy, op, comm->vcomm);
  return hetccl_api_ret(comm, hetccl_comm_redop_destroy(comm, op));
}

/* --- hetccl's own entry points --------------------------------------------- */

HETCCL_EXPORT const char *hetcclVersionString(void) { return HETCCL_VERSION_STRING; }

HETCCL_EXPORT int hetcclKnobCount(void) { return HETCCL_KNOB_COUNT; }

HETCCL_EXPORT ncclResult_t hetcclKnobInfo(int index, const char **name, const char **type,
                                          const char **defaultValue, const char **value,
                                          const char **help) {
  if (index < 0 || index >= HETCCL_KNOB_COUNT) {
    WARN("hetcclKnobInfo: index %d out of range [0, %d)", index, HETCCL_KNOB_COUNT);
    return ncclInvalidArgument;
  }
  const hetccl_knob_desc_t *d = hetccl_knob_desc((hetccl_knob_t)index);
  if (name) *name = d->env;
  if (type) *type = d->type_name; /* "int", "str", "enum:auto|shm|..." */
  if (defaultValue) *defaultValue = d->def;
  if (value) {
    static __thread char buf[32];
    if (d->type == HETCCL_KNOB_INT) {
      snprintf(buf, sizeof(buf), "%lld", (long long)hetccl_knob_int((hetccl_knob_t)index));
      *value = buf;
    } else {
      *value = hetccl_knob_str((hetccl_knob_t)index);
    }
  }
  if (help) *help = d->help;
  return ncclSuccess;
}

HETCCL_EXPORT ncclResult_t hetcclKnobsCheck(void) { return hetccl_knobs_check(); }

HETCCL_EXPORT int hetcclRuntimeCount(void) { return HETCCL_DEV_COUNT; }

HETCCL_EXPORT ncclResult_t hetcclRuntimeInfo(int index, const char **name, int *available,
                                             const char **detail) {
  const hetccl_runtime_t *rt = index >= 0 ? hetccl_runtime_get((hetccl_dev_kind_t)index) : NULL;
  if (!rt) {
    WARN("hetcclRuntimeInfo: index %d out of range [0, %d)", index, HETCCL_DEV_COUNT);
    return ncclInvalidArgument;
  }
  if (name) *name = rt->name;
  if (available) *available = rt->available();
  if (detail) *detail = rt->describe();
  return ncclSuccess;
}

HETCCL_EXPORT int hetcclVendorCount(void) { return HETCCL_VENDOR_COUNT; }

HETCCL_EXPORT ncclResult_t hetcclVendorInfo(int index, const char **name, int *version,
                                            const char **detail) {
  if (index < 0 || index >= HETCCL_VENDOR_COUNT) {
    WARN("hetcclVendorInfo: index %d out of range [0, %d)", index, HETCCL_VENDOR_COUNT);
    return ncclInvalidArgument;
  }
  const char *said = NULL;
  const hetccl_vendor_t *v = hetccl_vendor_probe((hetccl_vendor_id_t)index, &said);
  if (name) *name = hetccl_vendor_name((hetccl_vendor_id_t)index);
  if (version) *version = v ? v->version : 0;
  if (detail) *detail = said;
  return ncclSuccess;
}

HETCCL_EXPORT const char *hetcclCommBackend(ncclComm_t comm) {
  if (!comm || hetccl_comm_check(comm, "hetcclCommBackend") != ncclSuccess) return "invalid";
  if (comm->vendor) return comm->vendor->backend;
  if (comm->hier) { /* what serves the inside of this rank's island */
    const hetccl_vendor_t *v = comm->island ? comm->island->vendor : NULL;
    return v ? v->hier_backend : "hierarchical:engine";
  }
  return comm->engine ? "engine" : "initializing";
}
