/* Every exported nccl* function, generated from libhetccl/entries.h.
 *
 * Thread: the API caller's. Nothing here decides anything: see
 * entry/dispatch.h for where each call goes. */
#include "api/api.h"
#include "api/checks.h"

/* --- the checks an entry names --------------------------------------------- */

#define NO_CHECKS
#define ARG_NOT_NULL(p)                                                        \
  if (res == ncclSuccess && (p) == NULL) res = check_null(__func__, #p);
#define ARG(call)                                                              \
  if (res == ncclSuccess) res = (call);

/* --- re-entry and the communicator, by kind -------------------------------- */

#define UNPAREN(...) __VA_ARGS__
#define REENTRY_COMM(name, args) HETCCL_REENTRY(name, UNPAREN args);
#define REENTRY_PROC(name, args) HETCCL_REENTRY(name, UNPAREN args);
#define REENTRY_OWN_COMM(name, args)
#define REENTRY_OWN_PROC(name, args)
#define COMM_COMM comm
#define COMM_OWN_COMM comm
#define COMM_PROC NULL
#define COMM_OWN_PROC NULL

/* --- the entries ------------------------------------------------------------ */

#define ENTRY_CALL(kind, name, params, args, checks)                           \
  NCCL_API(ncclResult_t, nccl##name, UNPAREN params);                          \
  ncclResult_t nccl##name params {                                             \
    REENTRY_##kind(name, args)                                                 \
    hetccl_call_begin();                                                       \
    ncclResult_t res = ncclSuccess;                                            \
    checks                                                                     \
    if (res == ncclSuccess) res = check_named(__func__, hetccl_##name args);    \
    return hetccl_call_end(COMM_##kind, res);                                  \
  }
HETCCL_API_CALLS(ENTRY_CALL)
#undef ENTRY_CALL

#define OP(k, s, r, n, t, o, ro, pe, cfg)                                      \
  {.kind = HETCCL_OP_##k, .fn = __func__, .sendbuf = (s), .recvbuf = (r), .count = (n),      \
   .dtype = (t), .redop = (o), .root = (ro), .peer = (pe), .stream = stream, .config = (cfg)}
#define NO_ROOT HETCCL_NO_ROOT
#define NO_PEER HETCCL_NO_PEER
#define NO_REDOP HETCCL_NO_REDOP

#define ENTRY_OP(name, params, args, op)                                       \
  NCCL_API(ncclResult_t, nccl##name, UNPAREN params);                          \
  ncclResult_t nccl##name params {                                             \
    HETCCL_REENTRY(name, UNPAREN args);                                        \
    hetccl_call_begin();                                                       \
    const hetccl_op_t call_op = op;                                            \
    ncclResult_t res = check_op(&call_op);                                     \
    if (res == ncclSuccess) res = check_named(__func__, hetccl_dispatch(comm, &call_op)); \
    return hetccl_call_end(comm, res);                                         \
  }
HETCCL_API_OPS(ENTRY_OP)
#undef ENTRY_OP

#define ENTRY_VALUE(kind, ret, name, params, args)                             \
  NCCL_API(ret, nccl##name, UNPAREN params);                                   \
  ret nccl##name params {                                                      \
    REENTRY_##kind(name, args)                                                 \
    return hetccl_##name args;                                                 \
  }
HETCCL_API_VALUES(ENTRY_VALUE)
#undef ENTRY_VALUE

/* The three that return nothing. ncclResetDebugInitInternal has no p-name
 * in NCCL's export list, so neither here. */
NCCL_API(void, ncclParamDumpAll, void);
void ncclParamDumpAll(void) { hetccl_ParamDumpAll(); }

NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) { hetccl_ResetDebugInit(); }

HETCCL_EXPORT void ncclResetDebugInitInternal(void);
void ncclResetDebugInitInternal(void) { hetccl_ResetDebugInit(); }
