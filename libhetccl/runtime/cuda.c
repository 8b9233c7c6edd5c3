/* Device runtime: the CUDA entry.
 *
 * Nothing here links CUDA. Two libraries are opened with dlopen and used
 * only through dlsym on their handles:
 *   libcuda.so.1 (driver)   pointer attributes, contexts: calls that never
 *                           touch the runtime's per-thread "last error", so
 *                           asking about a plain host pointer leaves no
 *                           trace that the application's next
 *                           cudaGetLastError() would report;
 *   libcudart (runtime)     devices, memory, copies, streams: the one the
 *                           process already loaded (RTLD_NOLOAD: the same
 *                           runtime instance PyTorch or CuPy use, so device
 *                           selection and streams are shared), else
 *                           libcudart.so.13 / .12 / .11.0 / libcudart.so.
 * Each library is looked for in two ways: "only if already loaded" (in_use,
 * which must never load or initialise CUDA) and "load it" (every other
 * slot). A library found either way is kept for the life of the process;
 * a failed load is remembered so that it is reported, not retried.
 *
 * Errors: every runtime call goes through one adapter (cuda_result) that
 * WARNs with the call's name and cudaGetErrorString and returns
 * ncclUnhandledCudaError; it also clears the runtime's last error, which
 * belongs to the application.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic pointer; the tables are read-only afterwards. */
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

/* --- the few CUDA facts we need (public CUDA documentation) --------------- */

typedef int cudaError_t;   /* cudaSuccess = 0 */
typedef int CUresult;      /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NOT_SUPPORTED = 801 };
enum { cudaMemcpyDefault = 4 };
enum { cudaErrorNotReady = 600 };
enum { cudaEventDisableTiming = 0x02 };
enum { cudaHostAllocPortable = 0x01, cudaHostAllocMapped = 0x02 };
enum { cudaHostRegisterPortable = 0x01, cudaHostRegisterMapped = 0x02 };
enum { cudaStreamNonBlocking = 0x01 };
enum { CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124 };
enum { CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1 };
enum { CU_STREAM_WAIT_VALUE_GEQ = 0x0, CU_STREAM_WRITE_VALUE_DEFAULT = 0x0 };
enum { cudaStreamCaptureStatusNone = 0 };
enum {
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3,
       CU_MEMORYTYPE_UNIFIED = 4 };

/* X(name, return, params): the driver functions we take. */
#define CUDA_DRIVER_FNS(X)                                                                        \
  X(cuInit, CUresult, (unsigned flags))                                                           \
  X(cuGetErrorString, CUresult, (CUresult err, const char **str))                                 \
  X(cuCtxGetCurrent, CUresult, (CUcontext * ctx))                                                 \
  X(cuDeviceGetCount, CUresult, (int *count))                                                     \
  X(cuDeviceGet, CUresult, (CUdevice * dev, int ordinal))                                         \
  X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice dev, unsigned *flags, int *active))          \
  X(cuPointerGetAttributes, CUresult,                                                             \
    (unsigned n, int *attributes, void **data, CUdeviceptr ptr))

/* X(name, return, params): the runtime functions we take. */
#define CUDA_RUNTIME_FNS(X)                                                                       \
  X(cudaGetErrorString, const char *, (cudaError_t err))                                          \
  X(cudaGetLastError, cudaError_t, (void))                                                        \
  X(cudaGetDeviceCount, cudaError_t, (int *count))                                                \
  X(cudaGetDevice, cudaError_t, (int *dev))                                                       \
  X(cudaSetDevice, cudaError_t, (int dev))                                                        \
  X(cudaDeviceGetPCIBusId, cudaError_t, (char *busid, int len, int dev))                          \
  X(cudaMalloc, cudaError_t, (void **ptr, size_t bytes))                                          \
  X(cudaFree, cudaError_t, (void *ptr))                                                           \
  X(cudaMallocHost, cudaError_t, (void **ptr, size_t bytes))                                      \
  X(cudaFreeHost, cudaError_t, (void *ptr))                                                       \
  X(cudaMemcpyAsync, cudaError_t,                                                                 \
    (void *dst, const void *src, size_t bytes, int kind, void *stream))                           \
  X(cudaStreamSynchronize, cudaError_t, (void *stream))                                           \
  X(cudaStreamIsCapturing, cudaError_t, (void *stream, int *status))                             \
  X(cudaEventCreateWithFlags, cudaError_t, (void **event, unsigned flags))                        \
  X(cudaEventDestroy, cudaError_t, (void *event))                                                 \
  X(cudaEventRecord, cudaError_t, (void *event, void *stream))                                    \
  X(cudaEventQuery, cudaError_t, (void *event))                                                   \
  X(cudaStreamWaitEvent, cudaError_t, (void *stream, void *event, unsigned flags))                \
  X(cudaHostAlloc, cudaError_t, (void **ptr, size_t bytes, unsigned flags))                       \
  X(cudaHostGetDevicePointer, cudaError_t, (void **dev, void *host, unsigned flags))              \
  X(cudaHostRegister, cudaError_t, (void *ptr, size_t bytes, unsigned flags))                     \
  X(cudaHostUnregister, cudaError_t, (void *ptr))                                                 \
  X(cudaStreamCreateWithPriority, cudaError_t, (void **stream, unsigned flags, int priority))     \
  X(cudaDeviceGetStreamPriorityRange, cudaError_t, (int *least, int *greatest))                   \
  X(cudaStreamDestroy, cudaError_t, (void *stream))                                               \
  X(cudaLaunchHostFunc, cudaError_t, (void *stream, void (*fn)(void *), void *arg))

