/* The route (backend/route.h has the contract and the table as prose):
 * the one table of rules that says which form an operation takes, the
 * conditions it reads and the lines that say the answer.
 *
 * Adding a form or a condition: its row here (the order is the priority),
 * its bit and where the bit is read (conditions), its name in
 * exec/form.h, and the table in route.h's comment.
 *
 * Thread: the API caller's; never allocates. */
#include "backend/route.h"

#include "exec/dataplane.h"
#include "hier/hier.h"

/* Conditions a row may ask for; all of a row's must hold. */
enum {
  NEED_FORWARDED = 1u << 0,    /* the backend is the vendor's (chosen at init) */
  NEED_HIER = 1u << 1,         /* hierarchical communicator (hetccl_hier_setup, at init) */
  NEED_ELEMENTS = 1u << 2,     /* count > 0 */
  NEED_COMPOSES = 1u << 3,     /* the reduction composes across phases */
  NEED_CONTIGUOUS = 1u << 4,   /* every island's ranks are consecutive */
  NEED_RAILS_SLICED = 1u << 5, /* hetccl_hier_sliced_on_rails */
  NEED_RAILS = 1u << 6,        /* hetccl_hier_on_rails */
  NEED_PEER_INSIDE = 1u << 7,  /* hetccl_hier_p2p_inside */
  NEED_TASK = 1u << 8,         /* the engine's task is made (its buffers known) */
  NEED_PLANE = 1u << 9,        /* hetccl_dataplane_takes */
  NEED_DEVICE = 1u << 10,      /* the task has device buffers */
};

typedef struct rule {
  hetccl_form_t form;
  hetccl_form_how_t how;
  unsigned kinds; /* the operations it serves: bit HETCCL_OP_<kind> */
  unsigned need;
  const char *why;
} rule_t;

#define K(x) (1u << HETCCL_OP_##x)
#define ALL_KINDS ((1u << HETCCL_OP_KIND_COUNT) - 1)
#define HIER_ON(extra) (NEED_HIER | NEED_ELEMENTS | (extra))
enum { ROW_FORWARDED = 0 };
static const rule_t rules[] = {
    [ROW_FORWARDED] = {HETCCL_FORM_FORWARDED, HETCCL_HOW_VENDOR, ALL_KINDS, NEED_FORWARDED,
                       "one island with one vendor library, chosen at init"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_RAILS, K(AllReduce) | K(Reduce),
     HIER_ON(NEED_COMPOSES | NEED_RAILS_SLICED),
     "equal islands with rails, and the message reaches HETCCL_HIER_RAILS_MIN: every rank "
     "crosses with a slice"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_RAILS, K(Broadcast) | K(Bcast),
     HIER_ON(NEED_RAILS_SLICED),
     "equal islands with rails, and the message reaches HETCCL_HIER_RAILS_MIN: every rank "
     "crosses with a slice"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_LEADERS, K(AllReduce) | K(Reduce),
     HIER_ON(NEED_COMPOSES), "islands of several ranks, and the reduction composes across "
     "phases"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_LEADERS, K(Broadcast) | K(Bcast), HIER_ON(0),
     "islands of several ranks"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_RAILS, K(AllGather), HIER_ON(NEED_RAILS),
     "equal islands with rails, and the buffer reaches HETCCL_HIER_RAILS_MIN_GATHER"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_RAILS, K(ReduceScatter),
     HIER_ON(NEED_COMPOSES | NEED_RAILS),
     "equal islands with rails, and the buffer reaches HETCCL_HIER_RAILS_MIN_GATHER"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_LEADERS, K(AllGather), HIER_ON(NEED_CONTIGUOUS),
     "contiguous islands: each island's slice is one block"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_LEADERS, K(ReduceScatter),
     HIER_ON(NEED_COMPOSES | NEED_CONTIGUOUS),
     "contiguous islands, and the reduction composes across phases"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_PAIRS, K(AlltoAll) | K(Gather) | K(Scatter), HIER_ON(0),
     "islands of several ranks: the pairs inside a vendor island take its links"},
    {HETCCL_FORM_HIERARCHICAL, HETCCL_HOW_PAIRS, K(Send) | K(Recv), NEED_HIER | NEED_PEER_INSIDE,
     "the peer is in this rank's island, which a vendor serves"},
    {HETCCL_FORM_PLANE, HETCCL_HOW_NONE, ALL_KINDS, NEED_TASK | NEED_PLANE,
     "the communicator has a data plane, and it takes this operation"},
    {HETCCL_FORM_STAGED, HETCCL_HOW_NONE, ALL_KINDS, NEED_TASK | NEED_DEVICE,
     "device buffers, and no data plane takes them"},
    {HETCCL_FORM_HOST, HETCCL_HOW_NONE, ALL_KINDS, NEED_TASK, "host buffers"},
};
#undef HIER_ON
#undef K
#define NRULES ((int)(sizeof(rules) / sizeof(rules[0])))

