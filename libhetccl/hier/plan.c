/* The plans of the hierarchical forms: appending phases, and the one
 * runner (hier/plan.h has the model).
 *
 * Thread: the API caller's; one run at a time per communicator (NCCL's
 * rule), so the map's scratch event and the eager plan are its. */
#include "hier/plan.h"

#include <stdio.h>
#include <string.h>

#include "comm/backend.h"
#include "exec/enqueue.h"
#include "exec/group.h"
#include "exec/trace_points.h"
#include "hier/hier.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/log.h"

/* Phases besides the ones that grow with the map: the most any form has
 * (the rails' Reduce with its leaders' tail: 2 + a group + 3). */
#define HIER_PLAN_SPARE 8

int hetccl_hier_plan_cap(ncclComm_t comm, hetccl_op_kind_t kind) {
  const hetccl_hier_map_t *m = comm->hier.map;
  if (kind == HETCCL_OP_AlltoAll || kind == HETCCL_OP_Gather || kind == HETCCL_OP_Scatter)
    return 2 * comm->nranks + HIER_PLAN_SPARE; /* a send and a receive per peer, a copy */
  /* the leaders' unequal AllGather and ReduceScatter: a phase per island;
   * ReduceScatter's and the rails' Reduce's grouped pairs: one per rank
   * of the island */
  return m->islands + m->size[m->of[comm->rank]] + HIER_PLAN_SPARE;
}

int hetccl_hier_plan_cap_any(ncclComm_t comm) {
  int a = hetccl_hier_plan_cap(comm, HETCCL_OP_AlltoAll);
  int b = hetccl_hier_plan_cap(comm, HETCCL_OP_AllReduce);
  return a > b ? a : b;
}

void hetccl_hier_plan_init(hetccl_hier_plan_t *p, hetccl_hier_phase_t *phases, int cap) {
  *p = (hetccl_hier_plan_t){.phases = phases, .cap = cap};
}

/* --- building ---------------------------------------------------------------------- */

static void add(hetccl_hier_plan_t *p, int slot, where_t where, int kind, int flags,
                const void *send, void *recv, size_t count, int root) {
  if (p->n >= p->cap) {
    p->over = 1;
    return;
  }
  p->phases[p->n++] = (hetccl_hier_phase_t){
      .slot = (uint8_t)slot, .where = (uint8_t)where, .kind = (uint8_t)kind,
      .flags = (uint8_t)(flags | (p->group ? p->group_flags : 0)), .group = p->group, .root = root, .send = send, .recv = recv,
      .count = count};
}

void hetccl_hier_plan_collective(hetccl_hier_plan_t *p, int slot, where_t where,
                                 hetccl_op_kind_t kind, const void *send, void *recv,
                                 size_t count, int root) {
  add(p, slot, where, kind, 0, send, recv, count, root);
}

void hetccl_hier_plan_p2p(hetccl_hier_plan_t *p, int slot, where_t where, hetccl_op_kind_t kind,
                          void *buf, size_t count, int peer) {
  add(p, slot, where, kind, 0, kind == HETCCL_OP_Send ? buf : NULL,
      kind == HETCCL_OP_Recv ? buf : NULL, count, peer);
}

void hetccl_hier_plan_copy(hetccl_hier_plan_t *p, int slot, void *dst, const void *src,
                           size_t bytes) {
  add(p, slot, IN_ISLAND, HIER_COPY, 0, src, dst, bytes, HETCCL_NO_ROOT);
}

void hetccl_hier_plan_blocks(hetccl_hier_plan_t *p, int slot, void *chunks, void *blocks,
                             size_t bytes, int flags) {
  add(p, slot, IN_ISLAND, HIER_BLOCKS, flags, blocks, chunks, bytes, HETCCL_NO_ROOT);
}

void hetccl_hier_plan_group(hetccl_hier_plan_t *p, int flags) {
  p->group = ++p->groups;
  p->group_flags = flags;
}

void hetccl_hier_plan_ungroup(hetccl_hier_plan_t *p) { p->group = 0; }

/* --- running: the state of one run ------------------------------------------------- */

