/* Device reductions (runtime/devreduce.h) against the host's (reduce.c),
 * bit for bit.
 *
 *   test_devreduce [gpu]   on CUDA device 0 with NVRTC: every dtype x {sum,
 *                          prod, max, min} x {plain, avg, premul with the
 *                          scalar on the host, premul with the scalar on
 *                          the device} on 1,000,003 elements of random data
 *                          (NaN, Inf, -0, denormals, values at the narrow
 *                          formats' limits), a in device memory, b in mapped
 *                          pinned host memory, dst in device memory, in four
 *                          layouts: aligned, all +1 element, b alone +1 (no
 *                          vectors), in place (dst == a); then small counts
 *                          around the vector width, and fp32 sum bandwidth
 *                          (information only). Prints one line per case.
 *   test_devreduce nortc   HETCCL_NVRTC_LIBRARY / HETCCL_HIPRTC_LIBRARY name
 *                          what cannot be opened (or "none"): available
 *                          says 0 with a reason naming it, reduce_async
 *                          returns ncclInvalidUsage and leaves no error.
 *   test_devreduce search  no knob: either a compiler is found, or the
 *                          reason lists the names and directories tried.
 *   test_devreduce plan    the vendor-neutral part (rtc.c): variants, -D
 *                          options, launch plans for every alignment.
 *   test_devreduce compile every variant compiled by NVRTC for sm_90 with no
 *                          device (skipped without NVRTC).
 *   test_devreduce_emu emu (devreduce_emu.c) the kernel text compiled for the host
 *                          (kernel_emu.cpp) and run one emulated thread at
 *                          a time: every variant and layout against the
 *                          host, on 100,003 elements and small counts.
 * The CUDA runtime is opened with dlopen ($HETCCL_TEST_CUDART, else the
 * usual names, else /usr/local/cuda/lib64). Exit 0 pass, 1 fail, 77 skip. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/devreduce.h"
#include "runtime/reduce.h"
#include "runtime/rtc.h"
#include "runtime/runtime.h"
#include "util/log.h"

#include "devreduce_cases.h"

#define SKIP 77

int failures;


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

const ncclDataType_t all_types[NTYPES] = {
    ncclInt8,    ncclUint8,   ncclInt32,    ncclUint32,     ncclInt64,     ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64,  ncclBfloat16,   ncclFloat8e4m3, ncclFloat8e5m2};
const char *const kind_names[] = {"sum", "prod", "max", "min"};

/* --- nortc, search -------------------------------------------------------------- */

static void mode_nortc(void) {
  char why[2048] = "";
  const char *knob = getenv("HETCCL_NVRTC_LIBRARY");
  EXPECT(hetccl_cuda_reduce_available(why, sizeof(why)) == 0, "available with %s", knob);
  EXPECT(knob && strstr(why, knob), "the reason names %s: %s", knob, why);
  printf("cuda: %s\n", why);
  hetccl_redop_t op = {.dtype = ncclFloat32, .kind = HETCCL_RED_SUM};
  float x[4] = {0};
  hetccl_last_error_clear();
  EXPECT(hetccl_cuda_reduce_async(&op, x, x, x, 4, 0, NULL) == ncclInvalidUsage, "cuda usage");
  EXPECT(hetccl_last_error()[0] == '\0', "cuda left an error: %s", hetccl_last_error());
  knob = getenv("HETCCL_HIPRTC_LIBRARY");
  EXPECT(hetccl_hip_reduce_available(why, sizeof(why)) == 0, "hip available with %s", knob);
  EXPECT(knob && strstr(why, knob), "the reason names %s: %s", knob, why);
  printf("hip: %s\n", why);
  EXPECT(hetccl_hip_reduce_async(&op, x, x, x, 4, 0, NULL) == ncclInvalidUsage, "hip usage");
  EXPECT(hetccl_last_error()[0] == '\0', "hip left an error: %s", hetccl_last_error());
  /* Asking again gives the same answer (remembered, not retried). */
  char again[2048] = "";
  hetccl_cuda_reduce_available(again, sizeof(again));
  hetccl_cuda_reduce_available(why, sizeof(why));
  EXPECT(strcmp(again, why) == 0, "second answer differs: %s / %s", again, why);
}

