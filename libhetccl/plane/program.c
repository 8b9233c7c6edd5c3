/* Programs: schedules (sched/sched.h) lowered onto the data plane's lanes
 * of pieces (plane_impl.h): the device executor's front half, whose back
 * half runs the lanes (exec_stream.c on a GPU rank's streams, capture.c
 * into a graph, exec_host.c on a host thread).
 *
 * Each collective is built as a schedule by its form (algo/pieces.h: the
 * two-rank exchange, ring wavefronts, chains, direct exchanges, and under
 * HETCCL_ALGO=rhd the host engine's halving-doubling AllReduce), one phase
 * each in call order, then every send and receive of the call in one
 * phase. Lowering a schedule:
 *
 *   schedule                                plane step
 *   PREPARE (transient) + SEND              SEND, scaled by op's scalar on the way
 *   SEND / RECV / COPY                      SEND / RECV / COPY
 *   [PREPARE (transient) +] RECV_REDUCE     REDUCE into dst, this rank's operand
 *     [+ FINISH of the same dst]              scaled (SCALE_A) [and finished]
 *   [PREPARE +] RECV_REDUCE (transient)     REDUCE straight into the next
 *     + SEND of it                            channel's slot
 *   PREPARE / FINISH (alone)                SCALE (dst = src scaled / finished)
 *
 * Placement: with the schedule's one_lane every step goes on the ring lane
 * in listed order; else a message goes on its peer's lane for its
 * direction and a local step on the ring lane. An `after` within a lane
 * is kept by the lane's order; one across lanes must name a step that
 * writes a channel (a SEND), and becomes a wait for that piece's counter
 * (dep_out). Anything else (a local REDUCE, a transient step nothing
 * takes up, a second wait across lanes) is refused, naming it: the plane
 * cannot run that schedule yet.
 *
 * Pieces: a message longer than the plane's piece is cut (the forms of
 * algo/pieces.c cut their own; halving-doubling's messages are whole), and
 * consecutive messages that wait for none of each other and share no
 * channel take their pieces in turn (lower). Pieces are numbered per
 * channel in the order they are lowered, which keeps the schedule's order
 * on every channel: the peer lowers the same schedule and so numbers the
 * same pieces alike. A step of no bytes numbers none, on either rank. A
 * message of at least the plane's wide_min bytes per channel moves in wide
 * pieces (two slots each, two in flight of the default four;
 * plane_impl.h): the same bytes in flight in half as many pieces, each
 * paying its waits and signals once.
 *
 * Thread: the API caller's (build happens at launch). */
#include <stdlib.h>
#include <string.h>

#include "algo/pieces.h"
#include "plane/plane_impl.h"
#include "runtime/reduce.h"
#include "util/check.h"
#include "util/log.h"

typedef struct builder {
  hetccl_plane_t *p;
  plane_phase_t *ph;
  int rank, n;
  int graph;        /* a captured program's (capture.c) */
  plane_chan_t *out, *in; /* the channels it numbers on: the plane's or the captured ones */
} builder_t;

static ncclResult_t phase_open(builder_t *b, plane_prog_t *prog) {
  plane_phase_t *ph = calloc(1, sizeof(*ph));
  if (ph) ph->lanes = calloc((size_t)b->p->nlanes, sizeof(*ph->lanes));
  if (!ph || !ph->lanes) {
    free(ph);
    WARN("plane: out of memory for a program");
    return ncclSystemError;
  }
  ph->nlanes = b->p->nlanes;
  if (prog->tail) prog->tail->next = ph;
  else prog->head = ph;
  prog->tail = ph;
  b->ph = ph;
  return ncclSuccess;
}

