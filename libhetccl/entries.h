/* Every exported nccl* function, in one list (api/entries.c generates them;
 * entry/dispatch.h declares the core half of each from the same list).
 *
 * Each entry does the same three things and nothing else:
 *   1. re-entry: a call the vendor library made to one of its own exported
 *      names (bound to ours under LD_PRELOAD) goes straight back to it;
 *   2. the argument checks that need no communicator state (listed in the
 *      entry: ARG_NOT_NULL(p), or ARG(check_fn(...)) from api/checks.c);
 *   3. one call into the core (entry/dispatch.h): hetccl_<Name>(args), or
 *      for collectives and point-to-point hetccl_dispatch(comm, &op).
 * The core records the outcome as the last error (hetccl_call_end).
 *
 * Kinds, for the result-returning lists:
 *   COMM      the vendor has the same function; the last error is also the
 *             communicator's (the parameter must be named `comm`)
 *   PROC      the vendor has the same function; no communicator
 *   OWN_COMM  hetccl's alone (no re-entry check); has `comm`
 *   OWN_PROC  hetccl's alone; no communicator
 *
 * X(kind, Name, (params), (args), checks) */
#ifndef HETCCL_ENTRIES_H
#define HETCCL_ENTRIES_H

#define HETCCL_API_CALLS(X)                                                                       \
  /* --- version, ids, communicators ---------------------------------------------------- */    \
  X(PROC, GetVersion, (int *version), (version), ARG_NOT_NULL(version))                           \
  X(PROC, GetUniqueId, (ncclUniqueId *uniqueId), (uniqueId), ARG_NOT_NULL(uniqueId))              \
  X(PROC, CommInitRank, (ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank),         \
    (newcomm, nranks, commId, rank), ARG(check_init(__func__, newcomm, nranks, rank)))            \
  X(PROC, CommInitRankConfig,                                                                     \
    (ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config),       \
    (newcomm, nranks, commId, rank, config), ARG(check_init(__func__, newcomm, nranks, rank)))    \
  X(OWN_PROC, CommInitRankScalable,                                                               \
    (ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,                 \
     ncclConfig_t *config),                                                                       \
    (newcomm, nranks, myrank, nId, commIds, config),                                              \
    ARG_NOT_NULL(commIds) ARG(check_count(__func__, "nId", nId, 1))                               \
    ARG(check_init(__func__, newcomm, nranks, myrank)))                                           \
  X(OWN_PROC, CommInitAll, (ncclComm_t *comms, int ndev, const int *devlist),                     \
    (comms, ndev, devlist), ARG_NOT_NULL(comms) ARG(check_count(__func__, "ndev", ndev, 1)))     \
  X(COMM, CommFinalize, (ncclComm_t comm), (comm), NO_CHECKS)                                     \
  X(COMM, CommDestroy, (ncclComm_t comm), (comm), NO_CHECKS)                                      \
  X(COMM, CommAbort, (ncclComm_t comm), (comm), NO_CHECKS)                                        \
  X(COMM, CommRevoke, (ncclComm_t comm, int revokeFlags), (comm, revokeFlags), NO_CHECKS)         \
  X(COMM, CommSplit,                                                                              \
    (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config),             \
    (comm, color, key, newcomm, config), ARG_NOT_NULL(newcomm) ARG(check_color(color)))           \
  X(COMM, CommShrink,                                                                             \
    (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,          \
     ncclConfig_t *config, int shrinkFlags),                                                      \
    (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags),                    \
    ARG_NOT_NULL(newcomm)                                                                         \
    ARG(check_shrink(excludeRanksList, excludeRanksCount, shrinkFlags)))                          \
  X(OWN_COMM, CommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId), (comm, uniqueId),       \
    ARG_NOT_NULL(uniqueId))                                                                       \
  X(OWN_COMM, CommGrow,                                                                           \
    (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank, ncclComm_t *newcomm,    \
     ncclConfig_t *config),                                                                       \
    (comm, nRanks, uniqueId, rank, newcomm, config),                                              \
    ARG_NOT_NULL(newcomm) ARG(check_grow(comm, uniqueId)))                                        \
  /* --- queries ----------------------------------------------------------------------- */    \
  X(COMM, CommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError), (comm, asyncError),     \
    ARG_NOT_NULL(asyncError))                                                                     \
  X(COMM, CommCount, (const ncclComm_t comm, int *count), (comm, count), ARG_NOT_NULL(count))      \
  X(COMM, CommUserRank, (const ncclComm_t comm, int *rank), (comm, rank), ARG_NOT_NULL(rank))     \
  X(COMM, CommCuDevice, (const ncclComm_t comm, int *device), (comm, device),                     \
    ARG_NOT_NULL(device))                                                                         \
  X(COMM, CommQueryProperties, (ncclComm_t comm, ncclCommProperties_t *props), (comm, props),     \
    ARG_NOT_NULL(props))                                                                          \
  X(COMM, CommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value),               \
    (comm, stat, value), NO_CHECKS)                                                               \
  /* --- memory and registration -------------------------------------------------------- */  \
  X(PROC, MemAlloc, (void **ptr, size_t size), (ptr, size), ARG_NOT_NULL(ptr))                    \
  X(PROC, MemFree, (void *ptr), (ptr), NO_CHECKS)                                                 \
  X(COMM, CommRegister, (const ncclComm_t comm, void *buff, size_t size, void **handle),          \
    (comm, buff, size, handle), ARG_NOT_NULL(handle))                                             \
  X(COMM, CommDeregister, (const ncclComm_t comm, void *handle), (comm, handle), NO_CHECKS)       \
  X(COMM, CommWindowRegister,                                                                     \
    (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags),                  \
    (comm, buff, size, win, winFlags), NO_CHECKS)                                                 \
  X(COMM, CommWindowDeregister, (ncclComm_t comm, ncclWindow_t win), (comm, win), NO_CHECKS)      \
  X(COMM, CommSuspend, (ncclComm_t comm, int flags), (comm, flags), NO_CHECKS)                    \
  X(COMM, CommResume, (ncclComm_t comm), (comm), NO_CHECKS)                                       \
  /* --- reduction operators and groups ------------------------------------------------- */   \
  X(COMM, RedOpCreatePreMulSum,                                                                   \
    (ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,     \
     ncclComm_t comm),                                                                            \
    (op, scalar, datatype, residence, comm),                                                      \
    ARG_NOT_NULL(op) ARG_NOT_NULL(scalar) ARG(check_dtype(__func__, datatype)))                   \
  X(COMM, RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm), (op, comm), NO_CHECKS)                 \
  X(PROC, GroupStart, (void), (), NO_CHECKS)                                                      \
  X(PROC, GroupEnd, (void), (), NO_CHECKS)                                                        \
  X(PROC, GroupSimulateEnd, (ncclSimInfo_t *simInfo), (simInfo),                                  \
    ARG_NOT_NULL(simInfo) ARG(check_sim_info(simInfo)))                                           \
  /* --- device API, windows, one-sided signals (entry/entry_device.c) -------------------- */    \
  X(COMM, DevCommCreate,                                                                          \
    (ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm),          \
    (comm, reqs, outDevComm), ARG_NOT_NULL(reqs) ARG_NOT_NULL(outDevComm))                        \
  X(COMM, DevCommDestroy, (ncclComm_t comm, const ncclDevComm_t *devComm), (comm, devComm),       \
    ARG_NOT_NULL(devComm))                                                                        \
  X(COMM, WinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void **outUserPtr),                  \
    (comm, win, outUserPtr), ARG_NOT_NULL(outUserPtr))                                            \
  X(PROC, GetLsaDevicePointer, (ncclWindow_t window, size_t offset, int lsaRank, void **outPtr),  \
    (window, offset, lsaRank, outPtr), NO_CHECKS)                                                 \
  X(PROC, GetLsaMultimemDevicePointer, (ncclWindow_t window, size_t offset, void **outPtr),       \
    (window, offset, outPtr), NO_CHECKS)                                                          \
  X(PROC, GetMultimemDevicePointer,                                                               \
    (ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem, void **outPtr),           \
    (window, offset, multimem, outPtr), NO_CHECKS)                                                \
  X(PROC, GetPeerDevicePointer, (ncclWindow_t window, size_t offset, int peer, void **outPtr),    \
    (window, offset, peer, outPtr), NO_CHECKS)                                                    \
  X(PROC, GetPeerDeviceLeInfo,                                                                    \
    (ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId *leId, size_t *leOffset),     \
    (window, offset, peerWorld, leId, leOffset), NO_CHECKS)                                       \
  X(PROC, GetMultimemDeviceLeInfo,                                                                \
    (ncclWindow_t window, size_t offset, ncclCftLeId *leId, size_t *leOffset),                    \
    (window, offset, leId, leOffset), NO_CHECKS)                                                  \
  X(PROC, GetCftDeviceLeInfo,                                                                     \
    (ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam, ncclCftLeId *leId,      \
     size_t *leOffset),                                                                           \
    (window, offset, peerCft, cftTeam, leId, leOffset), NO_CHECKS)                                \
  X(PROC, LsaBarrierCreateRequirement,                                                            \
    (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t *outHandle,                           \
     ncclDevResourceRequirements_t *outReq),                                                      \
    (team, nBarriers, outHandle, outReq), NO_CHECKS)                                              \
  X(COMM, GinBarrierCreateRequirement,                                                            \
    (ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t *outHandle,          \
     ncclDevResourceRequirements_t *outReq),                                                      \
    (comm, team, nBarriers, outHandle, outReq), NO_CHECKS)                                        \
  X(PROC, GinOutboxCreateRequirement,                                                             \
    (int nBlocks, int size_log2, ncclGinOutboxHandle_t *outHandle,                                \
     ncclDevResourceRequirements_t *outReq),                                                      \
    (nBlocks, size_log2, outHandle, outReq), NO_CHECKS)                                           \
  X(PROC, GinInboxA2ACreateRequirement,                                                           \
    (ncclTeam_t peers, int nBlocks, int size_log2, ncclGinInboxA2AHandle_t *outHandle,            \
     ncclDevResourceRequirements_t *outReq),                                                      \
    (peers, nBlocks, size_log2, outHandle, outReq), NO_CHECKS)                                    \
  X(PROC, LLA2ACreateRequirement,                                                                 \
    (int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle, ncclDevResourceRequirements_t *outReq), \
    (nBlocks, nSlots, outHandle, outReq), NO_CHECKS)                                              \
  X(COMM, PutSignal,                                                                              \
    (const void *localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin, \
     size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,              \
     cudaStream_t stream),                                                                        \
    (localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream), \
    NO_CHECKS)                                                                                    \
  X(COMM, Signal,                                                                                 \
    (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream),    \
    (peer, sigIdx, ctx, flags, comm, stream), NO_CHECKS)                                          \
  X(COMM, WaitSignal,                                                                             \
    (int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm, cudaStream_t stream),         \
    (nDesc, signalDescs, comm, stream), ARG(check_signal_descs(nDesc, signalDescs)))              \
  /* --- process-wide settings and the parameter API (entry/params.c) ------------------- */     \
  X(OWN_PROC, SetEncryption, (const ncclEncryptionConfig_t *config), (config),                    \
    ARG_NOT_NULL(config))                                                                         \
  X(OWN_PROC, ParamBind, (ncclParamHandle_t *out, const char *key), (out, key),                   \
    ARG_NOT_NULL(out) ARG_NOT_NULL(key))                                                          \
  X(OWN_PROC, ParamGetI8, (ncclParamHandle_t h, int8_t *out), (h, out), ARG_NOT_NULL(out))        \
  X(OWN_PROC, ParamGetI16, (ncclParamHandle_t h, int16_t *out), (h, out), ARG_NOT_NULL(out))      \
  X(OWN_PROC, ParamGetI32, (ncclParamHandle_t h, int32_t *out), (h, out), ARG_NOT_NULL(out))      \
  X(OWN_PROC, ParamGetI64, (ncclParamHandle_t h, int64_t *out), (h, out), ARG_NOT_NULL(out))      \
  X(OWN_PROC, ParamGetU8, (ncclParamHandle_t h, uint8_t *out), (h, out), ARG_NOT_NULL(out))       \
  X(OWN_PROC, ParamGetU16, (ncclParamHandle_t h, uint16_t *out), (h, out), ARG_NOT_NULL(out))     \
  X(OWN_PROC, ParamGetU32, (ncclParamHandle_t h, uint32_t *out), (h, out), ARG_NOT_NULL(out))     \
  X(OWN_PROC, ParamGetU64, (ncclParamHandle_t h, uint64_t *out), (h, out), ARG_NOT_NULL(out))     \
  X(OWN_PROC, ParamGetStr, (ncclParamHandle_t h, const char **out), (h, out), ARG_NOT_NULL(out))  \
  X(OWN_PROC, ParamGet, (ncclParamHandle_t h, void *out, int maxLen, int *len),                   \
    (h, out, maxLen, len), ARG(check_param_out(out, maxLen)))                                     \
  X(OWN_PROC, ParamGetParameter, (const char *key, const char **value, int *valueLen),            \
    (key, value, valueLen), ARG_NOT_NULL(key) ARG_NOT_NULL(value))                                \
  X(OWN_PROC, ParamGetAllParameterKeys, (const char ***table, int *tableLen), (table, tableLen),  \
    ARG_NOT_NULL(table) ARG_NOT_NULL(tableLen))

