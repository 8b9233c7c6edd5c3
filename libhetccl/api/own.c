/* hetccl's own entry points (include/hetccl.h), from the list in
 * entry/dispatch.h: each hands straight to the core. */
#include "api/api.h"
#include "api/checks.h"
#include "hetccl.h"

#define UNPAREN(...) __VA_ARGS__
#define OWN_ENTRY(ret, name, params, args)                                     \
  HETCCL_EXPORT ret hetccl##name params { return hetccl_own_##name args; }
HETCCL_OWN_ENTRIES(OWN_ENTRY)
#undef OWN_ENTRY

/* A communicator entry: the frame and checks of ncclCommInitRankConfig. */
HETCCL_EXPORT ncclResult_t hetcclCommInitRankAs(ncclComm_t *newcomm, int nranks,
                                                ncclUniqueId commId, int rank,
                                                ncclConfig_t *config, hetcclDevice_t device) {
  hetccl_call_begin();
  ncclResult_t res = check_init("hetcclCommInitRankAs", newcomm, nranks, rank);
  if (res == ncclSuccess) res = hetccl_CommInitRankAs(newcomm, nranks, commId, rank, config, device);
  return hetccl_call_end(NULL, res);
}
