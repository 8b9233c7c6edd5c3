/* test_devreduce_emu emu: the kernel text compiled for the host
 * (kernel_emu.cpp) and run one emulated thread at a time, against the
 * host's reductions: every variant and layout of the plain kernel on
 * 100,003 elements and small counts, and the resident kernel on runs of
 * narrow and wide pieces (test_devreduce.c has the cases' data). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/reduce.h"
#include "runtime/rtc.h"
#include "runtime/runtime.h"

#include "devreduce_cases.h"

typedef struct {
  unsigned x, y, z;
} emu_dim_t;
emu_dim_t blockIdx, threadIdx, blockDim, gridDim;
typedef void (*emu_kernel_t)(void *, const void *, const void *, uint64_t, uint64_t, uint64_t,
                             double, uint64_t, const void *, int);
#define EMU_TYPES(X) \
  X(int8) X(uint8) X(int32) X(uint32) X(int64) X(uint64) X(float16) X(float32) X(float64) \
  X(bfloat16) X(e4m3) X(e5m2)
#define EMU_DECLARE(t) extern const emu_kernel_t emu_table_##t[4][4];
EMU_TYPES(EMU_DECLARE)
#define EMU_ENTRY(t) emu_table_##t,
static const emu_kernel_t (*const emu_tables[NTYPES])[4] = {EMU_TYPES(EMU_ENTRY)};
#define EMU_N 100003

/* The launch, one emulated thread after another (threads share no state). */
static void emu_launch(emu_kernel_t fn, const hetccl_rtc_launch_t *l) {
  gridDim.x = l->grid;
  blockDim.x = l->block;
  for (blockIdx.x = 0; blockIdx.x < l->grid; blockIdx.x++)
    for (threadIdx.x = 0; threadIdx.x < l->block; threadIdx.x++)
      fn(l->dst, l->a, l->b, l->head, l->nvec, l->count, l->s.f, l->s.u, l->s.dev, l->s.nranks);
}

static size_t emu_case(bufs_t *B, size_t t, int kind, int mode, const layout_t *L, size_t n) {
  ncclDataType_t dt = all_types[t];
  size_t size = hetccl_dtype_size(dt);
  static _Alignas(16) uint64_t scalar[2];
  hetccl_redop_t op = case_op(dt, kind, mode, scalar), host = op;
  host.scalar_dev = NULL;
  if (mode == MODE_PREMUL_DEV) dev_scalar(dt, scalar, &host);
  uint8_t *a = B->da + L->oa * size, *d = L->inplace ? a : B->dd + L->od * size;
  uint8_t *b = B->db + L->ob * size;
  memcpy(a, B->ha, n * size);
  memcpy(b, B->hb, n * size);
  if (!L->inplace) memset(B->dd, 0xa5, (n + 2 * SLACK) * size);
  reference(&host, mode_flags[mode], B, n);
  hetccl_rtc_variant_t v;
  EXPECT(hetccl_rtc_variant_of(&op, mode_flags[mode], 0, "emu", &v) == ncclSuccess &&
             v.flags == mode_flags[mode] && v.scalar_dev == (mode == MODE_PREMUL_DEV), "variant");
  hetccl_rtc_launch_t l;
  hetccl_rtc_plan(&op, d, a, b, n, 2, &l); /* few blocks: many grid-stride rounds */
  if (n) emu_launch(emu_tables[t][kind][mode], &l);
  memcpy(B->out, d, (n + 1) * size);
  char what[96];
  snprintf(what, sizeof(what), "emu %s %s %s %s n=%zu", hetccl_dtype_name(dt), kind_names[kind],
           mode_names[mode], L->name, n);
  size_t bad = compare(dt, kind, B, n, !L->inplace, what);
  failures += bad != 0;
  return bad;
}

