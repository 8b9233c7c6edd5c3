/* What the GPU runtime entries share (gpu.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr, dl_iterate_phdr */
#endif
#include "runtime/gpu.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define PATH_BYTES 512

typedef struct {
  const char *prefix;
  char path[PATH_BYTES];
} mapped_search_t;

/* dl_iterate_phdr callback: the first mapped object named prefix*. */
static int find_mapped(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  mapped_search_t *s = data;
  const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
  const char *base = slash ? slash + 1 : info->dlpi_name;
  if (base && strncmp(base, s->prefix, strlen(s->prefix)) == 0) {
    snprintf(s->path, sizeof(s->path), "%s", info->dlpi_name);
    return 1;
  }
  return 0;
}

void *hetccl_gpu_open_loaded(const char *const *names, size_t nnames, const char *prefix) {
  for (size_t i = 0; i < nnames; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h) return h;
  }
  /* No dlopen while dl_iterate_phdr holds the loader's lock: name first. */
  mapped_search_t s = {.prefix = prefix, .path = ""};
  if (dl_iterate_phdr(find_mapped, &s) && s.path[0])
    return dlopen(s.path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  return NULL;
}

/* dl_iterate_phdr callback: the count, from the first entry (every entry
 * carries it). */
static int first_entry_loads(struct dl_phdr_info *info, size_t size, void *out) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
    *(unsigned long long *)out = info->dlpi_adds;
  return 1;
}

unsigned long long hetccl_runtime_loads(void) {
  unsigned long long loads = 0;
  dl_iterate_phdr(first_entry_loads, &loads);
  return loads;
}

void hetccl_gpu_where_loaded(const void *sym, char *out, size_t len, const char *fallback) {
  Dl_info info;
  if (sym && dladdr(sym, &info) && info.dli_fname && info.dli_fname[0])
    snprintf(out, len, "%s", info.dli_fname);
  else
    snprintf(out, len, "%s", fallback);
}

int hetccl_gpu_loaded_file(const char *const *names, size_t nnames, const char *prefix,
                           const char *sym, char *out, size_t len) {
  out[0] = '\0';
  void *h = hetccl_gpu_open_loaded(names, nnames, prefix);
  if (!h) return 0;
  hetccl_gpu_where_loaded(dlsym(h, sym), out, len, "");
  dlclose(h);
  return 1;
}

int hetccl_gpu_take(void *h, const hetccl_gpu_sym_t *syms, size_t n, const char *lib, char *why,
                    size_t len) {
  for (size_t i = 0; i < n; i++) *syms[i].slot = NULL;
  for (size_t i = 0; i < n; i++) {
    if (*syms[i].slot) continue; /* an earlier name for the same slot was found */
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot && !syms[i].optional) {
      if (why && len) snprintf(why, len, "%s lacks %s", lib, syms[i].name);
      return 0;
    }
  }
  return 1;
}

typedef struct counter_job {
  volatile uint64_t *counter;
  uint64_t value;
  int write; /* 1: store value; 0: wait until counter >= value */
} counter_job_t;

void *hetccl_gpu_counter_job(volatile uint64_t *counter, uint64_t value, int write) {
  counter_job_t *job = malloc(sizeof(*job));
  if (!job) return NULL;
  job->counter = counter;
  job->value = value;
  job->write = write;
  return job;
}

void hetccl_gpu_counter_fn(void *arg) {
  counter_job_t *job = arg;
  struct timespec ts = {0, 2000};
  if (job->write)
    __atomic_store_n(job->counter, job->value, __ATOMIC_RELEASE);
  else
    while (__atomic_load_n(job->counter, __ATOMIC_ACQUIRE) < job->value) nanosleep(&ts, NULL);
  free(job);
}

hetccl_gpu_range_t hetccl_gpu_page_range(const void *ptr, size_t bytes) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t mask = (uintptr_t)(page > 0 ? page : 4096) - 1;
  uintptr_t p = (uintptr_t)ptr, base = p & ~mask, end = (p + bytes + mask) & ~mask;
  return (hetccl_gpu_range_t){.base = base, .bytes = end - base, .offset = p - base};
}

int hetccl_gpu_why(char *why, size_t len, const char *fmt, ...) {
  if (why && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  return 0;
}
