/* hetccl's own entry points (include/hetccl.h), from the list in
 * core/dispatch.h: each hands straight to the core. */
#include "api/api.h"
#include "hetccl.h"

#define UNPAREN(...) __VA_ARGS__
#define OWN_ENTRY(ret, name, params, args)                                     \
  HETCCL_EXPORT ret hetccl##name params { return hetccl_own_##name args; }
HETCCL_OWN_ENTRIES(OWN_ENTRY)
#undef OWN_ENTRY
