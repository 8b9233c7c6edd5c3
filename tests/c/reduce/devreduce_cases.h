/* What test_devreduce.c's cases share with the CPU emulation
 * (devreduce_emu.c): the types, operators and modes of a case, its data,
 * its buffers and layouts, the host's answer and the comparison. Defined
 * in test_devreduce.c. */
#ifndef HETCCL_TEST_DEVREDUCE_CASES_H
#define HETCCL_TEST_DEVREDUCE_CASES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nccl.h"
#include "runtime/reduce.h"

extern int failures;

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#define NTYPES 12
extern const ncclDataType_t all_types[NTYPES];
extern const char *const kind_names[];

/* The four modes of the table: flags and what the op carries. */
typedef enum { MODE_PLAIN, MODE_AVG, MODE_PREMUL, MODE_PREMUL_DEV, NMODES } mode_t_;
extern const char *const mode_names[];
extern const unsigned mode_flags[];

/* One element of type t: random bits, a moderate random value, or a
 * special (zeros, infinities, NaNs, denormals, the narrow formats' limits). */
void random_element(ncclDataType_t t, void *p);
int is_nan(ncclDataType_t t, const void *p);
/* The op of a case; scalars: host -1.7 (or -3, or a wide unsigned), device 2.5 (or 7). */
hetccl_redop_t case_op(ncclDataType_t t, int kind, int mode, const void *devscalar);
/* The device scalar's bytes for t, and the same value as the host path takes it. */
void dev_scalar(ncclDataType_t t, uint64_t *bytes, hetccl_redop_t *host);

#define BIG_N 1000003
#define SLACK 16 /* spare elements around every buffer */

typedef struct {
  uint8_t *ha, *hb;           /* the inputs, host copies */
  uint8_t *ta, *tb, *ref, *out;
  uint8_t *da, *dd;           /* a and dst: device memory */
  uint8_t *hb_pinned, *db;    /* b: mapped pinned host memory, and its device address */
  void *dscalar;              /* the ncclScalarDevice scalar */
  void *stream;
} bufs_t;

typedef struct {
  const char *name;
  size_t oa, ob, od; /* element offsets */
  int inplace;       /* dst == a */
} layout_t;

#define NLAYOUTS 4
extern const layout_t layouts[NLAYOUTS];

/* The host's answer in B->ref: each scaled operand prepared, reduced, finished. */
void reference(const hetccl_redop_t *op, unsigned flags, bufs_t *B, size_t n);
/* Results of NaN + NaN or NaN * NaN that differ from the host's in NaN bits
 * only (compare counts them, and does not fail them). */
extern size_t nan_pairs;
/* Mismatches of B->out against B->ref (the first few printed), and a write
 * past the end when guard. */
size_t compare(ncclDataType_t t, int kind, const bufs_t *B, size_t n, int guard,
               const char *what);

/* devreduce_emu.c: the kernel text run on the CPU (test_devreduce_emu emu). */
void mode_emu(void);

#endif
