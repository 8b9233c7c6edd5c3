/* Collective algorithms over the engine's point-to-point plane.
 *
 * One collective = one call of hetccl_algo_run on every rank of the
 * communicator, with the same func, count, dtype, op and root (the engine
 * tags messages so that a mismatch is detected). Algorithms see host memory
 * only (device data is staged by the caller) and never a transport.
 *
 * Contracts common to all:
 *   - count == 0 is a no-op returning ncclSuccess (no message is sent).
 *   - in-place (sendbuf == recvbuf, or the NCCL in-place offsets for
 *     allgather / reducescatter / gather / scatter) works.
 *   - buffers not needed on a rank (recvbuf of a non-root Reduce) may be NULL.
 *   - any rank count >= 1, powers of two or not.
 *   - blocking: returns when this rank's part is complete.
 */
#ifndef HETCCL_ALGO_H
#define HETCCL_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "p2p/engine.h"
#include "runtime/reduce.h"

/* name */
#define HETCCL_FUNCS(X)                                                        \
  X(ALLREDUCE, "AllReduce")                                                    \
  X(BROADCAST, "Broadcast")                                                    \
  X(REDUCE, "Reduce")                                                          \
  X(ALLGATHER, "AllGather")                                                    \
  X(REDUCESCATTER, "ReduceScatter")                                            \
  X(ALLTOALL, "AlltoAll")                                                      \
  X(GATHER, "Gather")                                                          \
  X(SCATTER, "Scatter")                                                        \
  X(SEND, "Send")                                                              \
  X(RECV, "Recv")

typedef enum {
#define HETCCL_FUNC_ENUM(id, name) HETCCL_FUNC_##id,
  HETCCL_FUNCS(HETCCL_FUNC_ENUM)
#undef HETCCL_FUNC_ENUM
  HETCCL_FUNC_COUNT
} hetccl_func_t;

const char *hetccl_func_name(hetccl_func_t f);

/* Whether f reduces (has an operator) / names a root. */
static inline int hetccl_func_reduces(hetccl_func_t f) {
  return f == HETCCL_FUNC_ALLREDUCE || f == HETCCL_FUNC_REDUCESCATTER || f == HETCCL_FUNC_REDUCE;
}
static inline int hetccl_func_rooted(hetccl_func_t f) {
  return f == HETCCL_FUNC_BROADCAST || f == HETCCL_FUNC_REDUCE || f == HETCCL_FUNC_GATHER ||
         f == HETCCL_FUNC_SCATTER;
}

/* count semantics follow NCCL: AllReduce/Broadcast/Reduce/AlltoAll(per peer)
 * /Gather,Scatter (per rank): count; AllGather: sendcount; ReduceScatter:
 * recvcount. */
typedef struct hetccl_coll {
  hetccl_func_t func;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  ncclDataType_t dtype;
  hetccl_redop_t op; /* meaningful for reducing functions */
  int root;          /* Broadcast, Reduce, Gather, Scatter */
  uint64_t tag;      /* the operation's signature on its messages (p2p/engine.h: hetccl_msg_t);
                        0: unchecked */
} hetccl_coll_t;

/* Runs one collective (not SEND/RECV: the core posts those itself). */
ncclResult_t hetccl_algo_run(hetccl_engine_t *e, const hetccl_coll_t *c);

#endif
