/* Device reductions on CUDA devices (devreduce.h): the kernel text of
 * reduce_kernel.c compiled by NVRTC for the current device, loaded into the
 * current context, launched on the caller's stream.
 *
 * Nothing here links CUDA. Two libraries are used only through dlsym on
 * their handles:
 *   libnvrtc   the runtime compiler, loaded here (once per process);
 *   libcuda.1  the driver, which the CUDA runtime already loaded: taken
 *              with RTLD_NOLOAD, never loaded or initialised from here.
 *
 * Where NVRTC is looked for (the first that opens wins):
 *   1. HETCCL_NVRTC_LIBRARY, a path or a name; when set it is the only
 *      candidate, and "none" turns device reductions off;
 *   2. a libnvrtc the process has already loaded;
 *   3. the sonames libnvrtc.so.13, .12, .11.2, libnvrtc.so, the one of the
 *      loaded libcudart's major version first (a newer NVRTC's code may be
 *      refused by the driver that runtime came with);
 *   4. the directory the loaded libcudart came from, and that directory's
 *      pip-wheel siblings (nvidia/cuda_nvrtc/lib, nvidia/cu13/lib);
 *   5. /usr/local/cuda/lib64.
 * A failed search is remembered and reported by reduce_available, not
 * retried; the driver is looked for again until it is found.
 *
 * Compilation: for sm_XY of the current device, as a cubin; as PTX for
 * compute_XY (the driver finishes it) when NVRTC lacks nvrtcGetCUBIN, and
 * for the newest architecture NVRTC knows when the device is newer than
 * NVRTC. Always --fmad=false --prec-div=true --prec-sqrt=true --ftz=false:
 * the results must be the host's, bit for bit.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic; kernels are cached per (context, variant) in rtc.c's cache, one
 * compile at a time. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/devreduce.h"
#include "runtime/gpu.h"
#include "runtime/rtc.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- the few NVRTC and driver facts we need (public CUDA documentation) ---- */

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef void *nvrtcProgram;
typedef int CUresult;    /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

enum { NVRTC_SUCCESS = 0, CUDA_SUCCESS = 0 };
enum {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

/* X(name, return, params): NVRTC functions we need (all in NVRTC 11.0). */
#define NVRTC_FNS(X)                                                                              \
  X(nvrtcGetErrorString, const char *, (nvrtcResult r))                                           \
  X(nvrtcVersion, nvrtcResult, (int *major, int *minor))                                          \
  X(nvrtcCreateProgram, nvrtcResult,                                                              \
    (nvrtcProgram * prog, const char *src, const char *name, int nheaders,                        \
     const char *const *headers, const char *const *include_names))                               \
  X(nvrtcDestroyProgram, nvrtcResult, (nvrtcProgram * prog))                                      \
  X(nvrtcCompileProgram, nvrtcResult, (nvrtcProgram prog, int nopts, const char *const *opts))    \
  X(nvrtcGetProgramLogSize, nvrtcResult, (nvrtcProgram prog, size_t *bytes))                      \
  X(nvrtcGetProgramLog, nvrtcResult, (nvrtcProgram prog, char *log))                              \
  X(nvrtcGetPTXSize, nvrtcResult, (nvrtcProgram prog, size_t *bytes))                             \
  X(nvrtcGetPTX, nvrtcResult, (nvrtcProgram prog, char *ptx))

/* X(name, return, params): driver functions. None of these has a _v2 ABI
 * in cuda.h (cuCtxGetDevice_v2 of CUDA 13 is another call, with a context
 * argument; the plain name keeps the one-argument ABI). */
#define DRIVER_FNS(X)                                                                             \
  X(cuGetErrorString, CUresult, (CUresult err, const char **str))                                 \
  X(cuCtxGetCurrent, CUresult, (CUcontext * ctx))                                                 \
  X(cuCtxGetDevice, CUresult, (CUdevice * dev))                                                   \
  X(cuDeviceGetAttribute, CUresult, (int *value, int attribute, CUdevice dev))                    \
  X(cuModuleLoadData, CUresult, (CUmodule * module, const void *image))                           \
  X(cuModuleGetFunction, CUresult, (CUfunction * fn, CUmodule module, const char *name))          \
  X(cuModuleUnload, CUresult, (CUmodule module))                                                  \
  X(cuLaunchKernel, CUresult,                                                                     \
    (CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
     unsigned shared_bytes, void *stream, void **params, void **extra))

#define FN_FIELD(name, ret, params) ret(*name) params;

typedef struct {
  void *handle;
  char path[512];
  int major, minor;
  NVRTC_FNS(FN_FIELD)
  /* Optional: cubin output (11.1) and the architectures it knows (11.2). */
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram prog, size_t *bytes);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram prog, char *cubin);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int *n);
  nvrtcResult (*nvrtcGetSupportedArchs)(int *archs);
} nvrtc_lib_t;

