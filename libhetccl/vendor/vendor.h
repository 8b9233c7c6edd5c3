/* Vendor CCL layer: a real NCCL-API library (NCCL, RCCL) opened with dlopen.
 *
 * Every slot is taken with dlsym on the library's own handle, never by
 * global symbol lookup, so that hetccl (which exports the same names, and
 * may itself be installed as libnccl.so.2) is never found in its place. A
 * handle that resolves to hetccl itself is refused.
 *
 * Slots that the loaded version lacks stay at a shared stub that returns
 * ncclInvalidUsage with a message naming the function and the version (never
 * NULL). Required slots (init, destroy, the collectives, group calls) are
 * checked at load: a library missing one is refused.
 *
 * Threads: loading is once per process (thread-safe); slots are called from
 * the API thread exactly as the application called hetccl. */
#ifndef HETCCL_VENDOR_H
#define HETCCL_VENDOR_H

#include "nccl.h"
#include "nccl_device_host.h"

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

typedef struct hetccl_vendor {
  const char *name;    /* "nccl", "rccl" */
  const char *path;    /* what dlopen was given / resolved to */
  void *handle;        /* dlopen handle */
  int version;         /* its ncclGetVersion */
#define HETCCL_VENDOR_SLOT(slot, ret, params) ret(*slot) params;
  HETCCL_VENDOR_SLOTS(HETCCL_VENDOR_SLOT)
#undef HETCCL_VENDOR_SLOT
} hetccl_vendor_t;

/* Load (once per process) the vendor library for a device kind: NCCL for
 * cuda, RCCL for hip. *out is NULL with ncclSystemError and a WARN naming
 * what was tried when none loads; later calls return the same answer. */
ncclResult_t hetccl_vendor_load_nccl(const hetccl_vendor_t **out);

/* Is the calling thread currently inside a call into the vendor library?
 * (Re-entry guard: under LD_PRELOAD the vendor's calls to its own exported
 * names may bind to hetccl's definitions; those must go straight back to
 * the vendor, never loop.) */
int hetccl_vendor_in_call(void);

/* Did this call come from inside the vendor library? `caller` is the
 * exported function's return address. Yes when the thread is inside a call
 * hetccl made into the vendor, or when the caller's code lies in the
 * vendor's text (the program called the real library directly and it called
 * one of its own exported names, which bound to hetccl). Returns the vendor
 * to go back to, or NULL. */
const hetccl_vendor_t *hetccl_vendor_reentered(const void *caller);

/* Is an NCCL library other than hetccl mapped in this process? (Once.) */
int hetccl_vendor_foreign_mapped(void);

/* The vendor library loaded in this process, or NULL (for re-entry). */
const hetccl_vendor_t *hetccl_vendor_loaded(void);

/* Does addr (e.g. __builtin_return_address(0) in an exported function) lie
 * in the loaded vendor library's code? Catches the vendor calling one of
 * its own exported names from a thread of its own, where the depth counter
 * below is 0. Two compares; 0 when no vendor is loaded. A tail call from
 * the vendor (`return ncclGroupEnd();` compiled as a jump) leaves the
 * vendor's caller as the return address, so this complements the depth
 * counter and does not replace it. */
int hetccl_vendor_owns(const void *addr);

/* Thread-local depth of calls into the vendor library; owned by nccl.c. */
extern __thread int hetccl_vendor_depth;

/* Call a vendor slot with the re-entry guard held: any nccl* name that the
 * vendor calls while inside comes back to hetccl, sees
 * hetccl_vendor_in_call() and goes straight to the vendor again. */
#define HETCCL_VENDOR_CALL(v, slot, ...)                                       \
  __extension__({                                                              \
    hetccl_vendor_depth++;                                                     \
    __typeof__((v)->slot(__VA_ARGS__)) hetccl_vres_ = (v)->slot(__VA_ARGS__);  \
    hetccl_vendor_depth--;                                                     \
    hetccl_vres_;                                                              \
  })

#endif
