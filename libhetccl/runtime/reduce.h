/* Host reduction kernels for every NCCL data type and operator.
 *
 * Half, bfloat16 and both fp8 formats are reduced element by element in
 * float and rounded back to the storage type (round to nearest even, with
 * NaN/Inf preserved and fp8 e4m3 saturating to its largest finite value as
 * NCCL's conversion does), so that a pairwise reduction matches NCCL's.
 *
 * Pure functions of their arguments: any thread, no allocation, no locks. */
#ifndef HETCCL_RUNTIME_REDUCE_H
#define HETCCL_RUNTIME_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

typedef enum {
  HETCCL_RED_SUM = 0,
  HETCCL_RED_PROD,
  HETCCL_RED_MAX,
  HETCCL_RED_MIN,
} hetccl_red_kind_t;

/* A resolved reduction: the built-in op it runs pairwise, plus the local
 * pre-scale (PreMulSum) and the final post-scale (Avg) applied once. */
typedef struct hetccl_redop {
  ncclDataType_t dtype;
  hetccl_red_kind_t kind;
  int premul;           /* multiply each rank's input by `scalar` before summing */
  int average;          /* divide the final sum by `nranks` */
  int nranks;
  double scalar_f;      /* premul scalar for floating types */
  int64_t scalar_i;     /* premul scalar for signed integer types */
  uint64_t scalar_u;    /* premul scalar for unsigned integer types */
  const void *scalar_dev; /* ncclScalarDevice: the premul scalar, one element of dtype in
                            device memory (device kernels read it there); NULL: the above */
} hetccl_redop_t;

/* Size in bytes of one element; 0 for an invalid type. */
size_t hetccl_dtype_size(ncclDataType_t dtype);
const char *hetccl_dtype_name(ncclDataType_t dtype);
const char *hetccl_redop_name(ncclRedOp_t op);

/* dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b. */
void hetccl_reduce(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                   size_t count);

/* The local contribution: dst[i] = src[i] * scalar if op->premul, else a copy
 * (dst may equal src). */
void hetccl_reduce_prepare(const hetccl_redop_t *op, void *dst, const void *src, size_t count);

/* The final result in place: divide by nranks if op->average (integer types:
 * truncating division, as NCCL). No-op otherwise. */
void hetccl_reduce_finish(const hetccl_redop_t *op, void *buf, size_t count);

/* The transport consume hook: dst = dst (op) src, `bytes` a multiple of the
 * element size. ctx is a const hetccl_redop_t *. */
void hetccl_reduce_consume(void *ctx, void *dst, const void *src, size_t bytes);

/* Scalar conversions used by the kernels and the tests. */
float hetccl_half_to_float(uint16_t h);
uint16_t hetccl_float_to_half(float f);
float hetccl_bf16_to_float(uint16_t h);
uint16_t hetccl_float_to_bf16(float f);
float hetccl_e4m3_to_float(uint8_t v);
uint8_t hetccl_float_to_e4m3(float f);
float hetccl_e5m2_to_float(uint8_t v);
uint8_t hetccl_float_to_e5m2(float f);

#endif
