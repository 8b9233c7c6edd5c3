/* The hierarchical forms of the collectives (hier/hier.h): their
 * builders and their running.
 *
 * On a hierarchical communicator a collective runs as phases on the
 * caller's stream: inside each island on the island communicator (the
 * vendor library where it serves the island), across the islands' leaders
 * on the leaders communicator (the data plane or the engine), and inside
 * each island again. L is a rank's leader, R the root, I its island.
 *
 *   collective     inside, first           across the leaders        inside, last
 *   AllReduce      Reduce to L             AllReduce                 Broadcast from L
 *   Broadcast      I: Broadcast from R     Broadcast from I's L      others: Broadcast from L
 *   Reduce         Reduce to L             Reduce to I's L           I: L sends to R (R != L)
 *   AllGather *    AllGather into the      AllGather of the slices   Broadcast of the other
 *                  island's slice          (unequal: a Broadcast     islands' slices from L
 *                                          per island)
 *   ReduceScatter* Reduce of everything    ReduceScatter of the      L sends each rank its
 *                  to L (scratch)          slices (unequal: a        block (grouped send and
 *                                          Reduce per island)        receive)
 *
 *   * only where every island's ranks are consecutive (hier.h, contiguous):
 *     the island's slice of the receive buffer is then one block.
 *
 * Where every island holds as many ranks, AllReduce, Broadcast, Reduce,
 * AllGather and ReduceScatter of large messages cross on every rank at once instead
 * (the rails' forms: hier/hier_rails.c, its table at its top). A send or
 * receive inside a vendor island, and AlltoAll, Gather and Scatter, run as
 * pairs, those inside a vendor island on the island (hier/hier_pairs.c).
 * What the three files share: hier/hier_forms.h.
 *
 * A form is data: its builder appends its phases to a plan (hier/plan.h:
 * slot, sub-communicator, collective or send/receive, buffers, count,
 * root or peer, group) and submits nothing; one runner (hier/plan.c)
 * runs a plan through hetccl_comm_submit on the sub-communicators. A
 * builder decides only from the call's arguments, the map and the
 * communicators made at init, never from an earlier phase's result, so
 * every rank builds matching plans, and building before running changes
 * nothing: the partials' block a builder takes (hetccl_hier_partials) is
 * the same whenever the phases that use it run.
 *
 * ncclAvg and PreMulSum are not composable across phases (an average of
 * averages is wrong for islands of different sizes) and run flat, over
 * every rank on the engine, as do point-to-point between islands and the
 * collectives above where no form applies; every rank decides alike from
 * the same arguments and the map, which is NCCL's rule already. Which
 * form a call takes (leaders, rails, pairs, or none) is the route's
 * table (backend/route.h), which hands it here (hetccl_hier_run, _defer).
 *
 * Buffers: phases work in the user's buffers where the result lands there;
 * a leader that holds partial results no user buffer has room for (Reduce
 * at a leader that is not the root, ReduceScatter at every leader) keeps
 * them in the map's scratch block, of the user's kind of memory. Host
 * buffers where a vendor serves the island are staged through device
 * memory first, and the call then blocks as on the engine
 * (hier/hier_host.c): the forms see only memory the vendor can reach.
 *
 * Inside a group the phases cannot be grouped with the rest (the island's
 * vendor call would only start at the vendor's group end, after the
 * leaders' phase that needs its result): the operation is kept, checked,
 * and runs at the outermost ncclGroupEnd, after the group's other work and
 * the vendor's group have been launched (hetccl_hier_run_deferred). The
 * kept forms, each built once (at its slot 0), then run in step: their
 * phases fall in slots numbered alike on every rank (the table's
 * columns: 0 inside first, 1 across, 2 and 3 inside last), and slot k of
 * all of them goes in one group before slot k + 1, so that one thread
 * may drive several ranks of a vendor island; the staged ones finish
 * after every kept form is launched.
 *
 * A failing phase fails the communicator and its siblings, and the
 * message says which phase (inside the island, across the leaders or a
 * rail).
 *
 * Thread: the API caller's. Deferred operations are kept in the thread's
 * group (exec/group.h). */
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/init.h"
#include "exec/enqueue.h"
#include "exec/group.h"
#include "hier/hier.h"
#include "hier/hier_forms.h"
#include "hier/plan.h"
#include "runtime/reduce.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/log.h"

