/* Device runtime: the CUDA entry.
 *
 * Nothing here links CUDA. Two libraries are opened with dlopen and used
 * only through dlsym on their handles:
 *   libcuda.so.1 (driver)   pointer attributes, contexts: calls that never
 *                           touch the runtime's per-thread "last error", so
 *                           asking about a plain host pointer leaves no
 *                           trace that the application's next
 *                           cudaGetLastError() would report;
 *   libcudart (runtime)     devices, memory, copies, streams: the body in
 *                           gpu_entry.c over the names below, on the
 *                           libcudart the process already loaded, else
 *                           libcudart.so.13 / .12 / .11.0 / libcudart.so.
 * Both are looked for as gpu_entry.h says: "only if already loaded" for
 * in_use (which must never load or initialise CUDA), "load it" for every
 * other slot; kept once found, a failed load remembered, not retried.
 *
 * Errors: runtime calls through gpu_entry.c's adapter (cudaGetErrorString);
 * driver calls WARN with cuGetErrorString. Both return
 * ncclUnhandledCudaError.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic pointer; the tables are read-only afterwards. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "runtime/devreduce.h"
#include "runtime/gpu.h"
#include "runtime/gpu_entry.h"
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
enum { CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124 };
enum { CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1 };
enum { CU_STREAM_WAIT_VALUE_GEQ = 0x0, CU_STREAM_WRITE_VALUE_DEFAULT = 0x0 };
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

typedef struct {
  void *handle;
  char path[512];
#define FN_FIELD(name, ret, params) ret(*name) params;
  CUDA_DRIVER_FNS(FN_FIELD)
#undef FN_FIELD
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

static cuda_driver_t drv;
static cuda_driver_t *drv_ready;      /* published (atomic) once drv is filled */
static int drv_failed;                /* a full load was tried and failed */
static int drv_inited;                /* cuInit called */
static unsigned long long drv_absent_at; /* hetccl_runtime_loads() when the driver was last
                                          * found not loaded (atomic; 0: not since) */
static char drv_why[512];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER; /* the driver's and the runtime's */

static const hetccl_gpu_sym_t driver_syms[] = {
#define DRIVER_SYM(fn, ret, params) {#fn, (void **)&drv.fn, 0},
    CUDA_DRIVER_FNS(DRIVER_SYM)
#undef DRIVER_SYM
    /* CUDA 12 headers name the current ABI of these calls with a _v2 suffix. */
    {"cuStreamWaitValue64_v2", (void **)&drv.cuStreamWaitValue64, 1},
    {"cuStreamWaitValue64", (void **)&drv.cuStreamWaitValue64, 1},
    {"cuStreamWriteValue64_v2", (void **)&drv.cuStreamWriteValue64, 1},
    {"cuStreamWriteValue64", (void **)&drv.cuStreamWriteValue64, 1},
    {"cuDeviceGetAttribute", (void **)&drv.cuDeviceGetAttribute, 1},
    {"cuMemGetHandleForAddressRange", (void **)&drv.cuMemGetHandleForAddressRange, 1},
    {"cuFlushGPUDirectRDMAWrites", (void **)&drv.cuFlushGPUDirectRDMAWrites, 1},
};

/* X(name, return, params, optional): the runtime calls only CUDA has
 * (gpu_entry.h has the shared ones). */
#define CUDART_OWN_FNS(X)                                                                         \
  X(cudaMallocHost, cudaError_t, (void **ptr, size_t bytes), 0)                                   \
  X(cudaLaunchHostFunc, cudaError_t, (void *stream, void (*fn)(void *), void *arg), 0)

static struct { CUDART_OWN_FNS(HETCCL_GPU_SYM_FIELD) } own;

static const hetccl_gpu_sym_t own_syms[] = {
#define OWN_SYM(name, ret, params, optional) {#name, (void **)&own.name, optional},
    CUDART_OWN_FNS(OWN_SYM)
#undef OWN_SYM
};

static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};

/* --- the driver ------------------------------------------------------------------ */

/* Fill drv from handle h; 0 and a reason in why if a symbol is missing. */
static int driver_fill(void *h, const char *name) {
  if (!hetccl_gpu_take(h, driver_syms, sizeof(driver_syms) / sizeof(driver_syms[0]), name,
                       drv_why, sizeof(drv_why)))
    return 0;
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
  /* Not loaded when last looked for, and nothing loaded since (runtime.h) */
  unsigned long long loads = d ? 0 : hetccl_runtime_loads();
  if (!d && !may_load && loads && __atomic_load_n(&drv_absent_at, __ATOMIC_RELAXED) == loads)
    return NULL;
  pthread_mutex_lock(&load_lock);
  if (!drv_ready && !(may_load && drv_failed)) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | (may_load ? 0 : RTLD_NOLOAD));
    if (!h && !may_load) __atomic_store_n(&drv_absent_at, loads, __ATOMIC_RELAXED);
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

/* --- the runtime: gpu_entry.c over these names ------------------------------------ */

static void cudart_announce(const hetccl_gpu_t *g, const char *how) {
  INFO(HETCCL_RUNTIME, "cuda: runtime %s (%s)", g->path, how);
}

static ncclResult_t cudart_counter_op(hetccl_gpu_t *g, void *stream, void *dev, uint64_t value,
                                      int write, int *fallback);
static ncclResult_t cudart_launch_host(hetccl_gpu_t *g, void *stream, void *job);

