/* Vendor CCL layer: a real NCCL-API library (NCCL, RCCL) opened with dlopen.
 *
 * RCCL exports the NCCL API under the same names, so one slot table and one
 * loader serve both; a small descriptor per vendor (vendor_ccl/loader.c) says
 * where each is looked for. A process forwards to the vendor of its device
 * kind (the vendor column of HETCCL_DEVICE_KINDS in runtime/runtime.h, read
 * by comm/identity.c): NCCL for CUDA ranks, RCCL for HIP ranks.
 *
 * Every slot is taken with dlsym on the library's own handle, never by
 * global symbol lookup, so that hetccl (which exports the same names, and
 * may itself be installed as libnccl.so.2 or librccl.so.1) is never found in
 * its place. A handle that resolves to hetccl itself is refused.
 *
 * Slots that the loaded version lacks stay at a shared stub that returns
 * ncclInvalidUsage with a message naming the function and the version (never
 * NULL). Required slots (init, destroy, the collectives, group calls) are
 * checked at load: a library missing one is refused.
 *
 * Threads: loading is once per process and vendor (thread-safe); slots are
 * called from the API thread exactly as the application called hetccl. */
#ifndef HETCCL_VENDOR_H
#define HETCCL_VENDOR_H

#include "nccl.h"
#include "nccl_device_host.h"
#include "util/knobs.h"

/* The vendor libraries hetccl can forward to; what each is called and where
 * it is looked for is its descriptor in vendor_ccl/loader.c. */
#define HETCCL_VENDORS(X) X(NCCL) X(RCCL)

typedef enum {
#define HETCCL_VENDOR_ENUM(id) HETCCL_VENDOR_##id,
  HETCCL_VENDORS(HETCCL_VENDOR_ENUM)
#undef HETCCL_VENDOR_ENUM
  HETCCL_VENDOR_COUNT
} hetccl_vendor_id_t;

/* "nccl", "rccl"; "NCCL", "RCCL" (messages); the knob naming its library. */
const char *hetccl_vendor_name(hetccl_vendor_id_t id);
const char *hetccl_vendor_title(hetccl_vendor_id_t id);
hetccl_knob_t hetccl_vendor_knob(hetccl_vendor_id_t id);

