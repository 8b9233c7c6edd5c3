// The device reduction kernel's text (reduce_kernel.inc, written at build
// time from runtime/reduce_kernel.c) compiled as host C++ with stand-ins
// for the CUDA built-ins it uses, so that test_devreduce_emu can run every
// variant of one element type (-DHK_T_<TYPE>, -DEMU_TYPE=<name>) on the CPU
// against the host's reductions, one emulated thread at a time. What this
// cannot check (the GPU's own arithmetic, NVRTC) test_devreduce checks on a
// device.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
struct emu_dim {
  unsigned x, y, z;
};
extern emu_dim blockIdx, threadIdx, blockDim, gridDim;  // test_devreduce.c sets them
typedef void (*emu_kernel_t)(void *, const void *, const void *, uint64_t, uint64_t, uint64_t,
                             double, uint64_t, const void *, int);
typedef void (*emu_run_kernel_t)(void *, const void *, const char *, uint64_t, uint64_t, uint64_t,
                                 int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                                 const volatile uint64_t *, volatile uint64_t *,
                                 const volatile uint64_t *, uint64_t, uint64_t, unsigned *,
                                 volatile uint64_t *, double, uint64_t, const void *, int);
}

#define __global__
#define __device__
#define __forceinline__ inline
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; std::memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
// The resident kernel's barriers and fences: threads run one after another
// here, so there is nothing to wait for (its counters are set beforehand).
static inline void __syncthreads() {}
static inline void __threadfence() {}
static inline void __threadfence_system() {}
static inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
// Every wait of the resident kernel is met before its launch here: one
// that is not would spin forever, so it fails at once.
static inline void emu_pause() {
  std::fprintf(stderr, "emu: the resident kernel waits for a counter that was set otherwise\n");
  std::abort();
}
#define HK_PAUSE_HOOK emu_pause

#if defined(__aarch64__)
#define HK_NAN_ARM // as rtc.c asks on this host
#endif

#define EMU_CAT4_(a, b, c, d) a##_##b##_##c##_##d
#define EMU_CAT4(a, b, c, d) EMU_CAT4_(a, b, c, d)
#define EMU_KERNEL(op, mode) EMU_CAT4(emu_kernel, EMU_TYPE, op, mode)
#define EMU_RUN_KERNEL(op, mode) EMU_CAT4(emu_run_kernel, EMU_TYPE, op, mode)

// EMU_OP 0..3 (sum prod max min) x EMU_MODE 0..3 (plain, avg, premul,
// premul with the device scalar): test_devreduce.c's order.
#define EMU_OP 0
#include "kernel_emu_op.h"
#undef EMU_OP
#define EMU_OP 1
#include "kernel_emu_op.h"
#undef EMU_OP
#define EMU_OP 2
#include "kernel_emu_op.h"
#undef EMU_OP
#define EMU_OP 3
#include "kernel_emu_op.h"
#undef EMU_OP

#define EMU_FN(op, mode) (emu_kernel_t)EMU_CAT4(ns, EMU_TYPE, op, mode)::EMU_KERNEL(op, mode)
#define EMU_ROW(op) {EMU_FN(op, 0), EMU_FN(op, 1), EMU_FN(op, 2), EMU_FN(op, 3)}
#define EMU_TABLE_(t) emu_table_##t
#define EMU_TABLE(t) EMU_TABLE_(t)
extern "C" const emu_kernel_t EMU_TABLE(EMU_TYPE)[4][4] = {EMU_ROW(0), EMU_ROW(1), EMU_ROW(2),
                                                          EMU_ROW(3)};
#define EMU_RUN_FN(op, mode) \
  (emu_run_kernel_t)EMU_CAT4(ns, EMU_TYPE, op, mode)::EMU_RUN_KERNEL(op, mode)
#define EMU_RUN_ROW(op) {EMU_RUN_FN(op, 0), EMU_RUN_FN(op, 1), EMU_RUN_FN(op, 2), EMU_RUN_FN(op, 3)}
#define EMU_RUN_TABLE_(t) emu_run_table_##t
#define EMU_RUN_TABLE(t) EMU_RUN_TABLE_(t)
extern "C" const emu_run_kernel_t EMU_RUN_TABLE(EMU_TYPE)[4][4] = {
    EMU_RUN_ROW(0), EMU_RUN_ROW(1), EMU_RUN_ROW(2), EMU_RUN_ROW(3)};