typedef struct {
  void *handle;
  char path[512];
#define FN_FIELD(name, ret, params) ret(*name) params;
  CUDA_DRIVER_FNS(FN_FIELD)
  /* Optional (stream memory operations; NULL if the driver lacks them). */
  CUresult (*cuStreamWaitValue64)(void *stream, CUdeviceptr addr, uint64_t value, unsigned flags);
  CUresult (*cuStreamWriteValue64)(void *stream, CUdeviceptr addr, uint64_t value, unsigned flags);
  /* Optional (dma-buf export, CUDA 11.7 on; NULL if the driver lacks them). */
  CUresult (*cuDeviceGetAttribute)(int *value, int attribute, CUdevice dev);
  CUresult (*cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr ptr, size_t bytes,
                                            int type, unsigned long long flags);
  /* Optional (CUDA 11.3 on). */
  CUresult (*cuFlushGPUDirectRDMAWrites)(int target, int scope);
} cuda_driver_t;

typedef struct {
  void *handle;
  char path[512];
  CUDA_RUNTIME_FNS(FN_FIELD)
#undef FN_FIELD
} cuda_runtime_lib_t;

static cuda_driver_t drv;
static cuda_runtime_lib_t crt;
static cuda_driver_t *drv_ready;      /* published (atomic) once drv is filled */
static cuda_runtime_lib_t *crt_ready; /* published (atomic) once crt is filled */
static int drv_failed, crt_failed;    /* a full load was tried and failed */
static int drv_inited;                /* cuInit called */
static char drv_why[512], crt_why[768];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
#define NCUDART_NAMES (sizeof(cudart_names) / sizeof(cudart_names[0]))

/* --- loading ------------------------------------------------------------------ */