typedef struct run {
  ncclComm_t comm;
  const hetccl_op_t *op;
  where_t where;    /* where the last phase ran: the message's */
  unsigned checked; /* bit `where`: that communicator found usable in this run */
  int step;         /* phases traced so far in this run (trace/trace.h) */
} run_t;

static ncclComm_t where_comm(ncclComm_t c, where_t where) {
  return where == IN_ISLAND        ? c->hier.island
         : where == ACROSS_LEADERS ? c->hier.leaders
         : where == ACROSS_RAIL    ? hetccl_hier_rail(c)
                                   : c;
}

static const char *where_name(where_t where) {
  return where == IN_ISLAND ? "island" : where == ACROSS_LEADERS ? "leaders" : "rail";
}

/* The communicator a phase at `where` runs on, r->where set to it. Its
 * phases are submitted unchecked (hetccl_comm_submit: the operation was
 * validated at its entry), but it may have failed on its own since (on a
 * stream, a sibling's failure), so its state is checked at its first
 * phase in each run. */
static ncclResult_t phase_comm(run_t *r, where_t where, ncclComm_t *out) {
  ncclComm_t c = where_comm(r->comm, where);
  r->where = where;
  if (!(r->checked & (1u << where))) {
    ncclResult_t res = hetccl_comm_usable(c, r->op->fn);
    if (res != ncclSuccess) {
      hetccl_group_note_error(res); /* as the backend's own check did */
      return res;
    }
    r->checked |= 1u << where;
  }
  *out = c;
  return ncclSuccess;
}

/* A phase's event, when tracing (t0 from HETCCL_TRACE_BEGIN()). */
static void traced(run_t *r, const hetccl_op_t *p, uint64_t t0) {
  if (t0)
    hetccl_comm_trace_phase(r->comm, where_comm(r->comm, r->where), where_name(r->where), p,
                            r->step++, t0);
}

/* op made a send or a receive of ph's. */
static hetccl_op_t p2p_op(const hetccl_op_t *op, const hetccl_hier_phase_t *ph) {
  hetccl_op_t p = *op;
  p.kind = (hetccl_op_kind_t)ph->kind;
  p.sendbuf = ph->kind == HETCCL_OP_Send ? ph->send : NULL;
  p.recvbuf = ph->kind == HETCCL_OP_Recv ? ph->recv : NULL;
  p.count = ph->count;
  p.root = HETCCL_NO_ROOT;
  p.peer = ph->root;
  p.redop = HETCCL_NO_REDOP;
  p.config = NULL;
  return p;
}

static ncclResult_t run_collective(run_t *r, const hetccl_hier_phase_t *ph) {
  hetccl_op_t p = *r->op;
  p.kind = (hetccl_op_kind_t)ph->kind;
  p.sendbuf = ph->send;
  p.recvbuf = ph->recv;
  p.count = ph->count;
  p.root = ph->root;
  p.peer = HETCCL_NO_PEER;
  p.config = NULL; /* the user's algorithm choice was for the whole collective */
  if (p.kind != HETCCL_OP_AllReduce && p.kind != HETCCL_OP_Reduce &&
      p.kind != HETCCL_OP_ReduceScatter)
    p.redop = HETCCL_NO_REDOP;
  ncclComm_t c;
  HETCCL_CHECK(phase_comm(r, (where_t)ph->where, &c));
  uint64_t t0 = HETCCL_TRACE_BEGIN();
  ncclResult_t res = hetccl_comm_submit(c, &p);
  traced(r, &p, t0);
  return res;
}

/* A send or receive: inside the island, traced where it is alone outside
 * any group; between islands, on the communicator itself, as the user's
 * would be (named so), untraced. */
static ncclResult_t run_p2p(run_t *r, const hetccl_hier_phase_t *ph) {
  hetccl_op_t p = p2p_op(r->op, ph);
  if (ph->where == BETWEEN_ISLANDS) {
    p.fn = ph->kind == HETCCL_OP_Send ? "ncclSend" : "ncclRecv";
    r->where = BETWEEN_ISLANDS;
    return hetccl_comm_submit(r->comm, &p);
  }
  ncclComm_t island;
  HETCCL_CHECK(phase_comm(r, IN_ISLAND, &island));
  uint64_t t0 = HETCCL_TRACE_ON() && hetccl_group_depth() == 0 ? hetccl_trace_now() : 0;
  ncclResult_t res = hetccl_comm_submit(island, &p);
  traced(r, &p, t0);
  return res;
}

