/* Device reductions on HIP devices (devreduce.h): the kernel text of
 * reduce_kernel.c (with -DHETCCL_HIP) compiled by hipRTC for the current
 * device, loaded there with hipModuleLoadData, launched on the caller's
 * stream. Untested on hardware so far: the CUDA twin, rtc_cuda.c, is the
 * one with a GPU test; keep the two alike.
 *
 * Nothing here links HIP. Two libraries are used only through dlsym:
 *   libhiprtc      the runtime compiler, loaded here (once per process);
 *   libamdhip64    the HIP runtime the process already loaded (RTLD_NOLOAD:
 *                  never loaded or initialised from here).
 *
 * Where hipRTC is looked for (the first that opens wins):
 *   1. HETCCL_HIPRTC_LIBRARY, a path or a name; when set it is the only
 *      candidate, and "none" turns device reductions off;
 *   2. a libhiprtc the process has already loaded;
 *   3. the sonames libhiprtc.so.7, .6, .5, libhiprtc.so;
 *   4. the directory the loaded libamdhip64 came from, then /opt/rocm/lib.
 * A failed search is remembered, not retried.
 *
 * Target: the gcnArchName of the current device ("gfx90a:sramecc+:xnack-")
 * as --offload-arch. hipDeviceProp_t changed layout between ROCm 5 and 6
 * and the field's offset with it, so the name is found by content: the one
 * text in the structure that starts with "gfx" (preferring one with target
 * features). Without it, hipRTC picks the current device itself.
 * -ffp-contract=off and -fno-gpu-flush-denormals-to-zero: the results must
 * be the host's, bit for bit (HIP contracts by default, and flushes fp32
 * denormals on some targets).
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic; kernels are cached per (device, variant), one compile at a time. */
#include <ctype.h>
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

/* --- the few hipRTC and HIP facts we need (public HIP API) ------------------ */

typedef int hiprtcResult; /* HIPRTC_SUCCESS = 0 */
typedef void *hiprtcProgram;
typedef int hipError_t;   /* hipSuccess = 0 */
typedef void *hipModule_t;
typedef void *hipFunction_t;

enum { HIPRTC_SUCCESS = 0, hipSuccess = 0 };
#define PROPS_BYTES 16384 /* more than any hipDeviceProp_t so far (about 1.5 KiB) */

#define HIPRTC_FNS(X)                                                                             \
  X(hiprtcGetErrorString, const char *, (hiprtcResult r))                                         \
  X(hiprtcVersion, hiprtcResult, (int *major, int *minor))                                        \
  X(hiprtcCreateProgram, hiprtcResult,                                                            \
    (hiprtcProgram * prog, const char *src, const char *name, int nheaders,                       \
     const char **headers, const char **include_names))                                           \
  X(hiprtcDestroyProgram, hiprtcResult, (hiprtcProgram * prog))                                   \
  X(hiprtcCompileProgram, hiprtcResult, (hiprtcProgram prog, int nopts, const char **opts))       \
  X(hiprtcGetProgramLogSize, hiprtcResult, (hiprtcProgram prog, size_t *bytes))                   \
  X(hiprtcGetProgramLog, hiprtcResult, (hiprtcProgram prog, char *log))                           \
  X(hiprtcGetCodeSize, hiprtcResult, (hiprtcProgram prog, size_t *bytes))                         \
  X(hiprtcGetCode, hiprtcResult, (hiprtcProgram prog, char *code))

#define HIP_FNS(X)                                                                                \
  X(hipGetErrorString, const char *, (hipError_t err))                                            \
  X(hipGetLastError, hipError_t, (void))                                                          \
  X(hipGetDevice, hipError_t, (int *dev))                                                         \
  X(hipModuleLoadData, hipError_t, (hipModule_t * module, const void *image))                     \
  X(hipModuleGetFunction, hipError_t, (hipFunction_t * fn, hipModule_t module, const char *name)) \
  X(hipModuleUnload, hipError_t, (hipModule_t module))                                            \
  X(hipModuleLaunchKernel, hipError_t,                                                            \
    (hipFunction_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,           \
     unsigned bz, unsigned shared_bytes, void *stream, void **params, void **extra))

