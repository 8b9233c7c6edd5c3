/* Element types, reduction operators and the values the data check uses.
 *
 * Every test value is a small non-negative integer (or a power of two for
 * ncclProd), bounded so that any partial reduction over the ranks, in any
 * order, is exactly representable in the type: then the expected output is
 * exact, and the check needs no tolerance (except ncclAvg on floating
 * types, which NCCL computes by pre-multiplying with 1/n). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "perf.h"

/* ---- small binary floating formats (half, bfloat16, fp8) ---- */

struct minifloat {
  int ebits, mbits;
  int has_inf; /* IEEE-style: all-ones exponent is inf/NaN (not e4m3) */
};

static const struct minifloat fmt_half = {5, 10, 1};
static const struct minifloat fmt_bf16 = {8, 7, 1};
static const struct minifloat fmt_e4m3 = {4, 3, 0};
static const struct minifloat fmt_e5m2 = {5, 2, 1};

/* Round to nearest even. A mantissa that rounds up to 2^mbits carries into
 * the exponent field by plain addition, which is the right encoding. */
static uint32_t minifloat_encode(const struct minifloat *f, double x)
{
  uint32_t sign = signbit(x) ? 1u << (f->ebits + f->mbits) : 0;
  int bias = (1 << (f->ebits - 1)) - 1;
  x = fabs(x);
  if (x == 0)
    return sign;
  if (isnan(x))
    return sign | ((1u << (f->ebits + f->mbits)) - 1);
  int e;
  double frac = frexp(x, &e); /* x = frac * 2^e, frac in [0.5, 1) */
  int exponent = e - 1;
  uint32_t bits;
  if (exponent < 1 - bias) {
    bits = (uint32_t)nearbyint(ldexp(x, bias - 1 + f->mbits));
  } else {
    double mant = nearbyint(ldexp(frac * 2 - 1, f->mbits));
    bits = ((uint32_t)(exponent + bias) << f->mbits) + (uint32_t)mant;
  }
  uint32_t limit = f->has_inf ? (((1u << f->ebits) - 1) << f->mbits)
                              : ((1u << (f->ebits + f->mbits)) - 2);
  if (bits > limit)
    bits = limit; /* overflow: inf, or the largest finite e4m3 */
  return sign | bits;
}

static double minifloat_decode(const struct minifloat *f, uint32_t bits)
{
  int bias = (1 << (f->ebits - 1)) - 1;
  uint32_t mmask = (1u << f->mbits) - 1;
  uint32_t emax = (1u << f->ebits) - 1;
  uint32_t exp = (bits >> f->mbits) & emax;
  uint32_t mant = bits & mmask;
  double sign = (bits >> (f->ebits + f->mbits)) & 1 ? -1.0 : 1.0;
  if (f->has_inf && exp == emax)
    return mant ? NAN : sign * INFINITY;
  if (!f->has_inf && exp == emax && mant == mmask)
    return NAN;
  if (exp == 0)
    return sign * ldexp((double)mant, 1 - bias - f->mbits);
  return sign * ldexp((double)(mant | (1u << f->mbits)), (int)exp - bias - f->mbits);
}

#define MINIFLOAT_IO(fname, fmt, ctype)                                        \
  static void store_##fname(void *dst, double v)                             \
  {                                                                            \
    ctype bits = (ctype)minifloat_encode(&fmt, v);                             \
    memcpy(dst, &bits, sizeof bits);                                           \
  }                                                                            \
  static double load_##fname(const void *src)                                \
  {                                                                            \
    ctype bits;                                                                \
    memcpy(&bits, src, sizeof bits);                                           \
    return minifloat_decode(&fmt, bits);                                       \
  }

MINIFLOAT_IO(half, fmt_half, uint16_t)
MINIFLOAT_IO(bf16, fmt_bf16, uint16_t)
MINIFLOAT_IO(e4m3, fmt_e4m3, uint8_t)
MINIFLOAT_IO(e5m2, fmt_e5m2, uint8_t)

#define NATIVE_IO(fname, ctype)                                                \
  static void store_##fname(void *dst, double v)                             \
  {                                                                            \
    ctype x = (ctype)v;                                                        \
    memcpy(dst, &x, sizeof x);                                                 \
  }                                                                            \
  static double load_##fname(const void *src)                                \
  {                                                                            \
    ctype x;                                                                   \
    memcpy(&x, src, sizeof x);                                                 \
    return (double)x;                                                          \
  }

NATIVE_IO(i8, int8_t)
NATIVE_IO(u8, uint8_t)
NATIVE_IO(i32, int32_t)
NATIVE_IO(u32, uint32_t)
NATIVE_IO(i64, int64_t)
NATIVE_IO(u64, uint64_t)
NATIVE_IO(f32, float)
NATIVE_IO(f64, double)

#define TWO53 9007199254740992.0

