/* Device runtime: the HIP entry (AMD GPUs).
 *
 * Nothing here links HIP. libamdhip64 (one library: HIP has no separate
 * driver API library) is opened with dlopen and used only through dlsym on
 * its handle: the one the process already loaded (RTLD_NOLOAD: the same
 * runtime instance PyTorch or CuPy use, so device selection and streams are
 * shared), else libamdhip64.so / .so.6 / .so.5 by name. As in cuda.c it is
 * looked for in two ways: "only if already loaded" (in_use, which must
 * never load or initialise HIP) and "load it" (every other slot). A library
 * found either way is kept for the life of the process; a failed load is
 * remembered so that it is reported, not retried.
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
 * Errors: every call goes through one adapter (hip_result) that WARNs with
 * the call's name and hipGetErrorString and returns ncclUnhandledCudaError
 * (what RCCL itself returns for a HIP error); it also clears HIP's last
 * error, which belongs to the application.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic pointer; the table is read-only afterwards. */
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu.h"
#include "runtime/devreduce.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/log.h"

/* --- the few HIP facts we need (public HIP API) ------------------------------- */

typedef int hipError_t; /* hipSuccess = 0 */

enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorNotReady = 600,
       hipErrorNotSupported = 801 };
enum { hipMemcpyDefault = 4 };
enum { hipEventDisableTiming = 0x2 };
enum { hipHostMallocPortable = 0x1, hipHostMallocMapped = 0x2 };
enum { hipHostRegisterPortable = 0x1, hipHostRegisterMapped = 0x2 };
enum { hipStreamNonBlocking = 0x1 };
enum { hipStreamWaitValueGte = 0x0 };
enum { hipStreamCaptureStatusNone = 0 };
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

/* X(name, return, params): the functions we take (all in ROCm 5.2 and 6). */
#define HIP_FNS(X)                                                                                \
  X(hipGetErrorString, const char *, (hipError_t err))                                            \
  X(hipGetLastError, hipError_t, (void))                                                          \
  X(hipRuntimeGetVersion, hipError_t, (int *version))                                             \
  X(hipGetDeviceCount, hipError_t, (int *count))                                                  \
  X(hipGetDevice, hipError_t, (int *dev))                                                         \
  X(hipSetDevice, hipError_t, (int dev))                                                          \
  X(hipDeviceGetPCIBusId, hipError_t, (char *busid, int len, int dev))                            \
  X(hipPointerGetAttribute, hipError_t, (void *data, int attribute, void *ptr))                   \
  X(hipMalloc, hipError_t, (void **ptr, size_t bytes))                                            \
  X(hipFree, hipError_t, (void *ptr))                                                             \
  X(hipHostMalloc, hipError_t, (void **ptr, size_t bytes, unsigned flags))                        \
  X(hipHostFree, hipError_t, (void *ptr))                                                         \
  X(hipHostGetDevicePointer, hipError_t, (void **dev, void *host, unsigned flags))                \
  X(hipHostRegister, hipError_t, (void *ptr, size_t bytes, unsigned flags))                       \
  X(hipHostUnregister, hipError_t, (void *ptr))                                                   \
  X(hipStreamCreateWithPriority, hipError_t, (void **stream, unsigned flags, int priority))       \
  X(hipDeviceGetStreamPriorityRange, hipError_t, (int *least, int *greatest))                     \
  X(hipStreamDestroy, hipError_t, (void *stream))                                                 \
  X(hipMemcpyAsync, hipError_t,                                                                   \
    (void *dst, const void *src, size_t bytes, int kind, void *stream))                           \
  X(hipStreamSynchronize, hipError_t, (void *stream))                                             \
  X(hipStreamIsCapturing, hipError_t, (void *stream, int *status))                                \
  X(hipEventCreateWithFlags, hipError_t, (void **event, unsigned flags))                          \
  X(hipEventDestroy, hipError_t, (void *event))                                                   \
  X(hipEventRecord, hipError_t, (void *event, void *stream))                                      \
  X(hipEventQuery, hipError_t, (void *event))                                                     \
  X(hipStreamWaitEvent, hipError_t, (void *stream, void *event, unsigned flags))                  \
  X(hipStreamWaitValue64, hipError_t,                                                             \
    (void *stream, void *ptr, uint64_t value, unsigned flags, uint64_t mask))                     \
  X(hipStreamWriteValue64, hipError_t, (void *stream, void *ptr, uint64_t value, unsigned flags)) \
  X(hipStreamAddCallback, hipError_t,                                                             \
    (void *stream, hip_stream_callback_t fn, void *arg, unsigned flags))

