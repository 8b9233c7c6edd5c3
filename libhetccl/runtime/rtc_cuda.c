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
 * What is done as for HIP (finding the compiler, compiling, loading,
 * launching) is rtc.c's, over the names and hooks below.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic; kernels are cached per (context, variant) in rtc.c's cache, one
 * compile at a time. */
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

enum { NVRTC_SUCCESS = 0, CUDA_SUCCESS = 0 };
enum {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

/* X(name, return, params, optional): NVRTC's calls of its own, all
 * optional: cubin output (11.1) and the architectures it knows (11.2). The
 * shared ones (all in NVRTC 11.0) are rtc.h's. */
#define NVRTC_OWN_FNS(X)                                                                          \
  X(nvrtcGetCUBINSize, nvrtcResult, (nvrtcProgram prog, size_t *bytes), 1)                        \
  X(nvrtcGetCUBIN, nvrtcResult, (nvrtcProgram prog, char *cubin), 1)                              \
  X(nvrtcGetNumSupportedArchs, nvrtcResult, (int *n), 1)                                          \
  X(nvrtcGetSupportedArchs, nvrtcResult, (int *archs), 1)

/* X(name, return, params, optional): the driver's calls besides the module
 * ones. None of these has a _v2 ABI in cuda.h (cuCtxGetDevice_v2 of CUDA 13
 * is another call, with a context argument; the plain name keeps the
 * one-argument ABI). cuCtxGetId (CUDA 12.0, optional): a context's unique
 * id, so that a new context at a freed one's address does not find the old
 * one's kernels. */
#define DRIVER_FNS(X)                                                                             \
  X(cuGetErrorString, CUresult, (CUresult err, const char **str), 0)                              \
  X(cuCtxGetCurrent, CUresult, (CUcontext * ctx), 0)                                              \
  X(cuCtxGetDevice, CUresult, (CUdevice * dev), 0)                                                \
  X(cuDeviceGetAttribute, CUresult, (int *value, int attribute, CUdevice dev), 0)                 \
  X(cuCtxGetId, CUresult, (CUcontext ctx, unsigned long long *id), 1)

static struct { NVRTC_OWN_FNS(HETCCL_GPU_SYM_FIELD) } nvrtc_own;
static struct { DRIVER_FNS(HETCCL_GPU_SYM_FIELD) } drv;

static const hetccl_gpu_sym_t nvrtc_syms[] = {
#define NVRTC_SYM(name, ret, params, optional) {#name, (void **)&nvrtc_own.name, optional},
    NVRTC_OWN_FNS(NVRTC_SYM)
#undef NVRTC_SYM
};
static const hetccl_gpu_sym_t driver_syms[] = {
#define DRIVER_SYM(name, ret, params, optional) {#name, (void **)&drv.name, optional},
    DRIVER_FNS(DRIVER_SYM)
#undef DRIVER_SYM
};

static const char *const nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                                          "libnvrtc.so"};
#define NNVRTC_NAMES (sizeof(nvrtc_names) / sizeof(nvrtc_names[0]))
static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
static const char *const driver_names[] = {"libcuda.so.1"};

/* --- finding NVRTC ----------------------------------------------------------- */

/* The file of the libcudart this process loaded ("" if none), and its
 * major version from the file name (0 if it does not say). */
static int cudart_loaded(char *path, size_t len) {
  hetccl_gpu_loaded_file(cudart_names, sizeof(cudart_names) / sizeof(cudart_names[0]),
                         "libcudart.so", "cudaGetDevice", path, len);
  const char *v = strstr(path, "libcudart.so.");
  return v ? atoi(v + strlen("libcudart.so.")) : 0;
}

/* The major version a soname says (libnvrtc.so.12: 12; libnvrtc.so: 0). */
static int soname_major(const char *name) {
  const char *v = strstr(name, ".so.");
  return v ? atoi(v + strlen(".so.")) : 0;
}

