/* Run-time compiled reduction kernels: what the CUDA (rtc_cuda.c) and HIP
 * (rtc_hip.c) entries of devreduce.h share. Vendor calls live in those two
 * files; this one knows no vendor API.
 *
 *   variant   which specialisation of the kernel an op and flags need, and
 *             its -D options for the compiler;
 *   plan      the launch: vector part, scalar head and tail, grid, and the
 *             kernel's parameters;
 *   cache     compiled kernels, found without a lock, added under one;
 *   search    opening a runtime compiler from a list of candidates,
 *             remembering what was tried.
 *
 * Threads: any; the cache is the only shared state. */
#ifndef HETCCL_RUNTIME_RTC_H
#define HETCCL_RUNTIME_RTC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "runtime/devreduce.h"
#include "runtime/reduce.h"
#include "runtime/runtime.h"

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

/* For tests (rtc_cuda.c): compile (op, flags) for compute capability cc
 * (10 * major + minor) with no device, the code's size in *bytes and what
 * it was compiled for in target. ncclInvalidUsage when there is no NVRTC. */
ncclResult_t hetccl_rtc_cuda_compile(const hetccl_redop_t *op, unsigned flags, int cc,
                                     size_t *bytes, char *target, size_t tlen);

#endif
