/* The NCCL device API's host functions, one-sided signals, encryption and
 * the debug reset.
 *
 * Functions with a communicator go to its backend (comm/backend.h): the
 * vendor library for a forwarded one; on an engine communicator, which has
 * no device communicators or signals, they fail with ncclInvalidUsage,
 * its windows are registrations that give no peer access (comm/window.c),
 * and its teams are computed where they have a meaning
 * (backend/engine_device.c).
 *
 * Window and requirement functions take no communicator. A window that
 * comm/window.c made is answered there; any other window, and every device
 * resource, comes from a vendor communicator, so these go to the vendor
 * library loaded in this process, if any.
 *
 * API thread only, as the application calls them. */
#include <string.h>

#include "comm/backend.h"
#include "comm/comm.h"
#include "comm/window.h"
#include "entry/dispatch.h"
#include "nccl_device_host.h"
#include "util/check.h"
#include "util/log.h"

/* Functions without a communicator: the loaded vendor, else unsupported. */
#define FORWARD_TO_LOADED_VENDOR(slot, why, ...)                               \
  do {                                                                         \
    const hetccl_vendor_t *loaded_ = hetccl_vendor_loaded();                   \
    if (!loaded_) return hetccl_unsupported("nccl" #slot, why);                \
    return HETCCL_VENDOR_CALL(loaded_, slot, __VA_ARGS__);                     \
  } while (0)

/* ---- communicator properties and device communicators ---- */

ncclResult_t hetccl_CommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclCommQueryProperties"));
  return hetccl_backend_of(comm)->properties(comm, props);
}

ncclResult_t hetccl_DevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                               ncclDevComm_t *outDevComm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclDevCommCreate"));
  return hetccl_backend_of(comm)->dev_comm_create(comm, reqs, outDevComm);
}

ncclResult_t hetccl_DevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclDevCommDestroy"));
  return hetccl_backend_of(comm)->dev_comm_destroy(comm, devComm);
}

/* ---- teams ---- */

static const ncclTeam_t empty_team = {0, 0, 0};

/* A team, not a code: a failure is the communicator's last error, and the
 * team empty. */
static ncclTeam_t team_of(ncclComm_t comm, const char *fn, hetccl_team_kind_t kind,
                          ncclCftTeamMode_t mode) {
  if (hetccl_comm_check(comm, fn) != ncclSuccess) return empty_team;
  ncclTeam_t team = empty_team;
  ncclResult_t res = hetccl_backend_of(comm)->team(comm, kind, mode, &team);
  if (res != ncclSuccess) hetccl_comm_note_call(comm, res);
  return team;
}

ncclTeam_t hetccl_TeamWorld(ncclComm_t comm) {
  return team_of(comm, "ncclTeamWorld", HETCCL_TEAM_WORLD, (ncclCftTeamMode_t)0);
}

ncclTeam_t hetccl_TeamLsa(ncclComm_t comm) {
  return team_of(comm, "ncclTeamLsa", HETCCL_TEAM_LSA, (ncclCftTeamMode_t)0);
}

ncclTeam_t hetccl_TeamRail(ncclComm_t comm) {
  return team_of(comm, "ncclTeamRail", HETCCL_TEAM_RAIL, (ncclCftTeamMode_t)0);
}

ncclTeam_t hetccl_TeamCft(ncclComm_t comm, ncclCftTeamMode_t mode) {
  return team_of(comm, "ncclTeamCft", HETCCL_TEAM_CFT, mode);
}

ncclTeam_t hetccl_TeamCftMultimem(ncclComm_t comm) {
  return team_of(comm, "ncclTeamCftMultimem", HETCCL_TEAM_CFT_MULTIMEM, (ncclCftTeamMode_t)0);
}

/* A rank, or -1 with the failure as the communicator's last error. */
static int team_rank(ncclComm_t comm, const char *fn, ncclTeam_t team, int rank, int lsa) {
  if (hetccl_comm_check(comm, fn) != ncclSuccess) return -1;
  int out = -1;
  ncclResult_t res = hetccl_backend_of(comm)->team_rank(comm, team, rank, lsa, &out);
  if (res != ncclSuccess) {
    hetccl_comm_note_call(comm, res);
    return -1;
  }
  return out;
}

int hetccl_TeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_rank(comm, "ncclTeamRankToWorld", team, rank, 0);
}

int hetccl_TeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_rank(comm, "ncclTeamRankToLsa", team, rank, 1);
}

/* ---- window addresses ---- */

#define NO_WINDOWS "windows exist only on communicators served by a vendor library, none is loaded"
#define ENGINE_WINDOW "an engine communicator's window is a registration only (comm/window.c)"

/* A window of an engine communicator (comm/window.c) never reaches a vendor. */
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
  return hetccl_backend_of(comm)->win_user_ptr(comm, win, outUserPtr);
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
  return hetccl_backend_of(comm)->gin_barrier(comm, team, nBarriers, outHandle, outReq);
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

ncclResult_t hetccl_PutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclPutSignal"));
  return hetccl_backend_of(comm)->put_signal(comm, localbuff, count, datatype, peer, peerWin,
                                             peerWinOffset, sigIdx, ctx, flags, stream);
}

ncclResult_t hetccl_Signal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclSignal"));
  return hetccl_backend_of(comm)->signal(comm, peer, sigIdx, ctx, flags, stream);
}

ncclResult_t hetccl_WaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                            cudaStream_t stream) {
  HETCCL_CHECK(hetccl_comm_check(comm, "ncclWaitSignal"));
  return hetccl_backend_of(comm)->wait_signal(comm, nDesc, signalDescs, stream);
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
