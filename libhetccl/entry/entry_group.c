/* ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.
 *
 * A group may hold forwarded and engine operations at once: the vendor's
 * own group is opened alongside ours (when a vendor library is loaded) so
 * that forwarded calls inside it are grouped by the vendor, while engine
 * tasks are collected by core/group.c. The vendor group is closed after
 * the engine's tasks have run; then the group's hierarchical collectives
 * run (core/hier_ops.c), whose phases need the vendor's calls launched
 * one after the other.
 *
 * The core half of the three entry points (core/dispatch.h).
 *
 * Thread: the API caller; group state is per thread. */
#include "entry/dispatch.h"
#include "exec/group.h"
#include "hier/hier.h"
#include "exec/trace_points.h"
#include "util/check.h"
#include "util/log.h"

static __thread int vendor_open; /* depth at which we opened the vendor's group */

ncclResult_t hetccl_GroupStart(void) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  HETCCL_CHECK(hetccl_group_start());
  if (v) {
    ncclResult_t res = HETCCL_VENDOR_CALL(v, GroupStart);
    if (res != ncclSuccess) {
      hetccl_group_end();
      return res;
    }
    vendor_open++;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_GroupEnd(void) {
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  uint64_t traced = HETCCL_TRACE_ON() ? hetccl_comm_trace_group_begin() : 0;
  int close_vendor = vendor_open > 0 && vendor_open == hetccl_group_depth();
  ncclResult_t res = hetccl_group_end();
  if (close_vendor) {
    vendor_open--;
    ncclResult_t vres = HETCCL_VENDOR_CALL(v, GroupEnd);
    if (res == ncclSuccess || res == ncclInProgress) res = vres == ncclSuccess ? res : vres;
  }
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
  const hetccl_vendor_t *v = hetccl_vendor_loaded();
  if (hetccl_group_depth() == 0) {
    WARN("ncclGroupSimulateEnd: not inside a group");
    return ncclInvalidUsage;
  }
  int close_vendor = vendor_open > 0 && vendor_open == hetccl_group_depth();
  ncclResult_t res = hetccl_group_simulate_end(&simInfo->estimatedTime);
  if (hetccl_group_depth() == 0) (void)hetccl_hier_run_deferred(1);
  if (close_vendor) {
    vendor_open--;
    ncclSimInfo_t vinfo = *simInfo;
    if (HETCCL_VENDOR_CALL(v, GroupSimulateEnd, &vinfo) == ncclSuccess)
      simInfo->estimatedTime += vinfo.estimatedTime;
  }
  return res;
}