static void mode_search(void) {
  char why[2048] = "";
  int ok = hetccl_cuda_reduce_available(why, sizeof(why));
  printf("cuda: %d: %s\n", ok, why);
  if (!strstr(why, "NVRTC ")) {
    EXPECT(strstr(why, "libnvrtc.so.13") && strstr(why, "libnvrtc.so.11.2"), "sonames: %s", why);
    EXPECT(strstr(why, "/usr/local/cuda/lib64/libnvrtc.so.12"), "cuda dir: %s", why);
    EXPECT(strstr(why, "HETCCL_NVRTC_LIBRARY"), "names the knob: %s", why);
  }
  ok = hetccl_hip_reduce_available(why, sizeof(why));
  printf("hip: %d: %s\n", ok, why);
  if (!strstr(why, "hipRTC "))
    EXPECT(strstr(why, "libhiprtc.so.6") && strstr(why, "/opt/rocm/lib/libhiprtc.so"), "%s", why);
}

/* --- plan ------------------------------------------------------------------------- */

static void plan_variants(void) {
  hetccl_redop_t op = {.dtype = ncclFloat16, .kind = HETCCL_RED_MAX, .nranks = 1};
  hetccl_rtc_variant_t v;
  EXPECT(hetccl_rtc_variant_of(&op, HETCCL_REDUCE_ALL_FLAGS, 0, "t", &v) == ncclSuccess && v.flags == 0,
         "no premul, no average: no flags (%x)", v.flags);
  op.premul = 1;
  op.average = 1;
  op.nranks = 1;
  int x;
  op.scalar_dev = &x;
  EXPECT(hetccl_rtc_variant_of(&op, HETCCL_REDUCE_ALL_FLAGS, 0, "t", &v) == ncclSuccess &&
             v.flags == (HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B) && v.scalar_dev,
         "nranks 1: no finish (%x)", v.flags);
  op.nranks = 4;
  EXPECT(hetccl_rtc_variant_of(&op, HETCCL_REDUCE_FINISH, 0, "t", &v) == ncclSuccess &&
             v.flags == HETCCL_REDUCE_FINISH && !v.scalar_dev, "finish alone (%x)", v.flags);
  const char *defs[HETCCL_RTC_MAX_DEFINES];
  EXPECT(hetccl_rtc_variant_of(&op, HETCCL_REDUCE_ALL_FLAGS, 0, "t", &v) == ncclSuccess, "all");
  size_t n = hetccl_rtc_defines(&v, defs);
  EXPECT(n == 7 && strcmp(defs[0], "-DHK_T_FLOAT16") == 0 && strcmp(defs[1], "-DHK_OP_MAX") == 0 &&
             strcmp(defs[5], "-DHK_SCALAR_DEV") == 0, "defines (%zu)", n);
  char name[96];
  hetccl_rtc_variant_name(&v, name, sizeof(name));
  EXPECT(strcmp(name, "float16 max +scale_a +scale_b +finish +devscalar") == 0, "%s", name);
  hetccl_last_error_clear();
  EXPECT(hetccl_rtc_variant_of(&op, 0x8, 0, "t", &v) == ncclInvalidArgument, "bad flag");
  EXPECT(strstr(hetccl_last_error(), "unknown flags"), "%s", hetccl_last_error());
  op.dtype = ncclNumTypes;
  EXPECT(hetccl_rtc_variant_of(&op, 0, 0, "t", &v) == ncclInvalidArgument, "bad type");
}

/* Every element covered once by vectors or the scalar head and tail. */
static void plan_check(ncclDataType_t t, size_t oa, size_t ob, size_t od, size_t count) {
  size_t size = hetccl_dtype_size(t), vec = 16 / size;
  static _Alignas(16) char base[3][4096];
  hetccl_redop_t op = {.dtype = t, .kind = HETCCL_RED_SUM, .scalar_i = -2, .nranks = 5};
  hetccl_rtc_launch_t l;
  void *d = base[2] + od * size;
  const void *a = base[0] + oa * size, *b = base[1] + ob * size;
  hetccl_rtc_plan(&op, d, a, b, count, 132, &l);
  EXPECT(l.head + l.nvec * vec <= count, "%s %zu/%zu/%zu n=%zu", hetccl_dtype_name(t), oa, ob, od, count);
  int same = (oa * size) % 16 == (ob * size) % 16 && (oa * size) % 16 == (od * size) % 16;
  if (same && count >= 2 * vec) {
    EXPECT(l.nvec > 0 && ((uintptr_t)a + l.head * size) % 16 == 0, "vectors aligned");
    EXPECT(l.head < vec && count - l.head - l.nvec * vec < vec, "head and tail short");
  }
  if (!same) EXPECT(l.nvec == 0 && l.head == 0, "misaligned: all scalar");
  EXPECT(l.grid >= 1 && l.grid <= 132 * HETCCL_RTC_BLOCKS_PER_UNIT && l.block == HETCCL_RTC_THREADS, "grid");
  EXPECT(l.params[0] == &l.dst && l.params[9] == &l.s.nranks && l.s.nranks == 5, "params");
  int sgn = t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
  EXPECT(l.s.u == (sgn ? (uint64_t)-2 : 0), "scalar of %s", hetccl_dtype_name(t));
}