/* --- building ------------------------------------------------------------------- */

void hetccl_hier_phase(form_t *f, int slot, where_t where, hetccl_op_kind_t kind,
                       const void *send, void *recv, size_t count, int root) {
  hetccl_hier_plan_collective(f->plan, slot, where, kind, send, recv, count, root);
}

void hetccl_hier_p2p(form_t *f, int slot, hetccl_op_kind_t kind, void *buf, size_t count,
                     int peer) {
  hetccl_hier_plan_p2p(f->plan, slot, IN_ISLAND, kind, buf, count, peer);
}

/* Where a leader keeps partial results no user buffer has room for. */
ncclResult_t hetccl_hier_partials(form_t *f, size_t bytes, void **out) {
  if (f->scratch) {
    *out = f->scratch;
    return ncclSuccess;
  }
  return hetccl_hier_scratch(f->comm, bytes, f->op->sendbuf, out);
}

/* The bytes of partial results op's form (how) keeps here (its `partials`). */
static size_t partials_bytes(ncclComm_t c, const hetccl_op_t *op, hetccl_form_how_t how) {
  size_t n = op->count * hetccl_dtype_size(op->dtype), all = (size_t)c->nranks * n;
  int rails = how == HETCCL_HOW_RAILS;
  if (op->kind == HETCCL_OP_ReduceScatter && rails) return all;
  if (op->kind == HETCCL_OP_AllGather && rails)
    return hetccl_hier_align((size_t)c->hier.map->islands * n) + all;
  if (op->kind == HETCCL_OP_Reduce && rails)
    return c->rank != op->root ? hetccl_hier_reduce_rails_partials(c, op) : 0;
  if (!c->hier.leaders || !c->hier.island) return 0;
  if (op->kind == HETCCL_OP_Reduce) return c->rank != op->root ? n : 0;
  if (op->kind == HETCCL_OP_ReduceScatter) return (size_t)c->nranks * n;
  return 0;
}

/* --- the forms -------------------------------------------------------------------- */

/* Through the leaders: `count` elements from element `from` on. */
void hetccl_hier_all_reduce_leaders(form_t *f, size_t from, size_t count) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  const void *send = form_at(op->sendbuf, from, f->elem), *across = send;
  void *recv = form_at(op->recvbuf, from, f->elem);
  if (c->hier.island) {
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Reduce, send, recv, count, 0);
    across = recv;
  }
  if (c->hier.leaders)
    hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_AllReduce, across, recv, count,
                      HETCCL_NO_ROOT);
  if (c->hier.island) hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_Broadcast, recv, recv, count, 0);
}

/* Through the leaders: `count` elements from element `first` on; the
 * root's island's phase only where `inside` (the rails' form has run it
 * over the whole buffer). */
void hetccl_hier_broadcast_leaders(form_t *f, size_t first, size_t count, int inside) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  int from = f->map->of[op->root];
  const void *send = form_at(op->kind == HETCCL_OP_Bcast ? op->recvbuf : op->sendbuf, first,
                             f->elem);
  void *buf = form_at(op->recvbuf, first, f->elem);
  if (f->mine == from) {
    if (c->hier.island && inside)
      hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Broadcast, send, buf, count,
                        f->map->index[op->root]);
    /* A leader alone in its island is the root itself. */
    if (c->hier.leaders)
      hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_Broadcast, c->hier.island ? buf : send,
                        buf, count, from);
    return;
  }
  if (c->hier.leaders)
    hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_Broadcast, buf, buf, count, from);
  if (c->hier.island) hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_Broadcast, buf, buf, count, 0);
}

/* Through the leaders: `count` elements from element `first` on. A
 * leader that is not the root keeps its island's partial result at
 * `partial` (NULL: the form's partials). */
