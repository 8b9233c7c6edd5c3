/* Host reduction kernels (reduce.h).
 *
 * Thread: any. Pure functions of their arguments: no allocation, no locks,
 * no global state. Called on the hot path by the transports' consume hook,
 * so every loop is written for gcc's vectorizer (restrict pointers, no
 * branches in the loop body: selects instead of ifs).
 *
 * Aliasing: dst may be exactly a or b (then a two-operand kernel runs on
 * dst, keeping the operand order); partially overlapping buffers are not
 * supported. Operand order matters for bitwise results: max/min pick by
 * position on NaN payloads and signed zeros, and callers that must agree
 * across ranks combine in rank order.
 *
 * Floating max/min propagate NaN (if either input is NaN, the result is
 * that NaN); otherwise max(x, y) = x > y ? x : y, so max(+0, -0) is the
 * second operand.
 *
 * Conversions (all round to nearest, ties to even; a NaN stays a NaN of the
 * same sign, quieted):
 *   fp16  IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
 *         |x| >= 65520 (max 65504 plus half an ulp) rounds to inf.
 *   bf16  1 sign, 8 exponent (bias 127), 7 mantissa: the top half of a
 *         float; overflow rounds to inf as in float.
 *   e4m3  OCP FP8 E4M3 ("FN"): 1 sign, 4 exponent (bias 7), 3 mantissa; no
 *         infinities, S.1111.111 is NaN; max 448, min normal 2^-6, min
 *         subnormal 2^-9. Finite values beyond 448 and infinities saturate
 *         to +-448, as NCCL's conversion (__NV_SATFINITE) does.
 *   e5m2  1 sign, 5 exponent (bias 15), 2 mantissa: IEEE-like, the top byte
 *         of a binary16; max 57344, |x| >= 61440 rounds to inf, inf stays
 *         inf. (NCCL's own fp8 constructors saturate e5m2 as well; we keep
 *         IEEE overflow here: see E5M2_SATURATE.)
 * Half, bf16 and fp8 values are reduced as float and rounded once: float's
 * 24-bit significand is at least 2p+2 for each of these formats, so the
 * float operation followed by rounding gives the correctly rounded result
 * of the exact operation for +, * (no double-rounding error). */
#include "runtime/reduce.h"

#include <string.h>

/* The kernels must vectorize in every build type: gcc's -O2 cost model
 * ("very cheap") refuses loops that need an epilogue, i.e. all of these. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-loop-vectorize", "vect-cost-model=dynamic")
#endif

/* 1: e5m2 overflow and inf saturate to +-57344 like e4m3; 0: IEEE. */
#define E5M2_SATURATE 0

/* --- scalar conversions ---------------------------------------------------- */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* Branch-free select. Written with masks rather than ?: because gcc will not
 * if-convert a select whose arm holds a float operation (it may trap), and
 * a branch in the loop body stops vectorization. */
static inline uint32_t sel(int c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return (a & m) | (b & ~m);
}

static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t exp = em & 0x7c00u;
  uint32_t normal = (em << 13) + 0x38000000u;     /* rebias 15 -> 127 */
  uint32_t infnan = (em << 13) | 0x7f800000u;
  uint32_t sub = f2u((float)(int32_t)em * 0x1p-24f); /* exact: em < 2^10 */
  uint32_t r = sel(exp == 0x7c00u, infnan, normal);
  r = sel(exp == 0, sub, r);
  return u2f(r | sign);
}

static inline uint16_t float_to_half(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  /* Normal range: rebias, then round the 13 dropped bits to even; a carry
   * out of the mantissa bumps the exponent, up to inf. */
  uint32_t n = a - 0x38000000u;
  n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
  /* Below 2^-14: adding 0.5 (ulp 2^-24, the half subnormal step) makes the
   * FPU round at the right place; the low bits are the encoding. */
  uint32_t s = f2u(u2f(a) + 0.5f) - 0x3f000000u;
  uint32_t r = sel(a < 0x38800000u, s, n);
  r = sel(a >= 0x47800000u, 0x7c00u, r);                 /* >= 2^16 (and inf) */
  r = sel(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), r); /* NaN */
  return (uint16_t)(r | sign);
}

