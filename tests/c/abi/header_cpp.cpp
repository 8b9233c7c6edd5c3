// nccl.h against the NCCL 2.32.3 facts, in C++17. Needs no CUDA and no
// library: the prototypes are checked by type only.
#include <cstddef>
#include <type_traits>

#include "nccl.h"
#include "nccl_device_host.h"
#include "nccl_facts.h"

static_assert(std::is_same<decltype(&ncclCommInitRankConfig),
                           ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int,
                                            ncclConfig_t *)>::value,
              "ncclCommInitRankConfig prototype");
static_assert(std::is_same<decltype(&pncclAllReduce),
                           ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t,
                                            ncclRedOp_t, ncclComm_t, cudaStream_t)>::value,
              "pncclAllReduce prototype");
static_assert(std::is_same<decltype(&ncclGroupStart), ncclResult_t (*)()>::value,
              "ncclGroupStart prototype");

int main() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t coll = NCCL_COLLCONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  return check_initializers(&config, &coll, &sim, &enc);
}