static const hetccl_gpu_vendor_t cuda_vendor = {
    .tag = "cuda",
    .product = "CUDA",
    .libs = cudart_names,
    .nlibs = sizeof(cudart_names) / sizeof(cudart_names[0]),
    .lib_prefix = "libcudart.so",
    .loaded_name = "the loaded libcudart",
    .calls = HETCCL_GPU_NAMES(CUDA),
    .own = own_syms,
    .nown = sizeof(own_syms) / sizeof(own_syms[0]),
    .accept = NULL, /* any libcudart with every call serves */
    .announce = cudart_announce,
    .counter_op = cudart_counter_op,
    .launch_host = cudart_launch_host,
    .counter_calls = {"cuStreamWaitValue64", "cuStreamWriteValue64"},
};

static hetccl_gpu_t cudart = HETCCL_GPU_INIT(&cuda_vendor, &load_lock);

HETCCL_GPU_BIND(cuda, &cudart)

/* Counters on a stream: the driver's stream memory operations, or where
 * those are unavailable a host function on the stream (gpu_entry.c). */
static ncclResult_t cudart_counter_op(hetccl_gpu_t *g, void *stream, void *dev, uint64_t value,
                                      int write, int *fallback) {
  const cuda_driver_t *d = driver_get(1);
  CUresult (*fn)(void *, CUdeviceptr, uint64_t, unsigned) =
      d ? (write ? d->cuStreamWriteValue64 : d->cuStreamWaitValue64) : NULL;
  const char *name = g->vendor->counter_calls[write];
  if (!fn) {
    *fallback = 1;
    return ncclSuccess;
  }
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
  __atomic_store_n(&g->mem_ops_off, 1, __ATOMIC_RELAXED);
  *fallback = 1;
  return ncclSuccess;
}

static ncclResult_t cudart_launch_host(hetccl_gpu_t *g, void *stream, void *job) {
  return hetccl_gpu_result(g, own.cudaLaunchHostFunc(stream, hetccl_gpu_counter_fn, job),
                           "cudaLaunchHostFunc");
}

/* --- the slots CUDA serves its own way ---------------------------------------- */

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

static int cuda_in_use(void) { return hetccl_gpu_get(&cudart, 0) != NULL || driver_context_live(); }

static int cuda_available(void) { return hetccl_gpu_available(&cudart); }

static char describe_text[2048];

static void describe_once(void) {
  cuda_available();
  const hetccl_gpu_t *r = hetccl_gpu_get(&cudart, 0);
  if (!r) {
    snprintf(describe_text, sizeof(describe_text), "not found: %s", cudart.why);
    return;
  }
  const cuda_driver_t *d = driver_get(1);
  snprintf(describe_text, sizeof(describe_text), "%s, %s%s%s: %d device%s", r->path,
           d ? d->path : "no driver (", d ? "" : drv_why, d ? "" : ")", r->devices,
           r->devices == 1 ? "" : "s");
}

static const char *cuda_describe(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, describe_once);
  return describe_text;
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
  return hetccl_gpu_mem_kind_answer(k, ordinal, kind, dev);
}

/* Pinned memory by cudaMallocHost (the hip entry asks hipHostMalloc for
 * portable memory: the two slots differ in call, not only in name). */
static ncclResult_t cuda_host_alloc(void **ptr, size_t bytes) {
  HETCCL_CHECK(hetccl_gpu_need(&cudart, "host_alloc"));
  return hetccl_gpu_result(&cudart, own.cudaMallocHost(ptr, bytes), "cudaMallocHost");
}

static int cuda_dmabuf_export(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                              size_t len) {
  const cuda_driver_t *d = driver_get(1);
  const hetccl_gpu_t *r = hetccl_gpu_get(&cudart, 1);
  int dev = -1, supported = 0;
  if (!d || !r) return hetccl_gpu_why(why, len, "the CUDA driver or runtime could not be loaded");
  if (!d->cuMemGetHandleForAddressRange || !d->cuDeviceGetAttribute)
    return hetccl_gpu_why(why, len, "%s has no cuMemGetHandleForAddressRange (CUDA 11.7 adds it)",
                          d->path);
  if (r->api.get_device(&dev) != 0) {
    r->api.get_last_error(); /* the application's, not ours */
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

static ncclResult_t cuda_flush_nic_writes(void) {
  static int told;
  const cuda_driver_t *d = driver_get(1);
  CUresult err = d && d->cuFlushGPUDirectRDMAWrites
                     ? d->cuFlushGPUDirectRDMAWrites(FLUSH_TARGET_CURRENT_CTX, FLUSH_TO_OWNER)
                     : CUDA_ERROR_NOT_SUPPORTED;
  if (err == CUDA_SUCCESS) return ncclSuccess;
  if (err == CUDA_ERROR_NOT_SUPPORTED) { /* nothing to flush here, or no call to do it */
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

const hetccl_runtime_t hetccl_runtime_cuda = {
    .kind = HETCCL_DEV_CUDA,
    .name = "cuda",
    .caps = HETCCL_RT_CAP_STREAMS | HETCCL_RT_CAP_HOST_REGISTER | HETCCL_RT_CAP_NIC_FLUSH,
    .available = cuda_available,
    .in_use = cuda_in_use,
    .holds_memory = driver_context_live,
    .describe = cuda_describe,
    .mem_kind = cuda_mem_kind,
    .host_alloc = cuda_host_alloc,
    HETCCL_GPU_TABLE(cuda) /* the slots gpu_entry.c serves */
    .reduce_async = hetccl_cuda_reduce_async,
    .reduce_available = hetccl_cuda_reduce_available,
    .reduce_run_async = hetccl_cuda_reduce_run_async,
    .dmabuf_export = cuda_dmabuf_export,
    .flush_nic_writes = cuda_flush_nic_writes,
};
