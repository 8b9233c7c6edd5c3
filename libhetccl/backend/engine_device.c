/* The NCCL device API on an engine communicator (engine_impl.h).
 *
 * hetccl's engine has no device communicators or signals, so these fail
 * with ncclInvalidUsage (hetccl_unsupported); the teams, which cannot
 * return an error, are computed where they have a meaning for an engine
 * communicator (world: every rank; LSA, the ranks whose memory this one
 * can load and store: itself only) and are empty, with a WARN, where they
 * have none.
 *
 * Thread: the API caller's. */
#include <string.h>

#include "backend/engine_impl.h"
#include "util/check.h"
#include "util/log.h"

#define NO_DEVICE_API "the device API needs a communicator served by a vendor library"
#define NO_SIGNALS "one-sided signals need a communicator served by a vendor library"
#define NO_CFT "no CFT fabric on an engine communicator; empty team"

ncclResult_t hetccl_engine_devapi_properties(ncclComm_t comm, ncclCommProperties_t *props) {
  HETCCL_ARGCHECK(props->magic == NCCL_API_MAGIC && props->size >= sizeof(*props),
                  ncclInvalidArgument,
                  "ncclCommQueryProperties: props not set up with "
                  "NCCL_COMM_PROPERTIES_INITIALIZER (size %zu, magic 0x%x)",
                  props->size, props->magic);
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
  return ncclSuccess;
}

ncclResult_t hetccl_engine_devapi_dev_comm_create(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                                           ncclDevComm_t *out) {
  (void)comm; (void)reqs; (void)out;
  return hetccl_unsupported("ncclDevCommCreate", NO_DEVICE_API);
}

ncclResult_t hetccl_engine_devapi_dev_comm_destroy(ncclComm_t comm, const ncclDevComm_t *dev) {
  (void)comm; (void)dev;
  return hetccl_unsupported("ncclDevCommDestroy", NO_DEVICE_API);
}

/* The engine shares no memory between ranks: the LSA team is this rank,
 * and the rail team, one rank of each LSA team, is every rank. */
ncclResult_t hetccl_engine_devapi_team(ncclComm_t comm, hetccl_team_kind_t kind, ncclCftTeamMode_t mode,
                                ncclTeam_t *out) {
  (void)mode;
  switch (kind) {
    case HETCCL_TEAM_WORLD:
    case HETCCL_TEAM_RAIL:
      *out = (ncclTeam_t){.nRanks = comm->nranks, .rank = comm->rank, .stride = 1};
      return ncclSuccess;
    case HETCCL_TEAM_LSA: *out = (ncclTeam_t){.nRanks = 1, .rank = 0, .stride = 1}; return ncclSuccess;
    case HETCCL_TEAM_CFT: return hetccl_unsupported("ncclTeamCft", NO_CFT);
    case HETCCL_TEAM_CFT_MULTIMEM: return hetccl_unsupported("ncclTeamCftMultimem", NO_CFT);
  }
  WARN("team kind %d: none such", (int)kind);
  return ncclInternalError;
}

/* Members of a team are `stride` world ranks apart, this rank being
 * member team.rank; only this rank is in its LSA team. */
ncclResult_t hetccl_engine_devapi_team_rank(ncclComm_t comm, ncclTeam_t team, int rank, int lsa,
                                     int *out) {
  if (lsa) {
    if (rank == team.rank) {
      *out = 0;
      return ncclSuccess;
    }
    WARN("ncclTeamRankToLsa: member %d of the team is not in this rank's LSA team (an engine "
         "communicator shares no memory between ranks)", rank);
    return ncclInvalidArgument;
  }
  int64_t world = comm->rank + ((int64_t)rank - team.rank) * team.stride;
  if (rank < 0 || rank >= team.nRanks || world < 0 || world >= comm->nranks) {
    WARN("ncclTeamRankToWorld: rank %d is not in team {nRanks %d, rank %d, stride %d}", rank,
         team.nRanks, team.rank, team.stride);
    return ncclInvalidArgument;
  }
  *out = (int)world;
  return ncclSuccess;
}

ncclResult_t hetccl_engine_devapi_gin_barrier(ncclComm_t comm, ncclTeam_t team, int nbarriers,
                                       ncclGinBarrierHandle_t *handle,
                                       ncclDevResourceRequirements_t *req) {
  (void)comm; (void)team; (void)nbarriers; (void)handle; (void)req;
  return hetccl_unsupported("ncclGinBarrierCreateRequirement", NO_DEVICE_API);
}

ncclResult_t hetccl_engine_devapi_put_signal(ncclComm_t comm, const void *localbuff, size_t count,
                                      ncclDataType_t dtype, int peer, ncclWindow_t peer_win,
                                      size_t peer_win_offset, int sig_idx, int ctx,
                                      unsigned int flags, void *stream) {
  (void)comm; (void)localbuff; (void)count; (void)dtype; (void)peer; (void)peer_win;
  (void)peer_win_offset; (void)sig_idx; (void)ctx; (void)flags; (void)stream;
  return hetccl_unsupported("ncclPutSignal", NO_SIGNALS);
}

ncclResult_t hetccl_engine_devapi_signal(ncclComm_t comm, int peer, int sig_idx, int ctx,
                                  unsigned int flags, void *stream) {
  (void)comm; (void)peer; (void)sig_idx; (void)ctx; (void)flags; (void)stream;
  return hetccl_unsupported("ncclSignal", NO_SIGNALS);
}

ncclResult_t hetccl_engine_devapi_wait_signal(ncclComm_t comm, int ndesc, ncclWaitSignalDesc_t *descs,
                                       void *stream) {
  (void)comm; (void)ndesc; (void)descs; (void)stream;
  return hetccl_unsupported("ncclWaitSignal", NO_SIGNALS);
}