typedef struct {
  void *handle;
  char path[512];
  int version; /* hipRuntimeGetVersion */
#define FN_FIELD(name, ret, params) ret(*name) params;
  HIP_FNS(FN_FIELD)
#undef FN_FIELD
  /* Optional: ROCm 5.2's header declares it, its library does not export it. */
  hipError_t (*hipLaunchHostFunc)(void *stream, hip_host_fn_t fn, void *arg);
  /* Optional: dma-buf export, ROCm 6 on. */
  hipError_t (*hipMemGetHandleForAddressRange)(void *handle, void *ptr, size_t bytes, int type,
                                               unsigned long long flags);
} hip_lib_t;

static hip_lib_t hip;
static hip_lib_t *hip_ready;   /* published (atomic) once hip is filled */
static int hip_failed;         /* a full load was tried and failed */
static char hip_why[768];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const hip_names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};
#define HIP_NNAMES (sizeof(hip_names) / sizeof(hip_names[0]))

/* --- loading -------------------------------------------------------------------- */

/* Fill hip from handle h; 0 and a reason in hip_why if it cannot serve. */
static int hip_fill(void *h, const char *name) {
#define FN_TAKE(fn, ret, params)                                                                  \
  *(void **)&hip.fn = dlsym(h, #fn);                                                              \
  if (!hip.fn) {                                                                                  \
    snprintf(hip_why, sizeof(hip_why), "%s lacks %s", name, #fn);                                 \
    return 0;                                                                                     \
  }
  HIP_FNS(FN_TAKE)
#undef FN_TAKE
  *(void **)&hip.hipLaunchHostFunc = dlsym(h, "hipLaunchHostFunc");
  *(void **)&hip.hipMemGetHandleForAddressRange = dlsym(h, "hipMemGetHandleForAddressRange");
  hip.handle = h;
  hetccl_gpu_where_loaded((void *)hip.hipGetDevice, hip.path, sizeof(hip.path), name);
  /* Needs no device (it answers before HIP looks for one). */
  int version = 0;
  if (hip.hipRuntimeGetVersion(&version) != hipSuccess || HIP_VERSION_MAJOR_OF(version) < 5) {
    hip.hipGetLastError();
    snprintf(hip_why, sizeof(hip_why), "%s: hipRuntimeGetVersion gave no usable version (%d)",
             hip.path, version);
    return 0;
  }
  hip.version = version;
  return 1;
}

/* The library, loading it if may_load; NULL when absent (not an error for
 * may_load == 0). */
static const hip_lib_t *hip_get(int may_load) {
  hip_lib_t *r = __atomic_load_n(&hip_ready, __ATOMIC_ACQUIRE);
  if (r || (may_load && __atomic_load_n(&hip_failed, __ATOMIC_ACQUIRE))) return r;
  pthread_mutex_lock(&load_lock);
  if (!hip_ready && !(may_load && hip_failed)) {
    /* a versioned file name (libamdhip64.so.6.2.60200) matches no soname above */
    void *h = hetccl_gpu_open_loaded(hip_names, HIP_NNAMES, "libamdhip64.so");
    const char *how = "already loaded";
    if (h && !hip_fill(h, "the loaded libamdhip64")) {
      dlclose(h);
      h = NULL;
    }
    size_t off = 0;
    for (size_t i = 0; !h && may_load && i < HIP_NNAMES; i++) {
      h = dlopen(hip_names[i], RTLD_NOW | RTLD_LOCAL);
      how = "loaded by name";
      if (!h) {
        const char *e = dlerror();
        if (off < sizeof(hip_why))
          off += snprintf(hip_why + off, sizeof(hip_why) - off, "%s%s", off ? "; " : "",
                          e ? e : hip_names[i]);
      } else if (!hip_fill(h, hip_names[i])) {
        dlclose(h);
        h = NULL;
      }
    }
    if (h) {
      INFO(HETCCL_RUNTIME, "hip: %s, HIP %d (%s)", hip.path, hip.version, how);
      __atomic_store_n(&hip_ready, &hip, __ATOMIC_RELEASE);
    } else if (may_load) {
      __atomic_store_n(&hip_failed, 1, __ATOMIC_RELEASE);
    }
  }
  r = hip_ready;
  pthread_mutex_unlock(&load_lock);
  return r;
}

/* The library for a slot; a WARN naming what was tried when there is none. */
static ncclResult_t hip_need(const hip_lib_t **out, const char *what) {
  const hip_lib_t *r = hip_get(1);
  if (!r) {
    WARN("hip: %s needs the HIP runtime, which could not be loaded: %s", what, hip_why);
    return ncclUnhandledCudaError;
  }
  *out = r;
  return ncclSuccess;
}

/* The one adapter from a HIP error to ours. */
static ncclResult_t hip_result(const hip_lib_t *r, hipError_t err, const char *call) {
  if (err == hipSuccess) return ncclSuccess;
  const char *text = r->hipGetErrorString(err);
  r->hipGetLastError(); /* the error was ours: leave none for the application */
  WARN("hip: %s failed: %s (error %d)", call, text ? text : "unknown error", err);
  return ncclUnhandledCudaError;
}

#define HIP_CALL(r, fn, ...) hip_result((r), (r)->fn(__VA_ARGS__), #fn)

/* --- the slots -------------------------------------------------------------------- */

/* HIP has no driver context to look at apart from its runtime, and is not
 * linked statically: the process uses HIP when libamdhip64 is mapped. */
static int hip_in_use(void) { return hip_get(0) != NULL; }

static int available_cached = -1;
static int devices_seen;        /* hipGetDeviceCount's answer, for describe */
static char devices_note[160];  /* why it had none */

static int hip_available(void) {
  int a = __atomic_load_n(&available_cached, __ATOMIC_ACQUIRE);
  if (a >= 0) return a;
  const hip_lib_t *r = hip_get(1);
  int n = 0;
  if (r) {
    hipError_t err = r->hipGetDeviceCount(&n);
    if (err != hipSuccess) {
      const char *text = r->hipGetErrorString(err);
      snprintf(devices_note, sizeof(devices_note), "hipGetDeviceCount: %s (error %d)",
               text ? text : "unknown error", err);
      r->hipGetLastError();
      n = 0;
    }
  }
  a = n > 0;
  devices_seen = n;
  INFO(HETCCL_RUNTIME, "hip: %s (%d device%s)", a ? "available" : "not available", n,
       n == 1 ? "" : "s");
  __atomic_store_n(&available_cached, a, __ATOMIC_RELEASE);
  return a;
}

static char describe_text[1024];

static void describe_once(void) {
  int a = hip_available();
  const hip_lib_t *r = hip_get(0);
  if (!r) {
    snprintf(describe_text, sizeof(describe_text), "not found: %s", hip_why);
    return;
  }
  int v = r->version;
  snprintf(describe_text, sizeof(describe_text), "%s (HIP %d.%d.%d): %d device%s%s%s", r->path,
           HIP_VERSION_MAJOR_OF(v), v / 100000 % 100, v % 100000, devices_seen,
           devices_seen == 1 ? "" : "s", a || !devices_note[0] ? "" : ", ", a ? "" : devices_note);
}

static const char *hip_describe(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, describe_once);
  return describe_text;
}

static ncclResult_t hip_current_device(int *dev, char *busid, size_t busid_len) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "current_device"));
  int d = -1;
  HETCCL_CHECK(HIP_CALL(r, hipGetDevice, &d));
  if (busid && busid_len) {
    char buf[64] = "";
    HETCCL_CHECK(HIP_CALL(r, hipDeviceGetPCIBusId, buf, (int)sizeof(buf), d));
    /* Lower case, as NCCL and the cuda entry write bus ids. */
    for (char *c = buf; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(busid, busid_len, "%s", buf);
  }
  if (dev) *dev = d;
  return ncclSuccess;
}

