/* The NCCL device API's host functions, one-sided signals, encryption and
 * the debug reset.
 *
 * A forwarded communicator hands each call to its vendor library. hetccl's
 * engine has no device communicators or signals, so there these calls fail
 * with ncclInvalidUsage (hetccl_unsupported), and its windows are
 * registrations that give no peer access (core/window.c); the teams,
 * which cannot return an error, are computed where they have a meaning for
 * an engine communicator (world: every rank; LSA, the ranks whose memory
 * this one can load and store: itself only) and are empty, with a WARN,
 * where they have none.
 *
 * Window and requirement functions take no communicator. A window that
 * core/window.c made is answered there; any other window, and every device
 * resource, comes from a vendor communicator, so these go to the vendor
 * library loaded in this process, if any.
 *
 * API thread only, as the application calls them. */
#include <string.h>

#include "comm/comm.h"
#include "entry/dispatch.h"
#include "comm/window.h"
#include "nccl_device_host.h"
#include "util/check.h"
#include "util/log.h"

#define NO_DEVICE_API "the device API needs a communicator served by a vendor library"

/* Functions without a communicator: the loaded vendor, else unsupported. */
#define FORWARD_TO_LOADED_VENDOR(slot, why, ...)                               \
  do {                                                                         \
    const hetccl_vendor_t *loaded_ = hetccl_vendor_loaded();                   \
    if (!loaded_) return hetccl_unsupported("nccl" #slot, why);                \
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

ncclResult_t hetccl_CommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclCommQueryProperties"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, CommQueryProperties, comm->vcomm, props);
  HETCCL_ARGCHECK(props->magic == NCCL_API_MAGIC && props->size >= sizeof(*props),
                  ncclInvalidArgument,
                  "ncclCommQueryProperties: props not set up with "
                  "NCCL_COMM_PROPERTIES_INITIALIZER (size %zu, magic 0x%x)",
                  props->size, props->magic);
  engine_properties(comm, props);
  return ncclSuccess;
}

ncclResult_t hetccl_DevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                               ncclDevComm_t *outDevComm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclDevCommCreate"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, DevCommCreate, comm->vcomm, reqs, outDevComm);
  return hetccl_unsupported("ncclDevCommCreate", NO_DEVICE_API);
}

ncclResult_t hetccl_DevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclDevCommDestroy"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, DevCommDestroy, comm->vcomm, devComm);
  return hetccl_unsupported("ncclDevCommDestroy", NO_DEVICE_API);
}

/* ---- teams ---- */

static const ncclTeam_t empty_team = {0, 0, 0};

ncclTeam_t hetccl_TeamWorld(ncclComm_t comm) {
  if (hetccl_comm_check(comm, "ncclTeamWorld") != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamWorld, comm->vcomm);
  return (ncclTeam_t){.nRanks = comm->nranks, .rank = comm->rank, .stride = 1};
}

/* The engine shares no memory between ranks: the LSA team is this rank. */
ncclTeam_t hetccl_TeamLsa(ncclComm_t comm) {
  if (hetccl_comm_check(comm, "ncclTeamLsa") != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamLsa, comm->vcomm);
  return (ncclTeam_t){.nRanks = 1, .rank = 0, .stride = 1};
}

/* The rail team holds one rank of each LSA team; with LSA teams of one,
 * that is every rank. */
ncclTeam_t hetccl_TeamRail(ncclComm_t comm) {
  if (hetccl_comm_check(comm, "ncclTeamRail") != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRail, comm->vcomm);
  return (ncclTeam_t){.nRanks = comm->nranks, .rank = comm->rank, .stride = 1};
}

ncclTeam_t hetccl_TeamCft(ncclComm_t comm, ncclCftTeamMode_t mode) {
  if (hetccl_comm_check(comm, "ncclTeamCft") != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamCft, comm->vcomm, mode);
  hetccl_comm_note_call(comm, hetccl_unsupported("ncclTeamCft", "no CFT fabric on an engine "
                                                                  "communicator; empty team"));
  return empty_team;
}

ncclTeam_t hetccl_TeamCftMultimem(ncclComm_t comm) {
  if (hetccl_comm_check(comm, "ncclTeamCftMultimem") != ncclSuccess) return empty_team;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamCftMultimem, comm->vcomm);
  hetccl_comm_note_call(comm, hetccl_unsupported("ncclTeamCftMultimem", "no CFT fabric on an engine "
                                                                  "communicator; empty team"));
  return empty_team;
}