ncclResult_t hetccl_hier_reduce_leaders(form_t *f, size_t first, size_t count, void *partial) {
  const hetccl_op_t *op = f->op;
  ncclComm_t c = f->comm;
  int to = f->map->of[op->root], root_leads = f->map->first[to] == op->root;
  const void *send = form_at(op->sendbuf, first, f->elem);
  void *recv = op->recvbuf ? form_at(op->recvbuf, first, f->elem) : NULL;
  if (!c->hier.leaders) { /* inside an island only; the root may be here */
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Reduce, send, recv, count, 0);
    if (c->rank == op->root && !root_leads) hetccl_hier_p2p(f, 2, HETCCL_OP_Recv, recv, count, 0);
    return ncclSuccess;
  }
  /* A leader: its island's partial result in `acc`, the root's own buffer
   * where it is the root; then, at the root's leader, the whole result. */
  void *acc = recv;
  if (c->rank != op->root && c->hier.island) {
    acc = partial;
    if (!acc) HETCCL_CHECK(hetccl_hier_partials(f, count * f->elem, &acc));
  }
  const void *across = send;
  if (c->hier.island) {
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Reduce, send, acc, count, 0);
    across = acc;
  }
  hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_Reduce, across, acc, count, to);
  if (f->mine == to && !root_leads)
    hetccl_hier_p2p(f, 2, HETCCL_OP_Send, acc, count, f->map->index[op->root]);
  return ncclSuccess;
}

/* The islands' slices lie whole in the receive buffer (contiguous). */
static ncclResult_t all_gather(form_t *f) {
  if (f->how == HETCCL_HOW_RAILS) return hetccl_hier_all_gather_rails(f);
  const hetccl_op_t *op = f->op;
  const hetccl_hier_map_t *m = f->map;
  ncclComm_t c = f->comm;
  size_t n = op->count, first = (size_t)m->first[f->mine], size = (size_t)m->size[f->mine];
  void *slice = form_at(op->recvbuf, first * n, f->elem);
  if (c->hier.island)
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_AllGather, op->sendbuf, slice, n, 0);
  if (c->hier.leaders && m->equal) {
    hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_AllGather, slice, op->recvbuf, size * n,
                      HETCCL_NO_ROOT);
  } else if (c->hier.leaders) {
    for (int i = 0; i < m->islands; i++) {
      void *s = form_at(op->recvbuf, (size_t)m->first[i] * n, f->elem);
      const void *from = i == f->mine && !c->hier.island ? op->sendbuf : s;
      hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_Broadcast, from, s,
                        (size_t)m->size[i] * n, i);
    }
  }
  if (c->hier.island) { /* the other islands' slices: before this one's, and after */
    size_t after = first + size, total = (size_t)c->nranks;
    if (first > 0)
      hetccl_hier_phase(f, 2, IN_ISLAND, HETCCL_OP_Broadcast, op->recvbuf, op->recvbuf,
                        first * n, 0);
    if (after < total) {
      void *rest = form_at(op->recvbuf, after * n, f->elem);
      hetccl_hier_phase(f, 3, IN_ISLAND, HETCCL_OP_Broadcast, rest, rest, (total - after) * n, 0);
    }
  }
  return ncclSuccess;
}

/* The leader reduces the whole input of its island into scratch, the
 * leaders reduce-scatter island slices of it in place, and the leader
 * hands each rank of its island its block (one group, one phase in the
 * trace). */
