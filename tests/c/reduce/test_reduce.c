/* Host reduction kernels (runtime/reduce.c) against an independent
 * double-precision reference.
 *
 *   test_reduce          correctness: every conversion code point, rounding
 *                        of floats at every boundary, every dtype x op in every
 *                        aliasing mode, premul, average, NaN/inf
 *   test_reduce bench    float32 sum throughput on 64 MiB
 *
 * The reference decodes every narrow format with ldexp from its fields and
 * rounds a double to the nearest code by binary search over the (monotonic)
 * positive codes, ties to the even code. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/reduce.h"

static int failures;

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (failures++ < 30) {                                                   \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                   \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
      }                                                                        \
    }                                                                          \
  } while (0)

/* --- reference formats ---------------------------------------------------- */

typedef struct fmt {
  const char *name;
  ncclDataType_t dtype;
  int mbits, bias, ebits;
  int ieee_top;      /* all-ones exponent is inf/NaN (else only S.1111.111 is NaN) */
  uint32_t maxcode;  /* largest finite positive code */
  uint32_t signbit;
  double (*to_double)(uint32_t); /* library decode, widened */
  uint32_t (*from_float)(float); /* library encode */
} fmt_t;

static double ref_decode(const fmt_t *f, uint32_t c) {
  int neg = (c & f->signbit) != 0;
  uint32_t a = c & (f->signbit - 1);
  uint32_t e = a >> f->mbits, m = a & ((1u << f->mbits) - 1);
  uint32_t emax = (1u << f->ebits) - 1;
  double v;
  if (f->ieee_top && e == emax) v = m ? NAN : INFINITY;
  else if (!f->ieee_top && a > f->maxcode) v = NAN;
  else if (e == 0) v = ldexp(m, 1 - f->bias - f->mbits);
  else v = ldexp((double)((1u << f->mbits) | m), (int)e - f->bias - f->mbits);
  return neg ? -v : v;
}

static int is_nan_code(const fmt_t *f, uint32_t c) { return isnan(ref_decode(f, c)); }

/* Nearest code to v, ties to even; overflow: inf (IEEE formats) or the
 * largest finite (e4m3, saturating). */
static uint32_t ref_round(const fmt_t *f, double v) {
  if (isnan(v)) return (f->signbit - 1); /* some NaN: callers compare NaN-ness */
  uint32_t sign = signbit(v) ? f->signbit : 0;
  double a = fabs(v), max = ref_decode(f, f->maxcode);
  if (a > max) {
    if (!f->ieee_top) return f->maxcode | sign;
    double next = ldexp(1.0, (int)((1u << f->ebits) - 1) - f->bias); /* where inf would be */
    return (a >= (max + next) / 2 ? f->maxcode + 1 : f->maxcode) | sign; /* maxcode is odd */
  }
  uint32_t lo = 0, hi = f->maxcode; /* decode(lo) <= a <= decode(hi) */
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (ref_decode(f, mid) <= a) lo = mid;
    else hi = mid;
  }
  double dl = a - ref_decode(f, lo), dh = ref_decode(f, hi) - a;
  uint32_t c = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
  return c | sign;
}

static double half_d(uint32_t c) { return hetccl_half_to_float((uint16_t)c); }
static double bf16_d(uint32_t c) { return hetccl_bf16_to_float((uint16_t)c); }
static double e4m3_d(uint32_t c) { return hetccl_e4m3_to_float((uint8_t)c); }
static double e5m2_d(uint32_t c) { return hetccl_e5m2_to_float((uint8_t)c); }
static uint32_t half_e(float x) { return hetccl_float_to_half(x); }
static uint32_t bf16_e(float x) { return hetccl_float_to_bf16(x); }
static uint32_t e4m3_e(float x) { return hetccl_float_to_e4m3(x); }
static uint32_t e5m2_e(float x) { return hetccl_float_to_e5m2(x); }

