/* The API layer: thin. Validate arguments, record the last error, dispatch
 * to the vendor communicator or to the engine. Knows nothing of CUDA,
 * transports or algorithms.
 *
 * NCCL_API declares an exported function and its pncclX alias (the
 * profiling names NCCL exports too), both with default visibility. */
#ifndef HETCCL_API_H
#define HETCCL_API_H

#include "core/comm.h"
#include "nccl.h"
#include "util/check.h"
#include "util/log.h"

#define HETCCL_EXPORT __attribute__((visibility("default")))

#define NCCL_API(ret, func, ...)                                               \
  HETCCL_EXPORT ret func(__VA_ARGS__);                                         \
  HETCCL_EXPORT ret p##func(__VA_ARGS__) __attribute__((alias(#func)))

/* For functions hetccl cannot serve in the current situation: a WARN naming
 * the function (which becomes the last error) and ncclInvalidUsage. */
ncclResult_t hetccl_api_unsupported(const char *func, const char *why);

/* Re-entry from inside the vendor library: a call the vendor made to one of
 * its own exported names landed here. Go straight back to the vendor with
 * the arguments untouched (they hold vendor handles, not ours). */
#define HETCCL_REENTRY(slot, ...)                                              \
  do {                                                                         \
    const hetccl_vendor_t *reentered_ =                                        \
        hetccl_vendor_reentered(__builtin_return_address(0));                  \
    if (__builtin_expect(reentered_ != NULL, 0)) return reentered_->slot(__VA_ARGS__); \
  } while (0)

/* Return path of every API function taking a comm: records the thread's
 * last error on the communicator when the call failed. */
static inline ncclResult_t hetccl_api_ret(ncclComm_t comm, ncclResult_t res) {
  if (res != ncclSuccess && res != ncclInProgress && comm) hetccl_comm_record_error(comm, res);
  return res;
}

#endif