static ncclResult_t reduce_scatter(form_t *f) {
  if (f->how == HETCCL_HOW_RAILS) return hetccl_hier_reduce_scatter_rails(f);
  const hetccl_op_t *op = f->op;
  const hetccl_hier_map_t *m = f->map;
  ncclComm_t c = f->comm;
  size_t n = op->count, total = (size_t)c->nranks * n;
  size_t first = (size_t)m->first[f->mine], size = (size_t)m->size[f->mine];
  if (!c->hier.leaders) {
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Reduce, op->sendbuf, op->recvbuf, total, 0);
    hetccl_hier_p2p(f, 2, HETCCL_OP_Recv, op->recvbuf, n, 0);
    return ncclSuccess;
  }
  void *acc = NULL;
  const void *in = op->sendbuf;
  if (c->hier.island) {
    HETCCL_CHECK(hetccl_hier_partials(f, total * f->elem, &acc));
    hetccl_hier_phase(f, 0, IN_ISLAND, HETCCL_OP_Reduce, op->sendbuf, acc, total, 0);
    in = acc;
  }
  /* Alone in its island, a leader's slice is its own block: recvbuf. */
  void *mine = c->hier.island ? form_at(acc, first * n, f->elem) : op->recvbuf;
  if (m->equal) {
    hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_ReduceScatter, in, mine, size * n,
                      HETCCL_NO_ROOT);
  } else {
    for (int i = 0; i < m->islands; i++) {
      const void *s = form_at(in, (size_t)m->first[i] * n, f->elem);
      void *out = i == f->mine ? mine : (void *)s; /* read only where not the root */
      hetccl_hier_phase(f, 1, ACROSS_LEADERS, HETCCL_OP_Reduce, s, out, (size_t)m->size[i] * n, i);
    }
  }
  if (!c->hier.island) return ncclSuccess;
  hetccl_hier_plan_group(f->plan, 0);
  for (size_t t = 0; t < size; t++)
    hetccl_hier_p2p(f, 2, HETCCL_OP_Send, form_at(mine, t * n, f->elem), n, (int)t);
  hetccl_hier_p2p(f, 2, HETCCL_OP_Recv, op->recvbuf, n, 0);
  hetccl_hier_plan_ungroup(f->plan);
  return ncclSuccess;
}

/* A send or receive inside a vendor island: one phase. */
static ncclResult_t p2p(form_t *f) {
  const hetccl_op_t *op = f->op;
  void *buf = op->kind == HETCCL_OP_Send ? (void *)op->sendbuf : op->recvbuf;
  hetccl_hier_p2p(f, 0, op->kind, buf, op->count, f->map->index[op->peer]);
  return ncclSuccess;
}

/* The builders, by operation (NULL: no hierarchical form). Each appends
 * its phases to f->plan and submits nothing; it fails only where the
 * partials' block cannot be had. */
typedef ncclResult_t (*builder_t)(form_t *f);
static const builder_t builders[HETCCL_OP_KIND_COUNT] = {
    [HETCCL_OP_AllReduce] = hetccl_hier_all_reduce,
    [HETCCL_OP_Broadcast] = hetccl_hier_broadcast,
    [HETCCL_OP_Bcast] = hetccl_hier_broadcast,
    [HETCCL_OP_Reduce] = hetccl_hier_reduce,
    [HETCCL_OP_AllGather] = all_gather,
    [HETCCL_OP_ReduceScatter] = reduce_scatter,
    [HETCCL_OP_AlltoAll] = hetccl_hier_all_to_all,
    [HETCCL_OP_Gather] = hetccl_hier_gather,
    [HETCCL_OP_Scatter] = hetccl_hier_scatter,
    [HETCCL_OP_Send] = p2p,
    [HETCCL_OP_Recv] = p2p,
};

/* --- running ---------------------------------------------------------------------- */

/* Launch `want` (a slot, or ALL_SLOTS) of op's form (how) on comm: at the
 * first (ALL_SLOTS or slot 0) build it into plan, then run plan's phases
 * of `want` (hier/plan.h). A failure fails the communicator and its
 * siblings, the message saying where (a failed build: inside its island,
 * as before any phase ran). */
static ncclResult_t launch(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_how_t how, int want,
                           void *scratch, hetccl_hier_plan_t *plan) {
  if (want == ALL_SLOTS || want == 0) {
    const hetccl_hier_map_t *m = comm->hier.map;
    int mine = m->of[comm->rank];
    TRACE(HETCCL_COLL, "%s rank %d: hierarchical, %zu x %s, island %d of %d ranks%s", op->fn,
          comm->rank, op->count, hetccl_dtype_name(op->dtype), mine, m->size[mine],
          comm->hier.leaders ? ", leader" : "");
    builder_t build = (unsigned)op->kind < HETCCL_OP_KIND_COUNT ? builders[op->kind] : NULL;
    if (!build) {
      WARN("%s: no hierarchical form", op->fn);
      return ncclInternalError;
    }
    form_t f = {.comm = comm, .op = op, .how = how, .map = m, .mine = mine,
                .elem = hetccl_dtype_size(op->dtype), .scratch = scratch, .plan = plan};
    hetccl_hier_plan_init(plan, plan->phases, plan->cap);
    ncclResult_t res = build(&f);
    if (res != ncclSuccess) {
      if (res != ncclInProgress) hetccl_hier_plan_failed(comm, op, IN_ISLAND, res);
      return res;
    }
  }
  return hetccl_hier_plan_run(comm, op, plan, want);
}