static const fmt_t fmts[] = {
    {"float16", ncclFloat16, 10, 15, 5, 1, 0x7bff, 0x8000, half_d, half_e},
    {"bfloat16", ncclBfloat16, 7, 127, 8, 1, 0x7f7f, 0x8000, bf16_d, bf16_e},
    {"float8e4m3", ncclFloat8e4m3, 3, 7, 4, 0, 0x7e, 0x80, e4m3_d, e4m3_e},
    {"float8e5m2", ncclFloat8e5m2, 2, 15, 5, 1, 0x7b, 0x80, e5m2_d, e5m2_e},
};

static const fmt_t *fmt_of(ncclDataType_t t) {
  for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++)
    if (fmts[i].dtype == t) return &fmts[i];
  return NULL;
}

static int same_double(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return a == b && signbit(a) == signbit(b);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* --- conversions ------------------------------------------------------------ */

static void test_conversions(void) {
  for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
    const fmt_t *f = &fmts[i];
    uint32_t ncodes = f->signbit << 1;
    for (uint32_t c = 0; c < ncodes; c++) {
      double lib = f->to_double(c), ref = ref_decode(f, c);
      EXPECT(same_double(lib, ref), "%s decode 0x%x: %g, expected %g", f->name, c, lib, ref);
      uint32_t back = f->from_float((float)lib);
      if (is_nan_code(f, c))
        EXPECT(is_nan_code(f, back) && (back & f->signbit) == (c & f->signbit),
               "%s NaN 0x%x came back as 0x%x", f->name, c, back);
      else
        EXPECT(back == c, "%s round trip 0x%x -> %g -> 0x%x", f->name, c, lib, back);
    }
    /* Every boundary between neighbouring codes: the midpoint (a tie) and
     * the floats just either side of it. */
    for (uint32_t c = 0; c <= f->maxcode; c++) {
      double lo = ref_decode(f, c);
      double hi = c < f->maxcode ? ref_decode(f, c + 1)
                                 : ldexp(1.0, (int)((1u << f->ebits) - 1) - f->bias);
      float mid = (float)((lo + hi) / 2); /* exact: narrow formats have few bits */
      float probes[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), (float)lo,
                        -mid, -nextafterf(mid, INFINITY)};
      for (size_t k = 0; k < sizeof(probes) / sizeof(probes[0]); k++) {
        uint32_t got = f->from_float(probes[k]), want = ref_round(f, probes[k]);
        EXPECT(got == want, "%s encode %a: 0x%x, expected 0x%x", f->name, probes[k], got, want);
      }
    }
    /* Random float bit patterns, specials included. */
    for (int k = 0; k < 2000000; k++) {
      uint32_t bits = (uint32_t)rnd();
      if (f->dtype != ncclBfloat16 && (k & 1)) /* concentrate near the format's range */
        bits = (bits & 0x807fffffu) | ((uint32_t)(127 - f->bias - 12 + (int)(rnd() % 48)) << 23);
      float x;
      memcpy(&x, &bits, sizeof(x));
      uint32_t got = f->from_float(x), want = ref_round(f, x);
      if (isnan(x))
        EXPECT(is_nan_code(f, got), "%s encode NaN 0x%08x -> 0x%x", f->name, bits, got);
      else
        EXPECT(got == want, "%s encode %a (0x%08x): 0x%x, expected 0x%x", f->name, x, bits, got,
               want);
    }
    float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1e30f, -1e30f, 1e-30f};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) {
      uint32_t got = f->from_float(specials[k]);
      if (isnan(specials[k])) EXPECT(is_nan_code(f, got), "%s NaN", f->name);
      else EXPECT(got == ref_round(f, specials[k]), "%s encode %g: 0x%x", f->name,
                  specials[k], got);
    }
  }
  /* The fixed points the header promises. */
  EXPECT(hetccl_float_to_e4m3(INFINITY) == 0x7e, "e4m3(inf) saturates to 448");
  EXPECT(hetccl_float_to_e4m3(-1e6f) == 0xfe, "e4m3(-1e6) saturates to -448");
  EXPECT(hetccl_float_to_e5m2(INFINITY) == 0x7c, "e5m2(inf) is inf");
  EXPECT(hetccl_float_to_e5m2(61440.0f) == 0x7c && hetccl_float_to_e5m2(61439.0f) == 0x7b,
         "e5m2 overflow threshold");
  EXPECT(hetccl_float_to_half(65520.0f) == 0x7c00 && hetccl_float_to_half(65519.0f) == 0x7bff,
         "half overflow threshold");
  EXPECT(hetccl_e4m3_to_float(0x7e) == 448.0f && isnan(hetccl_e4m3_to_float(0xff)), "e4m3 top");
}

