/* Error propagation: every fallible function returns ncclResult_t.
 *
 * Two shapes, as everywhere in the tree:
 *   HETCCL_CHECK(call)               return the error to the caller
 *   HETCCL_CHECK_GOTO(call, res, lbl) store it in res and jump to a cleanup label
 * and one adapter per foreign error source (syscalls with EINTR retry,
 * pthreads). The function that first sees an error logs it with WARN (which
 * also records the thread's last error); callers pass it on silently. */
#ifndef HETCCL_UTIL_CHECK_H
#define HETCCL_UTIL_CHECK_H

#include <errno.h>
#include <string.h>

#include "nccl.h"
#include "util/log.h"

#define HETCCL_CHECK(call)                                                     \
  do {                                                                         \
    ncclResult_t hetccl_res_ = (call);                                         \
    if (hetccl_res_ != ncclSuccess) return hetccl_res_;                        \
  } while (0)

#define HETCCL_CHECK_GOTO(call, res, label)                                    \
  do {                                                                         \
    (res) = (call);                                                            \
    if ((res) != ncclSuccess) goto label;                                      \
  } while (0)

/* Syscall returning -1/errno; retried on EINTR. `what` names the action for
 * the message, e.g. "shm: ftruncate /hetccl-1234". */
#define HETCCL_SYSCHECK(call, what)                                            \
  do {                                                                         \
    int hetccl_rc_;                                                            \
    do { hetccl_rc_ = (int)(call); } while (hetccl_rc_ == -1 && errno == EINTR); \
    if (hetccl_rc_ == -1) {                                                    \
      WARN("%s: %s", (what), strerror(errno));                                 \
      return ncclSystemError;                                                  \
    }                                                                          \
  } while (0)

#define HETCCL_SYSCHECK_GOTO(call, what, res, label)                           \
  do {                                                                         \
    int hetccl_rc_;                                                            \
    do { hetccl_rc_ = (int)(call); } while (hetccl_rc_ == -1 && errno == EINTR); \
    if (hetccl_rc_ == -1) {                                                    \
      WARN("%s: %s", (what), strerror(errno));                                 \
      (res) = ncclSystemError;                                                 \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* pthread_* return the error number instead of setting errno. */
#define HETCCL_PTHREADCHECK(call, what)                                        \
  do {                                                                         \
    int hetccl_err_ = (call);                                                  \
    if (hetccl_err_ != 0) {                                                    \
      WARN("%s: %s", (what), strerror(hetccl_err_));                           \
      return ncclSystemError;                                                  \
    }                                                                          \
  } while (0)

/* Argument validation in the API layer: log, record, return. */
#define HETCCL_ARGCHECK(cond, res, ...)                                        \
  do {                                                                         \
    if (!(cond)) {                                                             \
      WARN(__VA_ARGS__);                                                       \
      return (res);                                                            \
    }                                                                          \
  } while (0)

#endif