/* Fill drv from handle h; 0 and a reason in why if a symbol is missing. */
static int driver_fill(void *h, const char *name) {
#define FN_TAKE(fn, ret, params)                                                                  \
  *(void **)&drv.fn = dlsym(h, #fn);                                                              \
  if (!drv.fn) {                                                                                  \
    snprintf(drv_why, sizeof(drv_why), "%s lacks %s", name, #fn);                                 \
    return 0;                                                                                     \
  }
  CUDA_DRIVER_FNS(FN_TAKE)
#undef FN_TAKE
  /* CUDA 12 headers name the current ABI of this call with a _v2 suffix. */
  *(void **)&drv.cuStreamWaitValue64 = dlsym(h, "cuStreamWaitValue64_v2");
  if (!drv.cuStreamWaitValue64) *(void **)&drv.cuStreamWaitValue64 = dlsym(h, "cuStreamWaitValue64");
  *(void **)&drv.cuStreamWriteValue64 = dlsym(h, "cuStreamWriteValue64_v2");
  if (!drv.cuStreamWriteValue64) *(void **)&drv.cuStreamWriteValue64 = dlsym(h, "cuStreamWriteValue64");
  *(void **)&drv.cuDeviceGetAttribute = dlsym(h, "cuDeviceGetAttribute");
  *(void **)&drv.cuMemGetHandleForAddressRange = dlsym(h, "cuMemGetHandleForAddressRange");
  *(void **)&drv.cuFlushGPUDirectRDMAWrites = dlsym(h, "cuFlushGPUDirectRDMAWrites");
  drv.handle = h;
  hetccl_gpu_where_loaded((void *)drv.cuInit, drv.path, sizeof(drv.path), name);
  return 1;
}

/* The driver, loading and initialising it if may_load; NULL when absent
 * (not an error for may_load == 0). in_use must not initialise CUDA, so
 * only a caller that may load calls cuInit (needed by pointer queries). */
static const cuda_driver_t *driver_get(int may_load) {
  cuda_driver_t *d = __atomic_load_n(&drv_ready, __ATOMIC_ACQUIRE);
  if (d && (!may_load || __atomic_load_n(&drv_inited, __ATOMIC_ACQUIRE))) return d;
  if (!d && may_load && __atomic_load_n(&drv_failed, __ATOMIC_ACQUIRE)) return NULL;
  pthread_mutex_lock(&load_lock);
  if (!drv_ready && !(may_load && drv_failed)) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (may_load ? 0 : RTLD_NOLOAD));
    if (!h && may_load) snprintf(drv_why, sizeof(drv_why), "%s", dlerror());
    if (h && !driver_fill(h, "libcuda.so.1")) {
      dlclose(h);
      h = NULL;
    }
    if (h) {
      INFO(HETCCL_RUNTIME, "cuda: driver %s", drv.path);
      __atomic_store_n(&drv_ready, &drv, __ATOMIC_RELEASE);
    } else if (may_load) {
      __atomic_store_n(&drv_failed, 1, __ATOMIC_RELEASE);
    }
  }
  d = drv_ready;
  if (d && may_load && !drv_inited) {
    CUresult err = d->cuInit(0);
    if (err != CUDA_SUCCESS) INFO(HETCCL_RUNTIME, "cuda: cuInit failed (error %d)", err);
    __atomic_store_n(&drv_inited, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_lock);
  return d;
}

static int runtime_fill(void *h, const char *name) {
#define FN_TAKE(fn, ret, params)                                                                  \
  *(void **)&crt.fn = dlsym(h, #fn);                                                              \
  if (!crt.fn) {                                                                                  \
    snprintf(crt_why, sizeof(crt_why), "%s lacks %s", name, #fn);                                 \
    return 0;                                                                                     \
  }
  CUDA_RUNTIME_FNS(FN_TAKE)
#undef FN_TAKE
  crt.handle = h;
  hetccl_gpu_where_loaded((void *)crt.cudaGetDevice, crt.path, sizeof(crt.path), name);
  return 1;
}

static const cuda_runtime_lib_t *runtime_get(int may_load) {
  cuda_runtime_lib_t *r = __atomic_load_n(&crt_ready, __ATOMIC_ACQUIRE);
  if (r || (may_load && __atomic_load_n(&crt_failed, __ATOMIC_ACQUIRE))) return r;
  pthread_mutex_lock(&load_lock);
  if (!crt_ready && !(may_load && crt_failed)) {
    /* a versioned file name (libcudart.so.13.0.96) matches no soname above */
    void *h = hetccl_gpu_open_loaded(cudart_names, NCUDART_NAMES, "libcudart.so");
    const char *how = "already loaded";
    if (h && !runtime_fill(h, "the loaded libcudart")) {
      dlclose(h);
      h = NULL;
    }
    size_t off = 0;
    for (size_t i = 0; !h && may_load && i < NCUDART_NAMES; i++) {
      h = dlopen(cudart_names[i], RTLD_NOW | RTLD_LOCAL);
      how = "loaded by name";
      if (!h) {
        const char *e = dlerror();
        if (off < sizeof(crt_why))
          off += snprintf(crt_why + off, sizeof(crt_why) - off, "%s%s", off ? "; " : "",
                          e ? e : cudart_names[i]);
      } else if (!runtime_fill(h, cudart_names[i])) {
        dlclose(h);
        h = NULL;
      }
    }
    if (h) {
      INFO(HETCCL_RUNTIME, "cuda: runtime %s (%s)", crt.path, how);
      __atomic_store_n(&crt_ready, &crt, __ATOMIC_RELEASE);
    } else if (may_load) {
      __atomic_store_n(&crt_failed, 1, __ATOMIC_RELEASE);
    }
  }
  r = crt_ready;
  pthread_mutex_unlock(&load_lock);
  return r;
}

/* The runtime for a slot; a WARN naming what was tried when there is none. */
static ncclResult_t runtime_need(const cuda_runtime_lib_t **out, const char *what) {
  const cuda_runtime_lib_t *r = runtime_get(1);
  if (!r) {
    WARN("cuda: %s needs the CUDA runtime, which could not be loaded: %s", what, crt_why);
    return ncclUnhandledCudaError;
  }
  *out = r;
  return ncclSuccess;
}

/* The one adapter from a CUDA runtime error to ours. */
static ncclResult_t cuda_result(const cuda_runtime_lib_t *r, cudaError_t err, const char *call) {
  if (err == 0) return ncclSuccess;
  const char *text = r->cudaGetErrorString(err);
  r->cudaGetLastError(); /* the error was ours: leave none for the application */
  WARN("cuda: %s failed: %s (error %d)", call, text ? text : "unknown error", err);
  return ncclUnhandledCudaError;
}

#define CUDA_CALL(r, fn, ...) cuda_result((r), (r)->fn(__VA_ARGS__), #fn)

/* --- the slots ------------------------------------------------------------------ */

/* Is a context current on this thread, or any primary context active?
 * Only asks a driver that the process loaded and initialised itself. */
static int driver_context_live(void) {
  const cuda_driver_t *d = driver_get(0);
  if (!d) return 0;
  CUcontext ctx = NULL;
  if (d->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx) return 1;
  int n = 0;
  if (d->cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0; /* e.g. not initialised */
  for (int i = 0; i < n; i++) {
    CUdevice dev;
    unsigned flags = 0;
    int active = 0;
    if (d->cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
        d->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active)
      return 1;
  }
  return 0;
}

static int cuda_in_use(void) { return runtime_get(0) != NULL || driver_context_live(); }

static int available_cached = -1;
static int devices_seen; /* cudaGetDeviceCount's answer, for describe */

static int cuda_available(void) {
  int a = __atomic_load_n(&available_cached, __ATOMIC_ACQUIRE);
  if (a >= 0) return a;
  const cuda_runtime_lib_t *r = runtime_get(1);
  int n = 0;
  if (r && r->cudaGetDeviceCount(&n) != 0) {
    r->cudaGetLastError();
    n = 0;
  }
  a = n > 0;
  devices_seen = n;
  INFO(HETCCL_RUNTIME, "cuda: %s (%d device%s)", a ? "available" : "not available", n,
       n == 1 ? "" : "s");
  __atomic_store_n(&available_cached, a, __ATOMIC_RELEASE);
  return a;
}

static char describe_text[2048];

static void describe_once(void) {
  cuda_available();
  const cuda_runtime_lib_t *r = runtime_get(0);
  if (!r) {
    snprintf(describe_text, sizeof(describe_text), "not found: %s", crt_why);
    return;
  }
  const cuda_driver_t *d = driver_get(1);
  snprintf(describe_text, sizeof(describe_text), "%s, %s%s%s: %d device%s", r->path,
           d ? d->path : "no driver (", d ? "" : drv_why, d ? "" : ")", devices_seen,
           devices_seen == 1 ? "" : "s");
}

static const char *cuda_describe(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, describe_once);
  return describe_text;
}

static ncclResult_t cuda_current_device(int *dev, char *busid, size_t busid_len) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "current_device"));
  int d = -1;
  HETCCL_CHECK(CUDA_CALL(r, cudaGetDevice, &d));
  if (busid && busid_len) {
    char buf[64] = "";
    HETCCL_CHECK(CUDA_CALL(r, cudaDeviceGetPCIBusId, buf, (int)sizeof(buf), d));
    /* NCCL writes bus ids in lower case; so do we, so that they compare. */
    for (char *c = buf; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(busid, busid_len, "%s", buf);
  }
  if (dev) *dev = d;
  return ncclSuccess;
}

static ncclResult_t cuda_set_device(int dev) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "set_device"));
  return CUDA_CALL(r, cudaSetDevice, dev);
}