/* --- kernels ---------------------------------------------------------------- */

static const ncclDataType_t all_types[] = {ncclInt8,    ncclUint8,   ncclInt32,      ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16,    ncclFloat32,
                                           ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

static int is_signed_int(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}
static int is_int(ncclDataType_t t) { return t <= ncclUint64; }

/* Element i of a buffer as raw bits (zero-extended). */
static uint64_t get_raw(ncclDataType_t t, const void *p, size_t i) {
  switch (hetccl_dtype_size(t)) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
  }
}

static void set_raw(ncclDataType_t t, void *p, size_t i, uint64_t v) {
  switch (hetccl_dtype_size(t)) {
    case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case 2: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case 4: ((uint32_t *)p)[i] = (uint32_t)v; break;
    default: ((uint64_t *)p)[i] = v; break;
  }
}

static double as_double(ncclDataType_t t, uint64_t raw) {
  const fmt_t *f = fmt_of(t);
  if (f) return ref_decode(f, (uint32_t)raw);
  if (t == ncclFloat32) {
    float x;
    uint32_t b = (uint32_t)raw;
    memcpy(&x, &b, 4);
    return x;
  }
  double d;
  memcpy(&d, &raw, 8);
  return d;
}

static uint64_t from_double(ncclDataType_t t, double v) {
  const fmt_t *f = fmt_of(t);
  if (f) return ref_round(f, v);
  if (t == ncclFloat32) {
    float x = (float)v; /* double -> float rounds once, to nearest even */
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
  }
  uint64_t b;
  memcpy(&b, &v, 8);
  return b;
}

static int64_t sext(ncclDataType_t t, uint64_t raw) {
  switch (t) {
    case ncclInt8: return (int8_t)raw;
    case ncclInt32: return (int32_t)raw;
    default: return (int64_t)raw;
  }
}

static uint64_t ref_op(ncclDataType_t t, hetccl_red_kind_t k, uint64_t x, uint64_t y) {
  if (is_int(t)) {
    if (k == HETCCL_RED_SUM) return x + y;
    if (k == HETCCL_RED_PROD) return x * y;
    int gt = is_signed_int(t) ? sext(t, x) > sext(t, y) : x > y;
    int lt = is_signed_int(t) ? sext(t, x) < sext(t, y) : x < y;
    if (k == HETCCL_RED_MAX) return gt ? x : y;
    return lt ? x : y;
  }
  double a = as_double(t, x), b = as_double(t, y), r;
  switch (k) {
    case HETCCL_RED_SUM: r = a + b; break;
    case HETCCL_RED_PROD: r = a * b; break;
    case HETCCL_RED_MAX: r = (isnan(a) || a > b) ? a : b; break;
    default: r = (isnan(a) || a < b) ? a : b; break;
  }
  return from_double(t, r);
}

static int same_elem(ncclDataType_t t, uint64_t got, uint64_t want) {
  size_t sz = hetccl_dtype_size(t);
  uint64_t mask = sz == 8 ? ~0ull : ((1ull << (8 * sz)) - 1);
  got &= mask;
  want &= mask;
  if (is_int(t)) return got == want;
  double g = as_double(t, got), w = as_double(t, want);
  return same_double(g, w);
}

/* Random element: integers any bits; floats mostly moderate values of
 * both signs, with specials sprinkled in. */
static uint64_t random_elem(ncclDataType_t t) {
  uint64_t r = rnd();
  if (is_int(t)) return r;
  int pick = (int)(rnd() % 64);
  double v;
  switch (pick) {
    case 0: v = NAN; break;
    case 1: v = INFINITY; break;
    case 2: v = -INFINITY; break;
    case 3: v = 0.0; break;
    case 4: v = -0.0; break;
    case 5: v = 1e300; break; /* overflows the narrow types */
    default: v = ldexp((double)(int64_t)(r % 20001) - 10000.0, (int)(rnd() % 24) - 16); break;
  }
  if (t == ncclFloat64) return from_double(t, v);
  if (t == ncclFloat32 && pick == 6) v = ldexp(1.5, -140); /* a float subnormal */
  return from_double(t, (float)v);
}