/* X(slot, return type, parameter list) for every forwarded function. */
#define HETCCL_VENDOR_SLOTS(X)                                                                    \
  X(GetVersion, ncclResult_t, (int *version))                                                     \
  X(GetUniqueId, ncclResult_t, (ncclUniqueId *id))                                                \
  X(CommInitRankConfig, ncclResult_t,                                                             \
    (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config))              \
  X(CommInitRank, ncclResult_t, (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank))        \
  X(CommFinalize, ncclResult_t, (ncclComm_t comm))                                                \
  X(CommDestroy, ncclResult_t, (ncclComm_t comm))                                                 \
  X(CommAbort, ncclResult_t, (ncclComm_t comm))                                                   \
  X(CommRevoke, ncclResult_t, (ncclComm_t comm, int flags))                                       \
  X(CommSplit, ncclResult_t,                                                                      \
    (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config))             \
  X(CommShrink, ncclResult_t,                                                                     \
    (ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm, ncclConfig_t *config,      \
     int flags))                                                                                  \
  X(CommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t *err))                        \
  X(CommCount, ncclResult_t, (const ncclComm_t comm, int *count))                                 \
  X(CommCuDevice, ncclResult_t, (const ncclComm_t comm, int *dev))                                \
  X(CommUserRank, ncclResult_t, (const ncclComm_t comm, int *rank))                               \
  X(CommRegister, ncclResult_t, (const ncclComm_t comm, void *buff, size_t size, void **handle))  \
  X(CommDeregister, ncclResult_t, (const ncclComm_t comm, void *handle))                          \
  X(CommWindowRegister, ncclResult_t,                                                             \
    (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int flags))                     \
  X(CommWindowDeregister, ncclResult_t, (ncclComm_t comm, ncclWindow_t win))                      \
  X(CommSuspend, ncclResult_t, (ncclComm_t comm, int flags))                                      \
  X(CommResume, ncclResult_t, (ncclComm_t comm))                                                  \
  X(CommMemStats, ncclResult_t, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value))       \
  X(MemAlloc, ncclResult_t, (void **ptr, size_t size))                                            \
  X(MemFree, ncclResult_t, (void *ptr))                                                           \
  X(GetErrorString, const char *, (ncclResult_t result))                                          \
  X(GetLastError, const char *, (ncclComm_t comm))                                                \
  X(RedOpCreatePreMulSum, ncclResult_t,                                                           \
    (ncclRedOp_t * op, void *scalar, ncclDataType_t dtype, ncclScalarResidence_t residence,       \
     ncclComm_t comm))                                                                            \
  X(RedOpDestroy, ncclResult_t, (ncclRedOp_t op, ncclComm_t comm))                                \
  X(Reduce, ncclResult_t,                                                                         \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclRedOp_t op,    \
     int root, ncclComm_t comm, cudaStream_t stream))                                             \
  X(Bcast, ncclResult_t,                                                                          \
    (void *buff, size_t count, ncclDataType_t dtype, int root, ncclComm_t comm,                   \
     cudaStream_t stream))                                                                        \
  X(Broadcast, ncclResult_t,                                                                      \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream))                                                       \
  X(AllReduce, ncclResult_t,                                                                      \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclRedOp_t op,    \
     ncclComm_t comm, cudaStream_t stream))                                                       \
  X(ReduceScatter, ncclResult_t,                                                                  \
    (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t dtype,                \
     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))                                       \
  X(AllGather, ncclResult_t,                                                                      \
    (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t dtype,                \
     ncclComm_t comm, cudaStream_t stream))                                                       \
  X(AlltoAll, ncclResult_t,                                                                       \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclComm_t comm,   \
     cudaStream_t stream))                                                                        \
  X(Gather, ncclResult_t,                                                                         \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream))                                                       \
  X(Scatter, ncclResult_t,                                                                        \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream))                                                       \
  X(Send, ncclResult_t,                                                                           \
    (const void *sendbuff, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,         \
     cudaStream_t stream))                                                                        \
  X(Recv, ncclResult_t,                                                                           \
    (void *recvbuff, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,               \
     cudaStream_t stream))                                                                        \
  X(AllReduceConfig, ncclResult_t,                                                                \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclRedOp_t op,    \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))                       \
  X(BroadcastConfig, ncclResult_t,                                                                \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))                       \
  X(ReduceConfig, ncclResult_t,                                                                   \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclRedOp_t op,    \
     int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))             \
  X(AllGatherConfig, ncclResult_t,                                                                \
    (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t dtype,                \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))                       \
  X(ReduceScatterConfig, ncclResult_t,                                                            \
    (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t dtype,                \
     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))       \
  X(AlltoAllConfig, ncclResult_t,                                                                 \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, ncclComm_t comm,   \
     cudaStream_t stream, const ncclCollConfig_t *config))                                        \
  X(GatherConfig, ncclResult_t,                                                                   \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))                       \
  X(ScatterConfig, ncclResult_t,                                                                  \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dtype, int root,          \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config))                       \
  X(GroupStart, ncclResult_t, (void))                                                             \
  X(GroupEnd, ncclResult_t, (void))                                                               \
  X(GroupSimulateEnd, ncclResult_t, (ncclSimInfo_t * info))                                       \
  /* one-sided operations, device API (nccl_device_host.h) */                                     \
  X(WinGetUserPtr, ncclResult_t, (ncclComm_t comm, ncclWindow_t win, void **outUserPtr))          \
  X(PutSignal, ncclResult_t,                                                                      \
    (const void *localbuff, size_t count, ncclDataType_t dtype, int peer, ncclWindow_t peerWin,   \
     size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,              \
     cudaStream_t stream))                                                                        \
  X(Signal, ncclResult_t,                                                                         \
    (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream))    \
  X(WaitSignal, ncclResult_t,                                                                     \
    (int nDesc, ncclWaitSignalDesc_t *descs, ncclComm_t comm, cudaStream_t stream))               \
  X(CommQueryProperties, ncclResult_t, (ncclComm_t comm, ncclCommProperties_t *props))            \
  X(DevCommCreate, ncclResult_t,                                                                  \
    (ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm))          \
  X(DevCommDestroy, ncclResult_t, (ncclComm_t comm, const ncclDevComm_t *devComm))                \
  X(TeamWorld, ncclTeam_t, (ncclComm_t comm))                                                     \
  X(TeamLsa, ncclTeam_t, (ncclComm_t comm))                                                       \
  X(TeamRail, ncclTeam_t, (ncclComm_t comm))                                                      \
  X(TeamCft, ncclTeam_t, (ncclComm_t comm, ncclCftTeamMode_t mode))                               \
  X(TeamCftMultimem, ncclTeam_t, (ncclComm_t comm))                                               \
  X(TeamRankToWorld, int, (ncclComm_t comm, ncclTeam_t team, int rank))                           \
  X(TeamRankToLsa, int, (ncclComm_t comm, ncclTeam_t team, int rank))                             \
  X(GetLsaDevicePointer, ncclResult_t,                                                            \
    (ncclWindow_t window, size_t offset, int lsaRank, void **outPtr))                             \
  X(GetLsaMultimemDevicePointer, ncclResult_t,                                                    \
    (ncclWindow_t window, size_t offset, void **outPtr))                                          \
  X(GetMultimemDevicePointer, ncclResult_t,                                                       \
    (ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem, void **outPtr))           \
  X(GetPeerDevicePointer, ncclResult_t,                                                           \
    (ncclWindow_t window, size_t offset, int peer, void **outPtr))                                \
  X(GetPeerDeviceLeInfo, ncclResult_t,                                                            \
    (ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId *leId, size_t *leOffset))     \
  X(GetMultimemDeviceLeInfo, ncclResult_t,                                                        \
    (ncclWindow_t window, size_t offset, ncclCftLeId *leId, size_t *leOffset))                    \
  X(GetCftDeviceLeInfo, ncclResult_t,                                                             \
    (ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam, ncclCftLeId *leId,      \
     size_t *leOffset))                                                                           \
  X(LsaBarrierCreateRequirement, ncclResult_t,                                                    \
    (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t *outHandle,                           \
     ncclDevResourceRequirements_t *outReq))                                                      \
  X(GinBarrierCreateRequirement, ncclResult_t,                                                    \
    (ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t *outHandle,          \
     ncclDevResourceRequirements_t *outReq))                                                      \
  X(GinOutboxCreateRequirement, ncclResult_t,                                                     \
    (int nBlocks, int size_log2, ncclGinOutboxHandle_t *outHandle,                                \
     ncclDevResourceRequirements_t *outReq))                                                      \
  X(GinInboxA2ACreateRequirement, ncclResult_t,                                                   \
    (ncclTeam_t peers, int nBlocks, int size_log2, ncclGinInboxA2AHandle_t *outHandle,            \
     ncclDevResourceRequirements_t *outReq))                                                      \
  X(LLA2ACalcSlots, int, (int maxElts, int maxEltSize))                                           \
  X(LLA2ACreateRequirement, ncclResult_t,                                                         \
    (int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,                                       \
     ncclDevResourceRequirements_t *outReq))