static ncclResult_t hip_set_device(int dev) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "set_device"));
  return HIP_CALL(r, hipSetDevice, dev);
}

/* The device ordinal first: for memory HIP never allocated or registered
 * it answers hipErrorInvalidValue, which means plain host memory, and the
 * memory-type query is not made (ROCm 5 reads the pointed-to bytes as a
 * hipArray there). */
static ncclResult_t hip_mem_kind(const void *ptr, hetccl_mem_kind_t *kind, int *dev) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "mem_kind"));
  int ordinal = -1;
  hipError_t err = r->hipPointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             (void *)ptr);
  if (err == hipErrorInvalidValue) {
    r->hipGetLastError();
    if (kind) *kind = HETCCL_MEM_HOST;
    if (dev) *dev = -1;
    return ncclSuccess;
  }
  HETCCL_CHECK(hip_result(r, err, "hipPointerGetAttribute(DEVICE_ORDINAL)"));
  uint32_t memtype = 0, managed = 0; /* managed: a bool is written, zeroed first */
  HETCCL_CHECK(HIP_CALL(r, hipPointerGetAttribute, &memtype, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE,
                        (void *)ptr));
  HETCCL_CHECK(HIP_CALL(r, hipPointerGetAttribute, &managed, HIP_POINTER_ATTRIBUTE_IS_MANAGED,
                        (void *)ptr));
  int v6 = HIP_VERSION_MAJOR_OF(r->version) >= 6;
  hetccl_mem_kind_t k = HETCCL_MEM_HOST;
  if (managed || memtype == (v6 ? HIP6_MEMORY_MANAGED : HIP5_MEMORY_MANAGED))
    k = HETCCL_MEM_MANAGED;
  else if (v6 ? memtype == HIP6_MEMORY_DEVICE || memtype == HIP6_MEMORY_ARRAY ||
                    memtype == HIP6_MEMORY_UNIFIED
              : memtype == HIP5_MEMORY_DEVICE || memtype == HIP5_MEMORY_ARRAY ||
                    memtype == HIP5_MEMORY_UNIFIED)
    k = HETCCL_MEM_DEVICE;
  if (kind) *kind = k;
  if (dev) *dev = k == HETCCL_MEM_HOST ? -1 : ordinal;
  return ncclSuccess;
}

