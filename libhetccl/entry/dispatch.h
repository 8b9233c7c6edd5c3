/* entry/: the core half of every entry point (api/ generates the exported
 * symbols, entries.h lists them): check the communicator, call its
 * backend's slot (comm/backend.h) or the process-wide function, keep the
 * last error. It runs on the API caller's thread, holds no state of its
 * own, and never tests which backend serves a communicator.
 *
 * What the API layer sees of the core: the one header api/ includes.
 *
 * Every nccl* entry point (libhetccl/entries.h) checks its arguments as far
 * as it can without a communicator, then makes one call into the core: the
 * core half of the function, hetccl_<Name>, declared below from the same
 * list; for collectives and point-to-point, hetccl_dispatch with the call
 * packed into an operation. From there the core owns everything: whether
 * the communicator is live and usable, the choice between the vendor
 * library (one island), the hierarchical form (several islands, one of them
 * with several ranks), the cross-island data plane and the engine, and the
 * last error.
 *
 * The last error. hetccl_call_begin clears the calling thread's; a failure
 * is logged once where it is born (which makes it the thread's last error)
 * and hetccl_call_end also keeps it as the communicator's, so that
 * ncclGetLastError(comm) says why that communicator's last call failed. A
 * call that succeeds clears the communicator's too. What made a
 * communicator fail (a dead peer, a failed stream operation) stays
 * readable through ncclGetLastError(comm) for as long as it is failed.
 *
 * The vendor table is exposed for the re-entry check only (api/api.h).
 *
 * Thread: the API caller's. */
#ifndef HETCCL_ENTRY_DISPATCH_H
#define HETCCL_ENTRY_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "comm/op.h"
#include "entries.h"
#include "hetccl.h"
#include "nccl.h"
#include "nccl_device_host.h"
#include "vendor_ccl/vendor.h"

/* Run op on comm: forwarded, hierarchical, on the data plane or the
 * engine; enqueued on op->stream where it has device buffers. */
ncclResult_t hetccl_dispatch(ncclComm_t comm, const hetccl_op_t *op);

/* The frame of every entry (see above). comm may be NULL or invalid:
 * the communicator's record is then left alone. Returns res. */
void hetccl_call_begin(void);
ncclResult_t hetccl_call_end(ncclComm_t comm, ncclResult_t res);

/* The core half of every other entry point: same parameters. */
#define HETCCL_CORE_CALL_PROTO(kind, name, params, args, checks) ncclResult_t hetccl_##name params;
HETCCL_API_CALLS(HETCCL_CORE_CALL_PROTO)
#undef HETCCL_CORE_CALL_PROTO
#define HETCCL_CORE_VALUE_PROTO(kind, ret, name, params, args) ret hetccl_##name params;
HETCCL_API_VALUES(HETCCL_CORE_VALUE_PROTO)
#undef HETCCL_CORE_VALUE_PROTO

/* Without a result code: ncclParamDumpAll, ncclResetDebugInit(Internal). */
void hetccl_ParamDumpAll(void);
void hetccl_ResetDebugInit(void);

/* hetcclCommInitRankAs, whose arguments api/own.c checks as
 * ncclCommInitRankConfig's. */
ncclResult_t hetccl_CommInitRankAs(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank,
                                   ncclConfig_t *config, hetcclDevice_t device);

/* hetccl's own entry points (include/hetccl.h): hetcclName (api/own.c)
 * calls hetccl_own_Name (entry/entry_process.c). X(ret, Name, params, args) */
#define HETCCL_OWN_ENTRIES(X)                                                                     \
  X(const char *, VersionString, (void), ())                                                      \
  X(int, KnobCount, (void), ())                                                                   \
  X(ncclResult_t, KnobInfo,                                                                       \
    (int index, const char **name, const char **type, const char **defaultValue,                 \
     const char **value, const char **help),                                                      \
    (index, name, type, defaultValue, value, help))                                               \
  X(ncclResult_t, KnobsCheck, (void), ())                                                         \
  X(int, RuntimeCount, (void), ())                                                                \
  X(ncclResult_t, RuntimeInfo, (int index, const char **name, int *available, const char **detail), \
    (index, name, available, detail))                                                             \
  X(int, VendorCount, (void), ())                                                                 \
  X(ncclResult_t, VendorInfo, (int index, const char **name, int *version, const char **detail),  \
    (index, name, version, detail))                                                               \
  X(const char *, CommBackend, (ncclComm_t comm), (comm))                                         \
  X(int, TransportCount, (void), ())                                                              \
  X(ncclResult_t, CommCopiedBytes,                                                                \
    (ncclComm_t comm, int index, const char **transport, unsigned long long *bytes),              \
    (comm, index, transport, bytes))                                                              \
  X(ncclResult_t, TransportHostInfo,                                                              \
    (int index, int localRanks, const char **name, const char **text),                            \
    (index, localRanks, name, text))

#define HETCCL_OWN_PROTO(ret, name, params, args) ret hetccl_own_##name params;
HETCCL_OWN_ENTRIES(HETCCL_OWN_PROTO)
#undef HETCCL_OWN_PROTO

#endif
