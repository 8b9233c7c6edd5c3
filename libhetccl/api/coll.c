/* Collectives and point-to-point: validate, then forward to the vendor
 * communicator or hand a task to the engine (core/group.c).
 *
 * Thread: the API caller. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "core/group.h"
#include "core/hier.h"
#include "core/init.h"
#include "util/knobs.h"

/* Forwarded communicators: one liveness check, one indirect call. */
#define FORWARD(comm, slot, ...)                                               \
  do {                                                                         \
    ncclResult_t r_ = hetccl_comm_check(comm, "nccl" #slot);                   \
    if (r_ != ncclSuccess) return r_;                                          \
    if (comm->vendor) {                                                        \
      TRACE(HETCCL_CALL, "nccl" #slot " rank %d -> %s", comm->rank, comm->vendor->name); \
      return HETCCL_VENDOR_CALL(comm->vendor, slot, __VA_ARGS__);              \
    }                                                                          \
  } while (0)

#define NO_ROOT INT32_MIN

typedef struct coll_args {
  const char *fn;
  hetccl_func_t func;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int has_op;
  int root;        /* NO_ROOT: the function has none */
  size_t send_mul; /* elements of sendbuf = count * send_mul (0: none needed) */
  size_t recv_mul;
  int send_root_only, recv_root_only;
} coll_args_t;

static ncclResult_t check_buffer(const coll_args_t *a, const void *buf, size_t mul, int root_only,
                                 int rank, const char *name) {
  if (mul == 0 || a->count == 0) return ncclSuccess;
  if (root_only && rank != a->root) return ncclSuccess;
  if (buf == NULL) {
    WARN("%s: %s is NULL with count %zu", a->fn, name, a->count);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* Which of the buffers are device memory. On an engine communicator those
 * are staged through pinned host memory in the order of `stream`
 * (core/devpath.h); a process with no GPU runtime in use has none. */
static ncclResult_t classify_buffers(ncclComm_t comm, const char *fn, const void *send,
                                     const void *recv, void *stream, hetccl_task_t *t) {
  if (comm->ptr_kind == HETCCL_DEV_HOST) return ncclSuccess;
  t->stream = stream; /* a staged batch orders every task of it on its stream */
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  if (!rt) return ncclSuccess;
  const void *bufs[2] = {send, recv};
  uint8_t *staged[2] = {&t->stage_send, &t->stage_recv};
  for (int i = 0; i < 2; i++) {
    hetccl_mem_kind_t kind = HETCCL_MEM_HOST;
    int dev;
    if (bufs[i]) HETCCL_CHECK(rt->mem_kind(bufs[i], &kind, &dev));
    *staged[i] = kind != HETCCL_MEM_HOST;
  }
  if (!t->stage_send && !t->stage_recv) return ncclSuccess;
  int capturing = 0;
  HETCCL_CHECK(rt->stream_capturing(stream, &capturing));
  if (capturing) {
    WARN("%s: stream %p is being captured into a graph, and this communicator spans several "
         "islands: hetccl's engine cannot be captured yet", fn, stream);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

static ncclResult_t coll_validate(ncclComm_t comm, const coll_args_t *a, size_t *elem) {
  if ((int)a->dtype < 0 || (int)a->dtype >= ncclNumTypes) {
    WARN("%s: invalid datatype %d", a->fn, (int)a->dtype);
    return ncclInvalidArgument;
  }
  *elem = hetccl_dtype_size(a->dtype);
  if (a->root != NO_ROOT && (a->root < 0 || a->root >= comm->nranks)) {
    WARN("%s: root %d out of range [0, %d)", a->fn, a->root, comm->nranks);
    return ncclInvalidArgument;
  }
  size_t mul = a->send_mul > a->recv_mul ? a->send_mul : a->recv_mul;
  if (mul == 0) mul = 1;
  if (a->count > (SIZE_MAX >> 1) / mul / *elem) {
    WARN("%s: count %zu of %s overflows the buffer size", a->fn, a->count,
         hetccl_dtype_name(a->dtype));
    return ncclInvalidArgument;
  }
  HETCCL_CHECK(check_buffer(a, a->sendbuf, a->send_mul, a->send_root_only, comm->rank, "sendbuff"));
  HETCCL_CHECK(check_buffer(a, a->recvbuf, a->recv_mul, a->recv_root_only, comm->rank, "recvbuff"));
  return ncclSuccess;
}

static ncclResult_t comm_usable(ncclComm_t comm, const char *fn) {
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
  if (err != ncclSuccess && err != ncclInProgress) {
    char why[HETCCL_ERRMSG_BYTES]; /* a proxy thread may be rewriting it */
    pthread_mutex_lock(&comm->lock);
    memcpy(why, comm->last_error, sizeof(why));
    pthread_mutex_unlock(&comm->lock);
    WARN("%s: communicator (rank %d) failed earlier with %s: %s", fn, comm->rank,
         ncclGetErrorString(err), why);
    return err;
  }
  if (comm->finalized) {
    WARN("%s: communicator (rank %d) was finalized", fn, comm->rank);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* Elementwise functions: piece k of the result needs piece k of the
 * input only. */
static int func_elementwise(hetccl_func_t f) {
  return f == HETCCL_FUNC_ALLREDUCE || f == HETCCL_FUNC_BROADCAST || f == HETCCL_FUNC_REDUCE;
}

/* Queue t, cut into comm->stage_piece-byte pieces (one task each, in
 * order, one group) where that applies: staging then moves piece k + 1
 * while the engine runs piece k (core/devpath.h). Every rank cuts the same
 * way, as the pieces are separate operations to its peers. */
static ncclResult_t enqueue_pieces(ncclComm_t comm, hetccl_task_t *t, size_t elem) {
  int check = (int)hetccl_knob_int(HETCCL_KNOB_CHECK_MISMATCH);
  size_t per = comm->stage_piece / elem;
  size_t n = 1;
  if (per && func_elementwise(t->coll.func) && t->coll.count > per)
    n = (t->coll.count + per - 1) / per;
  if (n == 1) {
    t->tag = check ? hetccl_comm_coll_tag(comm, &t->coll) : 0;
    return hetccl_group_enqueue(t);
  }
  hetccl_task_t *head = NULL, **tail = &head;
  for (size_t k = 0; k < n; k++) {
    hetccl_task_t *p = malloc(sizeof(*p));
    if (!p) {
      WARN("%s: out of memory for %zu pieces", hetccl_func_name(t->coll.func), n);
      hetccl_group_free_tasks(head);
      free(t);
      return ncclSystemError;
    }
    size_t off = k * per, cnt = k + 1 < n ? per : t->coll.count - off;
    *p = *t;
    p->next = NULL;
    p->coll.count = cnt;
    if (p->coll.sendbuf) p->coll.sendbuf = (const char *)t->coll.sendbuf + off * elem;
    if (p->coll.recvbuf) p->coll.recvbuf = (char *)t->coll.recvbuf + off * elem;
    p->in_bytes = t->in_bytes ? cnt * elem : 0;
    p->out_bytes = t->out_bytes ? cnt * elem : 0;
    *tail = p;
    tail = &p->next;
  }
  free(t);
  /* Signatures in call order, as every rank numbers them. */
  hetccl_group_start();
  while (head) {
    hetccl_task_t *p = head;
    head = p->next;
    p->tag = check ? hetccl_comm_coll_tag(comm, &p->coll) : 0;
    hetccl_group_enqueue(p); /* inside a group: appends */
  }
  return hetccl_group_end();
}

static ncclResult_t coll_submit(ncclComm_t comm, const coll_args_t *a, void *stream) {
  size_t elem;
  HETCCL_CHECK(comm_usable(comm, a->fn));
  HETCCL_CHECK(coll_validate(comm, a, &elem));
  hetccl_task_t *t = calloc(1, sizeof(*t));
  if (!t) {
    WARN("%s: out of memory", a->fn);
    return ncclSystemError;
  }
  t->comm = comm;
  t->kind = HETCCL_TASK_COLL;
  t->coll.func = a->func;
  t->coll.sendbuf = a->sendbuf;
  t->coll.recvbuf = a->recvbuf;
  t->coll.count = a->count;
  t->coll.dtype = a->dtype;
  t->coll.root = a->root == NO_ROOT ? 0 : a->root;
  int is_root = comm->rank == a->root;
  t->in_bytes = a->send_root_only && !is_root ? 0 : a->count * a->send_mul * elem;
  t->out_bytes = a->recv_root_only && !is_root ? 0 : a->count * a->recv_mul * elem;
  ncclResult_t res = a->has_op ? hetccl_comm_resolve_op(comm, a->op, a->dtype, &t->coll.op)
                               : ncclSuccess;
  if (res == ncclSuccess) res = classify_buffers(comm, a->fn, a->sendbuf, a->recvbuf, stream, t);
  if (res != ncclSuccess) {
    free(t);
    return res;
  }
  return enqueue_pieces(comm, t, elem);
}

/* Engine path of every collective: in-flight accounting, last error. */
static ncclResult_t coll_engine(ncclComm_t comm, const coll_args_t *a, cudaStream_t stream) {
  hetccl_comm_enter(comm);
  ncclResult_t res = coll_submit(comm, a, stream);
  hetccl_comm_leave(comm);
  if (res != ncclSuccess && res != ncclInProgress) hetccl_group_note_error(res);
  return hetccl_api_ret(comm, res);
}

static ncclResult_t coll_config_check(const char *fn, const ncclCollConfig_t *config) {
  if (!config) return ncclSuccess;
  if (config->magic != NCCL_API_MAGIC) {
    WARN("%s: ncclCollConfig_t not initialised with NCCL_COLLCONFIG_INITIALIZER", fn);
    return ncclInvalidArgument;
  }
  if (config->algSelection && config->algSelection[0] && config->forceAlgSelection) {
    WARN("%s: algorithm selection \"%s\" cannot be honoured by hetccl's engine", fn,
         config->algSelection);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* --- the collectives ------------------------------------------------------ */

/* Reduce, Broadcast and AllReduce on a communicator, forwarded or on the
 * engine: the public entry points after their re-entry check, and the
 * phases of a hierarchical AllReduce on an island or leaders communicator
 * (calls that start inside hetccl, so no re-entry check). */
static ncclResult_t reduce_on(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream) {
  FORWARD(comm, Reduce, sendbuff, recvbuff, count, datatype, op, root, comm->vcomm, stream);
  coll_args_t a = {"ncclReduce", HETCCL_FUNC_REDUCE, sendbuff, recvbuff, count, datatype,
                   op, 1, root, 1, 1, 0, 1};
  return coll_engine(comm, &a, stream);
}

static ncclResult_t broadcast_on(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  FORWARD(comm, Broadcast, sendbuff, recvbuff, count, datatype, root, comm->vcomm, stream);
  coll_args_t a = {"ncclBroadcast", HETCCL_FUNC_BROADCAST, sendbuff, recvbuff, count, datatype,
                   ncclSum, 0, root, 1, 1, 1, 0};
  return coll_engine(comm, &a, stream);
}

static ncclResult_t allreduce_on(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream) {
  FORWARD(comm, AllReduce, sendbuff, recvbuff, count, datatype, op, comm->vcomm, stream);
  coll_args_t a = {"ncclAllReduce", HETCCL_FUNC_ALLREDUCE, sendbuff, recvbuff, count, datatype,
                   op, 1, NO_ROOT, 1, 1, 0, 0};
  return coll_engine(comm, &a, stream);
}

/* Inside the island to its leader (island rank 0), across the leaders,
 * back inside the island (core/hier.h). A one-rank island has only the
 * middle phase, out of place as asked (no island communicator). */
static ncclResult_t allreduce_hier(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream) {
  ncclResult_t res = comm_usable(comm, "ncclAllReduce");
  if (res != ncclSuccess) return hetccl_api_ret(comm, res);
  hetccl_comm_enter(comm);
  ncclComm_t island = comm->island, leaders = comm->leaders;
  int alone = island == NULL;
  const void *across = sendbuff;
  TRACE(HETCCL_COLL, "AllReduce rank %d: hierarchical, %zu x %s, island of %d%s", comm->rank,
        count, hetccl_dtype_name(datatype), alone ? 1 : island->nranks,
        leaders ? ", leader" : "");
  int in_leaders = 0; /* which communicator the failing phase ran on */
  if (!alone) {
    res = reduce_on(sendbuff, recvbuff, count, datatype, op, 0, island, stream);
    across = recvbuff;
  }
  if (res == ncclSuccess && leaders) {
    in_leaders = 1;
    res = allreduce_on(across, recvbuff, count, datatype, op, leaders, stream);
  }
  if (res == ncclSuccess && !alone) {
    in_leaders = 0;
    res = broadcast_on(recvbuff, recvbuff, count, datatype, 0, island, stream);
  }
  if (res != ncclSuccess && res != ncclInProgress) {
    /* The phase spoke of its own communicator's ranks: name them as here. */
    char cause[HETCCL_ERRMSG_BYTES];
    hetccl_hier_translate(comm, in_leaders, hetccl_last_error(), cause, sizeof(cause));
    WARN("ncclAllReduce: rank %d: hierarchical AllReduce failed %s: %s", comm->rank,
         in_leaders ? "across the islands' leaders" : "inside its island", cause);
    hetccl_comm_set_error(comm, res);
    if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) /* abort tears them down */
      hetccl_hier_fail(comm, res, hetccl_last_error());
  }
  hetccl_comm_leave(comm);
  return hetccl_api_ret(comm, res);
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  HETCCL_REENTRY(AllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  FORWARD(comm, AllReduce, sendbuff, recvbuff, count, datatype, op, comm->vcomm, stream);
  if (hetccl_hier_allreduce_applies(comm, count, op))
    return allreduce_hier(sendbuff, recvbuff, count, datatype, op, comm, stream);
  return allreduce_on(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  HETCCL_REENTRY(Broadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
  return broadcast_on(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(Bcast, buff, count, datatype, root, comm, stream);
  FORWARD(comm, Bcast, buff, count, datatype, root, comm->vcomm, stream);
  coll_args_t a = {"ncclBcast", HETCCL_FUNC_BROADCAST, buff, buff, count, datatype,
                   ncclSum, 0, root, 1, 1, 1, 0};
  return coll_engine(comm, &a, stream);
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  HETCCL_REENTRY(Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  return reduce_on(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
  FORWARD(comm, AllGather, sendbuff, recvbuff, sendcount, datatype, comm->vcomm, stream);
  coll_args_t a = {"ncclAllGather", HETCCL_FUNC_ALLGATHER, sendbuff, recvbuff, sendcount,
                   datatype, ncclSum, 0, NO_ROOT, 1, (size_t)comm->nranks, 0, 0};
  return coll_engine(comm, &a, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff,
         size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  HETCCL_REENTRY(ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  FORWARD(comm, ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm->vcomm, stream);
  coll_args_t a = {"ncclReduceScatter", HETCCL_FUNC_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                   datatype, op, 1, NO_ROOT, (size_t)comm->nranks, 1, 0, 0};
  return coll_engine(comm, &a, stream);
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(AlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  FORWARD(comm, AlltoAll, sendbuff, recvbuff, count, datatype, comm->vcomm, stream);
  coll_args_t a = {"ncclAlltoAll", HETCCL_FUNC_ALLTOALL, sendbuff, recvbuff, count, datatype,
                   ncclSum, 0, NO_ROOT, (size_t)comm->nranks, (size_t)comm->nranks, 0, 0};
  return coll_engine(comm, &a, stream);
}

NCCL_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(Gather, sendbuff, recvbuff, count, datatype, root, comm, stream);
  FORWARD(comm, Gather, sendbuff, recvbuff, count, datatype, root, comm->vcomm, stream);
  coll_args_t a = {"ncclGather", HETCCL_FUNC_GATHER, sendbuff, recvbuff, count, datatype,
                   ncclSum, 0, root, 1, (size_t)comm->nranks, 0, 1};
  return coll_engine(comm, &a, stream);
}

NCCL_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  HETCCL_REENTRY(Scatter, sendbuff, recvbuff, count, datatype, root, comm, stream);
  FORWARD(comm, Scatter, sendbuff, recvbuff, count, datatype, root, comm->vcomm, stream);
  coll_args_t a = {"ncclScatter", HETCCL_FUNC_SCATTER, sendbuff, recvbuff, count, datatype,
                   ncclSum, 0, root, (size_t)comm->nranks, 1, 1, 0};
  return coll_engine(comm, &a, stream);
}

/* --- per-call config variants: the config is checked, its tuning hints do
 * not apply to the engine, and a forwarded communicator gets the plain call
 * (the vendor libraries this forwards to predate nccl*Config). */

NCCL_API(ncclResult_t, ncclAllReduceConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclAllReduceConfig", config));
  return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcastConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclBroadcastConfig(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclBroadcastConfig", config));
  return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclReduceConfig", config));
  return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGatherConfig, const void *sendbuff, void *recvbuff,
         size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclAllGatherConfig(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclAllGatherConfig", config));
  return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatterConfig, const void *sendbuff, void *recvbuff,
         size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream, const ncclCollConfig_t *config);
ncclResult_t ncclReduceScatterConfig(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclReduceScatterConfig", config));
  return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

NCCL_API(ncclResult_t, ncclAlltoAllConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclAlltoAllConfig(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclAlltoAllConfig", config));
  return ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
}

NCCL_API(ncclResult_t, ncclGatherConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclGatherConfig(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclGatherConfig", config));
  return ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclScatterConfig, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t *config);
ncclResult_t ncclScatterConfig(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t *config) {
  HETCCL_CHECK(coll_config_check("ncclScatterConfig", config));
  return ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

/* --- point-to-point ------------------------------------------------------- */

static ncclResult_t p2p_submit(ncclComm_t comm, const char *fn, hetccl_task_kind_t kind,
                               void *buf, size_t count, ncclDataType_t dtype, int peer,
                               void *stream) {
  HETCCL_CHECK(comm_usable(comm, fn));
  if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) {
    WARN("%s: invalid datatype %d", fn, (int)dtype);
    return ncclInvalidArgument;
  }
  if (peer < 0 || peer >= comm->nranks) {
    WARN("%s: peer %d out of range [0, %d)", fn, peer, comm->nranks);
    return ncclInvalidArgument;
  }
  size_t elem = hetccl_dtype_size(dtype);
  if (count > (SIZE_MAX >> 1) / elem) {
    WARN("%s: count %zu of %s overflows the buffer size", fn, count, hetccl_dtype_name(dtype));
    return ncclInvalidArgument;
  }
  if (count && !buf) {
    WARN("%s: buffer is NULL with count %zu", fn, count);
    return ncclInvalidArgument;
  }
  hetccl_task_t *t = calloc(1, sizeof(*t));
  if (!t) {
    WARN("%s: out of memory", fn);
    return ncclSystemError;
  }
  int sends = kind == HETCCL_TASK_SEND;
  ncclResult_t res = classify_buffers(comm, fn, sends ? buf : NULL, sends ? NULL : buf, stream, t);
  if (res != ncclSuccess) {
    free(t);
    return res;
  }
  t->comm = comm;
  t->kind = kind;
  t->peer = peer;
  t->buf = buf;
  t->bytes = count * elem;
  t->in_bytes = sends ? t->bytes : 0;
  t->out_bytes = sends ? 0 : t->bytes;
  t->tag = hetccl_knob_int(HETCCL_KNOB_CHECK_MISMATCH) ? hetccl_comm_p2p_tag(t->bytes) : 0;
  return hetccl_group_enqueue(t);
}

static ncclResult_t p2p_engine(ncclComm_t comm, const char *fn, hetccl_task_kind_t kind,
                               void *buf, size_t count, ncclDataType_t dtype, int peer,
                               cudaStream_t stream) {
  hetccl_comm_enter(comm);
  ncclResult_t res = p2p_submit(comm, fn, kind, buf, count, dtype, peer, stream);
  hetccl_comm_leave(comm);
  if (res != ncclSuccess && res != ncclInProgress) hetccl_group_note_error(res);
  return hetccl_api_ret(comm, res);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(Send, sendbuff, count, datatype, peer, comm, stream);
  FORWARD(comm, Send, sendbuff, count, datatype, peer, comm->vcomm, stream);
  return p2p_engine(comm, "ncclSend", HETCCL_TASK_SEND, (void *)sendbuff, count, datatype, peer,
                    stream);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  HETCCL_REENTRY(Recv, recvbuff, count, datatype, peer, comm, stream);
  FORWARD(comm, Recv, recvbuff, count, datatype, peer, comm->vcomm, stream);
  return p2p_engine(comm, "ncclRecv", HETCCL_TASK_RECV, recvbuff, count, datatype, peer,
                    stream);
}
