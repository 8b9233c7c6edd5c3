/* Forms: where an operation goes, said in one place.
 *
 *   form           when                                         decided in
 *   forwarded      the communicator is one island with one       comm/init.c (the backend)
 *                  vendor library: its function, at once
 *   hierarchical   several islands, one with several ranks:      hier/hier_ops.c (its table;
 *                  phases inside and across them, through the    how: leaders, rails, pairs)
 *                  leaders, the rails or point-to-point pairs
 *   data plane     device buffers of ranks that share a plane:   exec/dataplane.c
 *                  copy engines and device reductions
 *   staged         device buffers on the host engine, through    exec/devpath.c
 *                  pinned host memory
 *   host engine    host buffers: the host engine's algorithm,    algo/select.c (which says
 *                  over the transports                           the algorithm the same way)
 *
 * Each is said once per process and (operation, form) at INFO and on
 * every call at TRACE, subsystem COLL (HETCCL_DEBUG=INFO
 * HETCCL_DEBUG_SUBSYS=COLL): one place to read why a call went where it
 * went. The operations that hetccl derives for a hierarchical form's
 * phases are said as what they are on their internal communicators.
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

/* Say that op on comm takes form (how: a detail, or NULL). */
void hetccl_form_say(ncclComm_t comm, const hetccl_op_t *op, hetccl_form_t form,
                     const char *how);

#define HETCCL_FORM_SAY(comm, op, form, how)                                   \
  do {                                                                         \
    if (HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_COLL))                      \
      hetccl_form_say((comm), (op), (form), (how));                            \
  } while (0)

#endif
