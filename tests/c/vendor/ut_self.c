/* "hetccl itself" for the vendor loader's tests: the object the loader runs
 * in exports ncclGetVersion (so that pointing HETCCL_NCCL_LIBRARY at it must
 * be refused) and ncclGroupStart/ncclGroupEnd with the API layer's re-entry
 * rule, counting which way each call went. */
#include "vendor_ccl/vendor.h"

#define UT_EXPORT __attribute__((visibility("default")))

UT_EXPORT int ut_fresh_calls;   /* came in with no vendor call in progress */
UT_EXPORT int ut_reentered;     /* came back from inside the vendor: forwarded */
UT_EXPORT int ut_from_vendor;   /* return address inside the vendor's code */

UT_EXPORT ncclResult_t ncclGetVersion(int *version) {
  *version = 1;
  return ncclSuccess;
}

static ncclResult_t group_call(int start, const void *ret) {
  if (hetccl_vendor_owns(ret)) ut_from_vendor++;
  const hetccl_vendor_t *v = hetccl_vendor_inside; /* the vendor this call came back from */
  if (v) {
    ut_reentered++;
    return start ? v->GroupStart() : v->GroupEnd();
  }
  ut_fresh_calls++;
  return ncclSuccess;
}

UT_EXPORT ncclResult_t ncclGroupStart(void) {
  return group_call(1, __builtin_return_address(0));
}

UT_EXPORT ncclResult_t ncclGroupEnd(void) {
  return group_call(0, __builtin_return_address(0));
}
