/* Run-time compiled reduction kernels: what the CUDA (rtc_cuda.c) and HIP
 * (rtc_hip.c) entries of devreduce.h share. This one knows a vendor only
 * through the table it is given (hetccl_rtc_vendor_t) and its column of
 * the lists of calls both have (HETCCL_RTC_COMPILER_API, _MODULE_API).
 *
 *   variant   which specialisation of the kernel an op and flags need, and
 *             its -D options for the compiler;
 *   plan      the launch: vector part, scalar head and tail, grid, and the
 *             kernel's parameters;
 *   cache     compiled kernels, found without a lock, added under one;
 *   search    opening a runtime compiler from a list of candidates,
 *             remembering what was tried;
 *   entry     the body of both entries: finding the compiler and the
 *             device library, compiling, loading, launching.
 *
 * Threads: any; the cache is the only shared state. */
#ifndef HETCCL_RUNTIME_RTC_H
#define HETCCL_RUNTIME_RTC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "runtime/devreduce.h"
#include "runtime/gpu.h"
#include "runtime/reduce.h"
#include "runtime/runtime.h"
#include "util/knobs.h"

/* The kernel's text (reduce_kernel.c) and its entry point (extern "C"). */
extern const char hetccl_rtc_kernel_source[];
#define HETCCL_RTC_KERNEL_NAME "hetccl_reduce_kernel"
#define HETCCL_RTC_RUN_KERNEL_NAME "hetccl_reduce_run_kernel" /* the resident one */
#define HETCCL_RTC_THREADS 256    /* threads per block */
#define HETCCL_RTC_UNROLL 4       /* the kernel's HK_UNROLL */
#define HETCCL_RTC_BLOCKS_PER_UNIT 8
#define HETCCL_RTC_MAX_BLOCKS 1024 /* when the number of SMs / CUs is unknown */

#define HETCCL_REDUCE_ALL_FLAGS \
  (HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B | HETCCL_REDUCE_FINISH)
/* A variant's own bit: b is NULL, dst[i] = FIN(PRE_A(a[i])) (a PreMulSum
 * rank's data scaled on its way out of the device). */
#define HETCCL_RTC_UNARY 0x100u

typedef struct hetccl_rtc_variant {
  ncclDataType_t dtype;
  hetccl_red_kind_t kind;
  unsigned flags; /* those that do something for this op (no SCALE without premul) */
  int scalar_dev; /* the scalar is read from op->scalar_dev */
} hetccl_rtc_variant_t;

/* The variant that runs (op, flags); ncclInvalidArgument with a WARN naming
 * `who` for a bad type, operator or flag. */
ncclResult_t hetccl_rtc_variant_of(const hetccl_redop_t *op, unsigned flags, int unary,
                                   const char *who, hetccl_rtc_variant_t *v);

/* For logs: "float32 sum +scale_a+scale_b+finish+devscalar". */
void hetccl_rtc_variant_name(const hetccl_rtc_variant_t *v, char *out, size_t len);

/* The -D options that select v in the kernel text (static strings); the
 * number written to out, at most HETCCL_RTC_MAX_DEFINES. */
#define HETCCL_RTC_MAX_DEFINES 8
size_t hetccl_rtc_defines(const hetccl_rtc_variant_t *v, const char **out);

/* The op's scalars, the last four parameters of both kernel entries
 * (hk_scalar_init): scalar_u is the integer scalar, signed ones as their
 * two's complement. */
typedef struct hetccl_rtc_scalars {
  double f;
  uint64_t u;
  const void *dev;
  int nranks;
} hetccl_rtc_scalars_t;

/* One launch: the kernel's parameters (in its order) and the grid. */
typedef struct hetccl_rtc_launch {
  void *dst;
  const void *a, *b;
  uint64_t head;  /* elements before the first 16-byte aligned one */
  uint64_t nvec;  /* 16-byte vectors from there; 0 when a, b, dst disagree on alignment */
  uint64_t count;
  hetccl_rtc_scalars_t s;
  unsigned grid, block;
  void *params[10]; /* pointers to the fields above, for cuLaunchKernel/hipModuleLaunchKernel */
} hetccl_rtc_launch_t;

/* Fill l for count > 0 elements; units is the device's SM / CU count (0:
 * unknown). l must not move afterwards: params point into it. */
void hetccl_rtc_plan(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                     size_t count, int units, hetccl_rtc_launch_t *l);

/* One resident launch: the run (runtime.h) and the op's scalars, with
 * the kernel's parameters pointing into them in its order. */