static inline float bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

static inline uint16_t float_to_bf16(float f) {
  uint32_t x = f2u(f);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  r = sel((x & 0x7fffffffu) > 0x7f800000u, (x >> 16) | 0x40u, r);
  return (uint16_t)r;
}

static inline float e4m3_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80u) << 24;
  uint32_t em = v & 0x7fu;
  uint32_t normal = (em << 20) + 0x3c000000u;     /* rebias 7 -> 127 */
  uint32_t sub = f2u((float)(int32_t)em * 0x1p-9f);
  uint32_t r = sel((em & 0x78u) == 0, sub, normal);
  r = sel(em == 0x7fu, 0x7fc00000u, r);
  return u2f(r | sign);
}

static inline uint8_t float_to_e4m3(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  uint32_t n = a - 0x3c000000u;
  n = (n + 0x7ffffu + ((n >> 20) & 1u)) >> 20;
  uint32_t s = f2u(u2f(a) + 0x1p14f) - 0x46800000u; /* ulp of 2^14 is 2^-9 */
  uint32_t r = sel(a < 0x3c800000u, s, n);
  r = sel(r > 0x7eu, 0x7eu, r);                       /* saturate, inf too */
  r = sel(a > 0x7f800000u, 0x7fu, r);
  return (uint8_t)(r | sign);
}

static inline float e5m2_to_float(uint8_t v) { return half_to_float((uint16_t)(v << 8)); }

static inline uint8_t float_to_e5m2(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t a = x & 0x7fffffffu;
  uint32_t n = a - 0x38000000u;
  n = (n + 0xfffffu + ((n >> 21) & 1u)) >> 21;
  uint32_t s = f2u(u2f(a) + 128.0f) - 0x43000000u;  /* ulp of 2^7 is 2^-16 */
  uint32_t r = sel(a < 0x38800000u, s, n);
  r = sel(r > 0x7bu, E5M2_SATURATE ? 0x7bu : 0x7cu, r);
  r = sel(a > 0x7f800000u, 0x7eu, r);
  return (uint8_t)(r | sign);
}

float hetccl_half_to_float(uint16_t h) { return half_to_float(h); }
uint16_t hetccl_float_to_half(float f) { return float_to_half(f); }
float hetccl_bf16_to_float(uint16_t h) { return bf16_to_float(h); }
uint16_t hetccl_float_to_bf16(float f) { return float_to_bf16(f); }
float hetccl_e4m3_to_float(uint8_t v) { return e4m3_to_float(v); }
uint8_t hetccl_float_to_e4m3(float f) { return float_to_e4m3(f); }
float hetccl_e5m2_to_float(uint8_t v) { return e5m2_to_float(v); }
uint8_t hetccl_float_to_e5m2(float f) { return float_to_e5m2(f); }

/* --- names and sizes -------------------------------------------------------- */

size_t hetccl_dtype_size(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char *hetccl_dtype_name(ncclDataType_t dtype) {
  static const char *const names[ncclNumTypes] = {
      [ncclInt8] = "int8",       [ncclUint8] = "uint8",       [ncclInt32] = "int32",
      [ncclUint32] = "uint32",   [ncclInt64] = "int64",       [ncclUint64] = "uint64",
      [ncclFloat16] = "float16", [ncclFloat32] = "float32",   [ncclFloat64] = "float64",
      [ncclBfloat16] = "bfloat16", [ncclFloat8e4m3] = "float8e4m3",
      [ncclFloat8e5m2] = "float8e5m2"};
  return (int)dtype >= 0 && dtype < ncclNumTypes ? names[dtype] : "invalid-type";
}

const char *hetccl_redop_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return (int)op >= (int)ncclNumOps ? "premulsum" : "invalid-op";
  }
}