static ncclResult_t cuda_mem_kind(const void *ptr, hetccl_mem_kind_t *kind, int *dev) {
  const cuda_driver_t *d = driver_get(1);
  if (!d) {
    WARN("cuda: cannot tell what memory %p is: the CUDA driver could not be loaded: %s", ptr,
         drv_why);
    return ncclUnhandledCudaError;
  }
  /* The plural query answers "no attributes" (zeros) for a pointer CUDA
   * does not know, instead of failing: that is plain host memory. */
  int attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                  CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned memtype = 0, managed = 0;
  int ordinal = -1;
  void *data[3] = {&memtype, &ordinal, &managed};
  CUresult err = d->cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
  if (err != CUDA_SUCCESS) {
    const char *text = NULL;
    d->cuGetErrorString(err, &text);
    WARN("cuda: cuPointerGetAttributes(%p) failed: %s (error %d)", ptr,
         text ? text : "unknown error", err);
    return ncclUnhandledCudaError;
  }
  hetccl_mem_kind_t k = HETCCL_MEM_HOST;
  if (managed & 0xff) k = HETCCL_MEM_MANAGED;
  else if (memtype == CU_MEMORYTYPE_DEVICE || memtype == CU_MEMORYTYPE_ARRAY ||
           memtype == CU_MEMORYTYPE_UNIFIED)
    k = HETCCL_MEM_DEVICE;
  if (kind) *kind = k;
  if (dev) *dev = k == HETCCL_MEM_HOST ? -1 : ordinal;
  return ncclSuccess;
}

