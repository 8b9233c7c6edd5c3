/* Device runtime: the HIP entry (AMD GPUs).
 *
 * Nothing here links HIP. libamdhip64 (one library: HIP has no separate
 * driver API library) is opened with dlopen and used only through dlsym on
 * its handle, as gpu_entry.h says: the one the process already loaded, else
 * libamdhip64.so / .so.6 / .so.5 by name. What HIP does as CUDA's runtime
 * does is gpu_entry.c, over the names below; this file keeps what only HIP
 * has or does its own way.
 *
 * What is declared below are facts of the public HIP API (hip_runtime_api.h,
 * driver_types.h of ROCm 5 and 6), chosen among calls whose ABI is the same
 * in both: no struct crosses the boundary (hipPointerAttribute_t changed
 * layout between ROCm 5 and 6; hipPointerGetAttribute, one attribute at a
 * time, did not). One fact did change: the numbering of hipMemoryType
 * (ROCm 6 renumbered it to match CUDA's), so the runtime's major version is
 * read at load (hipRuntimeGetVersion) and mem_kind reads the answer in the
 * numbering of that version.
 *
 * Errors: every call goes through gpu_entry.c's adapter (hipGetErrorString,
 * ncclUnhandledCudaError as RCCL returns for a HIP error).
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic pointer; the table is read-only afterwards. */
#include <pthread.h>
#include <stdio.h>

#include "runtime/devreduce.h"
#include "runtime/gpu.h"
#include "runtime/gpu_entry.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/log.h"

/* --- the few HIP facts we need (public HIP API) ------------------------------- */

typedef int hipError_t; /* hipSuccess = 0 */

enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorNotSupported = 801 };
enum { hipHostMallocPortable = 0x1 };
enum { hipStreamWaitValueGte = 0x0 };
enum { hipMemRangeHandleTypeDmaBufFd = 1 };
/* hipPointer_attribute: the same values in ROCm 5 and 6 (and as CUDA's). */
enum {
  HIP_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  HIP_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};
/* hipMemoryType before ROCm 6 ... */
enum { HIP5_MEMORY_DEVICE = 1, HIP5_MEMORY_ARRAY = 2, HIP5_MEMORY_UNIFIED = 3,
       HIP5_MEMORY_MANAGED = 4 };
/* ... and from ROCm 6 on (hipMemoryTypeUnregistered = 0, Host = 1). */
enum { HIP6_MEMORY_DEVICE = 2, HIP6_MEMORY_MANAGED = 3, HIP6_MEMORY_ARRAY = 10,
       HIP6_MEMORY_UNIFIED = 11 };
/* HIP_VERSION = major * 10000000 + minor * 100000 + patch */
#define HIP_VERSION_MAJOR_OF(v) ((v) / 10000000)

typedef void (*hip_host_fn_t)(void *arg);
typedef void (*hip_stream_callback_t)(void *stream, hipError_t status, void *arg);

/* X(name, return, params, optional): the calls only HIP has, or HIP's own
 * way (gpu_entry.h has the shared ones); all in ROCm 5.2 and 6 but the
 * optional ones: hipLaunchHostFunc (ROCm 5.2's header declares it, its
 * library does not export it) and hipMemGetHandleForAddressRange (dma-buf
 * export, ROCm 6 on). */
#define HIP_OWN_FNS(X)                                                                            \
  X(hipRuntimeGetVersion, hipError_t, (int *version), 0)                                          \
  X(hipPointerGetAttribute, hipError_t, (void *data, int attribute, void *ptr), 0)                \
  X(hipStreamWaitValue64, hipError_t,                                                             \
    (void *stream, void *ptr, uint64_t value, unsigned flags, uint64_t mask), 0)                  \
  X(hipStreamWriteValue64, hipError_t, (void *stream, void *ptr, uint64_t value, unsigned flags), \
    0)                                                                                            \
  X(hipStreamAddCallback, hipError_t,                                                             \
    (void *stream, hip_stream_callback_t fn, void *arg, unsigned flags), 0)                       \
  X(hipLaunchHostFunc, hipError_t, (void *stream, hip_host_fn_t fn, void *arg), 1)                \
  X(hipMemGetHandleForAddressRange, hipError_t,                                                   \
    (void *handle, void *ptr, size_t bytes, int type, unsigned long long flags), 1)

static struct { HIP_OWN_FNS(HETCCL_GPU_SYM_FIELD) } own;

static const hetccl_gpu_sym_t own_syms[] = {
#define OWN_SYM(name, ret, params, optional) {#name, (void **)&own.name, optional},
    HIP_OWN_FNS(OWN_SYM)
#undef OWN_SYM
};

static int hip_version; /* hipRuntimeGetVersion's, set with the library */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const hip_names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};

/* --- the library: gpu_entry.c over these names ------------------------------------ */

/* A library serves only with a version whose numbering mem_kind knows. */
static int hip_accept(hetccl_gpu_t *g, char *why, size_t len) {
  /* Needs no device (it answers before HIP looks for one). */
  int version = 0;
  if (own.hipRuntimeGetVersion(&version) != hipSuccess || HIP_VERSION_MAJOR_OF(version) < 5) {
    g->api.get_last_error();
    snprintf(why, len, "%s: hipRuntimeGetVersion gave no usable version (%d)", g->path, version);
    return 0;
  }
  hip_version = version;
  return 1;
}