typedef struct hetccl_rtc_run_launch {
  hetccl_reduce_run_t r; /* dep_slots at least 1 */
  hetccl_rtc_scalars_t s;
  unsigned grid, block;
  void *params[23];
} hetccl_rtc_run_launch_t;

/* Fill l for run; l must not move afterwards. */
void hetccl_rtc_plan_run(const hetccl_redop_t *op, const hetccl_reduce_run_t *run,
                         hetccl_rtc_run_launch_t *l);

/* Compiled kernels of one vendor, keyed by where they were loaded (a
 * context id, a device) and variant. Entries are never removed: a module
 * lives as long as its context. */
typedef struct hetccl_rtc_entry {
  struct hetccl_rtc_entry *next;
  uint64_t where;
  hetccl_rtc_variant_t v;
  void *function; /* CUfunction / hipFunction_t */
  void *run_function; /* the resident kernel of the same module */
  int units;      /* SMs / CUs of the device it was loaded on (0: unknown) */
} hetccl_rtc_entry_t;

typedef struct hetccl_rtc_cache {
  hetccl_rtc_entry_t *head;   /* published with release stores */
  pthread_mutex_t compile;    /* held while compiling: one compile at a time */
} hetccl_rtc_cache_t;

#define HETCCL_RTC_CACHE_INIT {NULL, PTHREAD_MUTEX_INITIALIZER}

/* The entry for (where, v), or NULL; no lock. */
const hetccl_rtc_entry_t *hetccl_rtc_cache_find(hetccl_rtc_cache_t *c, uint64_t where,
                                                const hetccl_rtc_variant_t *v);
/* Builds (compiles and loads) the kernel for (where, v) into *e; called
 * with c->compile held, one build at a time. */
typedef ncclResult_t (*hetccl_rtc_build_fn)(void *ctx, uint64_t where,
                                            const hetccl_rtc_variant_t *v, hetccl_rtc_entry_t *e);

/* The entry for (where, v), built and published by build on first use:
 * the first call of a (where, variant) pays the compile. */
ncclResult_t hetccl_rtc_cache_get(hetccl_rtc_cache_t *c, uint64_t where,
                                  const hetccl_rtc_variant_t *v, hetccl_rtc_build_fn build,
                                  void *ctx, const hetccl_rtc_entry_t **out);

/* Open path (RTLD_NOW | RTLD_LOCAL, or only if already loaded); on failure
 * append path to tried ("a, b, c"). */
void *hetccl_rtc_open(const char *path, int noload, char *tried, size_t len);

/* dir/name of each name under dir (dir "" or NULL: nothing); the first that opens. */
void *hetccl_rtc_open_in(const char *dir, const char *const *names, size_t n, char *tried,
                         size_t len);

/* The directory part of file ("" when it has none); out may be file. */
void hetccl_rtc_dirname(const char *file, char *out, size_t len);

/* Compiled images on disk (rtc_disk.c): load one (1, a malloc'd *image)
 * or 0 on a miss; store one (failures only logged). version: the
 * compiler's (10 * major + minor). */
int hetccl_rtc_disk_load(const char *vendor, const char *target, int version,
                         const hetccl_rtc_variant_t *v, char **image, size_t *bytes);
void hetccl_rtc_disk_store(const char *vendor, const char *target, int version,
                           const hetccl_rtc_variant_t *v, const char *image, size_t bytes);

/* Milliseconds since an arbitrary point (compile timings). */
double hetccl_rtc_now_ms(void);

/* --- entry: the body of rtc_cuda.c and rtc_hip.c ------------------------------
 * Two libraries per vendor, used only through dlsym on their handles: the
 * runtime compiler, loaded here (once per process), and the device library
 * the process already loaded (the CUDA driver, the HIP runtime), never
 * loaded or initialised from here, looked for again until it is found. */

/* X(slot, return, params, CUDA's name, HIP's name): the compiler's calls,
 * alike in NVRTC and hipRTC but for names (nvrtcGetPTX is hiprtcGetCode);
 * 0 is success. */