static void test_kernels(void) {
  enum { N = 1003 };
  static uint64_t a[N], b[N], d[N], d2[N];
  for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
    ncclDataType_t t = all_types[ti];
    for (int k = HETCCL_RED_SUM; k <= HETCCL_RED_MIN; k++) {
      hetccl_redop_t op = {.dtype = t, .kind = (hetccl_red_kind_t)k, .nranks = 1};
      for (size_t i = 0; i < N; i++) {
        set_raw(t, a, i, random_elem(t));
        set_raw(t, b, i, random_elem(t));
      }
      /* mode 0: d = a op b; 1: d (=a) op= b; 2: d (=b) = a op d; 3: consume */
      for (int mode = 0; mode < 4; mode++) {
        size_t n = N - (size_t)mode; /* vary the epilogue */
        void *dst = d;
        const void *x = a, *y = b;
        memcpy(d2, b, sizeof(b));
        if (mode == 1) {
          memcpy(d, a, sizeof(a));
          x = d;
        } else if (mode == 2) {
          memcpy(d, b, sizeof(b));
          y = d;
        }
        if (mode == 3) {
          memcpy(d, a, sizeof(a));
          size_t bytes = n * hetccl_dtype_size(t), off = 0;
          while (off < bytes) { /* pieces of 8-byte multiples, as a transport delivers */
            size_t piece = 8 * (1 + rnd() % 40);
            if (piece > bytes - off) piece = bytes - off;
            hetccl_reduce_consume(&op, (char *)d + off, (const char *)b + off, piece);
            off += piece;
          }
        } else {
          hetccl_reduce(&op, dst, x, y, n);
        }
        for (size_t i = 0; i < N; i++) {
          uint64_t ai = get_raw(t, a, i), bi = get_raw(t, mode == 2 ? d2 : b, i);
          uint64_t want = i < n ? ref_op(t, op.kind, ai, bi)
                                : (mode == 0 ? 0 : mode == 2 ? bi : ai);
          if (i >= n && mode == 0) continue;
          uint64_t got = get_raw(t, d, i);
          EXPECT(same_elem(t, got, want), "%s %d mode %d [%zu]: 0x%llx op 0x%llx = 0x%llx, "
                 "expected 0x%llx", hetccl_dtype_name(t), k, mode, i, (unsigned long long)ai,
                 (unsigned long long)bi, (unsigned long long)got, (unsigned long long)want);
        }
      }
    }
  }
}

/* --- premul and average ----------------------------------------------------- */