#define FN_FIELD(name, ret, params) ret(*name) params;

typedef struct {
  void *handle;
  char path[512];
  int major, minor;
  HIPRTC_FNS(FN_FIELD)
} hiprtc_lib_t;

typedef struct {
  void *handle;
  HIP_FNS(FN_FIELD)
  /* ROCm 6 names the current layout of the properties R0600; ROCm 5 has
   * only the plain name. */
  hipError_t (*get_props)(void *props, int dev);
} hip_lib_t;

#undef FN_FIELD

static hiprtc_lib_t rtc;
static hip_lib_t hip;
static int rtc_state;          /* 0 not looked for, 1 loaded, -1 not available (atomic) */
static hip_lib_t *hip_ready;   /* published (atomic) once hip is filled */
static char rtc_why[1536];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static hetccl_rtc_cache_t cache = HETCCL_RTC_CACHE_INIT;

static const char *const rtc_names[] = {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5",
                                        "libhiprtc.so"};
#define NRTC_NAMES (sizeof(rtc_names) / sizeof(rtc_names[0]))
static const char *const hip_names[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                        "libamdhip64.so.5"};

/* --- finding hipRTC and HIP ---------------------------------------------------- */

static int rtc_fill(void *h) {
  hetccl_gpu_where_loaded(dlsym(h, "hiprtcVersion"), rtc.path, sizeof(rtc.path), "libhiprtc");
#define FN_TAKE(fn, ret, params)                                                                  \
  *(void **)&rtc.fn = dlsym(h, #fn);                                                              \
  if (!rtc.fn) {                                                                                  \
    snprintf(rtc_why, sizeof(rtc_why), "%s lacks %s", rtc.path, #fn);                             \
    return 0;                                                                                     \
  }
  HIPRTC_FNS(FN_TAKE)
#undef FN_TAKE
  if (rtc.hiprtcVersion(&rtc.major, &rtc.minor) != HIPRTC_SUCCESS) {
    snprintf(rtc_why, sizeof(rtc_why), "%s: hiprtcVersion failed", rtc.path);
    return 0;
  }
  rtc.handle = h;
  return 1;
}

/* Steps 3 and 4 of the search; tried collects what failed. */
static void *rtc_search(char *tried, size_t len) {
  void *h = NULL;
  for (size_t i = 0; !h && i < NRTC_NAMES; i++) h = hetccl_rtc_open(rtc_names[i], 0, tried, len);
  char amdhip[512] = "", dir[512];
  void *rt = hetccl_gpu_open_loaded(hip_names, sizeof(hip_names) / sizeof(hip_names[0]),
                                    "libamdhip64.so");
  if (rt) {
    hetccl_gpu_where_loaded(dlsym(rt, "hipGetDevice"), amdhip, sizeof(amdhip), "");
    dlclose(rt);
  }
  hetccl_rtc_dirname(amdhip, dir, sizeof(dir));
  if (!h) h = hetccl_rtc_open_in(dir, rtc_names, NRTC_NAMES, tried, len);
  if (!h) h = hetccl_rtc_open_in("/opt/rocm/lib", rtc_names, NRTC_NAMES, tried, len);
  return h;
}

static void *rtc_open(void) {
  const char *knob = hetccl_knob_str(HETCCL_KNOB_HIPRTC_LIBRARY);
  if (strcmp(knob, "none") == 0) {
    snprintf(rtc_why, sizeof(rtc_why), "disabled by HETCCL_HIPRTC_LIBRARY=none");
    return NULL;
  }
  if (knob[0]) {
    void *h = dlopen(knob, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(rtc_why, sizeof(rtc_why), "HETCCL_HIPRTC_LIBRARY=%s: %s", knob, dlerror());
    return h;
  }
  void *h = hetccl_gpu_open_loaded(rtc_names, NRTC_NAMES, "libhiprtc.so");
  if (h) return h;
  char tried[1280] = "";
  h = rtc_search(tried, sizeof(tried));
  if (!h) snprintf(rtc_why, sizeof(rtc_why), "no hipRTC found (tried %s); set "
                   "HETCCL_HIPRTC_LIBRARY", tried);
  return h;
}

static const hiprtc_lib_t *rtc_get(void) {
  int s = __atomic_load_n(&rtc_state, __ATOMIC_ACQUIRE);
  if (s) return s > 0 ? &rtc : NULL;
  pthread_mutex_lock(&load_lock);
  if (!rtc_state) {
    void *h = rtc_open();
    if (h && !rtc_fill(h)) {
      dlclose(h);
      h = NULL;
    }
    if (h) INFO(HETCCL_RUNTIME, "hip: hipRTC %d.%d from %s", rtc.major, rtc.minor, rtc.path);
    else INFO(HETCCL_RUNTIME, "hip: no device reductions: %s", rtc_why);
    __atomic_store_n(&rtc_state, h ? 1 : -1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&load_lock);
  return rtc_state > 0 ? &rtc : NULL;
}

/* The HIP runtime the process loaded; NULL while there is none. */
static const hip_lib_t *hip_get(void) {
  hip_lib_t *r = __atomic_load_n(&hip_ready, __ATOMIC_ACQUIRE);
  if (r) return r;
  pthread_mutex_lock(&load_lock);
  if (!hip_ready) {
    void *h = hetccl_gpu_open_loaded(hip_names, sizeof(hip_names) / sizeof(hip_names[0]),
                                     "libamdhip64.so");
    int ok = h != NULL;
#define FN_TAKE(fn, ret, params) \
  if (ok && !(*(void **)&hip.fn = dlsym(h, #fn))) ok = 0;
    HIP_FNS(FN_TAKE)
#undef FN_TAKE
    if (ok) {
      *(void **)&hip.get_props = dlsym(h, "hipGetDevicePropertiesR0600");
      if (!hip.get_props) *(void **)&hip.get_props = dlsym(h, "hipGetDeviceProperties");
      hip.handle = h;
      __atomic_store_n(&hip_ready, &hip, __ATOMIC_RELEASE);
    } else if (h) {
      dlclose(h);
    }
  }
  pthread_mutex_unlock(&load_lock);
  return hip_ready;
}

int hetccl_hip_reduce_available(char *why, size_t len) {
  const hiprtc_lib_t *n = rtc_get();
  const hip_lib_t *h = n ? hip_get() : NULL;
  if (why && len) {
    if (!n) snprintf(why, len, "%s", rtc_why);
    else if (!h) snprintf(why, len, "the HIP runtime (libamdhip64) is not loaded in this process");
    else snprintf(why, len, "hipRTC %d.%d from %s", n->major, n->minor, n->path);
  }
  return n && h;
}

/* --- compiling and loading ---------------------------------------------------- */

static ncclResult_t hip_result(const hip_lib_t *h, hipError_t err, const char *call,
                               const hetccl_rtc_variant_t *v) {
  if (err == hipSuccess) return ncclSuccess;
  const char *text = h->hipGetErrorString(err);
  h->hipGetLastError(); /* the error was ours: leave none for the application */
  char name[96];
  hetccl_rtc_variant_name(v, name, sizeof(name));
  WARN("hip: %s failed for the reduce kernel %s: %s (error %d)", call, name,
       text ? text : "unknown error", err);
  return ncclUnhandledCudaError;
}

static ncclResult_t rtc_result(const hiprtc_lib_t *n, hiprtcResult r, const char *call,
                               const hetccl_rtc_variant_t *v, const char *target,
                               hiprtcProgram p) {
  if (r == HIPRTC_SUCCESS) return ncclSuccess;
  char name[96], log[1024] = "";
  hetccl_rtc_variant_name(v, name, sizeof(name));
  size_t bytes = 0;
  char *text = p && n->hiprtcGetProgramLogSize(p, &bytes) == HIPRTC_SUCCESS && bytes > 1
                   ? malloc(bytes) : NULL;
  if (text && n->hiprtcGetProgramLog(p, text) == HIPRTC_SUCCESS) snprintf(log, sizeof(log), "%s", text);
  free(text);
  for (size_t end = strlen(log); end && (log[end - 1] == '\n' || log[end - 1] == ' ');) log[--end] = '\0';
  WARN("hip: %s failed for the reduce kernel %s (%s, hipRTC %d.%d from %s): %s%s%s", call, name,
       target, n->major, n->minor, n->path, n->hiprtcGetErrorString(r), log[0] ? ": " : "", log);
  return ncclUnhandledCudaError;
}

static int arch_char(char c) { return isalnum((unsigned char)c) || c == ':' || c == '+' || c == '-' || c == '_'; }

/* The device's gcnArchName, found by content (see the top); "" if none. */
static void device_arch(const hip_lib_t *h, int dev, char *out, size_t len) {
  out[0] = '\0';
  unsigned char *props = h->get_props ? calloc(1, PROPS_BYTES) : NULL;
  if (!props) return;
  if (h->get_props(props, dev) == hipSuccess) {
    for (size_t i = 0; i + 3 < PROPS_BYTES; i++) {
      if (memcmp(props + i, "gfx", 3) != 0 || (i && props[i - 1])) continue;
      size_t n = 3;
      while (i + n < PROPS_BYTES && arch_char((char)props[i + n])) n++;
      if (i + n == PROPS_BYTES || props[i + n] || n >= len) continue;
      int features = memchr(props + i, ':', n) != NULL;
      if (!out[0] || (features && !strchr(out, ':'))) snprintf(out, len, "%.*s", (int)n, props + i);
      i += n;
    }
  } else {
    h->hipGetLastError();
  }
  free(props);
}

/* Compile v for arch ("" = hipRTC's choice) into *image (malloc'd). */
static ncclResult_t rtc_compile(const hiprtc_lib_t *n, const hetccl_rtc_variant_t *v,
                                const char *arch, char **image, size_t *bytes) {
  char archopt[128];
  snprintf(archopt, sizeof(archopt), "--offload-arch=%s", arch);
  const char *opts[5 + HETCCL_RTC_MAX_DEFINES] = {"-DHETCCL_HIP", "-ffp-contract=off",
                                                  "-fno-gpu-flush-denormals-to-zero"};
  int nopts = 3;
  if (arch[0]) opts[nopts++] = archopt;
  nopts += (int)hetccl_rtc_defines(v, opts + nopts);
  const char *target = arch[0] ? arch : "current device";
  int version = n->major * 10 + n->minor;
  if (arch[0] && hetccl_rtc_disk_load("hiprtc", arch, version, v, image, bytes))
    return ncclSuccess;
  hiprtcProgram p = NULL;
  HETCCL_CHECK(rtc_result(n, n->hiprtcCreateProgram(&p, hetccl_rtc_kernel_source,
                                                    "hetccl_reduce.hip", 0, NULL, NULL),
                          "hiprtcCreateProgram", v, target, NULL));
  ncclResult_t res;
  HETCCL_CHECK_GOTO(rtc_result(n, n->hiprtcCompileProgram(p, nopts, opts), "hiprtcCompileProgram",
                               v, target, p), res, destroy);
  HETCCL_CHECK_GOTO(rtc_result(n, n->hiprtcGetCodeSize(p, bytes), "hiprtcGetCodeSize", v, target,
                               NULL), res, destroy);
  *image = malloc(*bytes ? *bytes : 1);
  if (!*image) {
    WARN("hip: reduce kernel: out of memory for %zu bytes of code", *bytes);
    res = ncclSystemError;
    goto destroy;
  }
  res = rtc_result(n, n->hiprtcGetCode(p, *image), "hiprtcGetCode", v, target, NULL);
  if (res != ncclSuccess) {
    free(*image);
    *image = NULL;
  } else if (arch[0]) {
    hetccl_rtc_disk_store("hiprtc", arch, version, v, *image, *bytes);
  }
destroy:
  n->hiprtcDestroyProgram(&p);
  return res;
}

/* hetccl_rtc_build_fn: compile v for device dev, load it there. ctx: the
 * hipRTC in use. The number of CUs is not asked (hipDeviceAttribute_t's
 * numbering moved between ROCm versions): the plan's fixed grid cap. */
static ncclResult_t kernel_build(void *ctx, uint64_t dev, const hetccl_rtc_variant_t *v,
                                 hetccl_rtc_entry_t *e) {
  const hiprtc_lib_t *n = ctx;
  const hip_lib_t *h = &hip; /* published: kernel_get's caller had it from hip_get */
  char arch[96], *image = NULL;
  size_t bytes = 0;
  device_arch(h, (int)dev, arch, sizeof(arch));
  double t0 = hetccl_rtc_now_ms();
  HETCCL_CHECK(rtc_compile(n, v, arch, &image, &bytes));
  double t1 = hetccl_rtc_now_ms();
  hipModule_t module = NULL;
  e->units = 0;
  ncclResult_t res = hip_result(h, h->hipModuleLoadData(&module, image), "hipModuleLoadData", v);
  free(image);
  HETCCL_CHECK(res);
  res = hip_result(h, h->hipModuleGetFunction(&e->function, module, HETCCL_RTC_KERNEL_NAME),
                   "hipModuleGetFunction", v);
  if (res == ncclSuccess)
    res = hip_result(h, h->hipModuleGetFunction(&e->run_function, module,
                                                 HETCCL_RTC_RUN_KERNEL_NAME),
                     "hipModuleGetFunction", v);
  if (res != ncclSuccess) {
    h->hipModuleUnload(module);
    return res;
  }
  char name[96];
  hetccl_rtc_variant_name(v, name, sizeof(name));
  INFO(HETCCL_RUNTIME, "hip: reduce kernel %s: compiled for %s by hipRTC %d.%d in %.1f ms "
       "(%zu bytes), loaded in %.1f ms", name, arch[0] ? arch : "the current device", n->major,
       n->minor, t1 - t0, bytes, hetccl_rtc_now_ms() - t1);
  return ncclSuccess;
}

/* The current device's kernel for v; the first call of a (device, variant)
 * pays the compile. */
static ncclResult_t kernel_get(const hiprtc_lib_t *n, const hip_lib_t *h,
                               const hetccl_rtc_variant_t *v, const hetccl_rtc_entry_t **out) {
  int dev = 0;
  HETCCL_CHECK(hip_result(h, h->hipGetDevice(&dev), "hipGetDevice", v));
  return hetccl_rtc_cache_get(&cache, (uint64_t)dev, v, kernel_build, (void *)n, out);
}

ncclResult_t hetccl_hip_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                     const void *b, size_t count, unsigned flags, void *stream) {
  const hiprtc_lib_t *n = rtc_get();
  const hip_lib_t *h = n ? hip_get() : NULL;
  if (!n || !h) return ncclInvalidUsage; /* no WARN: the caller falls back to the host */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, b == NULL, "hetccl_hip_reduce_async", &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(n, h, &v, &e)); /* count 0 too: it loads the kernel ahead */
  if (count == 0) return ncclSuccess;
  if (!b) b = a; /* unary: the kernel never reads it; the plan aligns on it */
  hetccl_rtc_launch_t l;
  hetccl_rtc_plan(op, dst, a, b, count, e->units, &l);
  return hip_result(h, h->hipModuleLaunchKernel(e->function, l.grid, 1, 1, l.block, 1, 1, 0,
                                                stream, l.params, NULL),
                    "hipModuleLaunchKernel", &v);
}

ncclResult_t hetccl_hip_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                         const hetccl_reduce_run_t *run, void *stream) {
  const hiprtc_lib_t *n = rtc_get();
  const hip_lib_t *h = n ? hip_get() : NULL;
  if (!n || !h) return ncclInvalidUsage; /* no WARN: as reduce_async */
  hetccl_rtc_variant_t v;
  HETCCL_CHECK(hetccl_rtc_variant_of(op, flags, 0, "hetccl_hip_reduce_run_async", &v));
  const hetccl_rtc_entry_t *e;
  HETCCL_CHECK(kernel_get(n, h, &v, &e));
  if (run->steps == 0) return ncclSuccess;
  hetccl_rtc_run_launch_t l;
  hetccl_rtc_plan_run(op, run, &l);
  return hip_result(h, h->hipModuleLaunchKernel(e->run_function, l.grid, 1, 1, l.block, 1, 1, 0,
                                                stream, l.params, NULL),
                    "hipModuleLaunchKernel", &v);
}