/* The resident kernel (hetccl_reduce_run_kernel) on a run of `steps`
 * pieces of `span` slots of S elements (the last of last_span, cut
 * short), its first piece at stage piece depth - 1 so that it runs on into
 * the stage's room; the stage holds one operand, `local` the other (with
 * swap the stage's is the first), the counters already past every wait.
 * Checks the result against the host's, that *reduced and *seen end at
 * the last piece's end and that every arrive word is back at zero. */
#define EMU_RUN_S 64
#define EMU_RUN_DEPTH 16
typedef void (*emu_run_kernel_t)(void *, const void *, const char *, uint64_t, uint64_t, uint64_t,
                                 int, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                                 const volatile uint64_t *, volatile uint64_t *,
                                 const volatile uint64_t *, uint64_t, uint64_t, unsigned *,
                                 volatile uint64_t *, double, uint64_t, const void *, int);
#define EMU_RUN_DECLARE(t) extern const emu_run_kernel_t emu_run_table_##t[4][4];
EMU_TYPES(EMU_RUN_DECLARE)
#define EMU_RUN_ENTRY(t) emu_run_table_##t,
static const emu_run_kernel_t (*const emu_run_tables[NTYPES])[4] = {EMU_TYPES(EMU_RUN_ENTRY)};

static size_t emu_run_case(bufs_t *B, size_t t, int kind, int mode, int span, int swap,
                           int inplace) {
  ncclDataType_t dt = all_types[t];
  size_t size = hetccl_dtype_size(dt), slot = EMU_RUN_S * size;
  uint64_t steps = 6, per = (uint64_t)span * EMU_RUN_S, first = EMU_RUN_DEPTH - 1;
  uint64_t last_n = EMU_RUN_S / 2 + 3, n = (steps - 1) * per + last_n, last_span = 1;
  static _Alignas(16) uint64_t scalar[2];
  hetccl_redop_t op = case_op(dt, kind, mode, scalar), host = op;
  host.scalar_dev = NULL;
  if (mode == MODE_PREMUL_DEV) dev_scalar(dt, scalar, &host);
  /* stage pieces in use are never reused in one run here: every piece can
   * be in place before the launch */
  static _Alignas(16) uint8_t stage[(EMU_RUN_DEPTH + 1) * EMU_RUN_S * 8];
  uint64_t staged[EMU_RUN_DEPTH] = {0}, dep[4], reduced = 0, end = 0, seen = 0;
  unsigned arrive[EMU_RUN_DEPTH] = {0};
  for (int i = 0; i < 4; i++) dep[i] = UINT64_MAX >> 2;
  const uint8_t *in_stage = swap ? B->ha : B->hb, *in_local = swap ? B->hb : B->ha;
  for (uint64_t k = 0; k < steps; k++) {
    uint64_t sp = k + 1 == steps ? last_span : (uint64_t)span, i = first + k * (uint64_t)span;
    uint64_t cnt = k + 1 == steps ? last_n : per;
    memcpy(stage + (i % EMU_RUN_DEPTH) * slot, in_stage + k * per * size, cnt * size);
    end = i + sp;
    staged[(end - 1) % EMU_RUN_DEPTH] = end;
  }
  uint8_t *local = B->da, *d = inplace ? local : B->dd;
  memcpy(local, in_local, n * size);
  if (!inplace) memset(B->dd, 0xa5, (n + 2 * SLACK) * size);
  reference(&host, mode_flags[mode], B, n);
  /* With swap the scaled operands would trade flags (exec_stream.c); these
   * modes scale both or neither, so the variant is the mode's either way. */
  hetccl_reduce_run_t run = {.dst = d, .local = local, .stage = stage, .count = n, .per = per,
                             .steps = steps, .swap = swap, .first = first,
                             .span = (uint64_t)span, .last_span = last_span,
                             .depth = EMU_RUN_DEPTH, .slot_bytes = slot, .staged = staged,
                             .reduced = &reduced, .dep = dep, .dep_first = 0, .dep_slots = 4,
                             .arrive = arrive, .seen = &seen, .blocks = 2};
  hetccl_rtc_run_launch_t l;
  hetccl_rtc_plan_run(&op, &run, &l);
  emu_run_kernel_t fn = emu_run_tables[t][kind][mode];
  void *const *P = l.params;
  gridDim.x = l.grid;
  blockDim.x = l.block;
  for (blockIdx.x = 0; blockIdx.x < l.grid; blockIdx.x++)
    for (threadIdx.x = 0; threadIdx.x < l.block; threadIdx.x++)
      /* through the launch's parameter list, as the driver reads it: its
       * order and types are the kernel's */
      fn(*(void **)P[0], *(const void **)P[1], *(const char **)P[2], *(uint64_t *)P[3],
         *(uint64_t *)P[4], *(uint64_t *)P[5], *(int *)P[6], *(uint64_t *)P[7],
         *(uint64_t *)P[8], *(uint64_t *)P[9], *(uint64_t *)P[10], *(uint64_t *)P[11],
         *(const volatile uint64_t **)P[12], *(volatile uint64_t **)P[13],
         *(const volatile uint64_t **)P[14], *(uint64_t *)P[15], *(uint64_t *)P[16],
         *(unsigned **)P[17], *(volatile uint64_t **)P[18], *(double *)P[19],
         *(uint64_t *)P[20], *(const void **)P[21], *(int *)P[22]);
  memcpy(B->out, d, (n + 1) * size);
  char what[128];
  snprintf(what, sizeof(what), "emu run %s %s %s span %d%s%s", hetccl_dtype_name(dt),
           kind_names[kind], mode_names[mode], span, swap ? " swap" : "",
           inplace ? " in place" : "");
  size_t bad = compare(dt, kind, B, n, !inplace, what);
  if (reduced != end || seen != end) {
    fprintf(stderr, "  %s: reduced %llu, seen %llu, want %llu\n", what,
            (unsigned long long)reduced, (unsigned long long)seen, (unsigned long long)end);
    bad++;
  }
  for (int i = 0; i < EMU_RUN_DEPTH; i++)
    if (arrive[i]) {
      fprintf(stderr, "  %s: arrive[%d] left at %u\n", what, i, arrive[i]);
      bad++;
    }
  failures += bad != 0;
  return bad;
}

