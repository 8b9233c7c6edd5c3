/* Forms: where an operation goes, and how that is said.
 *
 *   form           when                                  decided in: backend/route.c's
 *                                                        table, its rows reading
 *   forwarded      the communicator is one island with   the backend comm/init.c chose
 *                  one vendor library: its function,     at init (comm/backend.h)
 *                  at once (how: the library's name)
 *   hierarchical   several islands, one with several     hier/: the map made at init,
 *                  ranks: phases inside and across       hetccl_hier_sliced_on_rails,
 *                  them (how: through the leaders, on    hetccl_hier_on_rails,
 *                  the rails, as point-to-point pairs)   hetccl_hier_p2p_inside
 *   data plane     the communicator has a data plane     hetccl_dataplane_takes
 *                  and it takes the operation: copy      (exec/dataplane.c)
 *                  engines and device reductions
 *   staged         device buffers on the host engine,    the task's buffers, as
 *                  through pinned host memory            exec/enqueue.c classified them
 *   host engine    host buffers: the host engine's       the rest (algo/select.c then
 *                  algorithm, over the transports        says the algorithm the same way)
 *
 * One table of rules decides, the first that fits winning
 * (backend/route.h has it). This header is the vocabulary it shares with
 * the layers that run the forms: hier/ reads the "how" of a hierarchical
 * form (rails or leaders), exec/ the form an engine task was given
 * (plane, staged, host).
 *
 * Each form is said once per process and (operation, form) at INFO and on
 * every call at TRACE, subsystem COLL (HETCCL_DEBUG=INFO
 * HETCCL_DEBUG_SUBSYS=COLL), with the reason of the rule that chose it:
 * one place to read why a call went where it went. The operations that
 * hetccl derives for a hierarchical form's phases are said as what they
 * are on their internal communicators.
 *
 * Thread: any; the check that logging is on costs one branch, which keeps
 * the forwarded path at the vendor's speed. */
#ifndef HETCCL_EXEC_FORM_H
#define HETCCL_EXEC_FORM_H

#include "comm/comm.h"
#include "comm/op.h"
#include "util/log.h"

typedef enum {
  HETCCL_FORM_FORWARDED,
  HETCCL_FORM_HIERARCHICAL,
  HETCCL_FORM_PLANE,
  HETCCL_FORM_STAGED,
  HETCCL_FORM_HOST,
  HETCCL_FORM_COUNT
} hetccl_form_t;

/* A form's detail: which vendor library, which hierarchical form. */
typedef enum {
  HETCCL_HOW_NONE,    /* the form says it all */
  HETCCL_HOW_VENDOR,  /* forwarded: the communicator's vendor library */
  HETCCL_HOW_LEADERS, /* hierarchical, through the leaders (hier/hier_ops.c) */
  HETCCL_HOW_RAILS,   /* hierarchical, on the rails (hier/hier_rails.c) */
  HETCCL_HOW_PAIRS,   /* hierarchical, as point-to-point pairs (hier/hier_pairs.c) */
  HETCCL_HOW_COUNT
} hetccl_form_how_t;

/* Say that op on comm takes form: how (a detail, or NULL), why (the
 * rule's reason, or NULL). */
void hetccl_form_say(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_t form,
                     const char *how, const char *why);

#define HETCCL_FORM_SAY(comm, op, form, how, why)                              \
  do {                                                                         \
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_COLL))                      \
      hetccl_form_say((comm), (op), (form), (how), (why));                     \
  } while (0)

#endif