/* Members of a team are `stride` world ranks apart, this rank being
 * member team.rank. */
int hetccl_TeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  if (hetccl_comm_check(comm, "ncclTeamRankToWorld") != ncclSuccess) return -1;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRankToWorld, comm->vcomm, team, rank);
  int64_t world = comm->rank + ((int64_t)rank - team.rank) * team.stride;
  if (rank < 0 || rank >= team.nRanks || world < 0 || world >= comm->nranks) {
    WARN("ncclTeamRankToWorld: rank %d is not in team {nRanks %d, rank %d, stride %d}", rank,
         team.nRanks, team.rank, team.stride);
    hetccl_comm_note_call(comm, ncclInvalidArgument);
    return -1;
  }
  return (int)world;
}

int hetccl_TeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  if (hetccl_comm_check(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, TeamRankToLsa, comm->vcomm, team, rank);
  if (rank == team.rank) return 0; /* only this rank is in its LSA team */
  WARN("ncclTeamRankToLsa: member %d of the team is not in this rank's LSA team (an engine "
       "communicator shares no memory between ranks)", rank);
  hetccl_comm_note_call(comm, ncclInvalidArgument);
  return -1;
}

/* ---- window addresses ---- */

#define NO_WINDOWS "windows exist only on communicators served by a vendor library, none is loaded"
#define ENGINE_WINDOW "an engine communicator's window is a registration only (core/window.c)"

/* A window of an engine communicator (core/window.c) never reaches a vendor. */
#define ENGINE_WINDOW_UNSUPPORTED(func, window)                                \
  do {                                                                         \
    if (hetccl_window_is_engine(window)) return hetccl_unsupported(func, ENGINE_WINDOW); \
  } while (0)

ncclResult_t hetccl_GetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                     void **outPtr) {
  if (hetccl_window_is_engine(window))
    return hetccl_window_local_ptr("ncclGetLsaDevicePointer", window, offset, lsaRank, 0, outPtr);
  FORWARD_TO_LOADED_VENDOR(GetLsaDevicePointer, NO_WINDOWS, window, offset, lsaRank, outPtr);
}

ncclResult_t hetccl_GetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr) {
  ENGINE_WINDOW_UNSUPPORTED("ncclGetLsaMultimemDevicePointer", window);
  FORWARD_TO_LOADED_VENDOR(GetLsaMultimemDevicePointer, NO_WINDOWS, window, offset, outPtr);
}

ncclResult_t hetccl_GetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                          ncclMultimemHandle_t multimem, void **outPtr) {
  ENGINE_WINDOW_UNSUPPORTED("ncclGetMultimemDevicePointer", window);
  FORWARD_TO_LOADED_VENDOR(GetMultimemDevicePointer, NO_WINDOWS, window, offset, multimem, outPtr);
}

ncclResult_t hetccl_GetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void **outPtr) {
  if (hetccl_window_is_engine(window))
    return hetccl_window_local_ptr("ncclGetPeerDevicePointer", window, offset, peer, 1, outPtr);
  FORWARD_TO_LOADED_VENDOR(GetPeerDevicePointer, NO_WINDOWS, window, offset, peer, outPtr);
}

ncclResult_t hetccl_GetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
                                     ncclCftLeId *leId, size_t *leOffset) {
  ENGINE_WINDOW_UNSUPPORTED("ncclGetPeerDeviceLeInfo", window);
  FORWARD_TO_LOADED_VENDOR(GetPeerDeviceLeInfo, NO_WINDOWS, window, offset, peerWorld, leId,
                           leOffset);
}

ncclResult_t hetccl_GetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId *leId,
                                         size_t *leOffset) {
  ENGINE_WINDOW_UNSUPPORTED("ncclGetMultimemDeviceLeInfo", window);
  FORWARD_TO_LOADED_VENDOR(GetMultimemDeviceLeInfo, NO_WINDOWS, window, offset, leId, leOffset);
}

ncclResult_t hetccl_GetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
                                    ncclTeam_t cftTeam, ncclCftLeId *leId, size_t *leOffset) {
  ENGINE_WINDOW_UNSUPPORTED("ncclGetCftDeviceLeInfo", window);
  FORWARD_TO_LOADED_VENDOR(GetCftDeviceLeInfo, NO_WINDOWS, window, offset, peerCft, cftTeam, leId,
                           leOffset);
}