static ncclResult_t hip_mem_alloc(void **ptr, size_t bytes) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "mem_alloc"));
  return HIP_CALL(r, hipMalloc, ptr, bytes);
}

static ncclResult_t hip_mem_free(void *ptr) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "mem_free"));
  return HIP_CALL(r, hipFree, ptr);
}

static ncclResult_t hip_host_alloc(void **ptr, size_t bytes) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "host_alloc"));
  return HIP_CALL(r, hipHostMalloc, ptr, bytes, hipHostMallocPortable);
}

static ncclResult_t hip_host_free(void *ptr) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "host_free"));
  return HIP_CALL(r, hipHostFree, ptr);
}

static ncclResult_t hip_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "memcpy_async"));
  if (bytes == 0) return ncclSuccess;
  return HIP_CALL(r, hipMemcpyAsync, dst, src, bytes, hipMemcpyDefault, stream);
}

static ncclResult_t hip_stream_sync(void *stream) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "stream_sync"));
  return HIP_CALL(r, hipStreamSynchronize, stream);
}

static ncclResult_t hip_stream_capturing(void *stream, int *capturing) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "stream_capturing"));
  int status = hipStreamCaptureStatusNone;
  HETCCL_CHECK(HIP_CALL(r, hipStreamIsCapturing, stream, &status));
  if (capturing) *capturing = status != hipStreamCaptureStatusNone;
  return ncclSuccess;
}

/* --- staging support (core/devpath.c) ------------------------------------------- */

static ncclResult_t hip_event_create(void **event) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "event_create"));
  return HIP_CALL(r, hipEventCreateWithFlags, event, hipEventDisableTiming);
}

