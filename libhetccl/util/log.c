/* Logging (util/log.h): levels, subsystem mask, output file, and the
 * thread-local last error that every WARN records.
 *
 * Any thread may log. Settings are read once (pthread_once) from the knob
 * table and re-read by hetccl_log_reset (ncclResetDebugInit), which may run
 * while other threads log: the level and mask are atomics, the output file
 * is swapped under log_lock, and the host name is written only once. Lines
 * are formatted whole before one write, so lines of concurrent threads do
 * not interleave. Nothing is printed unless the user asked for a level. */
#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/knobs.h"

#define LOG_LINE_BYTES 2048
#define LAST_ERROR_BYTES 1024

int hetccl_log_level_cached = -1;
unsigned hetccl_log_mask_cached = 0;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER; /* guards log_file */
static FILE *log_file;           /* NULL means stderr */
static char log_host[64] = "?";  /* written by the first setup only */
static _Thread_local char last_error[LAST_ERROR_BYTES];

static const struct {
  const char *name;
  unsigned bit;
} subsystems[] = {
#define HETCCL_SUBSYS_ROW(name, bit) {#name, bit},
    HETCCL_SUBSYSTEMS(HETCCL_SUBSYS_ROW)
#undef HETCCL_SUBSYS_ROW
};
#define N_SUBSYSTEMS (sizeof(subsystems) / sizeof(subsystems[0]))

static const char *const level_names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};

/* The hetccl variable wins over NCCL's when both are set. */
static const char *knob_either(hetccl_knob_t ours, hetccl_knob_t nccls) {
  const char *v = hetccl_knob_str(ours);
  return v[0] ? v : hetccl_knob_str(nccls);
}

/* HETCCL_DEBUG, else NCCL_DEBUG (one word list, any case, as NCCL reads
 * them); unset: silent. A refused word reads as unset here, and fails
 * comm init there. */
static int knob_level(void) {
  switch (hetccl_knob_enum(hetccl_knob_or_nccl(HETCCL_KNOB_DEBUG, HETCCL_KNOB_NCCL_DEBUG))) {
    case HETCCL_KNOB_DEBUG_VERSION: return HETCCL_LOG_VERSION;
    case HETCCL_KNOB_DEBUG_WARN: return HETCCL_LOG_WARN;
    case HETCCL_KNOB_DEBUG_INFO: return HETCCL_LOG_INFO;
    case HETCCL_KNOB_DEBUG_ABORT: return HETCCL_LOG_WARN; /* NCCL's ABORT prints warnings as WARN */
    case HETCCL_KNOB_DEBUG_TRACE: return HETCCL_LOG_TRACE;
    default: return HETCCL_LOG_NONE;
  }
}

static unsigned subsys_bit(const char *name, size_t len) {
  if (len == 3 && strncasecmp(name, "ALL", 3) == 0) return (unsigned)HETCCL_ALL;
  for (size_t i = 0; i < N_SUBSYSTEMS; i++)
    if (strlen(subsystems[i].name) == len && strncasecmp(name, subsystems[i].name, len) == 0)
      return subsystems[i].bit;
  return 0;
}

/* "INIT,NET" selects; "^NET" starts from ALL and drops; unknown names are
 * skipped (copied into `unknown` for one warning once logging works). */
static unsigned parse_mask(const char *s, char *unknown, size_t unknown_len) {
  unsigned mask = s[0] == '^' ? (unsigned)HETCCL_ALL : 0;
  unknown[0] = '\0';
  while (*s) {
    size_t len = strcspn(s, ",");
    int negate = s[0] == '^';
    const char *name = s + negate;
    size_t name_len = len - (size_t)negate;
    unsigned bit = subsys_bit(name, name_len);
    if (bit == 0 && name_len > 0 && unknown[0] == '\0')
      snprintf(unknown, unknown_len, "%.*s", (int)name_len, name);
    mask = negate ? mask & ~bit : mask | bit;
    s += len + (s[len] == ',');
  }
  return mask;
}

/* Expands %h (host) and %p (pid) of a NCCL_DEBUG_FILE pattern. */
static void expand_path(const char *pattern, char *out, size_t out_len) {
  size_t n = 0;
  for (const char *p = pattern; *p && n + 1 < out_len; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      int w = p[1] == 'h' ? snprintf(out + n, out_len - n, "%s", log_host)
                          : snprintf(out + n, out_len - n, "%d", (int)getpid());
      n = w < 0 ? n : n + (size_t)w;
      if (n >= out_len) n = out_len - 1;
      p++;
    } else {
      out[n++] = *p;
    }
  }
  out[n] = '\0';
}