/* Append s to lane l, numbering its pieces on its channels. */
static plane_step_t *emit(builder_t *b, int l, const plane_step_t *s) {
  plane_lane_t *lane = &b->ph->lanes[l];
  if (lane->n == lane->cap) {
    int cap = lane->cap ? 2 * lane->cap : 64;
    plane_step_t *n = realloc(lane->steps, (size_t)cap * sizeof(*n));
    if (!n) return NULL;
    lane->steps = n;
    lane->cap = cap;
  }
  plane_step_t *t = &lane->steps[lane->n++];
  *t = *s;
  t->span = t->bytes > b->p->a.piece ? 2 : 1; /* a wide piece (plane_impl.h) */
  t->graph = (uint8_t)b->graph;
  t->oc = t->out >= 0 ? &b->out[t->out] : NULL;
  t->ic = t->in >= 0 ? &b->in[t->in] : NULL;
  if (t->oc) t->out_q = t->oc->next, t->oc->next += t->span;
  if (t->ic) t->in_q = t->ic->next, t->ic->next += t->span;
  /* A piece that crosses to another host: its bridge learns its size. */
  if (t->oc && t->oc->bridge && plane_bridge_queue(b->p, t->oc, t->out_q, t->bytes) != ncclSuccess)
    return NULL;
  if (t->ic && t->ic->bridge && plane_bridge_queue(b->p, t->ic, t->in_q, t->bytes) != ncclSuccess)
    return NULL;
  return t;
}

/* A step with no channels and no extra wait. */
#define STEP(...) ((plane_step_t){.in = -1, .out = -1, .dep_out = -1, __VA_ARGS__})

static ncclResult_t oom(void) {
  WARN("plane: out of memory for a program");
  return ncclSystemError;
}

/* --- lowering -------------------------------------------------------------------- */

/* Where a schedule's step went: its lane, and the channel piece it writes
 * last (for the waits of steps on other lanes). */
typedef struct placed {
  int lane;
  int out;             /* peer of the channel written, -1: none */
  uint64_t out_q;
  uint8_t span;
} placed_t;

/* Steps [first, last] of a schedule, fused into one plane step `st`
 * (bytes: the whole of it), cut into pieces if it moves a message. */
typedef struct unit {
  int first, last;
  int lane;
  plane_step_t st;
} unit_t;

/* Does the unit move a message (else it is a local step, never cut)? */
static int moves(const unit_t *u) { return u->st.in >= 0 || u->st.out >= 0; }

static ncclResult_t refuse(const hetccl_sched_t *s, int i, const char *why) {
  WARN("plane: cannot run step %d of %d (kind %d) of this schedule: %s", i, s->nsteps,
       (int)s->steps[i].kind, why);
  return ncclInternalError;
}

/* Step i + 1, if it is of `kind`, `bytes` long, and waits for step i. */
static const hetccl_step_t *fusable(const hetccl_sched_t *s, int i, int kind) {
  if (i + 1 >= s->nsteps) return NULL;
  const hetccl_step_t *t = &s->steps[i], *u = &s->steps[i + 1];
  if (u->kind != kind || u->bytes != t->bytes) return NULL;
  for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++)
    if (u->after[k] == i) return u;
  return NULL;
}

