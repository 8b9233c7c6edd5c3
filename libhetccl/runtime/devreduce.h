/* Reductions of device data on the device: the GPU entries' reduction
 * kernels, compiled at run time (NVRTC for CUDA, hipRTC for HIP) from one
 * kernel source (reduce_kernel.c), for the cross-island data plane.
 *
 * Contract of reduce_async: enqueue on `stream` (a cudaStream_t /
 * hipStream_t; NULL is the legacy default stream)
 *     dst[i] = FIN(OP(PRE_A(a[i]), PRE_B(b[i])))   for i < count
 * where
 *   OP     op->kind (sum, prod, max, min) on op->dtype, any of the 12 NCCL
 *          types;
 *   PRE_A  multiply by the PreMulSum scalar, when HETCCL_REDUCE_SCALE_A is
 *          set and op->premul (PRE_B likewise with SCALE_B); the scalar is
 *          op->scalar_f / scalar_i / scalar_u, or, when op->scalar_dev is
 *          not NULL, one element of op->dtype that the kernel reads there
 *          (ncclScalarDevice: a device-accessible pointer);
 *   FIN    divide by op->nranks, when HETCCL_REDUCE_FINISH is set and
 *          op->average (integers: truncating division, as NCCL).
 * a, b and dst are device-accessible: device memory, or host memory
 * registered and mapped for the device (reading b over PCIe from mapped
 * host memory is the main use). dst may be exactly a or b; partial overlap
 * is not supported. count == 0 enqueues nothing.
 *
 * The result is bit-identical to the host's (runtime/reduce.c):
 * hetccl_reduce_prepare on each scaled operand, hetccl_reduce, then
 * hetccl_reduce_finish, because a GPU rank and a CPU rank of one
 * communicator each compute their own copy of a result. Each step rounds to
 * the storage type where the host does, with the same conversion code; a
 * NaN result is the NaN operand, quieted, or the CPU's default NaN, as the
 * host's (x86-64 and AArch64 rules). One exception, which no device rule
 * can meet: a sum or product of two NaNs is a NaN on both sides, but the
 * host's payload and sign are the operand gcc happened to put first, which
 * differs between reduce.c's vector body and its scalar tail; the device
 * takes a's.
 *
 * Blocking: never waits for the device. The first call of a combination of
 * (context or device, dtype, op, flags, scalar from device) compiles and
 * loads its kernel (tens to hundreds of milliseconds, logged at INFO); later
 * calls find it in a cache and only launch.
 *
 * Errors: ncclInvalidUsage, without a WARN, when there is no runtime
 * compiler or no loaded driver (the caller falls back to the host and logs
 * reduce_available's reason once); ncclInvalidArgument with a WARN for a bad
 * op or flags; ncclUnhandledCudaError with one WARN naming the failing
 * driver or compiler call otherwise.
 *
 * Threads: any; the kernel cache is shared by the process. */
#ifndef HETCCL_RUNTIME_DEVREDUCE_H
#define HETCCL_RUNTIME_DEVREDUCE_H

#include <stddef.h>

#include "nccl.h"
#include "runtime/reduce.h"

/* The same names also appear in runtime.h. */
#ifndef HETCCL_REDUCE_SCALE_A
#define HETCCL_REDUCE_SCALE_A 0x1u /* PRE_A: a[i] * scalar (PreMulSum) */
#endif
#ifndef HETCCL_REDUCE_SCALE_B
#define HETCCL_REDUCE_SCALE_B 0x2u /* PRE_B: b[i] * scalar */
#endif
#ifndef HETCCL_REDUCE_FINISH
#define HETCCL_REDUCE_FINISH 0x4u /* FIN: / nranks (Avg) */
#endif

ncclResult_t hetccl_cuda_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                      const void *b, size_t count, unsigned flags, void *stream);

/* 1 when reduce_async can run here (a runtime compiler was found and the
 * driver is loaded); 0 and, in why, what was tried. Loads the compiler on
 * the first call; cheap afterwards. */
int hetccl_cuda_reduce_available(char *why, size_t len);

/* runtime.h: hetccl_rt_reduce_run_async_fn (a resident kernel reducing
 * pieces as they land). */
struct hetccl_reduce_run;
ncclResult_t hetccl_cuda_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                          const struct hetccl_reduce_run *run, void *stream);
ncclResult_t hetccl_hip_reduce_run_async(const hetccl_redop_t *op, unsigned flags,
                                         const struct hetccl_reduce_run *run, void *stream);

ncclResult_t hetccl_hip_reduce_async(const hetccl_redop_t *op, void *dst, const void *a,
                                     const void *b, size_t count, unsigned flags, void *stream);
int hetccl_hip_reduce_available(char *why, size_t len);

#endif