static void hip_announce(const hetccl_gpu_t *g, const char *how) {
  INFO(HETCCL_RUNTIME, "hip: %s, HIP %d (%s)", g->path, hip_version, how);
}

static ncclResult_t hip_counter_op(hetccl_gpu_t *g, void *stream, void *dev, uint64_t value,
                                   int write, int *fallback);
static ncclResult_t hip_launch_host(hetccl_gpu_t *g, void *stream, void *job);

static const hetccl_gpu_vendor_t hip_vendor = {
    .tag = "hip",
    .product = "HIP",
    .libs = hip_names,
    .nlibs = sizeof(hip_names) / sizeof(hip_names[0]),
    .lib_prefix = "libamdhip64.so", /* a versioned file (libamdhip64.so.6.2.60200) */
    .loaded_name = "the loaded libamdhip64",
    .calls = HETCCL_GPU_NAMES(HIP),
    .own = own_syms,
    .nown = sizeof(own_syms) / sizeof(own_syms[0]),
    .accept = hip_accept,
    .announce = hip_announce,
    .counter_op = hip_counter_op,
    .launch_host = hip_launch_host,
    .counter_calls = {"hipStreamWaitValue64", "hipStreamWriteValue64"},
};

static hetccl_gpu_t hip = HETCCL_GPU_INIT(&hip_vendor, &load_lock);

HETCCL_GPU_BIND(hip, &hip)

/* Counters on a stream: HIP's stream memory operations on the mapped
 * counter, or where those are refused a host function on the stream
 * (gpu_entry.c). HIP refuses a wait on memory that is not signal memory
 * when GPU_STREAMOPS_CP_WAIT is set (invalid value), and a device may not
 * support them at all (not supported): both turn the fallback on for the
 * process. */
static ncclResult_t hip_counter_op(hetccl_gpu_t *g, void *stream, void *dev, uint64_t value,
                                   int write, int *fallback) {
  const char *name = g->vendor->counter_calls[write];
  HETCCL_CHECK(hetccl_gpu_need(g, name));
  hipError_t err = write ? own.hipStreamWriteValue64(stream, dev, value, 0)
                         : own.hipStreamWaitValue64(stream, dev, value, hipStreamWaitValueGte,
                                                    ~(uint64_t)0);
  if (err == hipSuccess) return ncclSuccess;
  if (err != hipErrorNotSupported && err != hipErrorInvalidValue)
    return hetccl_gpu_result(g, err, name);
  const char *text = g->api.get_error_string(err);
  g->api.get_last_error();
  INFO(HETCCL_RUNTIME, "hip: %s refused (%s): host functions on the stream instead", name,
       text ? text : "");
  __atomic_store_n(&g->mem_ops_off, 1, __ATOMIC_RELAXED);
  *fallback = 1;
  return ncclSuccess;
}

/* hipStreamAddCallback's shape, for runtimes without hipLaunchHostFunc. */
static void counter_callback(void *stream, hipError_t status, void *arg) {
  (void)stream;
  (void)status; /* the counter is moved whatever happened before: never leave a waiter */
  hetccl_gpu_counter_fn(arg);
}

static ncclResult_t hip_launch_host(hetccl_gpu_t *g, void *stream, void *job) {
  if (own.hipLaunchHostFunc)
    return hetccl_gpu_result(g, own.hipLaunchHostFunc(stream, hetccl_gpu_counter_fn, job),
                             "hipLaunchHostFunc");
  return hetccl_gpu_result(g, own.hipStreamAddCallback(stream, counter_callback, job, 0),
                           "hipStreamAddCallback");
}

/* --- the slots HIP serves its own way ------------------------------------------- */

/* HIP has no driver context to look at apart from its runtime, and is not
 * linked statically: the process uses HIP when libamdhip64 is mapped. */
static int hip_in_use(void) { return hetccl_gpu_get(&hip, 0) != NULL; }

static int hip_available(void) { return hetccl_gpu_available(&hip); }

static char describe_text[1024];

static void describe_once(void) {
  int a = hip_available();
  const hetccl_gpu_t *r = hetccl_gpu_get(&hip, 0);
  if (!r) {
    snprintf(describe_text, sizeof(describe_text), "not found: %s", hip.why);
    return;
  }
  char note[160] = ""; /* why it had no devices */
  if (r->devices_err) {
    const char *text = r->api.get_error_string(r->devices_err);
    snprintf(note, sizeof(note), "hipGetDeviceCount: %s (error %d)",
             text ? text : "unknown error", r->devices_err);
  }
  int v = hip_version;
  snprintf(describe_text, sizeof(describe_text), "%s (HIP %d.%d.%d): %d device%s%s%s", r->path,
           HIP_VERSION_MAJOR_OF(v), v / 100000 % 100, v % 100000, r->devices,
           r->devices == 1 ? "" : "s", a || !note[0] ? "" : ", ", a ? "" : note);
}