static void mode_plan(void) {
  plan_variants();
  size_t counts[] = {0, 1, 2, 15, 16, 17, 31, 32, 33, 100, 257};
  for (size_t t = 0; t < NTYPES; t++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (size_t o = 0; o < 4; o++) {
        plan_check(all_types[t], o, o, o, counts[c]);
        plan_check(all_types[t], 0, o, 0, counts[c]);
      }
  hetccl_redop_t op = {.dtype = ncclFloat32};
  hetccl_rtc_launch_t l;
  static _Alignas(16) float big[4];
  hetccl_rtc_plan(&op, big, big, big, (size_t)1 << 30, 0, &l);
  EXPECT(l.grid == HETCCL_RTC_MAX_BLOCKS, "no unit count: the fixed cap (%u)", l.grid);
  hetccl_rtc_plan(&op, big, big, big, 5, 0, &l);
  EXPECT(l.grid == 1, "small: one block (%u)", l.grid);
}

/* --- compile ---------------------------------------------------------------------- */

const char *const mode_names[] = {"plain", "avg", "premul", "premul-dev"};
const unsigned mode_flags[] = {
    0, HETCCL_REDUCE_FINISH, HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B,
    HETCCL_REDUCE_SCALE_A | HETCCL_REDUCE_SCALE_B};

static int mode_compile(int cc) {
  char why[2048];
  size_t bytes = 0;
  char target[32];
  hetccl_redop_t op = {.dtype = ncclFloat32, .kind = HETCCL_RED_SUM};
  if (hetccl_rtc_cuda_compile(&op, 0, cc, &bytes, target, sizeof(target)) == ncclInvalidUsage) {
    hetccl_cuda_reduce_available(why, sizeof(why));
    printf("SKIP: %s\n", why);
    return SKIP;
  }
  static int devscalar;
  for (size_t t = 0; t < NTYPES; t++)
    for (int k = 0; k < 4; k++)
      for (int m = 0; m < NMODES; m++) {
        hetccl_redop_t o = {.dtype = all_types[t], .kind = (hetccl_red_kind_t)k,
                            .premul = m >= MODE_PREMUL, .average = m == MODE_AVG, .nranks = 3,
                            .scalar_dev = m == MODE_PREMUL_DEV ? &devscalar : NULL};
        double t0 = hetccl_rtc_now_ms();
        ncclResult_t r = hetccl_rtc_cuda_compile(&o, mode_flags[m], cc, &bytes, target, sizeof(target));
        EXPECT(r == ncclSuccess, "%s %s %s: %s", hetccl_dtype_name(all_types[t]), kind_names[k],
               mode_names[m], hetccl_last_error());
        printf("%-11s %-5s %-11s %-10s %7zu bytes %7.1f ms\n", hetccl_dtype_name(all_types[t]),
               kind_names[k], mode_names[m], target, bytes, hetccl_rtc_now_ms() - t0);
      }
  return 0;
}

/* --- the CUDA runtime, for the test's own buffers -------------------------------- */

typedef int cudaError_t;
enum { cudaMemcpyDefault = 4, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2 };

#define CUDART_FNS(X)                                                          \
  X(cudaGetErrorString, const char *, (cudaError_t e))                         \
  X(cudaGetDeviceCount, cudaError_t, (int *n))                                 \
  X(cudaSetDevice, cudaError_t, (int dev))                                     \
  X(cudaMalloc, cudaError_t, (void **p, size_t bytes))                         \
  X(cudaFree, cudaError_t, (void *p))                                          \
  X(cudaHostAlloc, cudaError_t, (void **p, size_t bytes, unsigned flags))      \
  X(cudaHostGetDevicePointer, cudaError_t, (void **d, void *h, unsigned f))    \
  X(cudaFreeHost, cudaError_t, (void *p))                                      \
  X(cudaMemcpy, cudaError_t, (void *d, const void *s, size_t bytes, int kind)) \
  X(cudaMemset, cudaError_t, (void *d, int value, size_t bytes))               \
  X(cudaStreamCreate, cudaError_t, (void **s))                                 \
  X(cudaStreamSynchronize, cudaError_t, (void *s))                             \
  X(cudaEventCreate, cudaError_t, (void **e))                                  \
  X(cudaEventRecord, cudaError_t, (void *e, void *s))                          \
  X(cudaEventSynchronize, cudaError_t, (void *e))                              \
  X(cudaEventElapsedTime, cudaError_t, (float *ms, void *start, void *end))

static struct {
#define FN_FIELD(name, ret, params) ret(*name) params;
  CUDART_FNS(FN_FIELD)
#undef FN_FIELD
} rt;

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_) {                                                                  \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,       \
              rt.cudaGetErrorString(e_));                                      \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* 1 when a CUDA runtime with a device is usable; else why is printed. */
