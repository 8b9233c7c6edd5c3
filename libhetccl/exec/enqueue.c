/* Operations as engine tasks (enqueue.h). */
#include "exec/enqueue.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/identity.h"
#include "exec/group.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* What each collective reads and writes on a rank: elements of count
 * (ONE) or of count * nranks (ALL), on every rank or on the root only. */
enum { NONE = 0, ONE = 1, ALL = 2 };

typedef struct op_shape {
  hetccl_func_t func;
  uint8_t send, recv;                   /* NONE, ONE, ALL */
  uint8_t send_root_only, recv_root_only;
} op_shape_t;

static const op_shape_t shapes[HETCCL_OP_KIND_COUNT] = {
    [HETCCL_OP_AllReduce] = {HETCCL_FUNC_ALLREDUCE, ONE, ONE, 0, 0},
    [HETCCL_OP_Broadcast] = {HETCCL_FUNC_BROADCAST, ONE, ONE, 1, 0},
    [HETCCL_OP_Bcast] = {HETCCL_FUNC_BROADCAST, ONE, ONE, 1, 0},
    [HETCCL_OP_Reduce] = {HETCCL_FUNC_REDUCE, ONE, ONE, 0, 1},
    [HETCCL_OP_AllGather] = {HETCCL_FUNC_ALLGATHER, ONE, ALL, 0, 0},
    [HETCCL_OP_ReduceScatter] = {HETCCL_FUNC_REDUCESCATTER, ALL, ONE, 0, 0},
    [HETCCL_OP_AlltoAll] = {HETCCL_FUNC_ALLTOALL, ALL, ALL, 0, 0},
    [HETCCL_OP_Gather] = {HETCCL_FUNC_GATHER, ONE, ALL, 0, 1},
    [HETCCL_OP_Scatter] = {HETCCL_FUNC_SCATTER, ALL, ONE, 1, 0},
    [HETCCL_OP_Send] = {HETCCL_FUNC_SEND, ONE, NONE, 0, 0},
    [HETCCL_OP_Recv] = {HETCCL_FUNC_RECV, NONE, ONE, 0, 0},
};

hetccl_func_t hetccl_op_func(hetccl_op_kind_t kind) { return shapes[kind].func; }

static int is_p2p(const hetccl_op_t *op) {
  return op->kind == HETCCL_OP_Send || op->kind == HETCCL_OP_Recv;
}

static size_t elements(ncclComm_t comm, const hetccl_op_t *op, uint8_t mul) {
  return mul == NONE ? 0 : mul == ONE ? op->count : op->count * (size_t)comm->nranks;
}

