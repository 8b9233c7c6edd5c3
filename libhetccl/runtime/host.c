/* Device runtime: the host entry, the shared "unsupported" stubs, the table
 * lookup (every table's slots checked once, at first lookup), and the
 * choice of the device kind a process presents at comm init.
 *
 * The host entry treats "device" memory as ordinary memory: allocations are
 * page-aligned heap blocks, a stream is ignored, an asynchronous copy is a
 * memcpy finished before it returns (so stream order holds trivially) and a
 * synchronisation has nothing to wait for. It has no caps: events, streams,
 * mapped or registered memory and device reductions are stubs.
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
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
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

static ncclResult_t host_capture_mode_exchange(int *mode) {
  (void)mode;
  return ncclSuccess;
}

/* No events, streams or mapped memory: a host rank's "device" work is
 * finished when the call returns, so there is nothing to wait on. */
HETCCL_RT_UNSUPPORTED_STUB(host, event_create, (void **event))
HETCCL_RT_UNSUPPORTED_STUB(host, event_destroy, (void *event))
HETCCL_RT_UNSUPPORTED_STUB(host, event_record, (void *event, void *stream))
HETCCL_RT_UNSUPPORTED_STUB(host, event_query, (void *event, int *done))
HETCCL_RT_UNSUPPORTED_STUB(host, stream_wait_event, (void *stream, void *event))
HETCCL_RT_UNSUPPORTED_STUB(host, host_alloc_mapped, (void **host, void **dev, size_t bytes))
HETCCL_RT_UNSUPPORTED_STUB(host, stream_wait_counter,
                           (void *stream, volatile uint64_t *host, void *dev, uint64_t value))
HETCCL_RT_UNSUPPORTED_STUB(host, stream_write_counter,
                           (void *stream, volatile uint64_t *host, void *dev, uint64_t value))
HETCCL_RT_UNSUPPORTED_STUB(host, stream_create, (void **stream, int urgent))
HETCCL_RT_UNSUPPORTED_STUB(host, stream_destroy, (void *stream))
HETCCL_RT_UNSUPPORTED_STUB(host, host_register, (void *ptr, size_t bytes, void **dev))
HETCCL_RT_UNSUPPORTED_STUB(host, host_unregister, (void *ptr))

const hetccl_runtime_t hetccl_runtime_host = {
    .kind = HETCCL_DEV_HOST,
    .name = "host",
    .caps = 0,
    .available = host_available,
    .in_use = host_in_use,
    .holds_memory = host_in_use,
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
    .capture_mode_exchange = host_capture_mode_exchange,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .stream_wait_event = host_stream_wait_event,
    .host_alloc_mapped = host_host_alloc_mapped,
    .stream_wait_counter = host_stream_wait_counter,
    .stream_write_counter = host_stream_write_counter,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .host_register = host_host_register,
    .host_unregister = host_host_unregister,
    .reduce_async = hetccl_rt_reduce_async_none,
    .reduce_available = hetccl_rt_reduce_available_none,
    .reduce_run_async = hetccl_rt_reduce_run_async_none,
    .dmabuf_export = hetccl_rt_dmabuf_export_none,
    .flush_nic_writes = hetccl_rt_flush_nic_writes_none,
};

/* --- shared stubs ------------------------------------------------------------ */

ncclResult_t hetccl_rt_unsupported(const char *runtime, const char *slot) {
  WARN("%s runtime: %s is not supported", runtime, slot);
  return ncclInvalidUsage;
}

ncclResult_t hetccl_rt_reduce_async_none(const hetccl_redop_t *op, void *dst, const void *a,
                                         const void *b, size_t count, unsigned flags,
                                         void *stream) {
  return ncclInvalidUsage; /* no WARN: the caller decides (the slot's contract) */
}

ncclResult_t hetccl_rt_reduce_run_async_none(const hetccl_redop_t *op, unsigned flags,
                                             const hetccl_reduce_run_t *run, void *stream) {
  (void)op, (void)flags, (void)run, (void)stream;
  return ncclInvalidUsage; /* no WARN, as reduce_async */
}

int hetccl_rt_reduce_available_none(char *why, size_t len) {
  if (why && len) snprintf(why, len, "no device reduction kernels in this build");
  return 0;
}

ncclResult_t hetccl_rt_flush_nic_writes_none(void) { return ncclSuccess; }

int hetccl_rt_dmabuf_export_none(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                                 size_t len) {
  if (why && len) snprintf(why, len, "host memory is registered as it is, no dma-buf needed");
  return 0;
}

/* --- helpers on any table ---------------------------------------------------- */

ncclResult_t hetccl_runtime_stream_join(const hetccl_runtime_t *rt, void *to, void *from) {
  void *ev = NULL;
  HETCCL_CHECK(rt->event_create(&ev));
  ncclResult_t res = rt->event_record(ev, from);
  if (res == ncclSuccess) res = rt->stream_wait_event(to, ev);
  rt->event_destroy(ev); /* released once reached */
  return res;
}

/* --- lookup ------------------------------------------------------------------ */

static const char *const kind_names[HETCCL_DEV_COUNT] = {
#define KIND_NAME(id, text, vendor) [HETCCL_DEV_##id] = text,
    HETCCL_DEVICE_KINDS(KIND_NAME)
#undef KIND_NAME
};

const char *hetccl_dev_kind_name(hetccl_dev_kind_t k) {
  return (unsigned)k < HETCCL_DEV_COUNT ? kind_names[k] : "unknown";
}

static const hetccl_runtime_t *const registry[HETCCL_DEV_COUNT] = {
    [HETCCL_DEV_HOST] = &hetccl_runtime_host,
    [HETCCL_DEV_CUDA] = &hetccl_runtime_cuda,
    [HETCCL_DEV_HIP] = &hetccl_runtime_hip,
};

static int registry_valid[HETCCL_DEV_COUNT];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

/* Every slot filled (a missing one is a stub, never NULL), and each table
 * under its own kind. */
static void registry_check(void) {
  for (int k = 0; k < HETCCL_DEV_COUNT; k++) {
    const hetccl_runtime_t *rt = registry[k];
    int ok = rt != NULL && rt->kind == (hetccl_dev_kind_t)k && rt->name != NULL;
    if (!ok) WARN("device runtime %s: no table, or one of another kind", kind_names[k]);
#define CHECK_SLOT(slot)                                                       \
  if (ok && rt->slot == NULL) {                                                \
    WARN("device runtime %s: slot '" #slot "' is NULL; runtime not registered", rt->name); \
    ok = 0;                                                                    \
  }
    HETCCL_RT_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
    registry_valid[k] = ok;
  }
}

const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind) {
  if ((unsigned)kind >= HETCCL_DEV_COUNT) return NULL;
  pthread_once(&registry_once, registry_check);
  return registry_valid[kind] ? registry[kind] : NULL;
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