/* Collectives and point-to-point: every one an operation (entry/dispatch.h)
 * handed to hetccl_dispatch; the *Config forms carry the caller's config
 * to the vendor where it has them. The communicator is `comm`.
 *
 * X(Name, (params), (args), OP(kind, sendbuf, recvbuf, count, dtype, redop, root, peer,
 *                              config)) */
#define HETCCL_API_OPS(X)                                                                         \
  X(AllReduce,                                                                                    \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, op, comm, stream),                                      \
    OP(AllReduce, sendbuff, recvbuff, count, datatype, op, NO_ROOT, NO_PEER, NULL))               \
  X(Broadcast,                                                                                    \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream),                                    \
    OP(Broadcast, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, NULL))            \
  X(Bcast,                                                                                        \
    (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,                \
     cudaStream_t stream),                                                                        \
    (buff, count, datatype, root, comm, stream),                                                  \
    OP(Bcast, buff, buff, count, datatype, NO_REDOP, root, NO_PEER, NULL))                        \
  X(Reduce,                                                                                       \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     int root, ncclComm_t comm, cudaStream_t stream),                                             \
    (sendbuff, recvbuff, count, datatype, op, root, comm, stream),                                \
    OP(Reduce, sendbuff, recvbuff, count, datatype, op, root, NO_PEER, NULL))                     \
  X(AllGather,                                                                                    \
    (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,             \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, sendcount, datatype, comm, stream),                                      \
    OP(AllGather, sendbuff, recvbuff, sendcount, datatype, NO_REDOP, NO_ROOT, NO_PEER, NULL))     \
  X(ReduceScatter,                                                                                \
    (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,             \
     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                       \
    (sendbuff, recvbuff, recvcount, datatype, op, comm, stream),                                  \
    OP(ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, NO_ROOT, NO_PEER, NULL))       \
  X(AlltoAll,                                                                                     \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,                 \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, comm, stream),                                          \
    OP(AlltoAll, sendbuff, recvbuff, count, datatype, NO_REDOP, NO_ROOT, NO_PEER, NULL))          \
  X(Gather,                                                                                       \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream),                                    \
    OP(Gather, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, NULL))               \
  X(Scatter,                                                                                      \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream),                                    \
    OP(Scatter, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, NULL))              \
  X(Send,                                                                                         \
    (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,      \
     cudaStream_t stream),                                                                        \
    (sendbuff, count, datatype, peer, comm, stream),                                              \
    OP(Send, sendbuff, NULL, count, datatype, NO_REDOP, NO_ROOT, peer, NULL))                     \
  X(Recv,                                                                                         \
    (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,            \
     cudaStream_t stream),                                                                        \
    (recvbuff, count, datatype, peer, comm, stream),                                              \
    OP(Recv, NULL, recvbuff, count, datatype, NO_REDOP, NO_ROOT, peer, NULL))                     \
  X(AllReduceConfig,                                                                              \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, count, datatype, op, comm, stream, config),                              \
    OP(AllReduce, sendbuff, recvbuff, count, datatype, op, NO_ROOT, NO_PEER, config))             \
  X(BroadcastConfig,                                                                              \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream, config),                            \
    OP(Broadcast, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, config))          \
  X(ReduceConfig,                                                                                 \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),             \
    (sendbuff, recvbuff, count, datatype, op, root, comm, stream, config),                        \
    OP(Reduce, sendbuff, recvbuff, count, datatype, op, root, NO_PEER, config))                   \
  X(AllGatherConfig,                                                                              \
    (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,             \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, sendcount, datatype, comm, stream, config),                              \
    OP(AllGather, sendbuff, recvbuff, sendcount, datatype, NO_REDOP, NO_ROOT, NO_PEER, config))   \
  X(ReduceScatterConfig,                                                                          \
    (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,             \
     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),       \
    (sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config),                          \
    OP(ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, NO_ROOT, NO_PEER, config))     \
  X(AlltoAllConfig,                                                                               \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,                 \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, count, datatype, comm, stream, config),                                  \
    OP(AlltoAll, sendbuff, recvbuff, count, datatype, NO_REDOP, NO_ROOT, NO_PEER, config))        \
  X(GatherConfig,                                                                                 \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream, config),                            \
    OP(Gather, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, config))             \
  X(ScatterConfig,                                                                                \
    (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config),                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream, config),                            \
    OP(Scatter, sendbuff, recvbuff, count, datatype, NO_REDOP, root, NO_PEER, config))