static ncclResult_t cuda_mem_alloc(void **ptr, size_t bytes) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "mem_alloc"));
  return CUDA_CALL(r, cudaMalloc, ptr, bytes);
}

static ncclResult_t cuda_mem_free(void *ptr) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "mem_free"));
  return CUDA_CALL(r, cudaFree, ptr);
}

static int cuda_dmabuf_export(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                              size_t len) {
  const cuda_driver_t *d = driver_get(1);
  const cuda_runtime_lib_t *r = runtime_get(1);
  int dev = -1, supported = 0;
  if (!d || !r) return hetccl_gpu_why(why, len, "the CUDA driver or runtime could not be loaded");
  if (!d->cuMemGetHandleForAddressRange || !d->cuDeviceGetAttribute)
    return hetccl_gpu_why(why, len, "%s has no cuMemGetHandleForAddressRange (CUDA 11.7 adds it)",
                          d->path);
  if (r->cudaGetDevice(&dev) != 0) {
    r->cudaGetLastError(); /* the application's, not ours */
    return hetccl_gpu_why(why, len, "cudaGetDevice failed");
  }
  CUdevice cu = 0;
  CUresult err = d->cuDeviceGet(&cu, dev);
  if (err == CUDA_SUCCESS)
    err = d->cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, cu);
  if (err != CUDA_SUCCESS)
    return hetccl_gpu_why(why, len, "cuDeviceGetAttribute(DMA_BUF_SUPPORTED) failed (error %d)",
                          err);
  if (!supported)
    return hetccl_gpu_why(why, len, "CUDA device %d does not support dma-buf (its driver or "
                          "kernel module predates it, or the module is the proprietary one)", dev);
  hetccl_gpu_range_t pr = hetccl_gpu_page_range(ptr, bytes);
  int handle = -1;
  err = d->cuMemGetHandleForAddressRange(&handle, (CUdeviceptr)pr.base, pr.bytes,
                                         CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (err != CUDA_SUCCESS || handle < 0) {
    const char *text = NULL;
    d->cuGetErrorString(err, &text);
    return hetccl_gpu_why(why, len, "cuMemGetHandleForAddressRange of %zu bytes at %p failed: %s "
                          "(error %d)", pr.bytes, (void *)pr.base, text ? text : "?", err);
  }
  *fd = handle;
  *offset = pr.offset;
  return 1;
}

/* cuFlushGPUDirectRDMAWrites: the current context, until the writes are
 * visible to it (CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
 * ..._TO_OWNER). */
#define FLUSH_TARGET_CURRENT_CTX 0
#define FLUSH_TO_OWNER 100
#define CUDA_ERROR_NOT_SUPPORTED_ 801