#define HETCCL_RTC_COMPILER_API(X)                                                                \
  X(get_error_string, const char *, (int r), nvrtcGetErrorString, hiprtcGetErrorString)           \
  X(version, int, (int *major, int *minor), nvrtcVersion, hiprtcVersion)                          \
  X(create_program, int,                                                                          \
    (void **prog, const char *src, const char *name, int nheaders, const char *const *headers,    \
     const char *const *include_names),                                                           \
    nvrtcCreateProgram, hiprtcCreateProgram)                                                      \
  X(destroy_program, int, (void **prog), nvrtcDestroyProgram, hiprtcDestroyProgram)               \
  X(compile_program, int,                                                                         \
    (void *prog, int nopts, const char *const *opts),                                             \
    nvrtcCompileProgram, hiprtcCompileProgram)                                                    \
  X(get_program_log_size, int,                                                                    \
    (void *prog, size_t *bytes),                                                                  \
    nvrtcGetProgramLogSize, hiprtcGetProgramLogSize)                                              \
  X(get_program_log, int, (void *prog, char *log), nvrtcGetProgramLog, hiprtcGetProgramLog)       \
  X(get_code_size, int, (void *prog, size_t *bytes), nvrtcGetPTXSize, hiprtcGetCodeSize)          \
  X(get_code, int, (void *prog, char *code), nvrtcGetPTX, hiprtcGetCode)

/* X(slot, return, params, CUDA's name, HIP's name): the device library's
 * module calls (the CUDA driver's, the HIP runtime's). */
#define HETCCL_RTC_MODULE_API(X)                                                                  \
  X(module_load_data, int,                                                                        \
    (void **module, const void *image),                                                           \
    cuModuleLoadData, hipModuleLoadData)                                                          \
  X(module_get_function, int,                                                                     \
    (void **fn, void *module, const char *name),                                                  \
    cuModuleGetFunction, hipModuleGetFunction)                                                    \
  X(module_unload, int, (void *module), cuModuleUnload, hipModuleUnload)                          \
  X(launch_kernel, int,                                                                           \
    (void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,      \
     unsigned shared_bytes, void *stream, void **params, void **extra),                           \
    cuLaunchKernel, hipModuleLaunchKernel)

#define HETCCL_RTC_FN_FIELD(slot, ret, params, cuda, hip) ret(*slot) params;
#define HETCCL_RTC_NAME_FIELD(slot, ret, params, cuda, hip) const char *slot;
typedef struct { HETCCL_RTC_COMPILER_API(HETCCL_RTC_FN_FIELD) } hetccl_rtc_compiler_api_t;
typedef struct { HETCCL_RTC_COMPILER_API(HETCCL_RTC_NAME_FIELD) } hetccl_rtc_compiler_names_t;
typedef struct { HETCCL_RTC_MODULE_API(HETCCL_RTC_FN_FIELD) } hetccl_rtc_module_api_t;
typedef struct { HETCCL_RTC_MODULE_API(HETCCL_RTC_NAME_FIELD) } hetccl_rtc_module_names_t;
#undef HETCCL_RTC_FN_FIELD
#undef HETCCL_RTC_NAME_FIELD

/* A vendor's column of one of the two lists above, as the initializer of
 * its names: HETCCL_RTC_NAMES(COMPILER, CUDA) are NVRTC's,
 * HETCCL_RTC_NAMES(MODULE, HIP) the HIP runtime's module calls. */
#define HETCCL_RTC_NAME_CUDA(slot, ret, params, cuda, hip) .slot = #cuda,
#define HETCCL_RTC_NAME_HIP(slot, ret, params, cuda, hip) .slot = #hip,
#define HETCCL_RTC_NAMES(list, vendor) {HETCCL_RTC_##list##_API(HETCCL_RTC_NAME_##vendor)}

/* How to compile one variant: the vendor fills it for the device. */
#define HETCCL_RTC_MAX_OPTS (5 + HETCCL_RTC_MAX_DEFINES)
typedef struct hetccl_rtc_compile_args {
  const char *opts[HETCCL_RTC_MAX_OPTS]; /* the compiler's options, the variant's -D included */
  int nopts;
  char option[128];  /* room for an option that names the target */
  char target[96];   /* what it compiles for, in messages ("sm_90", "gfx90a", "current device") */
  int cached;        /* 1: images for target are kept on disk (rtc_disk.c) */
  /* Which code to take from the program, and the names of the two calls
   * in messages. */
  int (*size)(void *prog, size_t *bytes);
  int (*get)(void *prog, char *code);
  const char *size_call, *get_call;
} hetccl_rtc_compile_args_t;

typedef struct hetccl_rtc hetccl_rtc_t;