static void emit(int level, unsigned subsys, const char *file, int line, const char *msg) {
  char buf[LOG_LINE_BYTES];
  const char *what = "";
  if (level >= HETCCL_LOG_INFO) {
    for (size_t i = 0; i < N_SUBSYSTEMS; i++)
      if (subsys & subsystems[i].bit) {
        what = subsystems[i].name;
        break;
      }
  }
  int n = snprintf(buf, sizeof(buf), "%s:%d:%ld hetccl %s%s%s ", log_host, (int)getpid(),
                   (long)syscall(SYS_gettid), level_names[level], what[0] ? " " : "", what);
  if (n < 0 || (size_t)n >= sizeof(buf)) return;
  if (level == HETCCL_LOG_TRACE)
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s:%d ", file, line);
  if ((size_t)n >= sizeof(buf)) n = (int)sizeof(buf) - 1;
  snprintf(buf + n, sizeof(buf) - (size_t)n, "%s\n", msg);
  pthread_mutex_lock(&log_lock);
  FILE *f = log_file ? log_file : stderr;
  fputs(buf, f);
  fflush(f);
  pthread_mutex_unlock(&log_lock);
}

/* Level, mask and output file from the knobs; first setup and every reset. */
static void log_settings(void) {
  int level = knob_level();
  const char *subsys = knob_either(HETCCL_KNOB_DEBUG_SUBSYS, HETCCL_KNOB_NCCL_DEBUG_SUBSYS);
  char unknown[64];
  unsigned mask = subsys[0] ? parse_mask(subsys, unknown, sizeof(unknown))
                            : (unsigned)(HETCCL_INIT | HETCCL_ENV);
  if (!subsys[0]) unknown[0] = '\0';

  FILE *f = NULL;
  const char *pattern = knob_either(HETCCL_KNOB_DEBUG_FILE, HETCCL_KNOB_NCCL_DEBUG_FILE);
  char path[1024];
  int open_errno = 0;
  if (level > HETCCL_LOG_NONE && pattern[0]) {
    expand_path(pattern, path, sizeof(path));
    f = fopen(path, "a");
    open_errno = errno;
  }
  pthread_mutex_lock(&log_lock);
  FILE *old = log_file;
  log_file = f;
  pthread_mutex_unlock(&log_lock);
  if (old) fclose(old);

  __atomic_store_n(&hetccl_log_mask_cached, mask, __ATOMIC_RELAXED);
  __atomic_store_n(&hetccl_log_level_cached, level, __ATOMIC_RELEASE);

  /* Logging works from here on; report what could not be honoured. */
  if (level >= HETCCL_LOG_WARN && pattern[0] && !f) {
    char msg[1200];
    snprintf(msg, sizeof(msg), "cannot open log file %s: %s; logging to stderr", path,
             strerror(open_errno));
    emit(HETCCL_LOG_WARN, HETCCL_ALL, __FILE__, __LINE__, msg);
  }
  if (level >= HETCCL_LOG_WARN && unknown[0]) {
    char msg[128];
    snprintf(msg, sizeof(msg), "unknown log subsystem '%s' ignored", unknown);
    emit(HETCCL_LOG_WARN, HETCCL_ALL, __FILE__, __LINE__, msg);
  }
}

static void log_setup(void) {
  char host[sizeof(log_host)];
  if (gethostname(host, sizeof(host)) != 0) strcpy(host, "?");
  host[sizeof(host) - 1] = '\0';
  host[strcspn(host, ".")] = '\0';
  /* Before the level's release store below: a thread that sees a level
   * sees the host too. */
  memcpy(log_host, host, sizeof(log_host));
  log_settings();
}

void hetccl_log_init(void) { pthread_once(&log_once, log_setup); }

void hetccl_log_reset(void) {
  hetccl_log_init(); /* so that a later first call cannot run setup again */
  hetccl_knobs_reload();
  log_settings();
}

void hetccl_log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
  if (__atomic_load_n(&hetccl_log_level_cached, __ATOMIC_ACQUIRE) < 0) hetccl_log_init();
  char msg[LAST_ERROR_BYTES];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level == HETCCL_LOG_WARN) memcpy(last_error, msg, sizeof(msg));

  int cur = __atomic_load_n(&hetccl_log_level_cached, __ATOMIC_ACQUIRE);
  if (level < HETCCL_LOG_VERSION || level > HETCCL_LOG_TRACE || cur < level) return;
  /* Warnings and the version banner ignore the subsystem mask. */
  if (level >= HETCCL_LOG_INFO && !(__atomic_load_n(&hetccl_log_mask_cached, __ATOMIC_RELAXED) & subsys))
    return;
  emit(level, subsys, file, line, msg);
}

const char *hetccl_last_error(void) { return last_error; }

void hetccl_last_error_clear(void) { last_error[0] = '\0'; }

void hetccl_last_error_set(const char *msg) {
  snprintf(last_error, sizeof(last_error), "%s", msg ? msg : "");
}

void hetccl_last_error_prefix(const char *fmt, ...) {
  char context[LAST_ERROR_BYTES], joined[2 * LAST_ERROR_BYTES + 2];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(context, sizeof(context), fmt, ap);
  va_end(ap);
  snprintf(joined, sizeof(joined), "%s%s%s", context, last_error[0] ? ": " : "", last_error);
  /* Too long: the cause loses its tail, the context stays whole. */
  snprintf(last_error, sizeof(last_error), "%.*s", (int)sizeof(last_error) - 1, joined);
}