/* Steps 3 to 5 of the search; tried collects what failed. */
static void *nvrtc_search(char *tried, size_t len) {
  char cudart[512], dir[640], wheels[512];
  int major = cudart_loaded(cudart, sizeof(cudart));
  void *h = NULL;
  for (size_t i = 0; !h && major && i < NNVRTC_NAMES; i++)
    if (soname_major(nvrtc_names[i]) == major) h = hetccl_rtc_open(nvrtc_names[i], 0, tried, len);
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

/* --- compiling and loading ---------------------------------------------------- */

/* The architecture to compile for (cc = 10 * major + minor): the device's,
 * else, for a device newer than this NVRTC, the newest one it knows, as
 * PTX that the driver compiles further. *cubin: ask NVRTC for a cubin. */
static int target_arch(int cc, int *cubin) {
  int count = 0, archs[256], best = 0;
  *cubin = nvrtc_own.nvrtcGetCUBINSize && nvrtc_own.nvrtcGetCUBIN;
  if (!nvrtc_own.nvrtcGetNumSupportedArchs || !nvrtc_own.nvrtcGetSupportedArchs ||
      nvrtc_own.nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0 || count > 256 ||
      nvrtc_own.nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
    return cc;
  for (int i = 0; i < count; i++) {
    if (archs[i] == cc) return cc;
    if (archs[i] < cc && archs[i] > best) best = archs[i];
  }
  if (!best) return cc; /* older than all NVRTC knows: its compile error says so */
  *cubin = 0;
  return best;
}

/* How to compile v for compute capability cc: a cubin for sm_XY, or PTX
 * for compute_XY; the options that make the results the host's. */
static void compile_args(const hetccl_rtc_t *r, const hetccl_rtc_variant_t *v, int cc,
                         hetccl_rtc_compile_args_t *a) {
  int cubin;
  int arch = target_arch(cc, &cubin);
  snprintf(a->target, sizeof(a->target), "%s_%d", cubin ? "sm" : "compute", arch);
  snprintf(a->option, sizeof(a->option), "--gpu-architecture=%s", a->target);
  const char *fixed[] = {a->option, "--fmad=false", "--prec-div=true", "--prec-sqrt=true",
                         "--ftz=false"};
  memcpy(a->opts, fixed, sizeof(fixed));
  a->nopts = 5 + (int)hetccl_rtc_defines(v, a->opts + 5);
  a->cached = 1;
  a->size = cubin ? nvrtc_own.nvrtcGetCUBINSize : r->cc.get_code_size;
  a->get = cubin ? nvrtc_own.nvrtcGetCUBIN : r->cc.get_code;
  a->size_call = a->get_call = cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX";
}

/* hetccl_rtc_build_fn: compile v for the current context's device and load
 * it there. ctx: the hetccl_rtc_t. */
static ncclResult_t kernel_build(void *ctx, uint64_t id, const hetccl_rtc_variant_t *v,
                                 hetccl_rtc_entry_t *e) {
  hetccl_rtc_t *r = ctx;
  (void)id; /* it names the current context, which is where the module loads */
  CUdevice dev;
  int major = 0, minor = 0, units = 0;
  HETCCL_CHECK(hetccl_rtc_device_result(r, drv.cuCtxGetDevice(&dev), "cuCtxGetDevice", v));
  HETCCL_CHECK(hetccl_rtc_device_result(
      r, drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
      "cuDeviceGetAttribute", v));
  HETCCL_CHECK(hetccl_rtc_device_result(
      r, drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
      "cuDeviceGetAttribute", v));
  HETCCL_CHECK(hetccl_rtc_device_result(
      r, drv.cuDeviceGetAttribute(&units, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
      "cuDeviceGetAttribute", v));
  hetccl_rtc_compile_args_t a;
  compile_args(r, v, major * 10 + minor, &a);
  return hetccl_rtc_build(r, v, &a, units, e);
}

/* Kernels are kept per context: its unique id where the driver has one. */
static ncclResult_t kernel_where(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v, uint64_t *where) {
  CUcontext ctx = NULL;
  HETCCL_CHECK(hetccl_rtc_device_result(r, drv.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent", v));
  if (!ctx) {
    WARN("cuda: device reduction on a thread with no current CUDA context (select a device "
         "first)");
    return ncclUnhandledCudaError;
  }
  unsigned long long id = (uintptr_t)ctx;
  if (drv.cuCtxGetId)
    HETCCL_CHECK(hetccl_rtc_device_result(r, drv.cuCtxGetId(ctx, &id), "cuCtxGetId", v));
  *where = id;
  return ncclSuccess;
}

static const char *driver_error_text(int err) {
  const char *text = NULL;
  drv.cuGetErrorString(err, &text);
  return text;
}

static const hetccl_rtc_vendor_t nvrtc_vendor = {
    .tag = "cuda",
    .compiler = "NVRTC",
    .disk_name = "nvrtc",
    .source_name = "hetccl_reduce.cu",
    .knob = HETCCL_KNOB_NVRTC_LIBRARY,
    .names = nvrtc_names,
    .nnames = NNVRTC_NAMES,
    .prefix = "libnvrtc.so",
    .fallback_path = "libnvrtc",
    .search = nvrtc_search,
    .compiler_calls = HETCCL_RTC_NAMES(COMPILER, CUDA),
    .compiler_own = nvrtc_syms,
    .ncompiler_own = sizeof(nvrtc_syms) / sizeof(nvrtc_syms[0]),
    .dev_names = driver_names,
    .ndev_names = 1,
    .dev_prefix = "libcuda.so",
    .module_calls = HETCCL_RTC_NAMES(MODULE, CUDA),
    .dev_own = driver_syms,
    .ndev_own = sizeof(driver_syms) / sizeof(driver_syms[0]),
    .dev_absent = "the CUDA driver (libcuda.so.1) is not loaded in this process",
    .error_text = driver_error_text,
    .where = kernel_where,
    .build = kernel_build,
    .async_who = "hetccl_cuda_reduce_async",
    .run_who = "hetccl_cuda_reduce_run_async",
};

static hetccl_rtc_t nvrtc = HETCCL_RTC_INIT(&nvrtc_vendor);

int hetccl_cuda_reduce_available(char *why, size_t len) {
  return hetccl_rtc_available(&nvrtc, why, len);
}

ncclResult_t hetccl_cuda_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                      const void *b, size_t count, unsigned flags, void *stream) {
  return hetccl_rtc_reduce_async(&nvrtc, op, dst, a, b, count, flags, stream);
}

ncclResult_t hetccl_cuda_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                          const hetccl_reduce_run_t *run, void *stream) {
  return hetccl_rtc_reduce_run_async(&nvrtc, op, flags, run, stream);
}

ncclResult_t hetccl_rtc_cuda_compile(const hetccl_redop_t *op, unsigned flags, int cc,
                                     size_t *bytes, char *target, size_t tlen) {
  const hetccl_rtc_t *r = hetccl_rtc_compiler(&nvrtc);
  if (!r) return ncclInvalidUsage;
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, 0, "hetccl_rtc_cuda_compile", &v));
  hetccl_rtc_compile_args_t a;
  compile_args(r, &v, cc, &a);
  snprintf(target, tlen, "%s", a.target);
  char *image = NULL;
  HETCCL_CHECK(hetccl_rtc_compile(r, &v, &a, &image, bytes));
  free(image);
  return ncclSuccess;
}