/* The unit that starts at step i (the table at the top). */
static ncclResult_t unit_at(const hetccl_sched_t *s, int i, unit_t *u) {
  const hetccl_step_t *t = &s->steps[i], *prep = NULL;
  plane_step_t *st = &u->st;
  *st = STEP(.bytes = t->bytes);
  u->first = i;
  u->lane = PLANE_LANE_RING;
  if (t->kind == HETCCL_STEP_PREPARE && (t->flags & HETCCL_STEP_FORWARD)) {
    if (!fusable(s, i, HETCCL_STEP_SEND) && !fusable(s, i, HETCCL_STEP_RECV_REDUCE))
      return refuse(s, i, "a transient scaling the next step does not take up");
    prep = t;
    t = &s->steps[++i];
  }
  switch (t->kind) {
    case HETCCL_STEP_SEND:
      st->kind = STEP_SEND, st->out = t->peer, st->src = prep ? prep->src : t->src;
      st->op = prep ? s->op : NULL;
      u->lane = PLANE_LANE_OUT(t->peer);
      break;
    case HETCCL_STEP_RECV:
      st->kind = STEP_RECV, st->in = t->peer, st->dst = t->dst;
      u->lane = PLANE_LANE_IN(t->peer);
      break;
    case HETCCL_STEP_COPY: st->kind = STEP_COPY, st->src = t->src, st->dst = t->dst; break;
    case HETCCL_STEP_PREPARE:
      st->kind = STEP_SCALE, st->src = t->src, st->dst = t->dst, st->op = s->op;
      st->flags = HETCCL_REDUCE_SCALE_A;
      break;
    case HETCCL_STEP_FINISH:
      st->kind = STEP_SCALE, st->src = t->dst, st->dst = t->dst, st->op = s->op;
      st->flags = HETCCL_REDUCE_FINISH;
      break;
    case HETCCL_STEP_RECV_REDUCE: {
      st->kind = STEP_REDUCE, st->in = t->peer, st->op = s->op, st->dst = t->dst;
      st->src = prep ? prep->src : t->src;
      st->swap = (t->flags & HETCCL_STEP_IN_RIGHT) != 0;
      st->flags = prep ? HETCCL_REDUCE_SCALE_A : 0;
      u->lane = PLANE_LANE_IN(t->peer);
      const hetccl_step_t *v;
      if (t->flags & HETCCL_STEP_FORWARD) {
        if (!s->one_lane || !(v = fusable(s, i, HETCCL_STEP_SEND)))
          return refuse(s, i, "a sum passed on other than by the next step on its lane");
        st->out = v->peer, st->dst = NULL;
        i++;
      } else if ((v = fusable(s, i, HETCCL_STEP_FINISH)) && v->dst == t->dst) {
        st->flags |= HETCCL_REDUCE_FINISH;
        i++;
      }
      break;
    }
    default: return refuse(s, i, "no plane step does this");
  }
  if (s->one_lane) u->lane = PLANE_LANE_RING;
  u->last = i;
  return ncclSuccess;
}

/* Can unit u join the group of units g[0..ng) and have its pieces taken
 * in turn with theirs? Only a message that waits for none of them and
 * shares no channel with them (each channel's pieces keep the schedule's
 * order, which the peer numbers alike). */
static int joins(const hetccl_sched_t *s, const unit_t *g, int ng, const unit_t *u) {
  if (!moves(u)) return 0;
  for (int j = u->first; j <= u->last; j++)
    for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++)
      if (s->steps[j].after[k] >= g[0].first && s->steps[j].after[k] < u->first) return 0;
  for (int m = 0; m < ng; m++)
    if ((u->st.in >= 0 && u->st.in == g[m].st.in) || (u->st.out >= 0 && u->st.out == g[m].st.out))
      return 0;
  return 1;
}

/* Unit u's waits across lanes (lanes keep their own order). */
static ncclResult_t unit_waits(const hetccl_sched_t *s, const placed_t *at, unit_t *u) {
  plane_step_t *st = &u->st;
  for (int j = u->first; j <= u->last; j++)
    for (int k = 0; k < HETCCL_STEP_MAX_AFTER; k++) {
      int a = s->steps[j].after[k];
      if (a == HETCCL_STEP_NONE || a >= u->first || at[a].lane < 0 || at[a].lane == u->lane)
        continue;
      if (at[a].out < 0)
        return refuse(s, j, "it waits across lanes for a step that writes no channel");
      uint64_t q = at[a].out_q + at[a].span;
      if (st->dep_out >= 0 && (st->dep_out != at[a].out || st->dep_q != q))
        return refuse(s, j, "it waits across lanes for two pieces");
      st->dep_out = at[a].out;
      st->dep_q = q;
    }
  return ncclSuccess;
}

/* Lower schedule s as the current phase (b->ph), messages cut into pieces
 * of at most `piece` bytes (SIZE_MAX: the schedule's steps are its
 * pieces). Consecutive messages that may move together (joins) take their
 * pieces in turn: two ranks exchanging long messages on one lane each send
 * piece k before receiving it, and neither waits for the other's last
 * piece to free a slot. */