/* --- running: the local copies ----------------------------------------------------- */

/* The local copies of a form, between the user's buffers and scratch:
 * where either is device memory, on op's stream with the rank's device
 * current (one thread may drive ranks of several devices); on host
 * memory, at once (host phases finish before they return). copies_begin
 * gives the runtime that copies (NULL: the CPU) with the device made
 * current, copies_end restores the caller's. */
static ncclResult_t copies_begin(run_t *r, const hetccl_runtime_t **rt, int *saved) {
  ncclComm_t comm = r->comm;
  int a, b;
  *rt = NULL;
  *saved = -1;
  HETCCL_CHECK(hetccl_hier_on_device(comm, r->op->sendbuf, &a));
  HETCCL_CHECK(hetccl_hier_on_device(comm, r->op->recvbuf, &b));
  if (!a && !b) return ncclSuccess;
  *rt = hetccl_runtime_get(comm->ptr_kind);
  ncclResult_t res = (*rt)->current_device(saved, NULL, 0);
  if (res == ncclSuccess && *saved != comm->dev) res = (*rt)->set_device(comm->dev);
  return res;
}

static ncclResult_t copies_end(run_t *r, const hetccl_runtime_t *rt, int saved,
                               ncclResult_t res) {
  if (rt && saved >= 0 && saved != r->comm->dev) (void)rt->set_device(saved);
  if (res != ncclSuccess) /* the runtime logged why */
    hetccl_last_error_prefix("%s: rank %d: a local copy of the rails' form failed", r->op->fn,
                             r->comm->rank);
  return res;
}

static ncclResult_t copy(const run_t *r, const hetccl_runtime_t *rt, void *dst, const void *src,
                         size_t bytes) {
  if (rt) return rt->memcpy_async(dst, src, bytes, r->op->stream);
  memmove(dst, src, bytes);
  return ncclSuccess;
}

/* HIER_BLOCKS: every rank's block of ph->send (ph->count bytes each) to
 * or from the chunks at ph->recv in index-major order (chunk j holds,
 * island by island, the block of index j's rank); HIER_GATHER: into the
 * chunks, else out of them. On device memory, after the previous rails
 * form's last use of the scratch (HIER_FIRST: its event; the scratch is
 * the communicator's, and a call on another stream may still read it),
 * and recording this one's (HIER_LAST). No chunks: no copy, only the wait
 * and the record. */
static ncclResult_t run_blocks(run_t *r, const hetccl_hier_phase_t *ph) {
  hetccl_hier_map_t *m = r->comm->hier.map;
  void *stream = r->op->stream;
  const hetccl_runtime_t *rt;
  int saved;
  ncclResult_t res = copies_begin(r, &rt, &saved);
  if (rt && res == ncclSuccess && !m->scratch_done) res = rt->event_create(&m->scratch_done);
  if (rt && res == ncclSuccess && (ph->flags & HIER_FIRST) && m->scratch_used)
    res = rt->stream_wait_event(stream, m->scratch_done);
  for (int q = 0; ph->recv && q < r->comm->nranks && res == ncclSuccess; q++) {
    size_t at = (size_t)m->index[q] * (size_t)m->islands + (size_t)m->of[q];
    char *chunk = (char *)ph->recv + at * ph->count;
    char *block = (char *)ph->send + (size_t)q * ph->count;
    res = ph->flags & HIER_GATHER ? copy(r, rt, chunk, block, ph->count)
                                  : copy(r, rt, block, chunk, ph->count);
  }
  if (rt && res == ncclSuccess && (ph->flags & HIER_LAST)) {
    res = rt->event_record(m->scratch_done, stream);
    if (res == ncclSuccess) m->scratch_used = 1;
  }
  return copies_end(r, rt, saved, res);
}