ncclResult_t hetccl_WinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclWinGetUserPtr"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, WinGetUserPtr, comm->vcomm, win, outUserPtr);
  return hetccl_window_user_ptr(comm, win, outUserPtr);
}

/* ---- device resource requirements ---- */

#define NO_DEVICE_RESOURCES "device resources need a vendor library, none is loaded"

ncclResult_t hetccl_LsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                             ncclLsaBarrierHandle_t *outHandle,
                                             ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(LsaBarrierCreateRequirement, NO_DEVICE_RESOURCES, team, nBarriers,
                           outHandle, outReq);
}

ncclResult_t hetccl_GinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                             ncclGinBarrierHandle_t *outHandle,
                                             ncclDevResourceRequirements_t *outReq) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclGinBarrierCreateRequirement"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, GinBarrierCreateRequirement,
                                                   comm->vcomm, team, nBarriers, outHandle, outReq);
  return hetccl_unsupported("ncclGinBarrierCreateRequirement", NO_DEVICE_API);
}

ncclResult_t hetccl_GinOutboxCreateRequirement(int nBlocks, int size_log2,
                                            ncclGinOutboxHandle_t *outHandle,
                                            ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(GinOutboxCreateRequirement, NO_DEVICE_RESOURCES, nBlocks, size_log2,
                           outHandle, outReq);
}

ncclResult_t hetccl_GinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                              ncclGinInboxA2AHandle_t *outHandle,
                                              ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(GinInboxA2ACreateRequirement, NO_DEVICE_RESOURCES, peers, nBlocks,
                           size_log2, outHandle, outReq);
}

ncclResult_t hetccl_LLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,
                                        ncclDevResourceRequirements_t *outReq) {
  FORWARD_TO_LOADED_VENDOR(LLA2ACreateRequirement, NO_DEVICE_RESOURCES, nBlocks, nSlots,
                           outHandle, outReq);
}

/* Returns a slot count, not an error code: -1 (and a WARN) without a vendor. */
int hetccl_LLA2ACalcSlots(int maxElts, int maxEltSize) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  if (v) return HETCCL_VENDOR_CALL(v, LLA2ACalcSlots, maxElts, maxEltSize);
  hetccl_unsupported("ncclLLA2ACalcSlots", NO_DEVICE_RESOURCES);
  return -1;
}

/* ---- one-sided signals ---- */

#define NO_SIGNALS "one-sided signals need a communicator served by a vendor library"

ncclResult_t hetccl_PutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclPutSignal"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, PutSignal, localbuff, count,
                                                   datatype, peer, peerWin, peerWinOffset, sigIdx,
                                                   ctx, flags, comm->vcomm, stream);
  return hetccl_unsupported("ncclPutSignal", NO_SIGNALS);
}

ncclResult_t hetccl_Signal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclSignal"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, Signal, peer, sigIdx, ctx, flags,
                                                   comm->vcomm, stream);
  return hetccl_unsupported("ncclSignal", NO_SIGNALS);
}

ncclResult_t hetccl_WaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                            cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclWaitSignal"));
  if (comm->vendor)
    return HETCCL_VENDOR_CALL(comm->vendor, WaitSignal, nDesc, signalDescs,
                                                   comm->vcomm, stream);
  return hetccl_unsupported("ncclWaitSignal", NO_SIGNALS);
}

/* ---- process-wide settings ---- */

ncclResult_t hetccl_SetEncryption(const ncclEncryptionConfig_t *config) {
  HETCCL_ARGCHECK(config->magic == NCCL_API_MAGIC, ncclInvalidArgument,
                  "ncclSetEncryption: config not set up with NCCL_ENCRYPTION_CONFIG_INITIALIZER "
                  "(magic 0x%x)", config->magic);
  switch (config->mode) {
  case NCCL_ENCRYPTION_MODE_NONE:
    return ncclSuccess; /* what hetccl does anyway */
  case NCCL_ENCRYPTION_MODE_PSK:
    return hetccl_unsupported("ncclSetEncryption", "hetccl has no TLS; traffic cannot be encrypted");
  default:
    WARN("ncclSetEncryption: unknown mode %d", config->mode);
    return ncclInvalidArgument;
  }
}

/* Re-read the logging environment (NCCL_DEBUG, HETCCL_DEBUG, ...). */
void hetccl_ResetDebugInit(void) { hetccl_log_reset(); }
