/* The API layer: thin. Every exported function is generated from one list
 * (libhetccl/entries.h, api/entries.c): re-entry check, the argument checks
 * that need no communicator (api/checks.c), one call into the core
 * (entry/dispatch.h, the only core header included here).
 *
 * NCCL_API declares an exported function and its pncclX alias (the
 * profiling names NCCL exports too), both with default visibility. */
#ifndef HETCCL_API_H
#define HETCCL_API_H

#include "entry/dispatch.h"
#include "nccl.h"

#define HETCCL_EXPORT __attribute__((visibility("default")))

#define NCCL_API(ret, func, ...)                                               \
  HETCCL_EXPORT ret func(__VA_ARGS__);                                         \
  HETCCL_EXPORT ret p##func(__VA_ARGS__) __attribute__((alias(#func)))

/* Re-entry from inside the vendor library: a call the vendor made to one of
 * its own exported names landed here. Go straight back to the vendor with
 * the arguments untouched (they hold vendor handles, not ours). */
#define HETCCL_REENTRY(slot, ...)                                              \
  do {                                                                         \
    const hetccl_vendor_t *reentered_ =                                        \
        hetccl_vendor_reentered(__builtin_return_address(0));                  \
    if (__builtin_expect(reentered_ != NULL, 0)) return reentered_->slot(__VA_ARGS__); \
  } while (0)

#endif