typedef struct hetccl_rtc_vendor {
  const char *tag;         /* "cuda": the first word of its messages */
  const char *compiler;    /* "NVRTC" */
  const char *disk_name;   /* "nvrtc": its images' names on disk */
  const char *source_name; /* the program's name ("hetccl_reduce.cu") */
  /* Where the compiler is looked for (the first that opens wins): the
   * knob, a path or a name, the only candidate when set ("none": no device
   * reductions); a library of one of names (or a mapped file starting with
   * prefix) the process has already loaded; then search, which appends
   * what failed to tried. fallback_path: its path where dladdr cannot tell. */
  hetccl_knob_t knob;
  const char *const *names;
  size_t nnames;
  const char *prefix;
  const char *fallback_path;
  void *(*search)(char *tried, size_t len);
  hetccl_rtc_compiler_names_t compiler_calls;
  const hetccl_gpu_sym_t *compiler_own; /* calls of its own (the vendor keeps where they go) */
  size_t ncompiler_own;
  /* The device library: the process's own (names, prefix as above). */
  const char *const *dev_names;
  size_t ndev_names;
  const char *dev_prefix;
  hetccl_rtc_module_names_t module_calls;
  const hetccl_gpu_sym_t *dev_own;
  size_t ndev_own;
  const char *dev_absent; /* reduce_available's why while it is not loaded */
  /* The device library's text for err; clears its last error where it
   * keeps one. */
  const char *(*error_text)(int err);
  /* The cache key of where the current thread's kernels load (a context's
   * id, a device), WARNing when there is none. */
  ncclResult_t (*where)(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v, uint64_t *where);
  /* Compiles and loads a variant for where (ctx: the hetccl_rtc_t). */
  hetccl_rtc_build_fn build;
  const char *async_who, *run_who; /* reduce_async's and reduce_run_async's names */
} hetccl_rtc_vendor_t;

/* One vendor's compiler, device library and kernels. Defined by the
 * vendor's file with HETCCL_RTC_INIT. */
struct hetccl_rtc {
  const hetccl_rtc_vendor_t *vendor;
  pthread_mutex_t lock; /* serialises loading */
  hetccl_rtc_cache_t cache;
  /* The compiler: read-only once state is 1. */
  void *handle;
  char path[512];
  int major, minor;
  hetccl_rtc_compiler_api_t cc;
  int state;      /* 0 not looked for, 1 loaded, -1 not available (atomic) */
  char why[1536]; /* why not */
  /* The device library: read-only once published. */
  void *dev_handle;
  hetccl_rtc_module_api_t mod;
  hetccl_rtc_t *dev_ready; /* this, published (atomic) once mod is filled */
};

#define HETCCL_RTC_INIT(vendor_)                                                                  \
  {.vendor = (vendor_), .lock = PTHREAD_MUTEX_INITIALIZER, .cache = HETCCL_RTC_CACHE_INIT}

/* The compiler, looked for once; NULL when there is none (why in r->why). */
const hetccl_rtc_t *hetccl_rtc_compiler(hetccl_rtc_t *r);

/* reduce_available (devreduce.h) of the vendor. */
int hetccl_rtc_available(hetccl_rtc_t *r, char *why, size_t len);

/* The one adapter from the device library's error to ours. */
ncclResult_t hetccl_rtc_device_result(const hetccl_rtc_t *r, int err, const char *call,
                                      const hetccl_rtc_variant_t *v);

/* Compile v as a says into *image (malloc'd), or read it from the disk. */
ncclResult_t hetccl_rtc_compile(const hetccl_rtc_t *r, const hetccl_rtc_variant_t *v,
                                const hetccl_rtc_compile_args_t *a, char **image, size_t *bytes);

/* Compile v as a says and load it in the current context or device into e;
 * units: its SM / CU count (0: unknown). The body of a vendor's build. */
ncclResult_t hetccl_rtc_build(hetccl_rtc_t *r, const hetccl_rtc_variant_t *v,
                              const hetccl_rtc_compile_args_t *a, int units, hetccl_rtc_entry_t *e);

/* reduce_async and reduce_run_async (devreduce.h) of the vendor. */
ncclResult_t hetccl_rtc_reduce_async(hetccl_rtc_t *r, const hetccl_redop_t *op, void *dst,
                                     const void *a, const void *b, size_t count, unsigned flags,
                                     void *stream);
ncclResult_t hetccl_rtc_reduce_run_async(hetccl_rtc_t *r, const hetccl_redop_t *op,
                                         unsigned flags, const hetccl_reduce_run_t *run,
                                         void *stream);

/* For tests (rtc_cuda.c): compile (op, flags) for compute capability cc
 * (10 * major + minor) with no device, the code's size in *bytes and what
 * it was compiled for in target. ncclInvalidUsage when there is no NVRTC. */
ncclResult_t hetccl_rtc_cuda_compile(const hetccl_redop_t *op, unsigned flags, int cc,
                                     size_t *bytes, char *target, size_t tlen);

#endif
