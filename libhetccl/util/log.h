/* Logging with levels and subsystem bits, silent by default.
 *
 * Level from HETCCL_DEBUG, else NCCL_DEBUG (VERSION, WARN, INFO, ABORT, TRACE);
 * subsystems from HETCCL_DEBUG_SUBSYS, else NCCL_DEBUG_SUBSYS (comma list,
 * ^ to negate, ALL); output to HETCCL_DEBUG_FILE / NCCL_DEBUG_FILE (%h host,
 * %p pid) or stderr.
 *
 * WARN also records the message as the calling thread's last error
 * (ncclGetLastError), whether or not it is printed. Any thread may log. */
#ifndef HETCCL_UTIL_LOG_H
#define HETCCL_UTIL_LOG_H

#include <stdarg.h>

/* name, bit */
#define HETCCL_SUBSYSTEMS(X)                                                   \
  X(INIT, 0x0001)                                                              \
  X(COLL, 0x0002)                                                              \
  X(P2P, 0x0004)                                                               \
  X(SHM, 0x0008)                                                               \
  X(NET, 0x0010)                                                               \
  X(BOOTSTRAP, 0x0020)                                                         \
  X(PROXY, 0x0040)                                                             \
  X(ENV, 0x0080)                                                               \
  X(ALLOC, 0x0100)                                                             \
  X(VENDOR, 0x0200)                                                            \
  X(RUNTIME, 0x0400)                                                           \
  X(GROUP, 0x0800)                                                             \
  X(CALL, 0x1000)

typedef enum {
#define HETCCL_SUBSYS_ENUM(name, bit) HETCCL_##name = bit,
  HETCCL_SUBSYSTEMS(HETCCL_SUBSYS_ENUM)
#undef HETCCL_SUBSYS_ENUM
  HETCCL_ALL = ~0
} hetccl_subsys_t;

typedef enum {
  HETCCL_LOG_NONE = 0,
  HETCCL_LOG_VERSION = 1,
  HETCCL_LOG_WARN = 2,
  HETCCL_LOG_INFO = 3,
  HETCCL_LOG_TRACE = 4
} hetccl_log_level_t;

/* Current level, read once from the environment (cheap after the first call). */
extern int hetccl_log_level_cached;
extern unsigned hetccl_log_mask_cached;
void hetccl_log_init(void);
/* Re-read the logging knobs from the environment (ncclResetDebugInit). */
void hetccl_log_reset(void);

void hetccl_log(int level, unsigned subsys, const char *file, int line,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The calling thread's last error message ("" when none). */
const char *hetccl_last_error(void);
void hetccl_last_error_clear(void);
/* Hand an error that another thread logged (a proxy's) to this thread. */
void hetccl_last_error_set(const char *msg);
/* Put context in front of the calling thread's last error ("<context>:
 * <error>"), printing nothing. For a caller that passes on a failure that
 * was logged where it was born: it adds where, without a second WARN. */
void hetccl_last_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define WARN(...)                                                              \
  hetccl_log(HETCCL_LOG_WARN, HETCCL_ALL, __FILE__, __LINE__, __VA_ARGS__)

/* Relaxed loads: ncclResetDebugInit may change both while others log. */
#define HETCCL_LOG_ENABLED(level, subsys)                                      \
  (__atomic_load_n(&hetccl_log_level_cached, __ATOMIC_RELAXED) < 0 ? (hetccl_log_init(), 0) : 0, \
   __atomic_load_n(&hetccl_log_level_cached, __ATOMIC_RELAXED) >= (level) &&  \
       (__atomic_load_n(&hetccl_log_mask_cached, __ATOMIC_RELAXED) & (subsys)))

#define INFO(subsys, ...)                                                      \
  do {                                                                         \
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, (subsys)))                         \
      hetccl_log(HETCCL_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__);  \
  } while (0)

#define TRACE(subsys, ...)                                                     \
  do {                                                                         \
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_TRACE, (subsys)))                        \
      hetccl_log(HETCCL_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#endif