static ncclResult_t lower(builder_t *b, const hetccl_sched_t *s, size_t piece) {
  if (s->failed) return ncclInternalError; /* logged by the schedule */
  placed_t *at = calloc((size_t)s->nsteps + 1, sizeof(*at));
  unit_t *g = calloc((size_t)s->nsteps + 1, sizeof(*g));
  ncclResult_t res = at && g ? ncclSuccess : oom();
  for (int i = 0; i < s->nsteps && res == ncclSuccess;) {
    int ng = 0;
    res = unit_at(s, i, &g[ng]);
    while (res == ncclSuccess) {
      i = g[ng++].last + 1;
      if (!moves(&g[0])) break; /* a local step goes alone */
      if (i == s->nsteps || (res = unit_at(s, i, &g[ng])) != ncclSuccess) break;
      if (!joins(s, g, ng, &g[ng])) break;
    }
    for (int m = 0; m < ng && res == ncclSuccess; m++) res = unit_waits(s, at, &g[m]);
    /* a step of no bytes moves nothing and numbers no piece, on either rank */
    for (int m = 0; m < ng; m++)
      for (int j = g[m].first; g[m].st.bytes == 0 && j <= g[m].last; j++)
        at[j] = (placed_t){.lane = -1, .out = -1};
    for (size_t off = 0, more = 1; more && res == ncclSuccess; off += piece) {
      more = 0;
      for (int m = 0; m < ng && res == ncclSuccess; m++) {
        unit_t *u = &g[m];
        int local = !moves(u);
        if (off >= u->st.bytes || (local && off)) continue;
        plane_step_t st = u->st;
        if (!local) {
          st.bytes = u->st.bytes - off < piece ? u->st.bytes - off : piece;
          if (st.src) st.src = (const char *)st.src + off;
          if (st.dst) st.dst = (char *)st.dst + off;
          more |= st.bytes < u->st.bytes - off;
        }
        plane_step_t *e = emit(b, u->lane, &st);
        if (!e) res = oom();
        for (int j = u->first; e && j <= u->last; j++)
          at[j] = (placed_t){.lane = u->lane, .out = e->out, .out_q = e->out_q, .span = e->span};
      }
    }
  }
  free(at);
  free(g);
  return res;
}

/* A schedule of the size a first, counting build of it asked for, built by
 * `build` (which fills *s and says how lower should cut its messages in
 * *piece), then lowered as a new phase. */
typedef ncclResult_t (*sched_build_fn)(hetccl_sched_t *s, void *arg, size_t *piece);

static ncclResult_t lower_built(builder_t *b, plane_prog_t *prog, const hetccl_redop_t *op,
                                sched_build_fn build, void *arg) {
  size_t piece;
  hetccl_sched_t s;
  hetccl_sched_init_ranks(&s, NULL, 0, b->rank, b->n, op);
  HETCCL_CHECK(build(&s, arg, &piece));
  int steps = s.wanted;
  void *mem = malloc(hetccl_sched_bytes(steps, b->n));
  if (!mem) return oom();
  hetccl_sched_init_ranks(&s, mem, steps, b->rank, b->n, op);
  ncclResult_t res = build(&s, arg, &piece);
  if (res == ncclSuccess) res = phase_open(b, prog);
  if (res == ncclSuccess) res = lower(b, &s, piece);
  free(mem);
  return res;
}

/* --- programs ------------------------------------------------------------------- */

typedef struct coll_arg {
  const hetccl_coll_t *c;
  size_t piece;
} coll_arg_t;

static ncclResult_t build_coll(hetccl_sched_t *s, void *arg, size_t *piece) {
  const coll_arg_t *a = arg;
  int cut;
  HETCCL_CHECK(hetccl_pieces_coll(s, a->c, a->piece, &cut));
  *piece = cut ? a->piece : SIZE_MAX;
  return ncclSuccess;
}

/* The pieces of a message of `bytes` per channel: wide (two slots' worth,
 * plane_impl.h) from the plane's wide_min, else a slot's worth. Fewer,
 * larger pieces pay the per-piece waits and signals less often, at the
 * same bytes in flight; small messages keep more pieces to overlap. */
static size_t pieces_for(const builder_t *b, size_t bytes) {
  size_t slot = b->p->a.piece;
  return b->p->wide_min && !b->graph && bytes >= b->p->wide_min ? 2 * slot : slot;
}