static const char *const how_names[HETCCL_HOW_COUNT] = {
    [HETCCL_HOW_NONE] = NULL,
    [HETCCL_HOW_VENDOR] = NULL, /* the communicator's vendor's name */
    [HETCCL_HOW_LEADERS] = "through the leaders",
    [HETCCL_HOW_RAILS] = "on the rails",
    [HETCCL_HOW_PAIRS] = "as point-to-point pairs",
};

/* ncclSum .. ncclMin compose across phases; ncclAvg (an average of
 * averages is wrong for islands of different sizes) and PreMulSum do not. */
static int composes(ncclRedOp_t op) { return (int)op >= (int)ncclSum && (int)op < (int)ncclAvg; }

/* The hierarchical conditions of op on comm (a hierarchical communicator):
 * each rails and pairs predicate only for the operations whose rows read it. */
static unsigned hier_conditions(ncclComm_t comm, const hetccl_op_t *op) {
  unsigned have = NEED_HIER;
  if (op->count) have |= NEED_ELEMENTS;
  if (composes(op->redop)) have |= NEED_COMPOSES;
  if (comm->hier.map->contiguous) have |= NEED_CONTIGUOUS;
  switch (op->kind) {
    case HETCCL_OP_AllReduce:
    case HETCCL_OP_Reduce:
    case HETCCL_OP_Broadcast:
    case HETCCL_OP_Bcast:
      if (hetccl_hier_sliced_on_rails(comm, op)) have |= NEED_RAILS_SLICED;
      break;
    case HETCCL_OP_AllGather:
    case HETCCL_OP_ReduceScatter:
      if (hetccl_hier_on_rails(comm, op)) have |= NEED_RAILS;
      break;
    case HETCCL_OP_Send:
    case HETCCL_OP_Recv:
      if (hetccl_hier_p2p_inside(comm, op)) have |= NEED_PEER_INSIDE;
      break;
    default: break;
  }
  return have;
}

/* Without a task, what the call alone says; with one, what the task says
 * (the call's rows were walked already: route.h). */
static unsigned conditions(ncclComm_t comm, const hetccl_op_t *op, const hetccl_task_t *t) {
  if (hetccl_backend_of(comm) == &hetccl_backend_forward) return NEED_FORWARDED;
  if (!t) return comm->hier.enabled && comm->hier.map ? hier_conditions(comm, op) : 0;
  unsigned have = NEED_TASK;
  if (hetccl_dataplane_takes(comm, t)) have |= NEED_PLANE;
  if (t->stage_send || t->stage_recv || t->device_direct) have |= NEED_DEVICE;
  return have;
}

static void say(ncclComm_t comm, const hetccl_op_t *op, const rule_t *r) {
  const char *how = r->how == HETCCL_HOW_VENDOR ? comm->forward.vendor->name : how_names[r->how];
  hetccl_form_say(comm, op, r->form, how, r->why);
}

void hetccl_route_say_forwarded(ncclComm_t comm, const hetccl_op_t *op) {
  say(comm, op, &rules[ROW_FORWARDED]);
}

hetccl_route_t hetccl_route_walk(ncclComm_t comm, const hetccl_op_t *op, const hetccl_task_t *t) {
  unsigned have = conditions(comm, op, t), kind = 1u << op->kind;
  for (int i = 0; i < NRULES; i++) {
    const rule_t *r = &rules[i];
    if (!(r->kinds & kind)) continue;
    int task_row = (r->need & NEED_TASK) != 0;
    if (!t && task_row) break; /* the engine's task decides from here */
    if (t && !task_row) continue; /* walked already, without the task */
    if (r->need & ~have) continue;
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_COLL)) say(comm, op, r);
    return (hetccl_route_t){r->form, r->how};
  }
  return (hetccl_route_t){HETCCL_ROUTE_NEEDS_TASK, HETCCL_HOW_NONE};
}