static ncclResult_t cuda_flush_nic_writes(void) {
  static int told;
  const cuda_driver_t *d = driver_get(1);
  CUresult err = d && d->cuFlushGPUDirectRDMAWrites
                     ? d->cuFlushGPUDirectRDMAWrites(FLUSH_TARGET_CURRENT_CTX, FLUSH_TO_OWNER)
                     : CUDA_ERROR_NOT_SUPPORTED_;
  if (err == CUDA_SUCCESS) return ncclSuccess;
  if (err == CUDA_ERROR_NOT_SUPPORTED_) { /* nothing to flush here, or no call to do it */
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
      INFO(HETCCL_RUNTIME, "cuda: %s: a NIC's writes into device memory are not flushed",
           d && d->cuFlushGPUDirectRDMAWrites ? "cuFlushGPUDirectRDMAWrites is not supported here"
                                              : "the driver has no cuFlushGPUDirectRDMAWrites");
    return ncclSuccess;
  }
  const char *text = NULL;
  d->cuGetErrorString(err, &text);
  WARN("cuda: cuFlushGPUDirectRDMAWrites failed: %s (error %d)", text ? text : "?", err);
  return ncclUnhandledCudaError;
}

static ncclResult_t cuda_host_alloc(void **ptr, size_t bytes) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "host_alloc"));
  return CUDA_CALL(r, cudaMallocHost, ptr, bytes);
}

static ncclResult_t cuda_host_free(void *ptr) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "host_free"));
  return CUDA_CALL(r, cudaFreeHost, ptr);
}

static ncclResult_t cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "memcpy_async"));
  if (bytes == 0) return ncclSuccess;
  return CUDA_CALL(r, cudaMemcpyAsync, dst, src, bytes, cudaMemcpyDefault, stream);
}

static ncclResult_t cuda_stream_sync(void *stream) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "stream_sync"));
  return CUDA_CALL(r, cudaStreamSynchronize, stream);
}

static ncclResult_t cuda_stream_capturing(void *stream, int *capturing) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "stream_capturing"));
  int status = cudaStreamCaptureStatusNone;
  HETCCL_CHECK(CUDA_CALL(r, cudaStreamIsCapturing, stream, &status));
  if (capturing) *capturing = status != cudaStreamCaptureStatusNone;
  return ncclSuccess;
}

/* --- staging support (core/devpath.c) ------------------------------------------ */

static ncclResult_t cuda_event_create(void **event) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "event_create"));
  return CUDA_CALL(r, cudaEventCreateWithFlags, event, cudaEventDisableTiming);
}

static ncclResult_t cuda_event_destroy(void *event) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "event_destroy"));
  return CUDA_CALL(r, cudaEventDestroy, event);
}

static ncclResult_t cuda_event_record(void *event, void *stream) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "event_record"));
  return CUDA_CALL(r, cudaEventRecord, event, stream);
}

static ncclResult_t cuda_event_query(void *event, int *done) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "event_query"));
  cudaError_t err = r->cudaEventQuery(event);
  *done = err == 0;
  if (err == cudaErrorNotReady) {
    r->cudaGetLastError(); /* "not ready" is an answer, not an error to leave behind */
    return ncclSuccess;
  }
  return cuda_result(r, err, "cudaEventQuery");
}

static ncclResult_t cuda_stream_wait_event(void *stream, void *event) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "stream_wait_event"));
  return CUDA_CALL(r, cudaStreamWaitEvent, stream, event, 0);
}

static ncclResult_t cuda_host_alloc_mapped(void **host, void **dev, size_t bytes) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "host_alloc_mapped"));
  HETCCL_CHECK(CUDA_CALL(r, cudaHostAlloc, host, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  ncclResult_t res = CUDA_CALL(r, cudaHostGetDevicePointer, dev, *host, 0);
  if (res != ncclSuccess) {
    r->cudaFreeHost(*host);
    *host = NULL;
  }
  return res;
}

/* Counters on a stream: the driver's stream memory operations, or where
 * those are unavailable a host function on the stream (gpu.h). */

static int mem_ops_off; /* the driver refused a stream memory operation once */

static ncclResult_t counter_op(void *stream, volatile uint64_t *host, void *dev, uint64_t value,
                               int write) {
  const cuda_driver_t *d = driver_get(1);
  CUresult (*fn)(void *, CUdeviceptr, uint64_t, unsigned) =
      d ? (write ? d->cuStreamWriteValue64 : d->cuStreamWaitValue64) : NULL;
  const char *name = write ? "cuStreamWriteValue64" : "cuStreamWaitValue64";
  if (fn && !__atomic_load_n(&mem_ops_off, __ATOMIC_RELAXED)) {
    CUresult err = fn(stream, (CUdeviceptr)(uintptr_t)dev, value,
                      write ? CU_STREAM_WRITE_VALUE_DEFAULT : CU_STREAM_WAIT_VALUE_GEQ);
    if (err == CUDA_SUCCESS) return ncclSuccess;
    const char *text = NULL;
    d->cuGetErrorString(err, &text);
    if (err != CUDA_ERROR_NOT_SUPPORTED) {
      WARN("cuda: %s failed: %s (error %d)", name, text ? text : "unknown error", err);
      return ncclUnhandledCudaError;
    }
    INFO(HETCCL_RUNTIME, "cuda: stream memory operations not supported (%s): host functions "
         "on the stream instead", text ? text : "");
    __atomic_store_n(&mem_ops_off, 1, __ATOMIC_RELAXED);
  }
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, name));
  void *job = hetccl_gpu_counter_job(host, value, write);
  if (!job) {
    WARN("cuda: %s: out of memory", name);
    return ncclSystemError;
  }
  ncclResult_t res = CUDA_CALL(r, cudaLaunchHostFunc, stream, hetccl_gpu_counter_fn, job);
  if (res != ncclSuccess) free(job);
  return res;
}