ncclResult_t hetccl_comm_usable(ncclComm_t comm, const char *fn) {
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  if (err != ncclSuccess && err != ncclInProgress) {
    char why[HETCCL_ERRMSG_BYTES];
    hetccl_comm_fail_message(comm, why, sizeof(why));
    WARN("%s: communicator (rank %d) failed earlier with %s: %s", fn, comm->rank,
         ncclGetErrorString(err), why);
    return err;
  }
  if (comm->engine.finalized) {
    WARN("%s: communicator (rank %d) was finalized", fn, comm->rank);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_op_validate(ncclComm_t comm, const hetccl_op_t *op) {
  const op_shape_t *s = &shapes[op->kind];
  if (op->root != HETCCL_NO_ROOT && op->root >= comm->nranks) {
    WARN("%s: root %d out of range [0, %d)", op->fn, op->root, comm->nranks);
    return ncclInvalidArgument;
  }
  if (op->peer != HETCCL_NO_PEER && op->peer >= comm->nranks) {
    WARN("%s: peer %d out of range [0, %d)", op->fn, op->peer, comm->nranks);
    return ncclInvalidArgument;
  }
  size_t elem = hetccl_dtype_size(op->dtype);
  size_t mul = s->send == ALL || s->recv == ALL ? (size_t)comm->nranks : 1;
  if (op->count > (SIZE_MAX >> 1) / mul / elem) {
    WARN("%s: count %zu of %s overflows the buffer size", op->fn, op->count,
         hetccl_dtype_name(op->dtype));
    return ncclInvalidArgument;
  }
  int is_root = comm->rank == op->root;
  if (op->count && s->send_root_only && is_root && !op->sendbuf) {
    WARN("%s: sendbuff is NULL on the root with count %zu", op->fn, op->count);
    return ncclInvalidArgument;
  }
  if (op->count && s->recv_root_only && is_root && !op->recvbuf) {
    WARN("%s: recvbuff is NULL on the root with count %zu", op->fn, op->count);
    return ncclInvalidArgument;
  }
  if (op->config && op->config->algSelection && op->config->algSelection[0] &&
      op->config->forceAlgSelection) {
    WARN("%s: algorithm selection \"%s\" cannot be honoured by hetccl's engine", op->fn,
         op->config->algSelection);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* A communicator made where no GPU runtime was in use reads and writes its
 * buffers with the CPU. If the process has come to use one since (CuPy
 * loads CUDA at its first device call), a device buffer may still reach
 * it: refuse that, where the CPU would fault on it. */
static ncclResult_t refuse_late_device_buffers(ncclComm_t comm, const char *fn,
                                               const void *send, const void *recv) {
  hetccl_dev_kind_t kind = hetccl_late_pointer_kind();
  const hetccl_runtime_t *rt = kind == HETCCL_DEV_HOST ? NULL : hetccl_runtime_get(kind);
  if (!rt) return ncclSuccess;
  const void *bufs[2] = {send, recv};
  static const char *const names[2] = {"sendbuff", "recvbuff"};
  for (int i = 0; i < 2; i++) {
    hetccl_mem_kind_t mem = HETCCL_MEM_HOST;
    int dev;
    if (!bufs[i] || rt->mem_kind(bufs[i], &mem, &dev) != ncclSuccess || mem != HETCCL_MEM_DEVICE)
      continue;
    WARN("%s: %s %p is %s device memory, but rank %d of this communicator is a host rank: no "
         "GPU runtime was in use in this process when the communicator was made (use the "
         "device before ncclCommInitRank, or set HETCCL_DEVICE=%s)",
         fn, names[i], bufs[i], rt->name, comm->rank, rt->name);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* Which of the buffers are device memory. On an engine communicator those
 * are staged through pinned host memory in the order of `stream`
 * (exec/devpath.h); a process with no GPU runtime in use has none. */
static ncclResult_t classify_buffers(ncclComm_t comm, const char *fn, const void *send,
                                     const void *recv, void *stream, hetccl_task_t *t) {
  if (comm->ptr_kind == HETCCL_DEV_HOST) return refuse_late_device_buffers(comm, fn, send, recv);
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
  /* A send the NIC reads straight from device memory, or a receive it
   * writes straight into device memory, needs no staging; one it would
   * reach in device memory registered for it is staged there, by a copy on
   * the GPU (docs/gpudirect.md). */
  int is_send = t->kind == HETCCL_TASK_SEND, is_recv = t->kind == HETCCL_TASK_RECV;
  int p2p = ((is_send && t->stage_send) || (is_recv && t->stage_recv)) && t->bytes &&
            comm->engine.p2p && !comm->dataplane.plane;
  if (p2p && hetccl_engine_reaches(comm->engine.p2p, t->peer, t->buf, t->bytes, is_recv)) {
    t->stage_send = t->stage_recv = 0;
    t->device_direct = 1;
  } else if (p2p && hetccl_engine_reaches(comm->engine.p2p, t->peer, NULL, t->bytes, is_recv)) {
    t->stage_device = 1;
  }
  if (!t->stage_send && !t->stage_recv && !t->device_direct) return ncclSuccess;
  /* Only the data plane can be captured: the route decides, then
   * hetccl_dataplane_capture_check refuses what it did not take. */
  int capturing = 0;
  HETCCL_CHECK(rt->stream_capturing(stream, &capturing));
  t->captured = (uint8_t)capturing;
  return ncclSuccess;
}

/* Elementwise functions: piece k of the result needs piece k of the
 * input only. */
static int func_elementwise(hetccl_func_t f) {
  return f == HETCCL_FUNC_ALLREDUCE || f == HETCCL_FUNC_BROADCAST || f == HETCCL_FUNC_REDUCE;
}

/* Queue t, cut into comm->engine.stage_piece-byte pieces (one task each, in
 * order, one group) where that applies: staging then moves piece k + 1
 * while the engine runs piece k (exec/devpath.h). Every rank cuts the same
 * way, as the pieces are separate operations to its peers. */
static ncclResult_t enqueue_pieces(ncclComm_t comm, hetccl_task_t *t, size_t elem) {
  int check = (int)hetccl_knob_int(HETCCL_KNOB_CHECK_MISMATCH);
  size_t per = comm->engine.stage_piece / elem;
  size_t n = 1;
  /* The data plane pipelines within the operation: it takes it whole. */
  if (per && func_elementwise(t->coll.func) && t->coll.count > per &&
      t->form != HETCCL_FORM_PLANE)
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
      hetccl_tasks_free(head);
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

static ncclResult_t task_from_op(ncclComm_t comm, const hetccl_op_t *op, hetccl_task_t *t) {
  const op_shape_t *s = &shapes[op->kind];
  size_t elem = hetccl_dtype_size(op->dtype);
  int is_root = comm->rank == op->root;
  t->comm = comm;
  t->in_bytes = s->send_root_only && !is_root ? 0 : elements(comm, op, s->send) * elem;
  t->out_bytes = s->recv_root_only && !is_root ? 0 : elements(comm, op, s->recv) * elem;
  if (is_p2p(op)) {
    int sends = op->kind == HETCCL_OP_Send;
    t->kind = sends ? HETCCL_TASK_SEND : HETCCL_TASK_RECV;
    t->peer = op->peer;
    t->buf = sends ? (void *)op->sendbuf : op->recvbuf;
    t->bytes = op->count * elem;
    t->tag = hetccl_knob_int(HETCCL_KNOB_CHECK_MISMATCH) ? hetccl_comm_p2p_tag(t->bytes) : 0;
  } else {
    t->kind = HETCCL_TASK_COLL;
    t->coll.func = s->func;
    t->coll.sendbuf = op->sendbuf;
    t->coll.recvbuf = op->recvbuf;
    t->coll.count = op->count;
    t->coll.dtype = op->dtype;
    t->coll.root = op->root == HETCCL_NO_ROOT ? 0 : op->root;
    if (op->redop != HETCCL_NO_REDOP)
      HETCCL_CHECK(hetccl_comm_resolve_op(comm, op->redop, op->dtype, &t->coll.op));
  }
  return classify_buffers(comm, op->fn, op->sendbuf, op->recvbuf, op->stream, t);
}

ncclResult_t hetccl_enqueue_task_make(ncclComm_t comm, const hetccl_op_t *op,
                                      hetccl_task_t **out) {
  hetccl_task_t *t = calloc(1, sizeof(*t));
  if (!t) {
    WARN("%s: out of memory", op->fn);
    return ncclSystemError;
  }
  ncclResult_t res = task_from_op(comm, op, t);
  if (res != ncclSuccess) {
    free(t);
    return res;
  }
  *out = t;
  return ncclSuccess;
}

ncclResult_t hetccl_enqueue_task(ncclComm_t comm, hetccl_task_t *t) {
  if (t->kind != HETCCL_TASK_COLL) return hetccl_group_enqueue(t);
  return enqueue_pieces(comm, t, hetccl_dtype_size(t->coll.dtype));
}