static ncclResult_t hip_event_destroy(void *event) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "event_destroy"));
  return HIP_CALL(r, hipEventDestroy, event);
}

static ncclResult_t hip_event_record(void *event, void *stream) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "event_record"));
  return HIP_CALL(r, hipEventRecord, event, stream);
}

static ncclResult_t hip_event_query(void *event, int *done) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "event_query"));
  hipError_t err = r->hipEventQuery(event);
  *done = err == hipSuccess;
  if (err == hipErrorNotReady) {
    r->hipGetLastError(); /* "not ready" is an answer, not an error to leave behind */
    return ncclSuccess;
  }
  return hip_result(r, err, "hipEventQuery");
}

static ncclResult_t hip_stream_wait_event(void *stream, void *event) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "stream_wait_event"));
  return HIP_CALL(r, hipStreamWaitEvent, stream, event, 0);
}

static ncclResult_t hip_host_alloc_mapped(void **host, void **dev, size_t bytes) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "host_alloc_mapped"));
  HETCCL_CHECK(HIP_CALL(r, hipHostMalloc, host, bytes, hipHostMallocPortable | hipHostMallocMapped));
  ncclResult_t res = HIP_CALL(r, hipHostGetDevicePointer, dev, *host, 0);
  if (res != ncclSuccess) {
    r->hipHostFree(*host);
    *host = NULL;
  }
  return res;
}

/* Counters on a stream: HIP's stream memory operations on the mapped
 * counter, or where those are refused a host function on the stream
 * (gpu.h). HIP refuses a wait on memory that is not signal memory when
 * GPU_STREAMOPS_CP_WAIT is set (invalid value), and a device may not
 * support them at all (not supported): both turn the fallback on for the
 * process. */

/* hipStreamAddCallback's shape, for runtimes without hipLaunchHostFunc. */
static void counter_callback(void *stream, hipError_t status, void *arg) {
  (void)stream;
  (void)status; /* the counter is moved whatever happened before: never leave a waiter */
  hetccl_gpu_counter_fn(arg);
}

static int mem_ops_off; /* HIP refused a stream memory operation once */

static ncclResult_t counter_op(void *stream, volatile uint64_t *host, void *dev, uint64_t value,
                               int write) {
  const hip_lib_t *r;
  const char *name = write ? "hipStreamWriteValue64" : "hipStreamWaitValue64";
  HETCCL_CHECK(hip_need(&r, name));
  if (!__atomic_load_n(&mem_ops_off, __ATOMIC_RELAXED)) {
    hipError_t err = write ? r->hipStreamWriteValue64(stream, dev, value, 0)
                           : r->hipStreamWaitValue64(stream, dev, value, hipStreamWaitValueGte,
                                                     ~(uint64_t)0);
    if (err == hipSuccess) return ncclSuccess;
    if (err != hipErrorNotSupported && err != hipErrorInvalidValue) return hip_result(r, err, name);
    const char *text = r->hipGetErrorString(err);
    r->hipGetLastError();
    INFO(HETCCL_RUNTIME, "hip: %s refused (%s): host functions on the stream instead", name,
         text ? text : "");
    __atomic_store_n(&mem_ops_off, 1, __ATOMIC_RELAXED);
  }
  void *job = hetccl_gpu_counter_job(host, value, write);
  if (!job) {
    WARN("hip: %s: out of memory", name);
    return ncclSystemError;
  }
  ncclResult_t res = r->hipLaunchHostFunc
                         ? HIP_CALL(r, hipLaunchHostFunc, stream, hetccl_gpu_counter_fn, job)
                         : HIP_CALL(r, hipStreamAddCallback, stream, counter_callback, job, 0);
  if (res != ncclSuccess) free(job);
  return res;
}

static ncclResult_t hip_stream_wait_counter(void *stream, volatile uint64_t *host, void *dev,
                                            uint64_t value) {
  return counter_op(stream, host, dev, value, 0);
}

static ncclResult_t hip_stream_write_counter(void *stream, volatile uint64_t *host, void *dev,
                                             uint64_t value) {
  return counter_op(stream, host, dev, value, 1);
}

