/* The NCCL device API's host functions, one-sided signals, encryption and
 * the debug reset.
 *
 * A forwarded communicator hands each call to its vendor library. hetccl's
 * engine has no device communicators, windows or signals, so there these
 * calls fail with ncclInvalidUsage (hetccl_api_unsupported); the teams,
 * which cannot return an error, are computed where they have a meaning for
 * an engine communicator (world: every rank; LSA, the ranks whose memory
 * this one can load and store: itself only) and are empty, with a WARN,
 * where they have none.
 *
 * Window and requirement functions take no communicator. Windows and
 * device resources only ever come from a vendor communicator, so these go
 * to the vendor library loaded in this process, if any.
 *
 * API thread only, as the application calls them. */
#include <string.h>

#include "api/api.h"
#include "nccl_device_host.h"

#define NO_DEVICE_API "the device API needs a communicator served by a vendor library"

/* Called back from inside the vendor library (its own exported names bound
 * to ours): the arguments are the vendor's, give them straight back. */
/* Functions without a communicator: the loaded vendor, else unsupported. */
#define FORWARD_TO_LOADED_VENDOR(slot, why, ...)                               \
  do {                                                                         \
    HETCCL_REENTRY(slot, __VA_ARGS__);                                   \
    const hetccl_vendor_t *loaded_ = hetccl_vendor_loaded();                   \
    if (!loaded_) return hetccl_api_unsupported(__func__, why);                \
    return HETCCL_VENDOR_CALL(loaded_, slot, __VA_ARGS__);                     \
  } while (0)

/* ---- communicator properties and device communicators ---- */

static void engine_properties(ncclComm_t comm, ncclCommProperties_t *props) {
  size_t size = props->size;
  unsigned magic = props->magic, version = props->version;
  memset(props, 0, sizeof(*props));
  props->size = size;
  props->magic = magic;
  props->version = version;
  props->rank = comm->rank;
  props->nRanks = comm->nranks;
  props->cudaDev = comm->dev;
  props->nvmlDev = -1;
  props->ginType = NCCL_GIN_TYPE_NONE;
  props->railedGinType = NCCL_GIN_TYPE_NONE;
  props->nLsaTeams = comm->nranks; /* each rank is its own LSA team */
  props->commHash = comm->comm_id;
  props->ginConnectionType = NCCL_GIN_CONNECTION_NONE;
}

NCCL_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, ncclCommProperties_t *props);
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props) {
  HETCCL_REENTRY(CommQueryProperties, comm, props);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  HETCCL_ARGCHECK(props != NULL, hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclCommQueryProperties: props is NULL");
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, CommQueryProperties,
                                                   comm->vcomm, props));
  HETCCL_ARGCHECK(props->magic == NCCL_API_MAGIC && props->size >= sizeof(*props),
                  hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclCommQueryProperties: props not set up with "
                  "NCCL_COMM_PROPERTIES_INITIALIZER (size %zu, magic 0x%x)",
                  props->size, props->magic);
  engine_properties(comm, props);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
         ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                               ncclDevComm_t *outDevComm) {
  HETCCL_REENTRY(DevCommCreate, comm, reqs, outDevComm);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  HETCCL_ARGCHECK(reqs != NULL && outDevComm != NULL, hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclDevCommCreate: reqs or outDevComm is NULL");
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, DevCommCreate, comm->vcomm,
                                                   reqs, outDevComm));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_DEVICE_API));
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const ncclDevComm_t *devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
  HETCCL_REENTRY(DevCommDestroy, comm, devComm);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  HETCCL_ARGCHECK(devComm != NULL, hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclDevCommDestroy: devComm is NULL");
  if (comm->vendor)
    return hetccl_api_ret(comm,
                          HETCCL_VENDOR_CALL(comm->vendor, DevCommDestroy, comm->vcomm, devComm));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_DEVICE_API));
}

/* ---- teams ---- */

static const ncclTeam_t empty_team = {0, 0, 0};

NCCL_API(ncclTeam_t, ncclTeamWorld, ncclComm_t comm);
ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  HETCCL_REENTRY(TeamWorld, comm);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamWorld, comm->vcomm);
  return (ncclTeam_t){.nRanks = comm->nranks, .rank = comm->rank, .stride = 1};
}

/* The engine shares no memory between ranks: the LSA team is this rank. */
NCCL_API(ncclTeam_t, ncclTeamLsa, ncclComm_t comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  HETCCL_REENTRY(TeamLsa, comm);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamLsa, comm->vcomm);
  return (ncclTeam_t){.nRanks = 1, .rank = 0, .stride = 1};
}

/* The rail team holds one rank of each LSA team; with LSA teams of one,
 * that is every rank. */
NCCL_API(ncclTeam_t, ncclTeamRail, ncclComm_t comm);
ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  HETCCL_REENTRY(TeamRail, comm);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRail, comm->vcomm);
  return (ncclTeam_t){.nRanks = comm->nranks, .rank = comm->rank, .stride = 1};
}

