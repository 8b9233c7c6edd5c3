/* The core's trace points (trace_points.h). */
#include "exec/trace_points.h"

#include <string.h>

#include "runtime/reduce.h"

static const char *const op_kind_names[HETCCL_OP_KIND_COUNT] = {
#define OP_KIND_NAME(k) [HETCCL_OP_##k] = #k,
    HETCCL_OP_KINDS(OP_KIND_NAME)
#undef OP_KIND_NAME
};

static int trace_rank(ncclComm_t comm) { return hetccl_user_rank(comm->user_ranks, comm->rank); }

/* An event with nothing said yet: everything from the context. */
static hetccl_trace_ev_t blank(hetccl_trace_kind_t kind, const char *name) {
  return (hetccl_trace_ev_t){.kind = kind, .name = name, .rank = HETCCL_TRACE_NONE,
                             .peer = HETCCL_TRACE_NONE, .root = HETCCL_TRACE_NONE,
                             .step = HETCCL_TRACE_NONE, .seq = HETCCL_TRACE_NO_SEQ};
}

/* The exported name without its prefix: "AllReduce". */
static const char *call_name(const char *fn) {
  if (!strncmp(fn, "pnccl", 5)) return fn + 5;
  if (!strncmp(fn, "nccl", 4)) return fn + 4;
  return fn;
}

/* --- calls ----------------------------------------------------------------------- */

uint64_t hetccl_comm_trace_call_begin(ncclComm_t comm) {
  return hetccl_trace_call_begin(trace_rank(comm), comm->comm_id, comm->state.trace_calls++);
}

void hetccl_comm_trace_call_end(ncclComm_t comm, const hetccl_op_t *op, uint64_t t0) {
  hetccl_trace_ev_t ev = blank(HETCCL_TRACE_CALL, call_name(op->fn));
  ev.op = op->redop != HETCCL_NO_REDOP ? hetccl_redop_name(op->redop) : NULL;
  ev.dtype = hetccl_dtype_name(op->dtype);
  ev.bytes = op->count * hetccl_dtype_size(op->dtype);
  ev.comm = comm->comm_id;
  ev.rank = trace_rank(comm);
  ev.seq = comm->state.trace_calls - 1;
  if (op->root != HETCCL_NO_ROOT) ev.root = op->root;
  if (op->peer != HETCCL_NO_PEER) ev.peer = op->peer;
  hetccl_trace_call_end(t0, &ev);
}

uint64_t hetccl_comm_trace_group_begin(int depth) {
  int rank = hetccl_trace_context_rank();
  if (depth != 1 || rank == HETCCL_TRACE_NONE) return 0;
  return hetccl_trace_call_begin(rank, 0, HETCCL_TRACE_NO_SEQ);
}

void hetccl_comm_trace_group_end(uint64_t t0) {
  hetccl_trace_ev_t ev = blank(HETCCL_TRACE_GROUP, "GroupEnd");
  hetccl_trace_call_end(t0, &ev);
}

/* --- hierarchical phases ------------------------------------------------------------ */

void hetccl_comm_trace_phase(ncclComm_t comm, ncclComm_t on, const char *where,
                             const hetccl_op_t *phase, int step, uint64_t t0) {
  hetccl_trace_ev_t ev = blank(HETCCL_TRACE_PHASE, where);
  ev.op = op_kind_names[phase->kind];
  ev.dtype = hetccl_dtype_name(phase->dtype);
  ev.bytes = phase->count * hetccl_dtype_size(phase->dtype);
  ev.comm = on->comm_id;
  ev.rank = trace_rank(comm);
  ev.step = step;
  hetccl_trace_record(t0, &ev);
}

/* --- engine work -------------------------------------------------------------------- */

uint64_t hetccl_comm_trace_task_begin(ncclComm_t comm, const hetccl_task_t *t) {
  return hetccl_trace_context(trace_rank(comm), comm->comm_id,
                              t ? t->trace_seq : HETCCL_TRACE_NO_SEQ);
}

void hetccl_comm_trace_task_end(ncclComm_t comm, const hetccl_task_t *t, uint64_t t0) {
  const hetccl_coll_t *c = &t->coll;
  hetccl_trace_ev_t ev = blank(HETCCL_TRACE_ENGINE, hetccl_func_name(c->func));
  if (hetccl_func_reduces(c->func)) ev.op = hetccl_redop_name((ncclRedOp_t)c->op.kind);
  ev.dtype = hetccl_dtype_name(c->dtype);
  ev.bytes = c->count * hetccl_dtype_size(c->dtype);
  if (hetccl_func_rooted(c->func)) ev.root = hetccl_user_rank(comm->user_ranks, c->root);
  hetccl_trace_record(t0, &ev);
}

void hetccl_comm_trace_batch_end(const hetccl_task_t *tasks, hetccl_trace_kind_t kind,
                                 uint64_t t0) {
  hetccl_trace_ev_t ev = blank(kind, kind == HETCCL_TRACE_PLANE ? "plane" : "p2p");
  for (const hetccl_task_t *t = tasks; t; t = t->next) {
    if (t->kind != HETCCL_TASK_COLL) ev.bytes += t->bytes;
    else if (kind == HETCCL_TRACE_PLANE) ev.bytes += t->coll.count * hetccl_dtype_size(t->coll.dtype);
  }
  hetccl_trace_record(t0, &ev);
}

void hetccl_comm_trace_stage_wait(ncclComm_t comm, double t0_us, double t1_us) {
  hetccl_trace_ev_t ev = blank(HETCCL_TRACE_STAGE, "stage wait");
  ev.rank = trace_rank(comm);
  ev.comm = comm->comm_id;
  hetccl_trace_record_span((uint64_t)(t0_us * 1e3), (uint64_t)(t1_us * 1e3), &ev);
}