static void test_scaling(void) {
  enum { N = 517 };
  static uint64_t a[N], d[N];
  for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
    ncclDataType_t t = all_types[ti];
    for (int inplace = 0; inplace < 2; inplace++) {
      hetccl_redop_t op = {.dtype = t, .kind = HETCCL_RED_SUM, .premul = 1, .nranks = 3};
      uint64_t sraw = is_int(t) ? rnd() : from_double(t, t == ncclFloat64 ? 0.3 : -1.5);
      if (is_signed_int(t)) op.scalar_i = sext(t, sraw);
      else if (is_int(t)) op.scalar_u = sraw & (hetccl_dtype_size(t) == 8 ? ~0ull
                                               : (1ull << (8 * hetccl_dtype_size(t))) - 1);
      else op.scalar_f = as_double(t, sraw);
      for (size_t i = 0; i < N; i++) set_raw(t, a, i, random_elem(t));
      void *dst = inplace ? (void *)d : (void *)d;
      if (inplace) memcpy(d, a, sizeof(a));
      hetccl_reduce_prepare(&op, dst, inplace ? (const void *)d : (const void *)a, N);
      for (size_t i = 0; i < N; i++) {
        uint64_t x = get_raw(t, a, i), want;
        if (is_int(t)) want = x * (is_signed_int(t) ? (uint64_t)op.scalar_i : op.scalar_u);
        else want = from_double(t, as_double(t, x) * op.scalar_f);
        EXPECT(same_elem(t, get_raw(t, d, i), want), "%s premul [%zu] 0x%llx", hetccl_dtype_name(t),
               i, (unsigned long long)x);
      }
      /* Plain prepare is a copy. */
      op.premul = 0;
      memset(d, 0, sizeof(d));
      hetccl_reduce_prepare(&op, d, a, N);
      EXPECT(!memcmp(d, a, N * hetccl_dtype_size(t)), "%s prepare copy", hetccl_dtype_name(t));
      /* Average: truncating division for integers, rounded for floats. */
      op.average = 1;
      memcpy(d, a, sizeof(a));
      hetccl_reduce_finish(&op, d, N);
      for (size_t i = 0; i < N; i++) {
        uint64_t x = get_raw(t, a, i), want;
        if (is_signed_int(t)) want = (uint64_t)(sext(t, x) / 3);
        else if (is_int(t)) want = x / 3;
        else want = from_double(t, as_double(t, x) / 3.0);
        EXPECT(same_elem(t, get_raw(t, d, i), want), "%s average [%zu] 0x%llx: 0x%llx want 0x%llx",
               hetccl_dtype_name(t), i, (unsigned long long)x,
               (unsigned long long)get_raw(t, d, i), (unsigned long long)want);
      }
      op.average = 0;
      memcpy(d, a, sizeof(a));
      hetccl_reduce_finish(&op, d, N);
      EXPECT(!memcmp(d, a, N * hetccl_dtype_size(t)), "%s finish without avg", hetccl_dtype_name(t));
    }
  }
  EXPECT(hetccl_dtype_size(ncclFloat8e5m2) == 1 && hetccl_dtype_size(ncclNumTypes) == 0, "sizes");
  EXPECT(!strcmp(hetccl_dtype_name(ncclBfloat16), "bfloat16"), "names");
}

/* --- throughput ------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(void) {
  size_t bytes = 64u << 20, n = bytes / sizeof(float);
  float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *d = aligned_alloc(64, bytes);
  if (!a || !b || !d) return 1;
  for (size_t i = 0; i < n; i++) {
    a[i] = (float)i;
    b[i] = 1.0f;
    d[i] = 0.0f;
  }
  hetccl_redop_t op = {.dtype = ncclFloat32, .kind = HETCCL_RED_SUM, .nranks = 1};
  printf("%-28s %10s %12s\n", "kernel (float32, 64 MiB)", "time_ms", "GB/s_output");
  double best3 = 1e9, best2 = 1e9, bestc = 1e9;
  for (int it = 0; it < 5; it++) {
    double t0 = now_s();
    hetccl_reduce(&op, d, a, b, n);
    double t1 = now_s();
    hetccl_reduce(&op, d, d, b, n);
    double t2 = now_s();
    for (size_t off = 0; off < bytes; off += 1u << 20)
      hetccl_reduce_consume(&op, (char *)d + off, (char *)b + off, 1u << 20);
    double t3 = now_s();
    if (t1 - t0 < best3) best3 = t1 - t0;
    if (t2 - t1 < best2) best2 = t2 - t1;
    if (t3 - t2 < bestc) bestc = t3 - t2;
  }
  printf("%-28s %10.2f %12.2f\n", "d = a + b", best3 * 1e3, bytes / best3 / 1e9);
  printf("%-28s %10.2f %12.2f\n", "d += b", best2 * 1e3, bytes / best2 / 1e9);
  printf("%-28s %10.2f %12.2f\n", "consume, 1 MiB pieces", bestc * 1e3, bytes / bestc / 1e9);
  int ok = d[12345] == 12345.0f + 3.0f;
  free(a);
  free(b);
  free(d);
  if (!ok) {
    fprintf(stderr, "bench: wrong result\n");
    return 1;
  }
  return bytes / best3 / 1e9 < 0.5 ? 1 : 0; /* only an absurd figure fails */
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "bench")) return bench();
  test_conversions();
  test_kernels();
  test_scaling();
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("reduce: all conversions, kernels, premul and average match the reference\n");
  return 0;
}
