/* A stand-in NCCL for the vendor loader's tests: exports a subset of the
 * NCCL API and records what it was asked. Built three ways:
 *   (default)       every required function and a few optional ones
 *   -DFAKE_NO_SEND  lacks ncclSend (a required function): must be refused
 *   -DFAKE_HETCCL   also defines hetcclVersionString: looks like hetccl
 *   -DFAKE_NO_CONFIG lacks the nccl*Config collectives (as NCCL before 2.29)
 * (and in fakes/, as libnccl.so.2 and as librccl.so.1 for the searches).
 * Its ncclCommInitRank calls its own exported ncclGroupStart/ncclGroupEnd,
 * as the real NCCL's ncclCommInitAll does, to exercise re-entry. */
#include <string.h>

#include "nccl.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

FAKE_EXPORT int fake_group_starts, fake_group_ends, fake_allreduce_calls;
/* ncclAllReduceConfig calls, and the last config's magic seen there. */
FAKE_EXPORT int fake_allreduce_config_calls;
FAKE_EXPORT unsigned fake_last_config_magic;
FAKE_EXPORT size_t fake_last_count;
/* ncclSend / ncclRecv calls, and the peer of the last one of each. */
FAKE_EXPORT int fake_send_calls, fake_recv_calls, fake_last_send_peer = -1,
    fake_last_recv_peer = -1;

ncclResult_t ncclGetVersion(int *version) {
  *version = 23203;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0x5a, sizeof(*id));
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  fake_group_starts++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  fake_group_ends++;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  /* Calls through the PLT: may bind to an interposing definition. Not a
   * tail call, as in NCCL (its result is checked). */
  if (ncclGroupStart() != ncclSuccess) return ncclInternalError;
  *comm = (ncclComm_t)(void *)&fake_group_starts;
  if (ncclGroupEnd() != ncclSuccess) return ncclInternalError;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  return ncclCommInitRank(comm, nranks, id, rank);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclSuccess; }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  *count = 7;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  fake_allreduce_calls++;
  fake_last_count = count;
  return ncclSuccess;
}

#ifndef FAKE_NO_CONFIG
ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t *config) {
  fake_allreduce_config_calls++;
  fake_last_config_magic = config ? config->magic : 0;
  fake_last_count = count;
  return ncclSuccess;
}
#endif

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return ncclSuccess;
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return ncclSuccess;
}

#ifndef FAKE_NO_SEND
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  fake_send_calls++;
  fake_last_send_peer = peer;
  return ncclSuccess;
}
#endif

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  fake_recv_calls++;
  fake_last_recv_peer = peer;
  return ncclSuccess;
}

#ifdef FAKE_HETCCL
FAKE_EXPORT const char *hetcclVersionString(void) { return "fake"; }
#endif