NCCL_API(ncclTeam_t, ncclTeamCft, ncclComm_t comm, ncclCftTeamMode_t mode);
ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode) {
  HETCCL_REENTRY(TeamCft, comm, mode);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamCft, comm->vcomm, mode);
  hetccl_comm_record_error(comm, hetccl_api_unsupported(__func__, "no CFT fabric on an engine "
                                                                  "communicator; empty team"));
  return empty_team;
}

NCCL_API(ncclTeam_t, ncclTeamCftMultimem, ncclComm_t comm);
ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm) {
  HETCCL_REENTRY(TeamCftMultimem, comm);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamCftMultimem, comm->vcomm);
  hetccl_comm_record_error(comm, hetccl_api_unsupported(__func__, "no CFT fabric on an engine "
                                                                  "communicator; empty team"));
  return empty_team;
}

/* Members of a team are `stride` world ranks apart, this rank being
 * member team.rank. */
NCCL_API(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  HETCCL_REENTRY(TeamRankToWorld, comm, team, rank);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return -1;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRankToWorld, comm->vcomm, team, rank);
  int64_t world = comm->rank + ((int64_t)rank - team.rank) * team.stride;
  if (rank < 0 || rank >= team.nRanks || world < 0 || world >= comm->nranks) {
    WARN("ncclTeamRankToWorld: rank %d is not in team {nRanks %d, rank %d, stride %d}", rank,
         team.nRanks, team.rank, team.stride);
    hetccl_comm_record_error(comm, ncclInvalidArgument);
    return -1;
  }
  return (int)world;
}

NCCL_API(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  HETCCL_REENTRY(TeamRankToLsa, comm, team, rank);
  if (hetccl_comm_check(comm, __func__) != ncclSuccess) return -1;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRankToLsa, comm->vcomm, team, rank);
  if (rank == team.rank) return 0; /* only this rank is in its LSA team */
  WARN("ncclTeamRankToLsa: member %d of the team is not in this rank's LSA team (an engine "
       "communicator shares no memory between ranks)", rank);
  hetccl_comm_record_error(comm, ncclInvalidArgument);
  return -1;
}

/* ---- window addresses ---- */

#define NO_WINDOWS "windows exist only on communicators served by a vendor library, none is loaded"

NCCL_API(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank,
         void **outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                     void **outPtr) {
  FORWARD_TO_LOADED_VENDOR(GetLsaDevicePointer, NO_WINDOWS, window, offset, lsaRank, outPtr);
}

NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, ncclWindow_t window, size_t offset,
         void **outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr) {
  FORWARD_TO_LOADED_VENDOR(GetLsaMultimemDevicePointer, NO_WINDOWS, window, offset, outPtr);
}

NCCL_API(ncclResult_t, ncclGetMultimemDevicePointer, ncclWindow_t window, size_t offset,
         ncclMultimemHandle_t multimem, void **outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                          ncclMultimemHandle_t multimem, void **outPtr) {
  FORWARD_TO_LOADED_VENDOR(GetMultimemDevicePointer, NO_WINDOWS, window, offset, multimem, outPtr);
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer,
         void **outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void **outPtr) {
  FORWARD_TO_LOADED_VENDOR(GetPeerDevicePointer, NO_WINDOWS, window, offset, peer, outPtr);
}

NCCL_API(ncclResult_t, ncclGetPeerDeviceLeInfo, ncclWindow_t window, size_t offset, int peerWorld,
         ncclCftLeId *leId, size_t *leOffset);
ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
                                     ncclCftLeId *leId, size_t *leOffset) {
  FORWARD_TO_LOADED_VENDOR(GetPeerDeviceLeInfo, NO_WINDOWS, window, offset, peerWorld, leId,
                           leOffset);
}

NCCL_API(ncclResult_t, ncclGetMultimemDeviceLeInfo, ncclWindow_t window, size_t offset,
         ncclCftLeId *leId, size_t *leOffset);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId *leId,
                                         size_t *leOffset) {
  FORWARD_TO_LOADED_VENDOR(GetMultimemDeviceLeInfo, NO_WINDOWS, window, offset, leId, leOffset);
}

NCCL_API(ncclResult_t, ncclGetCftDeviceLeInfo, ncclWindow_t window, size_t offset, int peerCft,
         ncclTeam_t cftTeam, ncclCftLeId *leId, size_t *leOffset);
ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
                                    ncclTeam_t cftTeam, ncclCftLeId *leId, size_t *leOffset) {
  FORWARD_TO_LOADED_VENDOR(GetCftDeviceLeInfo, NO_WINDOWS, window, offset, peerCft, cftTeam, leId,
                           leOffset);
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  HETCCL_REENTRY(WinGetUserPtr, comm, win, outUserPtr);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  HETCCL_ARGCHECK(outUserPtr != NULL, hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclWinGetUserPtr: outUserPtr is NULL");
  if (comm->vendor)
    return hetccl_api_ret(comm,
                          HETCCL_VENDOR_CALL(comm->vendor, WinGetUserPtr, comm->vcomm, win, outUserPtr));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, "an engine communicator has no windows"));
}

/* ---- device resource requirements ---- */

#define NO_DEVICE_RESOURCES "device resources need a vendor library, none is loaded"