static const char *hip_describe(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, describe_once);
  return describe_text;
}

/* The device ordinal first: for memory HIP never allocated or registered
 * it answers hipErrorInvalidValue, which means plain host memory, and the
 * memory-type query is not made (ROCm 5 reads the pointed-to bytes as a
 * hipArray there). */
static ncclResult_t hip_mem_kind(const void *ptr, hetccl_mem_kind_t *kind, int *dev) {
  HETCCL_CHECK(hetccl_gpu_need(&hip, "mem_kind"));
  int ordinal = -1;
  hipError_t err = own.hipPointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                              (void *)ptr);
  if (err == hipErrorInvalidValue) {
    hip.api.get_last_error();
    return hetccl_gpu_mem_kind_answer(HETCCL_MEM_HOST, -1, kind, dev);
  }
  HETCCL_CHECK(hetccl_gpu_result(&hip, err, "hipPointerGetAttribute(DEVICE_ORDINAL)"));
  uint32_t memtype = 0, managed = 0; /* managed: a bool is written, zeroed first */
  HETCCL_CHECK(hetccl_gpu_result(
      &hip, own.hipPointerGetAttribute(&memtype, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, (void *)ptr),
      "hipPointerGetAttribute"));
  HETCCL_CHECK(hetccl_gpu_result(
      &hip, own.hipPointerGetAttribute(&managed, HIP_POINTER_ATTRIBUTE_IS_MANAGED, (void *)ptr),
      "hipPointerGetAttribute"));
  int v6 = HIP_VERSION_MAJOR_OF(hip_version) >= 6;
  hetccl_mem_kind_t k = HETCCL_MEM_HOST;
  if (managed || memtype == (v6 ? HIP6_MEMORY_MANAGED : HIP5_MEMORY_MANAGED))
    k = HETCCL_MEM_MANAGED;
  else if (v6 ? memtype == HIP6_MEMORY_DEVICE || memtype == HIP6_MEMORY_ARRAY ||
                    memtype == HIP6_MEMORY_UNIFIED
              : memtype == HIP5_MEMORY_DEVICE || memtype == HIP5_MEMORY_ARRAY ||
                    memtype == HIP5_MEMORY_UNIFIED)
    k = HETCCL_MEM_DEVICE;
  return hetccl_gpu_mem_kind_answer(k, ordinal, kind, dev);
}

/* Portable pinned memory (the cuda entry's is cudaMallocHost's). */
static ncclResult_t hip_host_alloc(void **ptr, size_t bytes) {
  HETCCL_CHECK(hetccl_gpu_need(&hip, "host_alloc"));
  return HETCCL_GPU_CALL(&hip, host_alloc, ptr, bytes, hipHostMallocPortable);
}

/* No device attribute to ask first: the export call itself answers
 * "not supported" where the kernel driver cannot. */
static int hip_dmabuf_export(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                             size_t len) {
  const hetccl_gpu_t *r = hetccl_gpu_get(&hip, 1);
  if (!r) return hetccl_gpu_why(why, len, "libamdhip64 could not be loaded");
  if (!own.hipMemGetHandleForAddressRange)
    return hetccl_gpu_why(why, len, "%s has no hipMemGetHandleForAddressRange (ROCm 6 adds it)",
                          r->path);
  hetccl_gpu_range_t pr = hetccl_gpu_page_range(ptr, bytes);
  int handle = -1;
  hipError_t err = own.hipMemGetHandleForAddressRange(&handle, (void *)pr.base, pr.bytes,
                                                      hipMemRangeHandleTypeDmaBufFd, 0);
  if (err != hipSuccess || handle < 0) {
    r->api.get_last_error(); /* the application's, not ours */
    return hetccl_gpu_why(why, len, "hipMemGetHandleForAddressRange of %zu bytes at %p failed: %s "
                          "(error %d)", pr.bytes, (void *)pr.base, r->api.get_error_string(err),
                          err);
  }
  *fd = handle;
  *offset = pr.offset;
  return 1;
}

const hetccl_runtime_t hetccl_runtime_hip = {
    .kind = HETCCL_DEV_HIP,
    .name = "hip",
    .caps = HETCCL_RT_CAP_STREAMS | HETCCL_RT_CAP_HOST_REGISTER,
    .available = hip_available,
    .in_use = hip_in_use,
    .holds_memory = hip_in_use,
    .describe = hip_describe,
    .mem_kind = hip_mem_kind,
    .host_alloc = hip_host_alloc,
    HETCCL_GPU_TABLE(hip) /* the slots gpu_entry.c serves */
    .reduce_async = hetccl_hip_reduce_async,
    .reduce_available = hetccl_hip_reduce_available,
    .reduce_run_async = hetccl_hip_reduce_run_async,
    .dmabuf_export = hip_dmabuf_export,
    /* HIP has no call that flushes a NIC's writes into device memory: the
     * ib transport reads them back instead (transport/ib/ib_flush.c). */
    .flush_nic_writes = hetccl_rt_flush_nic_writes_none,
};
