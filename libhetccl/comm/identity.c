/* Who this rank is (identity.h): its host, its device kind, the runtime
 * that reads its pointers. Any thread; the late pointer kind keeps its
 * last answer under a lock of its own. */
#include "comm/identity.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/knobs.h"

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t hetccl_host_hash(char *hostname, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (gethostname(hostname, len) != 0) snprintf(hostname, len, "unknown");
  hostname[len - 1] = 0;
  h = fnv1a(h, hostname, strlen(hostname));
  char buf[128] = {0};
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n > 0) h = fnv1a(h, buf, (size_t)n);
    close(fd);
  }
  struct stat st;
  if (stat("/proc/self/ns/ipc", &st) == 0) h = fnv1a(h, &st.st_ino, sizeof(st.st_ino));
  return h;
}

/* The device-kind table's vendor column (runtime/runtime.h) as vendor ids;
 * NONE, a kind no vendor library serves, reads as HETCCL_VENDOR_COUNT. */
#define HETCCL_VENDOR_NONE HETCCL_VENDOR_COUNT
static const hetccl_vendor_id_t kind_vendor[HETCCL_DEV_COUNT] = {
#define KIND_VENDOR(id, name, vendor) [HETCCL_DEV_##id] = HETCCL_VENDOR_##vendor,
    HETCCL_DEVICE_KINDS(KIND_VENDOR)
#undef KIND_VENDOR
};
#undef HETCCL_VENDOR_NONE

int hetccl_dev_vendor(hetccl_dev_kind_t kind, hetccl_vendor_id_t *id) {
  if ((unsigned)kind >= HETCCL_DEV_COUNT || kind_vendor[kind] == HETCCL_VENDOR_COUNT) return 0;
  *id = kind_vendor[kind];
  return 1;
}

/* GPU kinds, in the order the rules below ask them. */
static const hetccl_dev_kind_t gpu_kinds[] = {HETCCL_DEV_CUDA, HETCCL_DEV_HIP};
#define NGPU_KINDS (sizeof(gpu_kinds) / sizeof(gpu_kinds[0]))

/* Does this process link kind's real vendor library (libnccl.so.2,
 * librccl.so.1 mapped, not hetccl)? Looks, never loads. */
static int links_vendor_of(hetccl_dev_kind_t kind) {
  hetccl_vendor_id_t v;
  return hetccl_dev_vendor(kind, &v) && hetccl_vendor_foreign_mapped(v);
}

hetccl_dev_kind_t hetccl_process_dev_kind(void) {
  hetccl_dev_kind_t k = hetccl_runtime_detect();
  if (k != HETCCL_DEV_HOST || hetccl_knob_is_set(HETCCL_KNOB_DEVICE)) return k;
  /* Only a process that links the vendor library loads its runtime here. */
  for (size_t i = 0; i < NGPU_KINDS; i++)
    if (links_vendor_of(gpu_kinds[i]) && hetccl_runtime_get(gpu_kinds[i])->available())
      return gpu_kinds[i];
  return k;
}

hetccl_dev_kind_t hetccl_host_pointer_kind(void) {
  for (size_t i = 0; i < NGPU_KINDS; i++) {
    const hetccl_runtime_t *rt = hetccl_runtime_get(gpu_kinds[i]);
    if (rt->holds_memory() && rt->available()) return gpu_kinds[i];
  }
  return HETCCL_DEV_HOST;
}

/* Is some GPU runtime loaded (so that memory of it may come to exist
 * without another load)? */
static int gpu_runtime_loaded(void) {
  for (size_t i = 0; i < NGPU_KINDS; i++)
    if (hetccl_runtime_get(gpu_kinds[i])->in_use()) return 1;
  return 0;
}

hetccl_dev_kind_t hetccl_late_pointer_kind(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static unsigned long long asked_at = ULLONG_MAX; /* the loads when last asked */
  static hetccl_dev_kind_t answer = HETCCL_DEV_HOST;
  static int loaded; /* a GPU runtime was loaded when last asked */
  unsigned long long loads = hetccl_runtime_loads();
  pthread_mutex_lock(&lock);
  if (loads == 0 || loads != asked_at) {
    loaded = gpu_runtime_loaded();
    answer = loaded ? hetccl_host_pointer_kind() : HETCCL_DEV_HOST;
    asked_at = loads;
  } else if (answer == HETCCL_DEV_HOST && loaded) {
    answer = hetccl_host_pointer_kind(); /* a context may have been made since */
  }
  hetccl_dev_kind_t k = answer;
  pthread_mutex_unlock(&lock);
  return k;
}