static int cudart_open(void) {
  const char *names[] = {getenv("HETCCL_TEST_CUDART"), "libcudart.so.13", "libcudart.so.12",
                         "libcudart.so.11.0", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so"};
  void *h = NULL;
  for (size_t i = 0; !h && i < sizeof(names) / sizeof(names[0]); i++)
    if (names[i] && names[i][0]) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    printf("SKIP: no CUDA runtime (set HETCCL_TEST_CUDART)\n");
    return 0;
  }
#define FN_TAKE(fn, ret, params)                                               \
  if (!(*(void **)&rt.fn = dlsym(h, #fn))) {                                   \
    printf("SKIP: the CUDA runtime lacks %s\n", #fn);                          \
    return 0;                                                                  \
  }
  CUDART_FNS(FN_TAKE)
#undef FN_TAKE
  int n = 0;
  if (rt.cudaGetDeviceCount(&n) || n < 1) {
    printf("SKIP: no CUDA device\n");
    return 0;
  }
  CK(rt.cudaSetDevice(0));
  CK(rt.cudaFree(NULL)); /* the context exists and is current on this thread */
  return 1;
}

/* --- data ---------------------------------------------------------------------- */

static const uint32_t f32_specials[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7fa00001,
    0xff812345, 0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x477fe000,
    0x477ff000, 0x477fefff, 0xc77ff001, 0x43e00000, 0x43e80000, 0xc3e7ffff, 0x47600000,
    0x47700000, 0x38800000, 0x33800000, 0x33000000, 0x3b000000, 0x3a800000, 0x3f800000,
    0xbf800000, 0x3effffff, 0x37800000, 0x377fffff};

static double random_double(void) {
  double m = (double)(int64_t)rnd() / 9.2233720368547758e18; /* [-1, 1) */
  return ldexp(m, (int)(rnd() % 61) - 30);
}

/* One element of type t: random bits, a moderate random value, or a
 * special (zeros, infinities, NaNs, denormals, the narrow formats' limits). */
void random_element(ncclDataType_t t, void *p) {
  uint64_t r = rnd(), pick = r % 8, bits = rnd();
  size_t size = hetccl_dtype_size(t);
  uint32_t special = f32_specials[(r >> 8) % (sizeof(f32_specials) / sizeof(f32_specials[0]))];
  float sf;
  memcpy(&sf, &special, 4);
  if (t == ncclFloat32 && pick >= 4) {
    float f = pick >= 6 ? (float)random_double() : sf;
    memcpy(&bits, &f, 4);
  } else if (t == ncclFloat64 && pick >= 4) {
    double d = pick >= 6 ? random_double() : (double)sf;
    memcpy(&bits, &d, 8);
  } else if ((t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat8e4m3 ||
              t == ncclFloat8e5m2) && pick >= 5) {
    float f = pick >= 6 ? (float)random_double() : sf;
    uint16_t c = t == ncclFloat16 ? hetccl_float_to_half(f) : t == ncclBfloat16 ? hetccl_float_to_bf16(f)
               : t == ncclFloat8e4m3 ? hetccl_float_to_e4m3(f) : hetccl_float_to_e5m2(f);
    bits = c;
  } else if (t != ncclFloat32 && t != ncclFloat64 && size >= 4 && pick >= 5) {
    const int64_t ints[] = {0, 1, -1, 2, -2, 3, INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, 127, -128};
    bits = pick == 5 ? (uint64_t)ints[(r >> 8) % 12] : (uint64_t)(int64_t)((int)(r % 21) - 10);
  }
  memcpy(p, &bits, size); /* little-endian: the low bytes */
}

int is_nan(ncclDataType_t t, const void *p) {
  uint64_t c = 0;
  memcpy(&c, p, hetccl_dtype_size(t));
  switch (t) {
    case ncclFloat32: return (c & 0x7fffffffu) > 0x7f800000u;
    case ncclFloat64: return (c & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case ncclFloat16: return (c & 0x7fffu) > 0x7c00u;
    case ncclBfloat16: return (c & 0x7fffu) > 0x7f80u;
    case ncclFloat8e4m3: return (c & 0x7fu) == 0x7fu;
    case ncclFloat8e5m2: return (c & 0x7fu) > 0x7cu;
    default: return 0;
  }
}

/* The op of a case; scalars: host -1.7 (or -3, or a wide unsigned), device 2.5 (or 7). */
hetccl_redop_t case_op(ncclDataType_t t, int kind, int mode, const void *devscalar) {
  hetccl_redop_t op = {.dtype = t, .kind = (hetccl_red_kind_t)kind, .nranks = 3,
                       .average = mode == MODE_AVG, .premul = mode >= MODE_PREMUL,
                       .scalar_f = -1.7, .scalar_i = -3, .scalar_u = 0x9e3779b97f4a7c15ull};
  if (t == ncclFloat16) op.scalar_f = hetccl_half_to_float(hetccl_float_to_half(-1.7f));
  if (t == ncclBfloat16) op.scalar_f = hetccl_bf16_to_float(hetccl_float_to_bf16(-1.7f));
  if (t == ncclFloat8e4m3) op.scalar_f = hetccl_e4m3_to_float(hetccl_float_to_e4m3(-1.7f));
  if (t == ncclFloat8e5m2) op.scalar_f = hetccl_e5m2_to_float(hetccl_float_to_e5m2(-1.7f));
  if (t == ncclFloat32) op.scalar_f = -1.7f;
  if (mode == MODE_PREMUL_DEV) op.scalar_dev = devscalar;
  return op;
}

/* The device scalar's bytes for t, and the same value as the host path takes it. */
void dev_scalar(ncclDataType_t t, uint64_t *bytes, hetccl_redop_t *host) {
  float f = 2.5f;
  double d = 2.5;
  *bytes = 7;
  host->scalar_i = 7;
  host->scalar_u = 7;
  host->scalar_f = 2.5;
  if (t == ncclFloat32) memcpy(bytes, &f, 4);
  if (t == ncclFloat64) memcpy(bytes, &d, 8);
  if (t == ncclFloat16) *bytes = hetccl_float_to_half(f);
  if (t == ncclBfloat16) *bytes = hetccl_float_to_bf16(f);
  if (t == ncclFloat8e4m3) *bytes = hetccl_float_to_e4m3(f);
  if (t == ncclFloat8e5m2) *bytes = hetccl_float_to_e5m2(f);
}

/* --- the table ------------------------------------------------------------------ */

const layout_t layouts[NLAYOUTS] = {
    {"aligned", 0, 0, 0, 0}, {"offset1", 1, 1, 1, 0}, {"b+1", 0, 1, 0, 0}, {"inplace", 0, 0, 0, 1}};

static void bufs_init(bufs_t *B) {
  size_t bytes = (BIG_N + 2 * SLACK) * 8;
  uint8_t **host[] = {&B->ha, &B->hb, &B->ta, &B->tb, &B->ref, &B->out};
  for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
    if (!(*host[i] = malloc(bytes))) exit(1);
  CK(rt.cudaMalloc((void **)&B->da, bytes));
  CK(rt.cudaMalloc((void **)&B->dd, bytes));
  CK(rt.cudaMalloc(&B->dscalar, 64));
  CK(rt.cudaHostAlloc((void **)&B->hb_pinned, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  CK(rt.cudaHostGetDevicePointer((void **)&B->db, B->hb_pinned, 0));
  CK(rt.cudaStreamCreate(&B->stream));
}

/* The host's answer: each scaled operand prepared, reduced, finished. */
void reference(const hetccl_redop_t *op, unsigned flags, bufs_t *B, size_t n) {
  const void *x = B->ha, *y = B->hb;
  if ((flags & HETCCL_REDUCE_SCALE_A) && op->premul) {
    hetccl_reduce_prepare(op, B->ta, B->ha, n);
    x = B->ta;
  }
  if ((flags & HETCCL_REDUCE_SCALE_B) && op->premul) {
    hetccl_reduce_prepare(op, B->tb, B->hb, n);
    y = B->tb;
  }
  hetccl_reduce(op, B->ref, x, y, n);
  if (flags & HETCCL_REDUCE_FINISH) hetccl_reduce_finish(op, B->ref, n);
}

static uint64_t element(const uint8_t *p, size_t i, size_t size) {
  uint64_t v = 0;
  memcpy(&v, p + i * size, size);
  return v;
}

/* Where a[i] and b[i] are both NaN, the host's sum or product is one of the
 * two (quieted), but which one depends on the operand order gcc gave that
 * instruction: it differs between reduce.c's vector body and its scalar
 * epilogue, and between its aliasing modes, so no device rule can match it
 * everywhere. The device takes a's (x86's first-operand rule); such
 * elements must be NaN on both sides and are counted here, not failed. */
size_t nan_pairs;

/* Mismatches of out against ref (the first few printed), and a write past
 * the end when guard. */
size_t compare(ncclDataType_t t, int kind, const bufs_t *B, size_t n, int guard,
                      const char *what) {
  size_t size = hetccl_dtype_size(t), bad = 0;
  int arith = kind == HETCCL_RED_SUM || kind == HETCCL_RED_PROD;
  for (size_t i = 0; i < n; i++) {
    const uint8_t *o = B->out + i * size, *r = B->ref + i * size;
    if (memcmp(o, r, size) == 0) continue;
    if (arith && is_nan(t, o) && is_nan(t, r) && is_nan(t, B->ha + i * size) &&
        is_nan(t, B->hb + i * size)) {
      nan_pairs++;
      continue;
    }
    if (bad++ < 3)
      fprintf(stderr, "  %s [%zu]: a %0*llx b %0*llx: host %0*llx, device %0*llx\n", what, i,
              (int)size * 2, (unsigned long long)element(B->ha, i, size), (int)size * 2,
              (unsigned long long)element(B->hb, i, size), (int)size * 2,
              (unsigned long long)element(B->ref, i, size), (int)size * 2,
              (unsigned long long)element(B->out, i, size));
  }
  for (size_t k = 0; guard && k < size; k++)
    if (B->out[n * size + k] != 0xa5) {
      fprintf(stderr, "  %s: wrote past the end\n", what);
      bad++;
      break;
    }
  return bad;
}

/* One case on n elements: the inputs already in B->ha / B->hb. */
static size_t run_case(bufs_t *B, ncclDataType_t t, int kind, int mode, const layout_t *L,
                       size_t n, double *ms) {
  size_t size = hetccl_dtype_size(t);
  hetccl_redop_t op = case_op(t, kind, mode, B->dscalar), host = op;
  host.scalar_dev = NULL;
  if (mode == MODE_PREMUL_DEV) {
    uint64_t bytes;
    dev_scalar(t, &bytes, &host);
    CK(rt.cudaMemcpy(B->dscalar, &bytes, sizeof(bytes), cudaMemcpyDefault));
  }
  uint8_t *a = B->da + L->oa * size, *d = L->inplace ? a : B->dd + L->od * size;
  const uint8_t *b = B->db + L->ob * size;
  CK(rt.cudaMemcpy(a, B->ha, n * size, cudaMemcpyDefault));
  memcpy(B->hb_pinned + L->ob * size, B->hb, n * size);
  if (!L->inplace) CK(rt.cudaMemset(B->dd, 0xa5, (n + 2 * SLACK) * size));
  reference(&host, mode_flags[mode], B, n);
  double t0 = hetccl_rtc_now_ms();
  ncclResult_t r = hetccl_cuda_reduce_async(&op, d, a, b, n, mode_flags[mode], B->stream);
  *ms = hetccl_rtc_now_ms() - t0;
  EXPECT(r == ncclSuccess, "%s: %s", hetccl_dtype_name(t), hetccl_last_error());
  CK(rt.cudaStreamSynchronize(B->stream));
  CK(rt.cudaMemcpy(B->out, d, (n + 1) * size, cudaMemcpyDefault));
  char what[96];
  snprintf(what, sizeof(what), "%s %s %s %s n=%zu", hetccl_dtype_name(t), kind_names[kind],
           mode_names[mode], L->name, n);
  size_t bad = r == ncclSuccess ? compare(t, kind, B, n, !L->inplace, what) : n;
  failures += bad != 0;
  return bad;
}

static void run_table(bufs_t *B) {
  printf("%-11s %-5s %-10s", "dtype", "op", "mode");
  for (size_t l = 0; l < NLAYOUTS; l++) printf(" %-9s", layouts[l].name);
  printf(" %s\n", "first-call-ms");
  for (size_t t = 0; t < NTYPES; t++) {
    size_t size = hetccl_dtype_size(all_types[t]);
    for (size_t i = 0; i < BIG_N; i++) {
      random_element(all_types[t], B->ha + i * size);
      random_element(all_types[t], B->hb + i * size);
    }
    for (int k = 0; k < 4; k++)
      for (int m = 0; m < NMODES; m++) {
        double first = 0, ms;
        printf("%-11s %-5s %-10s", hetccl_dtype_name(all_types[t]), kind_names[k], mode_names[m]);
        for (size_t l = 0; l < NLAYOUTS; l++) {
          size_t bad = run_case(B, all_types[t], k, m, &layouts[l], BIG_N, &ms);
          char cell[32];
          snprintf(cell, sizeof(cell), bad ? "%zu-bad" : "ok", bad);
          printf(" %-9s", cell);
          if (l == 0) first = ms;
        }
        printf(" %.1f\n", first);
        fflush(stdout);
      }
  }
}

/* Counts around the vector width and the unrolled block, every layout. */
static void run_small(bufs_t *B) {
  static const size_t counts[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65,
                                  255, 257, 1023, 1025, 4099, 65537};
  for (size_t t = 0; t < NTYPES; t++) {
    size_t size = hetccl_dtype_size(all_types[t]), bad = 0;
    for (size_t i = 0; i < 65537; i++) {
      random_element(all_types[t], B->ha + i * size);
      random_element(all_types[t], B->hb + i * size);
    }
    double ms;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (size_t l = 0; l < NLAYOUTS; l++)
        bad += run_case(B, all_types[t], HETCCL_RED_SUM, MODE_PREMUL, &layouts[l], counts[c], &ms);
    printf("small counts %-11s %s\n", hetccl_dtype_name(all_types[t]), bad ? "FAIL" : "ok");
  }
}

/* --- bandwidth (information) ----------------------------------------------------- */

/* GB/s of a+b+dst traffic for one fp32 sum over n elements, b at bsrc. */
static double bench_one(void *stream, float *a, const float *b, float *d, size_t n) {
  hetccl_redop_t op = {.dtype = ncclFloat32, .kind = HETCCL_RED_SUM};
  void *start, *end;
  CK(rt.cudaEventCreate(&start));
  CK(rt.cudaEventCreate(&end));
  for (int i = 0; i < 2; i++) EXPECT(hetccl_cuda_reduce_async(&op, d, a, b, n, 0, stream) == ncclSuccess, "warm-up");
  const int iters = 10;
  CK(rt.cudaEventRecord(start, stream));
  for (int i = 0; i < iters; i++) EXPECT(hetccl_cuda_reduce_async(&op, d, a, b, n, 0, stream) == ncclSuccess, "run");
  CK(rt.cudaEventRecord(end, stream));
  CK(rt.cudaEventSynchronize(end));
  float ms = 0;
  CK(rt.cudaEventElapsedTime(&ms, start, end));
  return 3.0 * (double)n * sizeof(float) * iters / (ms / 1e3) / 1e9;
}

static void bench(void *stream) {
  size_t n = (size_t)64 << 20, bytes = n * sizeof(float);
  float *a, *bd, *d, *bh, *bm;
  CK(rt.cudaMalloc((void **)&a, bytes));
  CK(rt.cudaMalloc((void **)&bd, bytes));
  CK(rt.cudaMalloc((void **)&d, bytes));
  CK(rt.cudaHostAlloc((void **)&bh, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  CK(rt.cudaHostGetDevicePointer((void **)&bm, bh, 0));
  CK(rt.cudaMemset(a, 0, bytes));
  CK(rt.cudaMemset(bd, 0, bytes));
  memset(bh, 0, bytes);
  double dev = bench_one(stream, a, bd, d, n), mapped = bench_one(stream, a, bm, d, n);
  printf("bandwidth fp32 sum, %zu elements (a+b+dst bytes / time):\n", n);
  printf("  b in device memory        %8.1f GB/s\n", dev);
  printf("  b in mapped host memory   %8.1f GB/s (b read over PCIe at %.1f GB/s)\n", mapped,
         mapped / 3);
  rt.cudaFree(a);
  rt.cudaFree(bd);
  rt.cudaFree(d);
  rt.cudaFreeHost(bh);
}

/* The unary form (b NULL): a PreMulSum rank's data scaled on its way out,
 * dst = PRE_A(a), which must be the host's hetccl_reduce_prepare. */
static void run_unary(bufs_t *B) {
  size_t bad = 0;
  for (size_t t = 0; t < NTYPES; t++) {
    ncclDataType_t dt = all_types[t];
    size_t size = hetccl_dtype_size(dt), n = 100003;
    for (size_t i = 0; i < n; i++) random_element(dt, B->ha + i * size);
    hetccl_redop_t op = case_op(dt, HETCCL_RED_SUM, MODE_PREMUL, NULL);
    hetccl_reduce_prepare(&op, B->ref, B->ha, n);
    CK(rt.cudaMemcpy(B->da, B->ha, n * size, cudaMemcpyDefault));
    CK(rt.cudaMemset(B->dd, 0xa5, (n + 1) * size));
    ncclResult_t r = hetccl_cuda_reduce_async(&op, B->dd, B->da, NULL, n,
                                              HETCCL_REDUCE_SCALE_A, B->stream);
    EXPECT(r == ncclSuccess, "unary %s: %s", hetccl_dtype_name(dt), hetccl_last_error());
    CK(rt.cudaStreamSynchronize(B->stream));
    CK(rt.cudaMemcpy(B->out, B->dd, (n + 1) * size, cudaMemcpyDefault));
    memcpy(B->hb, B->ha, n * size); /* no NaN-pair excuse: one operand */
    char what[64];
    snprintf(what, sizeof(what), "unary premul %s", hetccl_dtype_name(dt));
    size_t b1 = r == ncclSuccess ? compare(dt, HETCCL_RED_MAX, B, n, 1, what) : n;
    printf("%-11s unary premul %s\n", hetccl_dtype_name(dt), b1 ? "BAD" : "ok");
    bad += b1 != 0;
  }
  failures += bad != 0;
}

static int mode_gpu(void) {
  if (!cudart_open()) return SKIP;
  char why[2048];
  if (!hetccl_cuda_reduce_available(why, sizeof(why))) {
    printf("SKIP: %s\n", why);
    return SKIP;
  }
  printf("device reductions: %s\n", why);
  bufs_t B;
  bufs_init(&B);
  hetccl_redop_t op = {.dtype = ncclFloat32, .kind = HETCCL_RED_SUM};
  hetccl_last_error_clear();
  EXPECT(hetccl_cuda_reduce_async(&op, B.dd, B.da, B.db, 0, 0, B.stream) == ncclSuccess, "count 0");
  EXPECT(hetccl_cuda_reduce_async(&op, B.dd, B.da, B.db, 4, 0x10, B.stream) == ncclInvalidArgument,
         "bad flags");
  EXPECT(strstr(hetccl_last_error(), "flags"), "bad flags: %s", hetccl_last_error());
  run_table(&B);
  run_small(&B);
  run_unary(&B);
  printf("%zu results of NaN + NaN or NaN * NaN differ from the host's in NaN bits only\n",
         nan_pairs);
  bench(B.stream);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "gpu";
  int rc = 0;
  if (strcmp(mode, "gpu") == 0) rc = mode_gpu();
  else if (strcmp(mode, "nortc") == 0) mode_nortc();
  else if (strcmp(mode, "search") == 0) mode_search();
  else if (strcmp(mode, "plan") == 0) mode_plan();
  else if (strcmp(mode, "compile") == 0) rc = mode_compile(argc > 2 ? atoi(argv[2]) : 90);
#ifdef HETCCL_TEST_EMU
  else if (strcmp(mode, "emu") == 0) mode_emu(); /* devreduce_emu.c */
#endif
  else {
    fprintf(stderr, "usage: %s [gpu|nortc|search|plan|compile [CC]|emu]\n", argv[0]);
    return 2;
  }
  if (rc == SKIP) return SKIP;
  printf("%s: %s\n", mode, failures || rc ? "FAIL" : "ok");
  return failures || rc ? 1 : 0;
}