/* Functions that return something other than a result code; they cannot
 * fail, so they answer with a neutral value (and a WARN) instead. The core
 * records the last error itself.
 *
 * X(kind, return type, Name, (params), (args)) */
#define HETCCL_API_VALUES(X)                                                                      \
  X(OWN_PROC, const char *, GetErrorString, (ncclResult_t result), (result))                      \
  X(PROC, const char *, GetLastError, (ncclComm_t comm), (comm))                                  \
  X(COMM, ncclTeam_t, TeamWorld, (ncclComm_t comm), (comm))                                       \
  X(COMM, ncclTeam_t, TeamLsa, (ncclComm_t comm), (comm))                                         \
  X(COMM, ncclTeam_t, TeamRail, (ncclComm_t comm), (comm))                                        \
  X(COMM, ncclTeam_t, TeamCft, (ncclComm_t comm, ncclCftTeamMode_t mode), (comm, mode))           \
  X(COMM, ncclTeam_t, TeamCftMultimem, (ncclComm_t comm), (comm))                                 \
  X(COMM, int, TeamRankToWorld, (ncclComm_t comm, ncclTeam_t team, int rank), (comm, team, rank)) \
  X(COMM, int, TeamRankToLsa, (ncclComm_t comm, ncclTeam_t team, int rank), (comm, team, rank))   \
  X(PROC, int, LLA2ACalcSlots, (int maxElts, int maxEltSize), (maxElts, maxEltSize))

#endif