/* --- pairwise kernels ------------------------------------------------------- */

/* Element operations. Integers wrap (computed in the unsigned type U). */
#define ISUM(T, U, x, y) ((T)((U)(x) + (U)(y)))
#define IPROD(T, U, x, y) ((T)((U)(x) * (U)(y)))
#define MAXV(x, y) ((x) > (y) ? (x) : (y))
#define MINV(x, y) ((x) < (y) ? (x) : (y))
#define FMAXV(x, y) (((x) != (x) || (x) > (y)) ? (x) : (y))
#define FMINV(x, y) (((x) != (x) || (x) < (y)) ? (x) : (y))

/* Three kernels per (type, op): three operands (d = a op b) and two
 * (d = d op s, and d = s op d), each with restrict pointers so that gcc vectorizes without
 * a runtime overlap check. EXPR combines x (left) and y (right). */
#define KERNEL_PAIR(NAME, T, EXPR)                                             \
  static void NAME##_3(void *restrict dv, const void *restrict av,            \
                       const void *restrict bv, size_t n) {                   \
    T *restrict d = dv;                                                        \
    const T *restrict a = av, *restrict b = bv;                                \
    for (size_t i = 0; i < n; i++) {                                           \
      T x = a[i], y = b[i];                                                    \
      d[i] = (EXPR);                                                           \
    }                                                                          \
  }                                                                            \
  static void NAME##_2(void *restrict dv, const void *restrict sv, size_t n) { \
    T *restrict d = dv;                                                        \
    const T *restrict s = sv;                                                  \
    for (size_t i = 0; i < n; i++) {                                           \
      T x = d[i], y = s[i];                                                    \
      d[i] = (EXPR);                                                           \
    }                                                                          \
  }                                                                            \
  static void NAME##_2r(void *restrict dv, const void *restrict sv, size_t n) { \
    T *restrict d = dv;                                                        \
    const T *restrict s = sv;                                                  \
    for (size_t i = 0; i < n; i++) {                                           \
      T x = s[i], y = d[i];                                                    \
      d[i] = (EXPR);                                                           \
    }                                                                          \
  }

