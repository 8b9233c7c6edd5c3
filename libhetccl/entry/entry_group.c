/* ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.
 *
 * A group may hold forwarded and engine operations at once: the vendor's
 * own group is opened alongside ours (exec/group.h, hetccl_group_open).
 * At the outermost end, after the engine's tasks and the vendor's group
 * have been launched, the group's hierarchical collectives run
 * (hier/hier_ops.c), whose phases need the vendor's calls launched one
 * after the other.
 *
 * The core half of the three entry points (entry/dispatch.h).
 *
 * Thread: the API caller; group state is per thread. */
#include "entry/dispatch.h"
#include "exec/group.h"
#include "exec/trace_points.h"
#include "hier/hier.h"
#include "util/check.h"
#include "util/log.h"

ncclResult_t hetccl_GroupStart(void) { return hetccl_group_open(); }

ncclResult_t hetccl_GroupEnd(void) {
  uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_group_begin(hetccl_group_depth()) : 0;
  ncclResult_t res = hetccl_group_close();
  if (hetccl_group_depth() == 0) { /* hierarchical collectives of the group, now */
    ncclResult_t hres = hetccl_hier_run_deferred(res != ncclSuccess && res != ncclInProgress);
    if (hres != ncclSuccess) res = hres;
  }
  if (traced) hetccl_comm_trace_group_end(traced);
  return res;
}

/* The engine's estimate is a plain latency/bandwidth model over the
 * group's bytes; the group is ended without running anything, as NCCL's
 * simulation does. */
ncclResult_t hetccl_GroupSimulateEnd(ncclSimInfo_t *simInfo) {
  if (hetccl_group_depth() == 0) {
    WARN("ncclGroupSimulateEnd: not inside a group");
    return ncclInvalidUsage;
  }
  ncclResult_t res = hetccl_group_simulate_close(simInfo);
  if (hetccl_group_depth() == 0) (void)hetccl_hier_run_deferred(1);
  return res;
}
