/* Argument checks that need no communicator state, named in the entry list
 * (libhetccl/entries.h). Each logs its own WARN naming the function and
 * the argument, and returns ncclInvalidArgument; what needs the
 * communicator (a root or peer against its size, an operator created on
 * it, a buffer only the root needs) is checked by the core.
 *
 * Thread: the API caller's; pure. */
#ifndef HETCCL_API_CHECKS_H
#define HETCCL_API_CHECKS_H

#include "entry/dispatch.h"

ncclResult_t check_null(const char *fn, const char *name);
ncclResult_t check_dtype(const char *fn, ncclDataType_t dtype);
/* value >= min */
ncclResult_t check_count(const char *fn, const char *name, int value, int min);
ncclResult_t check_init(const char *fn, ncclComm_t *newcomm, int nranks, int rank);
ncclResult_t check_color(int color);
ncclResult_t check_shrink(const int *exclude, int nexclude, int flags);
ncclResult_t check_grow(ncclComm_t comm, const ncclUniqueId *id);
ncclResult_t check_sim_info(const ncclSimInfo_t *info);
ncclResult_t check_signal_descs(int ndesc, const ncclWaitSignalDesc_t *descs);
ncclResult_t check_param_out(const void *out, int max_len);
/* A collective or point-to-point call (entry/dispatch.h). */
ncclResult_t check_op(const hetccl_op_t *op);

/* After an argument the core refused (ncclInvalidArgument or
 * ncclInvalidUsage): the last error names `fn` once. The core checks what
 * needs the communicator (an operator created on it, a root against its
 * size) where the exported name may be unknown to it; the entry adds it
 * when the text lacks it. Returns res. */
ncclResult_t check_named(const char *fn, ncclResult_t res);

#endif