/* Each slot's index, for hetccl_vendor_t.provided. */
typedef enum {
#define HETCCL_VENDOR_SLOT_ENUM(slot, ret, params) HETCCL_VSLOT_##slot,
  HETCCL_VENDOR_SLOTS(HETCCL_VENDOR_SLOT_ENUM)
#undef HETCCL_VENDOR_SLOT_ENUM
  HETCCL_VSLOT_COUNT
} hetccl_vendor_slot_t;

typedef struct hetccl_vendor {
  hetccl_vendor_id_t id;
  const char *name;    /* "nccl", "rccl" */
  const char *backend; /* "vendor:nccl", "vendor:rccl" (hetcclCommBackend) */
  const char *hier_backend; /* "hierarchical:nccl", ...: a hierarchical communicator
                             * whose island this vendor serves (hetcclCommBackend) */
  const char *path;    /* what dlopen was given / resolved to */
  void *handle;        /* dlopen handle */
  int version;         /* its ncclGetVersion */
  /* Which slots the library itself provides (the others are stubs): the
   * nccl*Config collectives, say, which older versions lack. */
  unsigned char provided[HETCCL_VSLOT_COUNT];
#define HETCCL_VENDOR_SLOT(slot, ret, params) ret(*slot) params;
  HETCCL_VENDOR_SLOTS(HETCCL_VENDOR_SLOT)
#undef HETCCL_VENDOR_SLOT
} hetccl_vendor_t;