typedef struct {
  void *handle;
  DRIVER_FNS(FN_FIELD)
  /* Optional (CUDA 12.0): a context's unique id, so that a new context at
   * a freed one's address does not find the old one's kernels. */
  CUresult (*cuCtxGetId)(CUcontext ctx, unsigned long long *id);
} cu_driver_t;

#undef FN_FIELD

static nvrtc_lib_t nvrtc;
static cu_driver_t drv;
static int nvrtc_state;      /* 0 not looked for, 1 loaded, -1 not available (atomic) */
static cu_driver_t *drv_ready; /* published (atomic) once drv is filled */
static char nvrtc_why[1536];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static hetccl_rtc_cache_t cache = HETCCL_RTC_CACHE_INIT;

static const char *const nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                          "libnvrtc.so"};
#define NNVRTC_NAMES (sizeof(nvrtc_names) / sizeof(nvrtc_names[0]))
static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
static const char *const driver_names[] = {"libcuda.so.1"};

/* --- finding NVRTC ----------------------------------------------------------- */

/* Fill nvrtc from h; 0 with the reason in nvrtc_why when it cannot serve. */
static int nvrtc_fill(void *h) {
  const char *name = nvrtc.path;
  hetccl_gpu_where_loaded(dlsym(h, "nvrtcVersion"), nvrtc.path, sizeof(nvrtc.path), "libnvrtc");
#define FN_TAKE(fn, ret, params)                                                                  \
  *(void **)&nvrtc.fn = dlsym(h, #fn);                                                            \
  if (!nvrtc.fn) {                                                                                \
    snprintf(nvrtc_why, sizeof(nvrtc_why), "%s lacks %s", name, #fn);                             \
    return 0;                                                                                     \
  }
  NVRTC_FNS(FN_TAKE)
#undef FN_TAKE
  *(void **)&nvrtc.nvrtcGetCUBINSize = dlsym(h, "nvrtcGetCUBINSize");
  *(void **)&nvrtc.nvrtcGetCUBIN = dlsym(h, "nvrtcGetCUBIN");
  *(void **)&nvrtc.nvrtcGetNumSupportedArchs = dlsym(h, "nvrtcGetNumSupportedArchs");
  *(void **)&nvrtc.nvrtcGetSupportedArchs = dlsym(h, "nvrtcGetSupportedArchs");
  if (!nvrtc.nvrtcGetCUBINSize || !nvrtc.nvrtcGetCUBIN) nvrtc.nvrtcGetCUBIN = NULL;
  if (!nvrtc.nvrtcGetNumSupportedArchs) nvrtc.nvrtcGetSupportedArchs = NULL;
  if (nvrtc.nvrtcVersion(&nvrtc.major, &nvrtc.minor) != NVRTC_SUCCESS) {
    snprintf(nvrtc_why, sizeof(nvrtc_why), "%s: nvrtcVersion failed", name);
    return 0;
  }
  nvrtc.handle = h;
  return 1;
}

/* The file of the libcudart this process loaded ("" if none), and its
 * major version from the file name (0 if it does not say). */
static int cudart_loaded(char *path, size_t len) {
  path[0] = '\0';
  void *h = hetccl_gpu_open_loaded(cudart_names, sizeof(cudart_names) / sizeof(cudart_names[0]),
                                   "libcudart.so");
  if (!h) return 0;
  hetccl_gpu_where_loaded(dlsym(h, "cudaGetDevice"), path, len, "");
  dlclose(h);
  const char *v = strstr(path, "libcudart.so.");
  return v ? atoi(v + strlen("libcudart.so.")) : 0;
}

/* Steps 3 to 5 of the search; tried collects what failed. */
static void *nvrtc_search(char *tried, size_t len) {
  char cudart[512], dir[640], wheels[512];
  int major = cudart_loaded(cudart, sizeof(cudart));
  void *h = NULL;
  for (size_t i = 0; !h && major && i < NNVRTC_NAMES; i++)
    if (atoi(nvrtc_names[i] + strlen("libnvrtc.so.")) == major)
      h = hetccl_rtc_open(nvrtc_names[i], 0, tried, len);
  for (size_t i = 0; !h && i < NNVRTC_NAMES; i++) h = hetccl_rtc_open(nvrtc_names[i], 0, tried, len);
  hetccl_rtc_dirname(cudart, dir, sizeof(dir));
  if (!h) h = hetccl_rtc_open_in(dir, nvrtc_names, NNVRTC_NAMES, tried, len);
  /* pip wheels: .../nvidia/cuda_runtime/lib beside .../nvidia/cuda_nvrtc/lib */
  hetccl_rtc_dirname(dir, wheels, sizeof(wheels));
  hetccl_rtc_dirname(wheels, wheels, sizeof(wheels));
  const char *const siblings[] = {"cuda_nvrtc/lib", "cu13/lib"};
  for (size_t i = 0; !h && wheels[0] && i < 2; i++) {
    snprintf(dir, sizeof(dir), "%s/%s", wheels, siblings[i]);
    h = hetccl_rtc_open_in(dir, nvrtc_names, NNVRTC_NAMES, tried, len);
  }
  if (!h) h = hetccl_rtc_open_in("/usr/local/cuda/lib64", nvrtc_names, NNVRTC_NAMES, tried, len);
  if (!h && !cudart[0]) {
    size_t off = strlen(tried);
    snprintf(tried + off, len - off, " (no libcudart loaded to look beside)");
  }
  return h;
}

/* Open NVRTC by the rules at the top; the reason in nvrtc_why when none. */
static void *nvrtc_open(void) {
  const char *knob = hetccl_knob_str(HETCCL_KNOB_NVRTC_LIBRARY);
  if (strcmp(knob, "none") == 0) {
    snprintf(nvrtc_why, sizeof(nvrtc_why), "disabled by HETCCL_NVRTC_LIBRARY=none");
    return NULL;
  }
  if (knob[0]) {
    void *h = dlopen(knob, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(nvrtc_why, sizeof(nvrtc_why), "HETCCL_NVRTC_LIBRARY=%s: %s", knob, dlerror());
    return h;
  }
  void *h = hetccl_gpu_open_loaded(nvrtc_names, NNVRTC_NAMES, "libnvrtc.so");
  if (h) return h;
  char tried[1280] = "";
  h = nvrtc_search(tried, sizeof(tried));
  if (!h) snprintf(nvrtc_why, sizeof(nvrtc_why), "no NVRTC found (tried %s); set "
                   "HETCCL_NVRTC_LIBRARY", tried);
  return h;
}

/* NVRTC, looked for once; NULL when there is none (reason in nvrtc_why). */
static const nvrtc_lib_t *nvrtc_get(void) {
  int s = __atomic_load_n(&nvrtc_state, __ATOMIC_ACQUIRE);
  if (s) return s > 0 ? &nvrtc : NULL;
  pthread_mutex_lock(&load_lock);
  if (!nvrtc_state) {
    void *h = nvrtc_open();
    if (h && !nvrtc_fill(h)) {
      dlclose(h);
      h = NULL;
    }
    if (h) INFO(HETCCL_RUNTIME, "cuda: NVRTC %d.%d from %s", nvrtc.major, nvrtc.minor, nvrtc.path);
    else INFO(HETCCL_RUNTIME, "cuda: no device reductions: %s", nvrtc_why);
    __atomic_store_n(&nvrtc_state, h ? 1 : -1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_lock);
  return nvrtc_state > 0 ? &nvrtc : NULL;
}

/* The driver the CUDA runtime loaded; NULL while there is none. */
static const cu_driver_t *driver_get(void) {
  cu_driver_t *d = __atomic_load_n(&drv_ready, __ATOMIC_ACQUIRE);
  if (d) return d;
  pthread_mutex_lock(&load_lock);
  if (!drv_ready) {
    void *h = hetccl_gpu_open_loaded(driver_names, 1, "libcuda.so");
    int ok = h != NULL;
#define FN_TAKE(fn, ret, params) \
  if (ok && !(*(void **)&drv.fn = dlsym(h, #fn))) ok = 0;
    DRIVER_FNS(FN_TAKE)
#undef FN_TAKE
    if (ok) {
      *(void **)&drv.cuCtxGetId = dlsym(h, "cuCtxGetId");
      drv.handle = h;
      __atomic_store_n(&drv_ready, &drv, __ATOMIC_RELEASE);
    } else if (h) {
      dlclose(h); /* a driver without these calls is too old to use */
    }
  }
  pthread_mutex_unlock(&load_lock);
  return drv_ready;
}

int hetccl_cuda_reduce_available(char *why, size_t len) {
  const nvrtc_lib_t *n = nvrtc_get();
  const cu_driver_t *d = n ? driver_get() : NULL;
  if (why && len) {
    if (!n) snprintf(why, len, "%s", nvrtc_why);
    else if (!d) snprintf(why, len, "the CUDA driver (libcuda.so.1) is not loaded in this process");
    else snprintf(why, len, "NVRTC %d.%d from %s", n->major, n->minor, n->path);
  }
  return n && d;
}

/* --- compiling and loading ---------------------------------------------------- */

/* The one adapter from a driver error to ours. */
static ncclResult_t cu_result(const cu_driver_t *d, CUresult r, const char *call,
                              const hetccl_rtc_variant_t *v) {
  if (r == CUDA_SUCCESS) return ncclSuccess;
  const char *text = NULL;
  d->cuGetErrorString(r, &text);
  char name[96] = "";
  if (v) hetccl_rtc_variant_name(v, name, sizeof(name));
  WARN("cuda: %s failed%s%s: %s (error %d)", call, v ? " for the reduce kernel " : "", name,
       text ? text : "unknown error", r);
  return ncclUnhandledCudaError;
}

/* The same for NVRTC, with the compiler's log when there is a program. */
static ncclResult_t nvrtc_result(const nvrtc_lib_t *n, nvrtcResult r, const char *call,
                                 const hetccl_rtc_variant_t *v, const char *target,
                                 nvrtcProgram p) {
  if (r == NVRTC_SUCCESS) return ncclSuccess;
  char name[96], log[1024] = "";
  hetccl_rtc_variant_name(v, name, sizeof(name));
  size_t bytes = 0;
  char *text = p && n->nvrtcGetProgramLogSize(p, &bytes) == NVRTC_SUCCESS && bytes > 1
                   ? malloc(bytes) : NULL;
  if (text && n->nvrtcGetProgramLog(p, text) == NVRTC_SUCCESS) snprintf(log, sizeof(log), "%s", text);
  free(text);
  for (size_t end = strlen(log); end && (log[end - 1] == '\n' || log[end - 1] == ' ');) log[--end] = '\0';
  WARN("cuda: %s failed for the reduce kernel %s (%s, NVRTC %d.%d from %s): %s%s%s", call, name,
       target, n->major, n->minor, n->path, n->nvrtcGetErrorString(r), log[0] ? ": " : "", log);
  return ncclUnhandledCudaError;
}

/* The architecture to compile for (cc = 10 * major + minor): the device's,
 * else, for a device newer than this NVRTC, the newest one it knows, as
 * PTX that the driver compiles further. *cubin: ask NVRTC for a cubin. */
static int target_arch(const nvrtc_lib_t *n, int cc, int *cubin) {
  int count = 0, archs[256], best = 0;
  *cubin = n->nvrtcGetCUBIN != NULL;
  if (!n->nvrtcGetSupportedArchs || n->nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS ||
      count <= 0 || count > 256 || n->nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
    return cc;
  for (int i = 0; i < count; i++) {
    if (archs[i] == cc) return cc;
    if (archs[i] < cc && archs[i] > best) best = archs[i];
  }
  if (!best) return cc; /* older than all NVRTC knows: its compile error says so */
  *cubin = 0;
  return best;
}

/* Compile v for compute capability cc into *image (malloc'd): a cubin, or
 * PTX text; target names what it is for ("sm_90", "compute_90"). */
static ncclResult_t nvrtc_compile(const nvrtc_lib_t *n, const hetccl_rtc_variant_t *v, int cc,
                                  char **image, size_t *bytes, char *target, size_t tlen) {
  int cubin;
  int arch = target_arch(n, cc, &cubin), version = n->major * 10 + n->minor;
  snprintf(target, tlen, "%s_%d", cubin ? "sm" : "compute", arch);
  if (hetccl_rtc_disk_load("nvrtc", target, version, v, image, bytes)) return ncclSuccess;
  char archopt[64];
  snprintf(archopt, sizeof(archopt), "--gpu-architecture=%s", target);
  const char *opts[5 + HETCCL_RTC_MAX_DEFINES] = {archopt, "--fmad=false", "--prec-div=true",
                                                  "--prec-sqrt=true", "--ftz=false"};
  int nopts = 5 + (int)hetccl_rtc_defines(v, opts + 5);
  nvrtcProgram p = NULL;
  HETCCL_CHECK(nvrtc_result(n, n->nvrtcCreateProgram(&p, hetccl_rtc_kernel_source,
                                                     "hetccl_reduce.cu", 0, NULL, NULL),
                            "nvrtcCreateProgram", v, target, NULL));
  ncclResult_t res;
  HETCCL_CHECK_GOTO(nvrtc_result(n, n->nvrtcCompileProgram(p, nopts, opts), "nvrtcCompileProgram",
                                 v, target, p), res, destroy);
  const char *get = cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX";
  HETCCL_CHECK_GOTO(nvrtc_result(n, (cubin ? n->nvrtcGetCUBINSize : n->nvrtcGetPTXSize)(p, bytes),
                                 get, v, target, NULL), res, destroy);
  *image = malloc(*bytes ? *bytes : 1);
  if (!*image) {
    WARN("cuda: reduce kernel: out of memory for %zu bytes of code", *bytes);
    res = ncclSystemError;
    goto destroy;
  }
  res = nvrtc_result(n, (cubin ? n->nvrtcGetCUBIN : n->nvrtcGetPTX)(p, *image), get, v, target, NULL);
  if (res != ncclSuccess) {
    free(*image);
    *image = NULL;
  } else {
    hetccl_rtc_disk_store("nvrtc", target, version, v, *image, *bytes);
  }
destroy:
  n->nvrtcDestroyProgram(&p);
  return res;
}

/* hetccl_rtc_build_fn: compile v for the current context's device and load
 * it there. ctx: the NVRTC in use. */
static ncclResult_t kernel_build(void *ctx, uint64_t id, const hetccl_rtc_variant_t *v,
                                 hetccl_rtc_entry_t *e) {
  const nvrtc_lib_t *n = ctx;
  const cu_driver_t *d = &drv; /* published: kernel_get's caller had it from driver_get */
  (void)id; /* it names the current context, which is where the module loads */
  CUdevice dev;
  int major = 0, minor = 0, units = 0;
  HETCCL_CHECK(cu_result(d, d->cuCtxGetDevice(&dev), "cuCtxGetDevice", v));
  HETCCL_CHECK(cu_result(d, d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                         "cuDeviceGetAttribute", v));
  HETCCL_CHECK(cu_result(d, d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                         "cuDeviceGetAttribute", v));
  HETCCL_CHECK(cu_result(d, d->cuDeviceGetAttribute(&units, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                         "cuDeviceGetAttribute", v));
  char *image = NULL, target[32];
  size_t bytes = 0;
  double t0 = hetccl_rtc_now_ms();
  HETCCL_CHECK(nvrtc_compile(n, v, major * 10 + minor, &image, &bytes, target, sizeof(target)));
  double t1 = hetccl_rtc_now_ms();
  CUmodule module = NULL;
  e->units = units;
  ncclResult_t res = cu_result(d, d->cuModuleLoadData(&module, image), "cuModuleLoadData", v);
  free(image);
  HETCCL_CHECK(res);
  res = cu_result(d, d->cuModuleGetFunction(&e->function, module, HETCCL_RTC_KERNEL_NAME),
                  "cuModuleGetFunction", v);
  if (res == ncclSuccess)
    res = cu_result(d, d->cuModuleGetFunction(&e->run_function, module,
                                               HETCCL_RTC_RUN_KERNEL_NAME),
                    "cuModuleGetFunction", v);
  if (res != ncclSuccess) {
    d->cuModuleUnload(module);
    return res;
  }
  char name[96];
  hetccl_rtc_variant_name(v, name, sizeof(name));
  INFO(HETCCL_RUNTIME, "cuda: reduce kernel %s: compiled (or read from the disk cache) for %s "
       "by NVRTC %d.%d in %.1f ms "
       "(%zu bytes), loaded in %.1f ms", name, target, n->major, n->minor, t1 - t0, bytes,
       hetccl_rtc_now_ms() - t1);
  return ncclSuccess;
}

/* The current context's kernel for v; the first call of a (context,
 * variant) pays the compile. */
static ncclResult_t kernel_get(const nvrtc_lib_t *n, const cu_driver_t *d,
                               const hetccl_rtc_variant_t *v, const hetccl_rtc_entry_t **out) {
  CUcontext ctx = NULL;
  HETCCL_CHECK(cu_result(d, d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent", v));
  if (!ctx) {
    WARN("cuda: device reduction on a thread with no current CUDA context (select a device "
         "first)");
    return ncclUnhandledCudaError;
  }
  unsigned long long id = (uintptr_t)ctx;
  if (d->cuCtxGetId) HETCCL_CHECK(cu_result(d, d->cuCtxGetId(ctx, &id), "cuCtxGetId", v));
  return hetccl_rtc_cache_get(&cache, id, v, kernel_build, (void *)n, out);
}

ncclResult_t hetccl_cuda_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                      const void *b, size_t count, unsigned flags, void *stream) {
  const nvrtc_lib_t *n = nvrtc_get();
  const cu_driver_t *d = n ? driver_get() : NULL;
  if (!n || !d) return ncclInvalidUsage; /* no WARN: the caller falls back to the host */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, b == NULL, "hetccl_cuda_reduce_async", &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(n, d, &v, &e)); /* count 0 too: it loads the kernel ahead */
  if (count == 0) return ncclSuccess;
  if (!b) b = a; /* unary: the kernel never reads it; the plan aligns on it */
  hetccl_rtc_launch_t l;
  hetccl_rtc_plan(op, dst, a, b, count, e->units, &l);
  return cu_result(d, d->cuLaunchKernel(e->function, l.grid, 1, 1, l.block, 1, 1, 0, stream,
                                        l.params, NULL),
                   "cuLaunchKernel", &v);
}

ncclResult_t hetccl_cuda_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                          const hetccl_reduce_run_t *run, void *stream) {
  const nvrtc_lib_t *n = nvrtc_get();
  const cu_driver_t *d = n ? driver_get() : NULL;
  if (!n || !d) return ncclInvalidUsage; /* no WARN: as reduce_async */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, 0, "hetccl_cuda_reduce_run_async", &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(n, d, &v, &e));
  if (run->steps == 0) return ncclSuccess;
  hetccl_rtc_run_launch_t l;
  hetccl_rtc_plan_run(op, run, &l);
  return cu_result(d, d->cuLaunchKernel(e->run_function, l.grid, 1, 1, l.block, 1, 1, 0, stream,
                                        l.params, NULL),
                   "cuLaunchKernel", &v);
}

ncclResult_t hetccl_rtc_cuda_compile(const hetccl_redop_t *op, unsigned flags, int cc,
                                     size_t *bytes, char *target, size_t tlen) {
  const nvrtc_lib_t *n = nvrtc_get();
  if (!n) return ncclInvalidUsage;
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, 0, "hetccl_rtc_cuda_compile", &v));
  char *image = NULL;
  HETCCL_CHECK(nvrtc_compile(n, &v, cc, &image, bytes, target, tlen));
  free(image);
  return ncclSuccess;
}
