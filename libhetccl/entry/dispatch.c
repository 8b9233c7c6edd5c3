/* Where an operation goes (dispatch.h), and the last error of every call.
 *
 * An operation goes to its communicator's backend (comm/backend.h):
 *
 *   forwarded communicator          the vendor's function (its *Config form
 *                                   when the caller gave a config and the
 *                                   vendor has it), one indirect call
 *                                   (backend/forward.c)
 *   engine communicator             the operation's hierarchical form
 *                                   (hier/hier_ops.c) where it has one,
 *                                   inside a group at the group's end;
 *                                   otherwise engine tasks (exec/enqueue.h)
 *                                   whose device buffers go to the data
 *                                   plane or to staging at the group's end
 *                                   (backend/engine.c)
 *
 * Thread: the API caller's. */
#include "entry/dispatch.h"

#include "comm/backend.h"
#include "comm/comm.h"
#include "exec/trace_points.h"
#include "util/check.h"
#include "util/log.h"

void hetccl_call_begin(void) { hetccl_last_error_clear(); }

ncclResult_t hetccl_call_end(ncclComm_t comm, ncclResult_t res) {
  if (comm) hetccl_comm_note_call(comm, res);
  return res;
}

ncclResult_t hetccl_dispatch(ncclComm_t comm, const hetccl_op_t *op) {
  HETCCL_CHECK(hetccl_comm_check(comm, op->fn));
  uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_call_begin(comm) : 0;
  ncclResult_t res = hetccl_comm_dispatch(comm, op);
  if (traced) hetccl_comm_trace_call_end(comm, op, traced);
  return res;
}
