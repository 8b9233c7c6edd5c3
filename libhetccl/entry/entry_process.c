/* The core half of the process-wide entry points (entry/dispatch.h):
 * version, errors, memory, reduction operators; and hetccl's own entry
 * points (include/hetccl.h, exported by api/own.c).
 *
 * Thread: the API caller. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/comm.h"
#include "comm/identity.h"
#include "entry/dispatch.h"
#include "hetccl.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/knob_check.h"
#include "util/knobs.h"
#include "util/log.h"

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

/* The vendor's version when this process forwards to one (so programs gate
 * features on what will really serve them), else the API version hetccl
 * implements. */
ncclResult_t hetccl_GetVersion(int *version) {
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

const char *hetccl_GetErrorString(ncclResult_t result) {
  switch (result) {
#define RESULT_CASE(code, text) case code: return text;
    HETCCL_RESULTS(RESULT_CASE)
#undef RESULT_CASE
    default: return "unknown result code";
  }
}

/* Not an API call of its own for the last error: it reads it. */
const char *hetccl_GetLastError(ncclComm_t comm) {
  static __thread char copy[HETCCL_ERRMSG_BYTES];
  if (comm && hetccl_comm_check(comm, "ncclGetLastError") == ncclSuccess)
    return hetccl_backend_of(comm)->last_error(comm, copy, sizeof(copy));
  return hetccl_last_error();
}

ncclResult_t hetccl_MemAlloc(void **ptr, size_t size) {
  const hetccl_vendor_t *v = process_vendor();
  if (v) return HETCCL_VENDOR_CALL(v, MemAlloc, ptr, size);
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  HETCCL_CHECK(rt->mem_alloc(ptr, size));
  hetccl_transport_mem_allocated(*ptr, size); /* used in place by ib */
  return ncclSuccess;
}

ncclResult_t hetccl_MemFree(void *ptr) {
  const hetccl_vendor_t *v = process_vendor();
  if (v) return HETCCL_VENDOR_CALL(v, MemFree, ptr);
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  hetccl_transport_mem_freed(ptr); /* no registration outlives the memory */
  return rt->mem_free(ptr);
}

ncclResult_t hetccl_RedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclRedOpCreatePreMulSum"));
  return hetccl_backend_of(comm)->redop_create(comm, op, scalar, datatype, residence);
}

ncclResult_t hetccl_RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclRedOpDestroy"));
  return hetccl_backend_of(comm)->redop_destroy(comm, op);
}

/* --- hetccl's own entry points --------------------------------------------- */

const char *hetccl_own_VersionString(void) { return HETCCL_VERSION_STRING; }

int hetccl_own_KnobCount(void) { return HETCCL_KNOB_COUNT; }

ncclResult_t hetccl_own_KnobInfo(int index, const char **name, const char **type,
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
  const char *given, *why;
  if (value && hetccl_knob_refused((hetccl_knob_t)index, &given, &why)) {
    *value = given; /* what was set, for `hetccl info` to flag: no reader sees it */
  } else if (value) {
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

ncclResult_t hetccl_own_KnobsCheck(void) { return hetccl_knobs_check(); }

int hetccl_own_RuntimeCount(void) { return HETCCL_DEV_COUNT; }

ncclResult_t hetccl_own_RuntimeInfo(int index, const char **name, int *available,
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

int hetccl_own_VendorCount(void) { return HETCCL_VENDOR_COUNT; }

ncclResult_t hetccl_own_VendorInfo(int index, const char **name, int *version,
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

int hetccl_own_TransportCount(void) { return HETCCL_TRANSPORT_COUNT; }

static unsigned long long copied_of(ncclComm_t comm, int t) {
  if (comm == NULL) return 0;
  return __atomic_load_n(&comm->engine.copied[t], __ATOMIC_RELAXED) +
         copied_of(comm->hier.island, t) + copied_of(comm->hier.leaders, t) +
         copied_of(comm->hier.rail, t);
}

ncclResult_t hetccl_own_CommCopiedBytes(ncclComm_t comm, int index, const char **transport,
                                        unsigned long long *bytes) {
  HETCCL_CHECK(hetccl_comm_check(comm, "hetcclCommCopiedBytes"));
  if (index < 0 || index >= HETCCL_COPIED_PATHS) {
    WARN("hetcclCommCopiedBytes: index %d is not in [0, %d]", index, HETCCL_TRANSPORT_COUNT);
    return ncclInvalidArgument;
  }
  if (transport) *transport = hetccl_copied_path_name(index);
  if (bytes) *bytes = copied_of(comm, index);
  return ncclSuccess;
}

ncclResult_t hetccl_own_TransportHostInfo(int index, int localRanks, const char **name,
                                          const char **text) {
  if (index < 0 || index >= HETCCL_TRANSPORT_COUNT || localRanks < 1) {
    WARN("hetcclTransportHostInfo: index %d not in [0, %d), or %d local ranks (at least 1)",
         index, HETCCL_TRANSPORT_COUNT, localRanks);
    return ncclInvalidArgument;
  }
  static __thread char buf[512];
  const hetccl_transport_t *t = hetccl_transport_get((hetccl_transport_id_t)index);
  buf[0] = '\0';
  if (t->host_info) t->host_info(localRanks, buf, sizeof(buf));
  if (name) *name = t->name;
  if (text) *text = buf;
  return ncclSuccess;
}

const char *hetccl_own_CommBackend(ncclComm_t comm) {
  if (!comm || hetccl_comm_check(comm, "hetcclCommBackend") != ncclSuccess) return "invalid";
  return hetccl_backend_of(comm)->describe(comm);
}