static ncclResult_t run_copy(run_t *r, const hetccl_hier_phase_t *ph) {
  const hetccl_runtime_t *rt;
  int saved;
  ncclResult_t res = copies_begin(r, &rt, &saved);
  if (res == ncclSuccess) res = copy(r, rt, ph->recv, ph->send, ph->count);
  return copies_end(r, rt, saved, res);
}

/* --- running: phases, groups, a plan ----------------------------------------------- */

static ncclResult_t run_phase(run_t *r, const hetccl_hier_phase_t *ph) {
  switch (ph->kind) {
    case HIER_COPY: return run_copy(r, ph);
    case HIER_BLOCKS: return run_blocks(r, ph);
    case HETCCL_OP_Send:
    case HETCCL_OP_Recv: return run_p2p(r, ph);
    default: return run_collective(r, ph);
  }
}

/* The n phases of one group: their calls end together at the group's
 * close (the rest are skipped after a failure; the group still closes),
 * traced as one phase inside the island (plan.h) unless HIER_QUIET. */
static ncclResult_t run_group(run_t *r, const hetccl_hier_phase_t *ph, int n) {
  uint64_t t0 = ph->flags & HIER_QUIET ? 0 : HETCCL_TRACE_BEGIN();
  ncclResult_t res = hetccl_group_open();
  for (int i = 0; i < n && res == ncclSuccess; i++) res = run_phase(r, &ph[i]);
  ncclResult_t end = hetccl_group_close();
  if (t0) {
    hetccl_op_t p = *r->op;
    p.kind = (hetccl_op_kind_t)ph->kind;
    p.count = 0;
    for (int i = 0; i < n; i++)
      if (ph[i].kind == ph->kind) p.count += ph[i].count;
    r->where = IN_ISLAND;
    traced(r, &p, t0);
  }
  return res != ncclSuccess ? res : end;
}

void hetccl_hier_plan_failed(ncclComm_t comm, const hetccl_op_t *op, where_t where,
                             ncclResult_t res) {
  /* The phase logged its cause, naming ranks as this communicator does
   * (its engine and transports have the map); the message here adds where
   * it ran, and goes to the siblings as why. A pair between islands has
   * always been said to fail across the leaders. */
  char msg[HETCCL_ERRMSG_BYTES];
  snprintf(msg, sizeof(msg), "%s: rank %d: hierarchical %s failed %s: %.900s", op->fn,
           comm->rank, hetccl_func_name(hetccl_op_func(op->kind)),
           where == ACROSS_LEADERS || where == BETWEEN_ISLANDS ? "across the islands' leaders"
           : where == ACROSS_RAIL                              ? "across the islands on its rail"
                                                               : "inside its island",
           hetccl_last_error());
  hetccl_last_error_set(msg);
  hetccl_comm_set_error(comm, res);
  if (!__atomic_load_n(&comm->state.abort_flag, __ATOMIC_ACQUIRE)) /* abort tears them down */
    hetccl_hier_fail(comm, res, msg);
}

ncclResult_t hetccl_hier_plan_run(ncclComm_t comm, const hetccl_op_t *op,
                                  const hetccl_hier_plan_t *plan, int want) {
  run_t r = {.comm = comm, .op = op, .where = IN_ISLAND};
  ncclResult_t res = ncclSuccess;
  if (plan->over) {
    WARN("%s: rank %d: the hierarchical form has more phases than its plan's %d "
         "(hier/plan.h: hetccl_hier_plan_cap)", op->fn, comm->rank, plan->cap);
    res = ncclInternalError;
  }
  for (int i = 0; i < plan->n && res == ncclSuccess;) {
    const hetccl_hier_phase_t *ph = &plan->phases[i];
    int n = 1;
    while (ph->group && i + n < plan->n && ph[n].group == ph->group) n++;
    if (want == ALL_SLOTS || ph->slot == want)
      res = ph->group ? run_group(&r, ph, n) : run_phase(&r, ph);
    i += n;
  }
  if (res != ncclSuccess && res != ncclInProgress) hetccl_hier_plan_failed(comm, op, r.where, res);
  return res;
}