static int failed(ncclResult_t res) { return res != ncclSuccess && res != ncclInProgress; }

/* The result of a staged call into the user's host buffer (blocking). */
static ncclResult_t finish(ncclComm_t comm, const char *fn, hetccl_hier_stage_t *stage) {
  ncclResult_t res = hetccl_hier_host_finish(comm, stage);
  if (res != ncclSuccess) { /* the stream's failure was logged where it was met */
    hetccl_last_error_prefix("%s: rank %d: the hierarchical collective on host buffers failed "
                             "on its stream", fn, comm->rank);
    hetccl_comm_set_error(comm, res);
  }
  return res;
}

/* The plan of an eager call: kept in comm's map, made at its first call
 * large enough for any form (hetccl_hier_plan_cap_any). */
static ncclResult_t eager_plan(ncclComm_t comm, const char *fn, hetccl_hier_plan_t *plan) {
  hetccl_hier_map_t *m = comm->hier.map;
  if (!m->plan) {
    int cap = hetccl_hier_plan_cap_any(comm);
    m->plan = malloc((size_t)cap * sizeof(hetccl_hier_phase_t));
    if (!m->plan) {
      WARN("%s: rank %d: out of memory for a hierarchical plan of %d phases", fn, comm->rank, cap);
      return ncclSystemError;
    }
    m->plan_cap = cap;
  }
  hetccl_hier_plan_init(plan, m->plan, m->plan_cap);
  return ncclSuccess;
}

ncclResult_t hetccl_hier_run(ncclComm_t comm, const hetccl_op_t *user, hetccl_form_how_t how) {
  hetccl_op_t op = *user;
  hetccl_hier_stage_t *stage = NULL;
  hetccl_hier_plan_t plan;
  ncclResult_t res = eager_plan(comm, op.fn, &plan);
  if (res == ncclSuccess) res = hetccl_hier_host_begin(comm, &op, &stage);
  if (res == ncclSuccess) res = launch(comm, &op, how, ALL_SLOTS, NULL, &plan);
  if (!failed(res) && stage) res = hetccl_hier_host_return(comm, stage);
  if (!failed(res) && stage) res = finish(comm, op.fn, stage);
  return res;
}

/* --- inside a group ----------------------------------------------------------------- */

/* An operation kept in the thread's group (exec/group.h, its `hier` list). */
typedef struct hetccl_hier_deferred {
  ncclComm_t comm;
  hetccl_op_t op;
  hetccl_form_how_t how;      /* the route's choice */
  hetccl_hier_stage_t *stage; /* host buffers staged (hier_host.c) */
  void *scratch;              /* its part of the partial results' block */
  size_t partials;            /* bytes of it */
  int on_device;              /* of which kind of memory (its sendbuf's) */
  ncclResult_t res;
  struct hetccl_hier_deferred *next;
  hetccl_hier_plan_t plan;       /* built at slot 0, run slot by slot */
  hetccl_hier_phase_t phases[]; /* hetccl_hier_plan_cap of them */
} deferred_t;

ncclResult_t hetccl_hier_defer(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_how_t how) {
  int cap = hetccl_hier_plan_cap(comm, op->kind);
  deferred_t *d = malloc(sizeof(*d) + (size_t)cap * sizeof(hetccl_hier_phase_t));
  if (!d) {
    WARN("%s: out of memory", op->fn);
    return ncclSystemError;
  }
  hetccl_hier_plan_init(&d->plan, d->phases, cap);
  d->comm = comm;
  d->op = *op;
  d->op.config = NULL;
  d->how = how;
  d->stage = NULL;
  d->scratch = NULL;
  d->partials = 0;
  d->on_device = 0;
  d->res = ncclSuccess;
  d->next = NULL;
  hetccl_group_t *g = hetccl_group_current();
  if (g->hier.last) g->hier.last->next = d;
  else g->hier.head = d;
  g->hier.last = d;
  return ncclSuccess;
}