#define INT_KERNELS(NAME, T, U)                                                \
  KERNEL_PAIR(NAME##_sum, T, ISUM(T, U, x, y))                                 \
  KERNEL_PAIR(NAME##_prod, T, IPROD(T, U, x, y))                               \
  KERNEL_PAIR(NAME##_max, T, MAXV(x, y))                                       \
  KERNEL_PAIR(NAME##_min, T, MINV(x, y))

#define FLT_KERNELS(NAME, T)                                                   \
  KERNEL_PAIR(NAME##_sum, T, x + y)                                            \
  KERNEL_PAIR(NAME##_prod, T, x * y)                                           \
  KERNEL_PAIR(NAME##_max, T, FMAXV(x, y))                                      \
  KERNEL_PAIR(NAME##_min, T, FMINV(x, y))

/* Narrow floats: decode both, operate in float, encode once. */
static inline float fsum(float x, float y) { return x + y; }
static inline float fprod(float x, float y) { return x * y; }
static inline float fmaxv(float x, float y) {
  return u2f(sel((x != x) | (x > y), f2u(x), f2u(y)));
}
static inline float fminv(float x, float y) {
  return u2f(sel((x != x) | (x < y), f2u(x), f2u(y)));
}

#define NARROW_KERNELS(NAME, T, DEC, ENC)                                      \
  KERNEL_PAIR(NAME##_sum, T, ENC(fsum(DEC(x), DEC(y))))                        \
  KERNEL_PAIR(NAME##_prod, T, ENC(fprod(DEC(x), DEC(y))))                      \
  KERNEL_PAIR(NAME##_max, T, ENC(fmaxv(DEC(x), DEC(y))))                       \
  KERNEL_PAIR(NAME##_min, T, ENC(fminv(DEC(x), DEC(y))))

INT_KERNELS(i8, int8_t, uint8_t)
INT_KERNELS(u8, uint8_t, uint8_t)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(u32, uint32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)
INT_KERNELS(u64, uint64_t, uint64_t)
FLT_KERNELS(f32, float)
FLT_KERNELS(f64, double)
NARROW_KERNELS(f16, uint16_t, half_to_float, float_to_half)
NARROW_KERNELS(bf16, uint16_t, bf16_to_float, float_to_bf16)
NARROW_KERNELS(e4m3, uint8_t, e4m3_to_float, float_to_e4m3)
NARROW_KERNELS(e5m2, uint8_t, e5m2_to_float, float_to_e5m2)

typedef void (*kernel3_fn)(void *restrict, const void *restrict, const void *restrict, size_t);
typedef void (*kernel2_fn)(void *restrict, const void *restrict, size_t);

typedef struct {
  kernel3_fn k3;
  kernel2_fn k2;  /* d = d op s */
  kernel2_fn k2r; /* d = s op d */
} kernel_t;

#define KROW(NAME)                                                             \
  {[HETCCL_RED_SUM] = {NAME##_sum_3, NAME##_sum_2, NAME##_sum_2r},                            \
   [HETCCL_RED_PROD] = {NAME##_prod_3, NAME##_prod_2, NAME##_prod_2r},                         \
   [HETCCL_RED_MAX] = {NAME##_max_3, NAME##_max_2, NAME##_max_2r},                            \
   [HETCCL_RED_MIN] = {NAME##_min_3, NAME##_min_2, NAME##_min_2r}}

static const kernel_t kernels[ncclNumTypes][4] = {
    [ncclInt8] = KROW(i8),         [ncclUint8] = KROW(u8),
    [ncclInt32] = KROW(i32),       [ncclUint32] = KROW(u32),
    [ncclInt64] = KROW(i64),       [ncclUint64] = KROW(u64),
    [ncclFloat16] = KROW(f16),     [ncclFloat32] = KROW(f32),
    [ncclFloat64] = KROW(f64),     [ncclBfloat16] = KROW(bf16),
    [ncclFloat8e4m3] = KROW(e4m3), [ncclFloat8e5m2] = KROW(e5m2),
};

static const kernel_t *kernel_of(const hetccl_redop_t *op) {
  if ((int)op->dtype < 0 || op->dtype >= ncclNumTypes || (unsigned)op->kind > HETCCL_RED_MIN)
    return NULL;
  return &kernels[op->dtype][op->kind];
}

void hetccl_reduce(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                   size_t count) {
  const kernel_t *k = kernel_of(op);
  if (!k || count == 0) return;
  if (dst == a)
    k->k2(dst, b, count);
  else if (dst == b)
    k->k2r(dst, a, count); /* keeps the operand order: max/min are not bitwise commutative */
  else
    k->k3(dst, a, b, count);
}

void hetccl_reduce_consume(void *ctx, void *dst, const void *src, size_t bytes) {
  const hetccl_redop_t *op = ctx;
  const kernel_t *k = kernel_of(op);
  if (!k) return;
  size_t count = bytes / hetccl_dtype_size(op->dtype);
  if (count) k->k2(dst, src, count);
}

/* --- premul (PreMulSum) and average ---------------------------------------- */

#define SCALE_LOOP(T, EXPR)                                                    \
  do {                                                                         \
    T *d_ = dst;                                                               \
    const T *s_ = src;                                                         \
    for (size_t i = 0; i < count; i++) {                                       \
      T x = s_[i];                                                             \
      d_[i] = (EXPR);                                                          \
    }                                                                          \
  } while (0)

/* dst may equal src: no restrict here (off the hot path: once per input). */
static void scale(const hetccl_redop_t *op, void *dst, const void *src, size_t count) {
  const float sf = (float)op->scalar_f;
  const double sd = op->scalar_f;
  const uint64_t su = op->dtype == ncclInt8 || op->dtype == ncclInt32 || op->dtype == ncclInt64
                          ? (uint64_t)op->scalar_i
                          : op->scalar_u;
  switch (op->dtype) {
    case ncclInt8: SCALE_LOOP(int8_t, (int8_t)(uint8_t)((uint8_t)x * (uint8_t)su)); break;
    case ncclUint8: SCALE_LOOP(uint8_t, (uint8_t)(x * (uint8_t)su)); break;
    case ncclInt32: SCALE_LOOP(int32_t, (int32_t)((uint32_t)x * (uint32_t)su)); break;
    case ncclUint32: SCALE_LOOP(uint32_t, x * (uint32_t)su); break;
    case ncclInt64: SCALE_LOOP(int64_t, (int64_t)((uint64_t)x * su)); break;
    case ncclUint64: SCALE_LOOP(uint64_t, x * su); break;
    case ncclFloat16: SCALE_LOOP(uint16_t, float_to_half(half_to_float(x) * sf)); break;
    case ncclFloat32: SCALE_LOOP(float, x * sf); break;
    case ncclFloat64: SCALE_LOOP(double, x * sd); break;
    case ncclBfloat16: SCALE_LOOP(uint16_t, float_to_bf16(bf16_to_float(x) * sf)); break;
    case ncclFloat8e4m3: SCALE_LOOP(uint8_t, float_to_e4m3(e4m3_to_float(x) * sf)); break;
    case ncclFloat8e5m2: SCALE_LOOP(uint8_t, float_to_e5m2(e5m2_to_float(x) * sf)); break;
    default: break;
  }
}

void hetccl_reduce_prepare(const hetccl_redop_t *op, void *dst, const void *src, size_t count) {
  if (count == 0) return;
  if (op->premul) {
    scale(op, dst, src, count);
  } else if (dst != src) {
    memmove(dst, src, count * hetccl_dtype_size(op->dtype));
  }
}

#define DIV_LOOP(T, EXPR)                                                      \
  do {                                                                         \
    T *restrict b_ = buf;                                                      \
    for (size_t i = 0; i < count; i++) {                                       \
      T x = b_[i];                                                             \
      b_[i] = (EXPR);                                                          \
    }                                                                          \
  } while (0)

void hetccl_reduce_finish(const hetccl_redop_t *op, void *buf, size_t count) {
  if (!op->average || count == 0 || op->nranks <= 1) return;
  const int64_t n = op->nranks;
  const float nf = (float)n;
  const double nd = (double)n;
  switch (op->dtype) {
    case ncclInt8: DIV_LOOP(int8_t, (int8_t)(x / n)); break;
    case ncclUint8: DIV_LOOP(uint8_t, (uint8_t)(x / (uint64_t)n)); break;
    case ncclInt32: DIV_LOOP(int32_t, (int32_t)(x / n)); break;
    case ncclUint32: DIV_LOOP(uint32_t, (uint32_t)(x / (uint64_t)n)); break;
    case ncclInt64: DIV_LOOP(int64_t, x / n); break;
    case ncclUint64: DIV_LOOP(uint64_t, x / (uint64_t)n); break;
    case ncclFloat16: DIV_LOOP(uint16_t, float_to_half(half_to_float(x) / nf)); break;
    case ncclFloat32: DIV_LOOP(float, x / nf); break;
    case ncclFloat64: DIV_LOOP(double, x / nd); break;
    case ncclBfloat16: DIV_LOOP(uint16_t, float_to_bf16(bf16_to_float(x) / nf)); break;
    case ncclFloat8e4m3: DIV_LOOP(uint8_t, float_to_e4m3(e4m3_to_float(x) / nf)); break;
    case ncclFloat8e5m2: DIV_LOOP(uint8_t, float_to_e5m2(e5m2_to_float(x) / nf)); break;
    default: break;
  }
}
