/* Personalized exchanges, as schedules (sched/sched.h): AlltoAll
 * (pairwise: step k sends to rank + k and receives from rank - k),
 * Gather and Scatter (the root talks to every other rank in turn). A
 * bounded window of steps is in flight (HETCCL_ALGO_WINDOW per
 * direction), so the transports see several messages at once without
 * every one of n - 1 being queued.
 *
 * Every receive is a plain copy: peers may read our buffers in place
 * (engine.h: hetccl_msg_t's pull_ok).
 *
 * Thread: whichever thread drives the engine. */
#include "algo/algo_impl.h"

ncclResult_t hetccl_pairwise_alltoall(hetccl_engine_t *e, const hetccl_coll_t *c) {
  int n = hetccl_engine_nranks(e);
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  const char *in = c->sendbuf;
  char *copy;
  /* in place: blocks we receive would overwrite blocks still to send */
  size_t staged = in == c->recvbuf ? bytes * (size_t)n : 0;
  hetccl_sched_t *s = hetccl_algo_sched(e, NULL, algo_pairwise_steps(n) + 1, staged,
                                        (void **)&copy);
  if (!s) return ncclSystemError;
  s->pull_ok = 1;
  int first = HETCCL_STEP_NONE;
  if (staged) {
    first = hetccl_sched_copy(s, copy, in, staged, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    in = copy;
  }
  hetccl_algo_sched_pairwise(s, in, bytes, c->recvbuf, bytes, bytes, 1, first, NULL);
  return hetccl_sched_run_host(s, c->tag);
}

/* Gather (to_root) or Scatter: the root's side, a window of receives
 * (sends) with every other rank, its own block copied once they are
 * posted. */
static ncclResult_t linear(hetccl_engine_t *e, const hetccl_coll_t *c, int to_root) {
  int n = hetccl_engine_nranks(e), r = hetccl_engine_rank(e), root = c->root;
  size_t bytes = c->count * hetccl_dtype_size(c->dtype);
  hetccl_sched_t *s = hetccl_algo_sched(e, NULL, n + 1, 0, NULL);
  if (!s) return ncclSystemError;
  s->pull_ok = 1;
  if (r != root) {
    if (to_root)
      hetccl_sched_send(s, root, c->sendbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    else
      hetccl_sched_recv(s, root, c->recvbuf, bytes, HETCCL_STEP_NONE, HETCCL_STEP_NONE);
    return hetccl_sched_run_host(s, c->tag);
  }
  char *out = c->recvbuf;
  const char *in = c->sendbuf;
  int window[HETCCL_ALGO_WINDOW];
  for (int k = 1; k < n; k++) {
    int p = algo_mod(r + k, n), slot = k % HETCCL_ALGO_WINDOW;
    int back = k > HETCCL_ALGO_WINDOW ? window[slot] : HETCCL_STEP_NONE;
    window[slot] = to_root
                       ? hetccl_sched_recv(s, p, out + (size_t)p * bytes, bytes, back,
                                           HETCCL_STEP_NONE)
                       : hetccl_sched_send(s, p, in + (size_t)p * bytes, bytes, back,
                                           HETCCL_STEP_NONE);
    if (k == 1) /* in place, a block copied onto itself: nothing moves */
      hetccl_sched_copy(s, to_root ? out + (size_t)r * bytes : c->recvbuf,
                        to_root ? c->sendbuf : in + (size_t)r * bytes, bytes, HETCCL_STEP_NONE,
                        HETCCL_STEP_NONE);
  }
  return hetccl_sched_run_host(s, c->tag);
}

/* In place when sendbuf == recvbuf + root * bytes at the root. */
ncclResult_t hetccl_linear_gather(hetccl_engine_t *e, const hetccl_coll_t *c) {
  return linear(e, c, 1);
}

/* In place when recvbuf == sendbuf + root * bytes at the root. */
ncclResult_t hetccl_linear_scatter(hetccl_engine_t *e, const hetccl_coll_t *c) {
  return linear(e, c, 0);
}
