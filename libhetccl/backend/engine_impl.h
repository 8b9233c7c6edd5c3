/* backend/: the two implementations of the backend table (comm/backend.h
 * has the slots and their contracts): forward.c hands every call to the
 * vendor's library, engine.c and engine_device.c run it on hetccl's engine
 * (exec/, hier/). Its slots run on the thread that called the entry point
 * (start: where init runs) and may use every folder below; nothing includes
 * this folder: a communicator reaches it only through the table it holds,
 * which init chooses. What a backend cannot serve, its slot refuses with
 * ncclInvalidUsage and a WARN naming the call.
 *
 * This header: the engine backend's slots that live outside engine.c (the
 * table is there), the device API on an engine communicator
 * (engine_device.c). Private to backend/engine*.c. */
#ifndef HETCCL_BACKEND_ENGINE_IMPL_H
#define HETCCL_BACKEND_ENGINE_IMPL_H

#include "comm/backend.h"

ncclResult_t hetccl_engine_devapi_properties(ncclComm_t comm, ncclCommProperties_t *props);
ncclResult_t hetccl_engine_devapi_dev_comm_create(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                                           ncclDevComm_t *out);
ncclResult_t hetccl_engine_devapi_dev_comm_destroy(ncclComm_t comm, const ncclDevComm_t *dev);
ncclResult_t hetccl_engine_devapi_team(ncclComm_t comm, hetccl_team_kind_t kind, ncclCftTeamMode_t mode,
                                ncclTeam_t *out);
ncclResult_t hetccl_engine_devapi_team_rank(ncclComm_t comm, ncclTeam_t team, int rank, int lsa,
                                     int *out);
ncclResult_t hetccl_engine_devapi_gin_barrier(ncclComm_t comm, ncclTeam_t team, int nbarriers,
                                       ncclGinBarrierHandle_t *handle,
                                       ncclDevResourceRequirements_t *req);
ncclResult_t hetccl_engine_devapi_put_signal(ncclComm_t comm, const void *localbuff, size_t count,
                                      ncclDataType_t dtype, int peer, ncclWindow_t peer_win,
                                      size_t peer_win_offset, int sig_idx, int ctx,
                                      unsigned int flags, void *stream);
ncclResult_t hetccl_engine_devapi_signal(ncclComm_t comm, int peer, int sig_idx, int ctx,
                                  unsigned int flags, void *stream);
ncclResult_t hetccl_engine_devapi_wait_signal(ncclComm_t comm, int ndesc, ncclWaitSignalDesc_t *descs,
                                       void *stream);

#endif