typedef struct p2p_arg {
  const builder_t *b;
  const hetccl_plane_task_t *tasks;
  int ntasks;
} p2p_arg_t;

/* Every send and receive of the share: per peer in call order; a message to
 * this rank itself is a copy from the matching send (k-th with k-th). */
static ncclResult_t build_p2p(hetccl_sched_t *s, void *arg, size_t *piece) {
  const p2p_arg_t *a = arg;
  *piece = SIZE_MAX; /* cut below */
  const hetccl_plane_task_t *tasks = a->tasks;
  int ntasks = a->ntasks, self_send = 0;
  for (int i = 0; i < ntasks; i++) {
    const hetccl_plane_task_t *t = &tasks[i];
    if (t->kind == HETCCL_PLANE_COLL || t->bytes == 0) continue;
    if (t->peer != s->rank) {
      size_t piece = pieces_for(a->b, t->bytes);
      if (t->kind == HETCCL_PLANE_SEND) hetccl_pieces_send(s, t->peer, t->buf, t->bytes, piece);
      else hetccl_pieces_recv(s, t->peer, t->buf, t->bytes, piece, HETCCL_STEP_NONE);
      continue;
    }
    if (t->kind != HETCCL_PLANE_RECV) continue;
    while (self_send < ntasks && !(tasks[self_send].kind == HETCCL_PLANE_SEND &&
                                   tasks[self_send].peer == s->rank && tasks[self_send].bytes))
      self_send++;
    if (self_send == ntasks || tasks[self_send].bytes != t->bytes) {
      WARN("p2p: rank %d receives %zu bytes from itself without a matching send",
           plane_user_rank(a->b->p, s->rank), t->bytes);
      return ncclInvalidUsage;
    }
    if (t->buf != tasks[self_send].buf)
      hetccl_sched_copy(s, t->buf, tasks[self_send].buf, t->bytes, HETCCL_STEP_NONE,
                        HETCCL_STEP_NONE);
    self_send++;
  }
  return ncclSuccess;
}

ncclResult_t plane_prog_build(hetccl_plane_t *p, const hetccl_plane_task_t *tasks, int ntasks,
                              int graph, plane_prog_t *prog) {
  memset(prog, 0, sizeof(*prog));
  builder_t b = {.p = p, .rank = p->a.rank, .n = p->a.nranks,
                 .graph = graph, .out = graph ? p->gout : p->out, .in = graph ? p->gin : p->in};
  prog->graph = graph;
  for (int q = 0; graph && q < p->a.nranks; q++) {
    p->gout[q].prog_base = p->gout[q].next;
    p->gout[q].dep_used = 0;
  }
  ncclResult_t res = ncclSuccess;
  int p2p = 0;
  for (int i = 0; i < ntasks && res == ncclSuccess; i++) {
    if (tasks[i].kind != HETCCL_PLANE_COLL) {
      p2p = 1;
      continue;
    }
    const hetccl_coll_t *c = &tasks[i].coll;
    if (c->count == 0) continue;
    coll_arg_t arg = {c, pieces_for(&b, hetccl_pieces_message_bytes(c, b.n))};
    res = lower_built(&b, prog, hetccl_func_reduces(c->func) ? &c->op : NULL, build_coll, &arg);
  }
  if (res == ncclSuccess && p2p) {
    p2p_arg_t arg = {&b, tasks, ntasks};
    res = lower_built(&b, prog, NULL, build_p2p, &arg);
  }
  if (res != ncclSuccess) plane_prog_free(prog);
  else if (p->bridges) prog->bridge_end = plane_bridge_mark(p);
  return res;
}

void plane_prog_free(plane_prog_t *prog) {
  while (prog->head) {
    plane_phase_t *ph = prog->head;
    prog->head = ph->next;
    for (int l = 0; l < ph->nlanes; l++) free(ph->lanes[l].steps);
    free(ph->lanes);
    free(ph);
  }
  prog->tail = NULL;
}

int hetccl_plane_task_reduces(const hetccl_plane_task_t *t) {
  return t->kind == HETCCL_PLANE_COLL && hetccl_func_reduces(t->coll.func) && t->coll.count;
}