NCCL_API(ncclResult_t, ncclLsaBarrierCreateRequirement, ncclTeam_t team, int nBarriers,
         ncclLsaBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                             ncclLsaBarrierHandle_t *outHandle,
                                             ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(LsaBarrierCreateRequirement, NO_DEVICE_RESOURCES, team, nBarriers,
                           outHandle, outReq);
}

NCCL_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, ncclTeam_t team,
         int nBarriers, ncclGinBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                             ncclGinBarrierHandle_t *outHandle,
                                             ncclDevResourceRequirements_t *outReq) {
  HETCCL_REENTRY(GinBarrierCreateRequirement, comm, team, nBarriers, outHandle, outReq);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, GinBarrierCreateRequirement,
                                                   comm->vcomm, team, nBarriers, outHandle, outReq));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_DEVICE_API));
}

NCCL_API(ncclResult_t, ncclGinOutboxCreateRequirement, int nBlocks, int size_log2,
         ncclGinOutboxHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2,
                                            ncclGinOutboxHandle_t *outHandle,
                                            ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(GinOutboxCreateRequirement, NO_DEVICE_RESOURCES, nBlocks, size_log2,
                           outHandle, outReq);
}

NCCL_API(ncclResult_t, ncclGinInboxA2ACreateRequirement, ncclTeam_t peers, int nBlocks,
         int size_log2, ncclGinInboxA2AHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                              ncclGinInboxA2AHandle_t *outHandle,
                                              ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(GinInboxA2ACreateRequirement, NO_DEVICE_RESOURCES, peers, nBlocks,
                           size_log2, outHandle, outReq);
}

NCCL_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots,
         ncclLLA2AHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,
                                        ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(LLA2ACreateRequirement, NO_DEVICE_RESOURCES, nBlocks, nSlots,
                           outHandle, outReq);
}

/* Returns a slot count, not an error code: -1 (and a WARN) without a vendor. */
NCCL_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  HETCCL_REENTRY(LLA2ACalcSlots, maxElts, maxEltSize);
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  if (v) return HETCCL_VENDOR_CALL(v, LLA2ACalcSlots, maxElts, maxEltSize);
  hetccl_api_unsupported(__func__, NO_DEVICE_RESOURCES);
  return -1;
}

/* ---- one-sided signals ---- */

#define NO_SIGNALS "one-sided signals need a communicator served by a vendor library"

NCCL_API(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
         unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(PutSignal, localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx,
                       ctx, flags, comm, stream);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, PutSignal, localbuff, count,
                                                   datatype, peer, peerWin, peerWinOffset, sigIdx,
                                                   ctx, flags, comm->vcomm, stream));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_SIGNALS));
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
  HETCCL_REENTRY(Signal, peer, sigIdx, ctx, flags, comm, stream);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, Signal, peer, sigIdx, ctx, flags,
                                                   comm->vcomm, stream));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_SIGNALS));
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                            cudaStream_t stream) {
  HETCCL_REENTRY(WaitSignal, nDesc, signalDescs, comm, stream);
  HETCCL_CHECK(hetccl_comm_check(comm, __func__));
  HETCCL_ARGCHECK(nDesc >= 0 && (nDesc == 0 || signalDescs != NULL),
                  hetccl_api_ret(comm, ncclInvalidArgument),
                  "ncclWaitSignal: %d descriptors at %p", nDesc, (void *)signalDescs);
  if (comm->vendor)
    return hetccl_api_ret(comm, HETCCL_VENDOR_CALL(comm->vendor, WaitSignal, nDesc, signalDescs,
                                                   comm->vcomm, stream));
  return hetccl_api_ret(comm, hetccl_api_unsupported(__func__, NO_SIGNALS));
}

/* ---- process-wide settings ---- */

NCCL_API(ncclResult_t, ncclSetEncryption, const ncclEncryptionConfig_t *config);
ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t *config) {
  HETCCL_ARGCHECK(config != NULL, ncclInvalidArgument, "ncclSetEncryption: config is NULL");
  HETCCL_ARGCHECK(config->magic == NCCL_API_MAGIC, ncclInvalidArgument,
                  "ncclSetEncryption: config not set up with NCCL_ENCRYPTION_CONFIG_INITIALIZER "
                  "(magic 0x%x)", config->magic);
  switch (config->mode) {
  case NCCL_ENCRYPTION_MODE_NONE:
    return ncclSuccess; /* what hetccl does anyway */
  case NCCL_ENCRYPTION_MODE_PSK:
    return hetccl_api_unsupported(__func__, "hetccl has no TLS; traffic cannot be encrypted");
  default:
    WARN("ncclSetEncryption: unknown mode %d", config->mode);
    return ncclInvalidArgument;
  }
}

/* Re-read the logging environment (NCCL_DEBUG, HETCCL_DEBUG, ...). */
NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) { hetccl_log_reset(); }

/* NCCL exports this one without a p-name; so do we. */
HETCCL_EXPORT void ncclResetDebugInitInternal(void);
void ncclResetDebugInitInternal(void) { hetccl_log_reset(); }
