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
 * What is done as for CUDA (finding the compiler, compiling, loading,
 * launching) is rtc.c's, over the names and hooks below.
 *
 * Threads: any. Loading is serialised by one mutex and published with an
 * atomic; kernels are cached per (device, variant), one compile at a time. */
#include <ctype.h>
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

typedef int hipError_t; /* hipSuccess = 0 */

enum { hipSuccess = 0 };
#define PROPS_BYTES 16384 /* more than any hipDeviceProp_t so far (about 1.5 KiB) */

/* X(name, return, params, optional): the HIP runtime's calls besides the
 * module ones. */
#define HIP_FNS(X)                                                                                \
  X(hipGetErrorString, const char *, (hipError_t err), 0)                                         \
  X(hipGetLastError, hipError_t, (void), 0)                                                       \
  X(hipGetDevice, hipError_t, (int *dev), 0)

static struct {
  HIP_FNS(HETCCL_GPU_SYM_FIELD)
  /* Optional. ROCm 6 names the current layout of the properties R0600;
   * ROCm 5 has only the plain name. */
  hipError_t (*get_props)(void *props, int dev);
} hip;

static const hetccl_gpu_sym_t hip_syms[] = {
#define HIP_SYM(name, ret, params, optional) {#name, (void **)&hip.name, optional},
    HIP_FNS(HIP_SYM)
#undef HIP_SYM
    {"hipGetDevicePropertiesR0600", (void **)&hip.get_props, 1},
    {"hipGetDeviceProperties", (void **)&hip.get_props, 1},
};

static const char *const rtc_names[] = {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5",
                                        "libhiprtc.so"};
#define NRTC_NAMES (sizeof(rtc_names) / sizeof(rtc_names[0]))
static const char *const hip_names[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                        "libamdhip64.so.5"};
#define NHIP_NAMES (sizeof(hip_names) / sizeof(hip_names[0]))

/* --- finding hipRTC ------------------------------------------------------------ */

/* Steps 3 and 4 of the search; tried collects what failed. */
static void *rtc_search(char *tried, size_t len) {
  void *h = NULL;
  for (size_t i = 0; !h && i < NRTC_NAMES; i++) h = hetccl_rtc_open(rtc_names[i], 0, tried, len);
  char amdhip[512] = "", dir[512];
  hetccl_gpu_loaded_file(hip_names, NHIP_NAMES, "libamdhip64.so", "hipGetDevice", amdhip,
                         sizeof(amdhip));
  hetccl_rtc_dirname(amdhip, dir, sizeof(dir));
  if (!h) h = hetccl_rtc_open_in(dir, rtc_names, NRTC_NAMES, tried, len);
  if (!h) h = hetccl_rtc_open_in("/opt/rocm/lib", rtc_names, NRTC_NAMES, tried, len);
  return h;
}

/* --- compiling and loading ---------------------------------------------------- */

static int arch_char(char c) { return isalnum((unsigned char)c) || c == ':' || c == '+' || c == '-' || c == '_'; }

/* The device's gcnArchName, found by content (see the top); "" if none. */
static void device_arch(int dev, char *out, size_t len) {
  out[0] = '\0';
  unsigned char *props = hip.get_props ? calloc(1, PROPS_BYTES) : NULL;
  if (!props) return;
  if (hip.get_props(props, dev) == hipSuccess) {
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
    hip.hipGetLastError();
  }
  free(props);
}

/* How to compile v for arch ("": hipRTC's choice, the current device,
 * which the disk cache cannot name). */
static void compile_args(const hetccl_rtc_t *r, const hetccl_rtc_variant_t *v, const char *arch,
                         hetccl_rtc_compile_args_t *a) {
  snprintf(a->option, sizeof(a->option), "--offload-arch=%s", arch);
  const char *fixed[] = {"-DHETCCL_HIP", "-ffp-contract=off", "-fno-gpu-flush-denormals-to-zero"};
  memcpy(a->opts, fixed, sizeof(fixed));
  a->nopts = 3;
  if (arch[0]) a->opts[a->nopts++] = a->option;
  a->nopts += (int)hetccl_rtc_defines(v, a->opts + a->nopts);
  snprintf(a->target, sizeof(a->target), "%s", arch[0] ? arch : "current device");
  a->cached = arch[0] != '\0';
  a->size = r->cc.get_code_size;
  a->get = r->cc.get_code;
  a->size_call = r->vendor->compiler_calls.get_code_size;
  a->get_call = r->vendor->compiler_calls.get_code;
}

/* hetccl_rtc_build_fn: compile v for device dev, load it there. ctx: the
 * hetccl_rtc_t. The number of CUs is not asked (hipDeviceAttribute_t's
 * numbering moved between ROCm versions): the plan's fixed grid cap. */
static ncclResult_t kernel_build(void *ctx, uint64_t dev, const hetccl_rtc_variant_t *v,
                                 hetccl_rtc_entry_t *e) {
  hetccl_rtc_t *r = ctx;
  char arch[96];
  device_arch((int)dev, arch, sizeof(arch));
  hetccl_rtc_compile_args_t a;
  compile_args(r, v, arch, &a);
  return hetccl_rtc_build(r, v, &a, 0, e);
}

/* Kernels are kept per device. */
static ncclResult_t kernel_where(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v, uint64_t *where) {
  int dev = 0;
  HETCCL_CHECK(hetccl_rtc_device_result(r, hip.hipGetDevice(&dev), "hipGetDevice", v));
  *where = (uint64_t)dev;
  return ncclSuccess;
}

static const char *hip_error_text(int err) {
  const char *text = hip.hipGetErrorString(err);
  hip.hipGetLastError(); /* the error was ours: leave none for the application */
  return text;
}

static const hetccl_rtc_vendor_t hiprtc_vendor = {
    .tag = "hip",
    .compiler = "hipRTC",
    .disk_name = "hiprtc",
    .source_name = "hetccl_reduce.hip",
    .knob = HETCCL_KNOB_HIPRTC_LIBRARY,
    .names = rtc_names,
    .nnames = NRTC_NAMES,
    .prefix = "libhiprtc.so",
    .fallback_path = "libhiprtc",
    .search = rtc_search,
    .compiler_calls = HETCCL_RTC_NAMES(COMPILER, HIP),
    .compiler_own = NULL,
    .ncompiler_own = 0,
    .dev_names = hip_names,
    .ndev_names = NHIP_NAMES,
    .dev_prefix = "libamdhip64.so",
    .module_calls = HETCCL_RTC_NAMES(MODULE, HIP),
    .dev_own = hip_syms,
    .ndev_own = sizeof(hip_syms) / sizeof(hip_syms[0]),
    .dev_absent = "the HIP runtime (libamdhip64) is not loaded in this process",
    .error_text = hip_error_text,
    .where = kernel_where,
    .build = kernel_build,
    .async_who = "hetccl_hip_reduce_async",
    .run_who = "hetccl_hip_reduce_run_async",
};

static hetccl_rtc_t hiprtc = HETCCL_RTC_INIT(&hiprtc_vendor);

int hetccl_hip_reduce_available(char *why, size_t len) {
  return hetccl_rtc_available(&hiprtc, why, len);
}

ncclResult_t hetccl_hip_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                     const void *b, size_t count, unsigned flags, void *stream) {
  return hetccl_rtc_reduce_async(&hiprtc, op, dst, a, b, count, flags, stream);
}

ncclResult_t hetccl_hip_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                         const hetccl_reduce_run_t *run, void *stream) {
  return hetccl_rtc_reduce_run_async(&hiprtc, op, flags, run, stream);
}