/* Names as nccl-tests spells them. */
static const struct perf_dtype dtypes[] = {
  {"int8", ncclInt8, 1, 0, 127, 6, 0, store_i8, load_i8},
  {"uint8", ncclUint8, 1, 0, 255, 7, 0, store_u8, load_u8},
  {"int32", ncclInt32, 4, 0, 2147483647.0, 30, 0, store_i32, load_i32},
  {"uint32", ncclUint32, 4, 0, 4294967295.0, 31, 0, store_u32, load_u32},
  {"int64", ncclInt64, 8, 0, TWO53, 52, 0, store_i64, load_i64},
  {"uint64", ncclUint64, 8, 0, TWO53, 52, 0, store_u64, load_u64},
  {"half", ncclFloat16, 2, 1, 2048, 15, 0x1p-10, store_half, load_half},
  {"float", ncclFloat32, 4, 1, 16777216.0, 60, 0x1p-23, store_f32, load_f32},
  {"double", ncclFloat64, 8, 1, TWO53, 60, 0x1p-52, store_f64, load_f64},
  {"bfloat16", ncclBfloat16, 2, 1, 256, 60, 0x1p-7, store_bf16, load_bf16},
  {"f8e4m3", ncclFloat8e4m3, 1, 1, 16, 8, 0x1p-3, store_e4m3, load_e4m3},
  {"f8e5m2", ncclFloat8e5m2, 1, 1, 8, 15, 0x1p-2, store_e5m2, load_e5m2},
};

static const struct {
  const char *alias, *name;
} dtype_aliases[] = {
  {"char", "int8"},     {"int", "int32"},     {"fp16", "half"},
  {"float16", "half"},  {"float32", "float"}, {"fp32", "float"},
  {"float64", "double"}, {"fp64", "double"},  {"bf16", "bfloat16"},
  {"e4m3", "f8e4m3"},   {"e5m2", "f8e5m2"},
};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

const struct perf_dtype *perf_dtype_at(int index)
{
  return index >= 0 && (size_t)index < COUNT_OF(dtypes) ? &dtypes[index] : NULL;
}

const struct perf_dtype *perf_dtype_find(const char *name)
{
  for (size_t i = 0; i < COUNT_OF(dtype_aliases); i++)
    if (strcmp(name, dtype_aliases[i].alias) == 0)
      name = dtype_aliases[i].name;
  for (size_t i = 0; i < COUNT_OF(dtypes); i++)
    if (strcmp(name, dtypes[i].name) == 0)
      return &dtypes[i];
  return NULL;
}

static const struct perf_redop redops[] = {
  {"sum", ncclSum}, {"prod", ncclProd}, {"max", ncclMax}, {"min", ncclMin}, {"avg", ncclAvg},
};

const struct perf_redop *perf_redop_at(int index)
{
  return index >= 0 && (size_t)index < COUNT_OF(redops) ? &redops[index] : NULL;
}

const struct perf_redop *perf_redop_find(const char *name)
{
  for (size_t i = 0; i < COUNT_OF(redops); i++)
    if (strcmp(name, redops[i].name) == 0)
      return &redops[i];
  return NULL;
}

/* ---- test values ---- */

static uint32_t mix(uint64_t x)
{
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint32_t)x;
}

#define VALUE_CAP 64.0

double perf_value(const struct perf_dtype *type, ncclRedOp_t op, int nranks, int rank,
                  size_t index)
{
  uint32_t h = mix(((uint64_t)index << 16) ^ (uint64_t)rank * 0x9e3779b97f4a7c15ull);
  if (op == ncclSum || op == ncclAvg) {
    double vmax = floor(fmin(type->exact_max, 1e9) / nranks);
    if (vmax >= 1)
      return (double)(h % (uint32_t)(fmin(vmax, VALUE_CAP) + 1));
    /* more ranks than exact integers: at most exact_max ones per element */
    return (double)((index + (size_t)rank) % (size_t)nranks) < type->exact_max ? 1.0 : 0.0;
  }
  if (op == ncclProd) {
    /* exactly k ranks contribute a 2, the others a 1: the product is 2^k */
    int k = (int)(mix(index) % (uint32_t)(nranks + 1));
    if (k > type->max_pow2)
      k = type->max_pow2;
    return (int)((index * 3 + (size_t)rank) % (size_t)nranks) < k ? 2.0 : 1.0;
  }
  return (double)(h % (uint32_t)(fmin(type->exact_max, VALUE_CAP) + 1));
}

static double round_to_type(const struct perf_dtype *type, double v)
{
  unsigned char buf[8];
  type->store(buf, v);
  return type->load(buf);
}

double perf_reduced(const struct perf_dtype *type, ncclRedOp_t op, int nranks, size_t index)
{
  double acc = perf_value(type, op, nranks, 0, index);
  for (int r = 1; r < nranks; r++) {
    double v = perf_value(type, op, nranks, r, index);
    switch (op) {
    case ncclProd: acc *= v; break;
    case ncclMax: acc = fmax(acc, v); break;
    case ncclMin: acc = fmin(acc, v); break;
    default: acc += v; break;
    }
  }
  if (op == ncclAvg)
    acc = type->is_float ? acc / nranks : floor(acc / nranks);
  return round_to_type(type, acc);
}

int perf_value_matches(const struct perf_dtype *type, ncclRedOp_t op, int nranks, double got,
                       double expected)
{
  if (op == ncclAvg && type->is_float) {
    double tol = (nranks + 1) * type->epsilon * fmax(fabs(expected), 1.0);
    return fabs(got - expected) <= tol;
  }
  return got == expected;
}