static ncclResult_t hip_stream_create(void **stream, int urgent) {
  const hip_lib_t *r;
  int least = 0, greatest = 0;
  HETCCL_CHECK(hip_need(&r, "stream_create"));
  if (urgent) HETCCL_CHECK(HIP_CALL(r, hipDeviceGetStreamPriorityRange, &least, &greatest));
  return HIP_CALL(r, hipStreamCreateWithPriority, stream, hipStreamNonBlocking,
                  urgent ? greatest : least);
}

static ncclResult_t hip_stream_destroy(void *stream) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "stream_destroy"));
  return HIP_CALL(r, hipStreamDestroy, stream);
}

/* --- registering host memory someone else mapped (a /dev/shm segment) ------- */

static ncclResult_t hip_host_register(void *ptr, size_t bytes, void **dev) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "host_register"));
  HETCCL_CHECK(HIP_CALL(r, hipHostRegister, ptr, bytes,
                        hipHostRegisterPortable | hipHostRegisterMapped));
  void *d = NULL;
  ncclResult_t res = HIP_CALL(r, hipHostGetDevicePointer, &d, ptr, 0);
  if (res != ncclSuccess) {
    r->hipHostUnregister(ptr);
    r->hipGetLastError(); /* the WARN above told the failure; leave the application none */
    return res;
  }
  *dev = d;
  return ncclSuccess;
}

static ncclResult_t hip_host_unregister(void *ptr) {
  const hip_lib_t *r;
  HETCCL_CHECK(hip_need(&r, "host_unregister"));
  return HIP_CALL(r, hipHostUnregister, ptr);
}

/* No device attribute to ask first: the export call itself answers
 * "not supported" where the kernel driver cannot. */
static int hip_dmabuf_export(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                             size_t len) {
  const hip_lib_t *r = hip_get(1);
  if (!r) return hetccl_gpu_why(why, len, "libamdhip64 could not be loaded");
  if (!r->hipMemGetHandleForAddressRange)
    return hetccl_gpu_why(why, len, "%s has no hipMemGetHandleForAddressRange (ROCm 6 adds it)",
                          r->path);
  hetccl_gpu_range_t pr = hetccl_gpu_page_range(ptr, bytes);
  int handle = -1;
  hipError_t err = r->hipMemGetHandleForAddressRange(&handle, (void *)pr.base, pr.bytes,
                                                     hipMemRangeHandleTypeDmaBufFd, 0);
  if (err != hipSuccess || handle < 0) {
    r->hipGetLastError(); /* the application's, not ours */
    return hetccl_gpu_why(why, len, "hipMemGetHandleForAddressRange of %zu bytes at %p failed: %s "
                          "(error %d)", pr.bytes, (void *)pr.base, r->hipGetErrorString(err), err);
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
    .describe = hip_describe,
    .current_device = hip_current_device,
    .set_device = hip_set_device,
    .mem_kind = hip_mem_kind,
    .mem_alloc = hip_mem_alloc,
    .mem_free = hip_mem_free,
    .host_alloc = hip_host_alloc,
    .host_free = hip_host_free,
    .memcpy_async = hip_memcpy_async,
    .stream_sync = hip_stream_sync,
    .stream_capturing = hip_stream_capturing,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_query = hip_event_query,
    .stream_wait_event = hip_stream_wait_event,
    .host_alloc_mapped = hip_host_alloc_mapped,
    .stream_wait_counter = hip_stream_wait_counter,
    .stream_write_counter = hip_stream_write_counter,
    .stream_create = hip_stream_create,
    .stream_destroy = hip_stream_destroy,
    .host_register = hip_host_register,
    .host_unregister = hip_host_unregister,
    /* device kernels (hipRTC) are not built yet */
    .reduce_async = hetccl_hip_reduce_async,
    .reduce_available = hetccl_hip_reduce_available,
    .reduce_run_async = hetccl_hip_reduce_run_async,
    .dmabuf_export = hip_dmabuf_export,
    /* HIP has no call that flushes a NIC's writes into device memory: the
     * ib transport reads them back instead (transport/ib/ib_flush.c). */
    .flush_nic_writes = hetccl_rt_flush_nic_writes_none,
};
