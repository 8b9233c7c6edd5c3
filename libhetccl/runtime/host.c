/* Device runtime: the host entry, the table lookup, and the choice of the
 * device kind a process presents at comm init.
 *
 * The host entry treats "device" memory as ordinary memory: allocations are
 * page-aligned heap blocks, a stream is ignored, an asynchronous copy is a
 * memcpy finished before it returns (so stream order holds trivially) and a
 * synchronisation has nothing to wait for.
 *
 * Which kind is this process? (hetccl_runtime_detect, knob HETCCL_DEVICE)
 *   host | cuda | hip
 *                 that kind, no questions asked (cuda or hip with no usable
 *                 runtime then fails at comm init, naming what is missing).
 *   auto          (the default) a GPU kind when the process is ALREADY using
 *                 that GPU runtime and it has a usable device, else host;
 *                 CUDA is asked first, then HIP. "Already using" (runtime
 *                 slot in_use) means: its runtime library (libcudart.so.N,
 *                 libamdhip64.so.N) is loaded in the process, or (CUDA) a
 *                 context of its driver is current / a primary context is
 *                 active. It never loads or initialises a GPU stack itself,
 *                 so a CUDA or host process never loads libamdhip64 (nor a
 *                 HIP process libcudart).
 * Why this rule: PyTorch and CuPy load libcudart (their ROCm builds
 * libamdhip64) before they create a communicator, so they are GPU ranks; a CPU-only program on a GPU box
 * (numpy buffers through the Python binding, a host-only benchmark) never
 * loaded CUDA, so it stays a host rank and pays no CUDA start-up, even though
 * a GPU and the CUDA libraries are present. A program that links the CUDA
 * runtime statically is seen through its current or primary context once it
 * has selected a device. Only a positive answer is cached: a process that
 * loads CUDA after a first host answer becomes a CUDA rank for its later
 * communicators.
 *
 * Threads: any. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- host entry ------------------------------------------------------------ */

static size_t page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

static int host_available(void) { return 1; }
static int host_in_use(void) { return 1; }
static const char *host_describe(void) { return "built in (host memory, host reductions)"; }

static ncclResult_t host_current_device(int *dev, char *busid, size_t busid_len) {
  if (dev) *dev = -1;
  if (busid && busid_len) busid[0] = '\0';
  return ncclSuccess;
}

static ncclResult_t host_set_device(int dev) { return ncclSuccess; }

static ncclResult_t host_mem_kind(const void *ptr, hetccl_mem_kind_t *kind, int *dev) {
  if (kind) *kind = HETCCL_MEM_HOST;
  if (dev) *dev = -1;
  return ncclSuccess;
}

static ncclResult_t host_alloc_aligned(void **ptr, size_t bytes, const char *what) {
  void *p = NULL;
  /* posix_memalign(0) may return NULL legitimately; keep a real block. */
  int err = posix_memalign(&p, page_size(), bytes ? bytes : 1);
  if (err != 0) {
    WARN("host runtime: %s of %zu bytes failed: %s", what, bytes, strerror(err));
    return ncclSystemError;
  }
  *ptr = p;
  return ncclSuccess;
}

static ncclResult_t host_mem_alloc(void **ptr, size_t bytes) {
  HETCCL_ARGCHECK(ptr != NULL, ncclInvalidArgument, "host runtime: mem_alloc: ptr is NULL");
  return host_alloc_aligned(ptr, bytes, "allocation");
}

static ncclResult_t host_mem_free(void *ptr) {
  free(ptr);
  return ncclSuccess;
}

static ncclResult_t host_host_alloc(void **ptr, size_t bytes) {
  HETCCL_ARGCHECK(ptr != NULL, ncclInvalidArgument, "host runtime: host_alloc: ptr is NULL");
  return host_alloc_aligned(ptr, bytes, "staging allocation");
}

static ncclResult_t host_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) {
  if (bytes && dst != src) memmove(dst, src, bytes);
  return ncclSuccess;
}

static ncclResult_t host_stream_sync(void *stream) { return ncclSuccess; }

static ncclResult_t host_stream_capturing(void *stream, int *capturing) {
  if (capturing) *capturing = 0;
  return ncclSuccess;
}

const hetccl_runtime_t hetccl_runtime_host = {
    .kind = HETCCL_DEV_HOST,
    .name = "host",
    .available = host_available,
    .in_use = host_in_use,
    .describe = host_describe,
    .current_device = host_current_device,
    .set_device = host_set_device,
    .mem_kind = host_mem_kind,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .host_alloc = host_host_alloc,
    .host_free = host_mem_free,
    .memcpy_async = host_memcpy_async,
    .stream_sync = host_stream_sync,
    .stream_capturing = host_stream_capturing,
};

/* --- lookup ------------------------------------------------------------------ */

static const char *const kind_names[HETCCL_DEV_COUNT] = {
#define KIND_NAME(id, text) [HETCCL_DEV_##id] = text,
    HETCCL_DEVICE_KINDS(KIND_NAME)
#undef KIND_NAME
};

const char *hetccl_dev_kind_name(hetccl_dev_kind_t k) {
  return (unsigned)k < HETCCL_DEV_COUNT ? kind_names[k] : "unknown";
}

const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind) {
  switch (kind) {
  case HETCCL_DEV_HOST: return &hetccl_runtime_host;
  case HETCCL_DEV_CUDA: return &hetccl_runtime_cuda;
  case HETCCL_DEV_HIP: return &hetccl_runtime_hip;
  default: return NULL;
  }
}

/* --- detection --------------------------------------------------------------- */

/* GPU kinds that auto may pick, in order of preference. */
static const hetccl_dev_kind_t auto_kinds[] = {HETCCL_DEV_CUDA, HETCCL_DEV_HIP};

static hetccl_dev_kind_t detected = HETCCL_DEV_COUNT; /* cached positive answer */

hetccl_dev_kind_t hetccl_runtime_detect(void) {
  /* The knob table spells the value as kind_names do, and allows no word
   * but auto and those (a bad one fails comm init there; here it is auto). */
  const char *want = hetccl_knob_str(HETCCL_KNOB_DEVICE);
  for (int k = 0; k < HETCCL_DEV_COUNT; k++)
    if (strcmp(want, kind_names[k]) == 0) return (hetccl_dev_kind_t)k;
  hetccl_dev_kind_t k = __atomic_load_n(&detected, __ATOMIC_ACQUIRE);
  if (k != HETCCL_DEV_COUNT) return k;
  for (size_t i = 0; i < sizeof(auto_kinds) / sizeof(auto_kinds[0]); i++) {
    const hetccl_runtime_t *rt = hetccl_runtime_get(auto_kinds[i]);
    if (rt && rt->in_use() && rt->available()) {
      INFO(HETCCL_RUNTIME, "device kind %s: this process already uses it", rt->name);
      __atomic_store_n(&detected, auto_kinds[i], __ATOMIC_RELEASE);
      return auto_kinds[i];
    }
  }
  return HETCCL_DEV_HOST;
}