#define HETCCL_VENDOR_HAS(v, slot) ((v)->provided[HETCCL_VSLOT_##slot])

/* Load (once per process) the library of vendor id. *out is NULL with
 * ncclSystemError and a WARN naming what was tried when none loads; later
 * calls return the same answer. */
ncclResult_t hetccl_vendor_load(hetccl_vendor_id_t id, const hetccl_vendor_t **out);

/* For `hetccl info`: load vendor id as hetccl_vendor_load does, then *detail
 * is the file it resolved to, or why none could be used (static text). */
const hetccl_vendor_t *hetccl_vendor_probe(hetccl_vendor_id_t id, const char **detail);

/* Is the calling thread currently inside a call into a vendor library?
 * (Re-entry guard: under LD_PRELOAD the vendor's calls to its own exported
 * names may bind to hetccl's definitions; those must go straight back to
 * the vendor, never loop.) */
int hetccl_vendor_in_call(void);

/* Did this call come from inside a vendor library? `caller` is the
 * exported function's return address. Yes when the thread is inside a call
 * hetccl made into a vendor, or when the caller's code lies in a loaded
 * vendor's text (the program called the real library directly and it
 * called one of its own exported names, which bound to hetccl). Returns the
 * vendor to go back to, or NULL. */
const hetccl_vendor_t *hetccl_vendor_reentered(const void *caller);

/* Is vendor id's library (not hetccl) mapped in this process? The mapped
 * objects are looked at once, the first call; a vendor found there is
 * loaded then, so that its calls into our names can be recognised. */
int hetccl_vendor_foreign_mapped(hetccl_vendor_id_t id);

/* The vendor library this process forwards to (the first one loaded), or
 * NULL. Functions without a communicator (group calls, memory, the device
 * API) go to it. */
const hetccl_vendor_t *hetccl_vendor_loaded(void);

/* Does addr (e.g. __builtin_return_address(0) in an exported function) lie
 * in a loaded vendor library's code? Catches the vendor calling one of
 * its own exported names from a thread of its own, where no call of ours
 * is in progress. A few compares; 0 when no vendor is loaded. A tail call
 * from the vendor (`return ncclGroupEnd();` compiled as a jump) leaves the
 * vendor's caller as the return address, so this complements
 * hetccl_vendor_inside and does not replace it. */
int hetccl_vendor_owns(const void *addr);

/* The vendor the calling thread is inside a call to (NULL: none); owned by
 * loader.c, set and restored by HETCCL_VENDOR_CALL. */
extern __thread const hetccl_vendor_t *hetccl_vendor_inside;

/* Call a vendor slot with the re-entry guard held: any nccl* name that the
 * vendor calls while inside comes back to hetccl, sees which vendor it is
 * inside and goes straight to that vendor again. */
#define HETCCL_VENDOR_CALL(v, slot, ...)                                       \
  __extension__({                                                              \
    const hetccl_vendor_t *hetccl_vouter_ = hetccl_vendor_inside;              \
    hetccl_vendor_inside = (v);                                                \
    __typeof__((v)->slot(__VA_ARGS__)) hetccl_vres_ = (v)->slot(__VA_ARGS__);  \
    hetccl_vendor_inside = hetccl_vouter_;                                     \
    hetccl_vres_;                                                              \
  })

#endif