void mode_emu(void) {
  bufs_t B;
  size_t bytes = (EMU_N + 2 * SLACK) * 8;
  uint8_t **all[] = {&B.ha, &B.hb, &B.ta, &B.tb, &B.ref, &B.out, &B.da, &B.dd, &B.db};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
    if (!(*all[i] = aligned_alloc(16, (bytes + 15) & ~(size_t)15))) exit(1);
  static const size_t small[] = {0, 1, 2, 15, 16, 17, 33, 1025};
  for (size_t t = 0; t < NTYPES; t++) {
    size_t size = hetccl_dtype_size(all_types[t]), bad = 0;
    for (size_t i = 0; i < EMU_N; i++) {
      random_element(all_types[t], B.ha + i * size);
      random_element(all_types[t], B.hb + i * size);
    }
    for (int k = 0; k < 4; k++)
      for (int m = 0; m < NMODES; m++)
        for (size_t l = 0; l < NLAYOUTS; l++) {
          bad += emu_case(&B, t, k, m, &layouts[l], EMU_N);
          for (size_t c = 0; c < sizeof(small) / sizeof(small[0]); c++)
            bad += emu_case(&B, t, k, m, &layouts[l], small[c]);
        }
    for (int k = 0; k < 4; k++)
      for (int m = 0; m < NMODES; m++)
        for (int span = 1; span <= 2; span++)
          for (int swap = 0; swap < 2; swap++)
            bad += emu_run_case(&B, t, k, m, span, swap, span == 2 && !swap);
    printf("emu %-11s %s\n", hetccl_dtype_name(all_types[t]), bad ? "FAIL" : "ok");
  }
  printf("%zu results of NaN + NaN or NaN * NaN differ from the host's in NaN bits only\n",
         nan_pairs);
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(*all[i]);
}