/* Each kept form that holds partial results gets a part of its
 * communicator's block of their kind of memory, as they run in step. */
static ncclResult_t share_partials(deferred_t *head) {
  for (deferred_t *d = head; d; d = d->next) {
    d->partials = d->res == ncclSuccess ? partials_bytes(d->comm, &d->op, d->how) : 0;
    d->scratch = NULL;
    if (d->partials) HETCCL_CHECK(hetccl_hier_on_device(d->comm, d->op.sendbuf, &d->on_device));
  }
  for (deferred_t *d = head; d; d = d->next) {
    if (!d->partials || d->scratch) continue;
    size_t total = 0;
    for (deferred_t *e = d; e; e = e->next)
      if (e->partials && e->comm == d->comm && e->on_device == d->on_device)
        total += hetccl_hier_align(e->partials);
    char *base;
    HETCCL_CHECK(hetccl_hier_scratch(d->comm, total, d->op.sendbuf, (void **)&base));
    for (deferred_t *e = d; e; e = e->next) {
      if (!e->partials || e->comm != d->comm || e->on_device != d->on_device) continue;
      e->scratch = base;
      base += hetccl_hier_align(e->partials);
    }
  }
  return ncclSuccess;
}

/* The kept forms move in step: slot k of every one of them in one group,
 * then slot k + 1. One thread may drive several ranks of an island (as
 * ncclCommInitAll's callers do), and the vendor then needs their calls of
 * one phase in one group, as NCCL does for any calls of several ranks from
 * one thread; slots are numbered alike on every rank, so each
 * communicator still sees its calls in the same order on all its ranks.
 * Staged host buffers are handed back once every form is launched. */
ncclResult_t hetccl_hier_run_deferred(int drop) {
  hetccl_group_t *g = hetccl_group_current();
  deferred_t *head = g->hier.head;
  g->hier.head = g->hier.last = NULL;
  if (!head) return ncclSuccess; /* also the groups below, which end here again */
  ncclResult_t first = ncclSuccess;
  for (deferred_t *d = head; d && !drop; d = d->next) {
    hetccl_comm_enter(d->comm);
    d->res = hetccl_comm_usable(d->comm, d->op.fn);
    if (d->res == ncclSuccess) d->res = hetccl_hier_host_begin(d->comm, &d->op, &d->stage);
    hetccl_comm_leave(d->comm);
    if (failed(d->res) && first == ncclSuccess) first = d->res;
  }
  if (!drop && first == ncclSuccess) first = share_partials(head);
  for (int slot = 0; slot < HIER_SLOTS && !drop && first == ncclSuccess; slot++) {
    ncclResult_t res = hetccl_group_open();
    for (deferred_t *d = head; d && res == ncclSuccess; d = d->next) {
      hetccl_comm_enter(d->comm);
      d->res = launch(d->comm, &d->op, d->how, slot, d->scratch, &d->plan);
      hetccl_comm_leave(d->comm);
      if (failed(d->res)) res = d->res;
    }
    ncclResult_t end = hetccl_group_close();
    if (failed(res)) first = res;
    else if (failed(end)) first = end;
  }
  for (deferred_t *d = head; d; d = d->next)
    if (d->stage && first == ncclSuccess) first = hetccl_hier_host_return(d->comm, d->stage);
  while (head) {
    deferred_t *next = head->next;
    /* A staged form that failed, or whose group did, keeps its blocks busy. */
    if (head->stage && first == ncclSuccess) {
      hetccl_comm_enter(head->comm);
      ncclResult_t res = finish(head->comm, head->op.fn, head->stage);
      hetccl_comm_leave(head->comm);
      if (failed(res)) first = res;
    }
    free(head);
    head = next;
  }
  return first;
}