static ncclResult_t cuda_stream_wait_counter(void *stream, volatile uint64_t *host, void *dev,
                                             uint64_t value) {
  return counter_op(stream, host, dev, value, 0);
}

static ncclResult_t cuda_stream_write_counter(void *stream, volatile uint64_t *host, void *dev,
                                              uint64_t value) {
  return counter_op(stream, host, dev, value, 1);
}

static ncclResult_t cuda_stream_create(void **stream, int urgent) {
  const cuda_runtime_lib_t *r;
  int least = 0, greatest = 0;
  HETCCL_CHECK(runtime_need(&r, "stream_create"));
  if (urgent) HETCCL_CHECK(CUDA_CALL(r, cudaDeviceGetStreamPriorityRange, &least, &greatest));
  return CUDA_CALL(r, cudaStreamCreateWithPriority, stream, cudaStreamNonBlocking,
                   urgent ? greatest : least);
}

static ncclResult_t cuda_stream_destroy(void *stream) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "stream_destroy"));
  return CUDA_CALL(r, cudaStreamDestroy, stream);
}

/* --- registering host memory someone else mapped (a /dev/shm segment) ----- */

static ncclResult_t cuda_host_register(void *ptr, size_t bytes, void **dev) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "host_register"));
  HETCCL_CHECK(CUDA_CALL(r, cudaHostRegister, ptr, bytes,
                         cudaHostRegisterPortable | cudaHostRegisterMapped));
  void *d = NULL;
  ncclResult_t res = CUDA_CALL(r, cudaHostGetDevicePointer, &d, ptr, 0);
  if (res != ncclSuccess) {
    r->cudaHostUnregister(ptr);
    r->cudaGetLastError(); /* the WARN above told the failure; leave the application none */
    return res;
  }
  *dev = d;
  return ncclSuccess;
}

static ncclResult_t cuda_host_unregister(void *ptr) {
  const cuda_runtime_lib_t *r;
  HETCCL_CHECK(runtime_need(&r, "host_unregister"));
  return CUDA_CALL(r, cudaHostUnregister, ptr);
}

const hetccl_runtime_t hetccl_runtime_cuda = {
    .kind = HETCCL_DEV_CUDA,
    .name = "cuda",
    .caps = HETCCL_RT_CAP_STREAMS | HETCCL_RT_CAP_HOST_REGISTER | HETCCL_RT_CAP_NIC_FLUSH,
    .available = cuda_available,
    .in_use = cuda_in_use,
    .describe = cuda_describe,
    .current_device = cuda_current_device,
    .set_device = cuda_set_device,
    .mem_kind = cuda_mem_kind,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .memcpy_async = cuda_memcpy_async,
    .stream_sync = cuda_stream_sync,
    .stream_capturing = cuda_stream_capturing,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .stream_wait_event = cuda_stream_wait_event,
    .host_alloc_mapped = cuda_host_alloc_mapped,
    .stream_wait_counter = cuda_stream_wait_counter,
    .stream_write_counter = cuda_stream_write_counter,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    /* device kernels (NVRTC) are not built yet */
    .reduce_async = hetccl_cuda_reduce_async,
    .reduce_available = hetccl_cuda_reduce_available,
    .reduce_run_async = hetccl_cuda_reduce_run_async,
    .dmabuf_export = cuda_dmabuf_export,
    .flush_nic_writes = cuda_flush_nic_writes,
};
