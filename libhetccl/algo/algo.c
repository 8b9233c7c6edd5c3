/* The helpers of algo_impl.h that every algorithm file shares: blocks
 * and pieces, schedules and the pairwise exchange (receives reduce
 * through the host executor's hook, sched/sched_host.c). The choice of
 * algorithm is select.c's.
 *
 * Thread: whichever thread drives the engine; never allocates (scratch
 * comes from hetccl_engine_scratch). */
#include "algo/algo_impl.h"


const char *hetccl_func_name(hetccl_func_t f) {
  static const char *const names[HETCCL_FUNC_COUNT] = {
#define HETCCL_FUNC_NAME(id, name) [HETCCL_FUNC_##id] = name,
      HETCCL_FUNCS(HETCCL_FUNC_NAME)
#undef HETCCL_FUNC_NAME
  };
  return (int)f >= 0 && f < HETCCL_FUNC_COUNT ? names[f] : "unknown";
}

/* --- shared helpers --------------------------------------------------------- */

void hetccl_algo_block(size_t count, size_t esize, int n, int b, size_t *off, size_t *cnt) {
  size_t align = esize < 64 ? 64 / esize : 1;
  size_t base = algo_round_up((count + (size_t)n - 1) / (size_t)n, align);
  size_t o = algo_min((size_t)b * base, count);
  *off = o;
  *cnt = algo_min(base, count - o);
}

/* Below this, splitting a block buys less overlap than the extra messages
 * cost. */
#define MIN_PIECE_BYTES (64u << 10)

size_t hetccl_algo_piece(const hetccl_engine_t *e, size_t block, size_t esize) {
  size_t chunk = hetccl_engine_pipeline_chunk(e); /* a multiple of 64 */
  size_t want = algo_round_up(block * esize / 4 + 1, 64);
  if (want < MIN_PIECE_BYTES) want = MIN_PIECE_BYTES;
  return algo_min(want, chunk) / esize;
}

/* --- schedules ---------------------------------------------------------------- */

hetccl_sched_t *hetccl_algo_sched(hetccl_engine_t *e, const hetccl_redop_t *op, int max_steps,
                                  size_t data, void **datap) {
  size_t head = algo_round_up(sizeof(hetccl_sched_t), 64);
  size_t steps = algo_round_up(hetccl_sched_bytes(max_steps, hetccl_engine_nranks(e)), 64);
  char *mem = hetccl_engine_scratch(e, head + steps + data);
  if (!mem) return NULL;
  hetccl_sched_t *s = (hetccl_sched_t *)mem;
  hetccl_sched_init(s, mem + head, max_steps, e, op);
  if (datap) *datap = data ? mem + head + steps : NULL;
  return s;
}

void hetccl_algo_sched_pairwise(hetccl_sched_t *s, const char *sbase, size_t sstride,
                                char *rbase, size_t rstride, size_t bytes, int copy_own,
                                int after, int *recv_at) {
  hetccl_engine_t *e = s->e;
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e);
  int copy_at = copy_own ? (n - 1 < HETCCL_ALGO_WINDOW ? n - 1 : HETCCL_ALGO_WINDOW) : 0;
  int sent[HETCCL_ALGO_WINDOW], got[HETCCL_ALGO_WINDOW];
  if (recv_at) recv_at[r] = HETCCL_STEP_NONE;
  for (int k = 1; k < n; k++) {
    int to = algo_mod(r + k, n), from = algo_mod(r - k, n), slot = k % HETCCL_ALGO_WINDOW;
    int back = k > HETCCL_ALGO_WINDOW; /* the step W earlier must be done first */
    int rs = hetccl_sched_recv(s, from, rbase + (size_t)from * rstride, bytes, after,
                               back ? got[slot] : HETCCL_STEP_NONE);
    int ss = hetccl_sched_send(s, to, sbase + (size_t)to * sstride, bytes, after,
                               back ? sent[slot] : HETCCL_STEP_NONE);
    got[slot] = rs;
    sent[slot] = ss;
    if (recv_at) recv_at[from] = rs;
    if (k == copy_at) {
      int own = hetccl_sched_copy(s, rbase + (size_t)r * rstride, sbase + (size_t)r * sstride,
                                  bytes, after, HETCCL_STEP_NONE);
      if (recv_at) recv_at[r] = own;
    }
  }
}
