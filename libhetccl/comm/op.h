/* One collective or point-to-point call, as the user made it: what the
 * entry points pack (api/entries.c) and every layer below hands on (the
 * backends' dispatch, comm/backend.h; the engine's tasks, exec/enqueue.h;
 * the hierarchical forms, hier/hier.h). A plain value: no thread, no
 * ownership of the buffers it names. */
#ifndef HETCCL_COMM_OP_H
#define HETCCL_COMM_OP_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Operations, named as the vendor slot that serves each when forwarded. */
#define HETCCL_OP_KINDS(X)                                                     \
  X(AllReduce) X(Broadcast) X(Bcast) X(Reduce) X(AllGather) X(ReduceScatter)  \
  X(AlltoAll) X(Gather) X(Scatter) X(Send) X(Recv)

typedef enum {
#define HETCCL_OP_KIND_ENUM(k) HETCCL_OP_##k,
  HETCCL_OP_KINDS(HETCCL_OP_KIND_ENUM)
#undef HETCCL_OP_KIND_ENUM
  HETCCL_OP_KIND_COUNT
} hetccl_op_kind_t;

#define HETCCL_NO_ROOT INT32_MIN /* the function takes no root / peer / operator */
#define HETCCL_NO_PEER INT32_MIN
#define HETCCL_NO_REDOP ((ncclRedOp_t)INT32_MIN)

/* count is NCCL's: per rank for AllGather (sendcount), ReduceScatter
 * (recvcount), AlltoAll, Gather and Scatter. */
typedef struct hetccl_op {
  hetccl_op_kind_t kind;
  const char *fn; /* the exported name, for messages */
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t redop;
  int root, peer;
  void *stream;
  const ncclCollConfig_t *config; /* the *Config forms; else NULL */
} hetccl_op_t;

#endif
