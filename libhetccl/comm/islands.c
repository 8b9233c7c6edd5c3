/* Islands (islands.h): forced ones, ranks sharing a GPU, and whether one
 * island covers the communicator. Thread: where init runs; the islands a
 * process remembers per device have a lock of their own. */
#include "comm/islands.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/identity.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* HETCCL_ISLANDS: "" (none), "rank" (one island per rank) or a comma list
 * giving each rank's island. The island it gives `rank`; *entries: how
 * many the list has (0 for none or 'rank'). A list of another length than
 * nranks leaves *island -1 without a message: the caller decides. */
static ncclResult_t listed_island(int rank, int nranks, int32_t *island, int *entries) {
  *entries = 0;
  const char *s = hetccl_knob_str(HETCCL_KNOB_ISLANDS);
  *island = -1;
  if (!s[0]) return ncclSuccess;
  if (!strcmp(s, "rank")) {
    *island = rank;
    return ncclSuccess;
  }
  int idx = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || (*end && *end != ',')) {
      WARN("HETCCL_ISLANDS=%s: expected 'rank' or a comma list of island ids", s);
      return ncclInvalidArgument;
    }
    if (idx == rank) *island = (int32_t)v;
    idx++;
    p = *end ? end + 1 : end;
  }
  *entries = idx;
  if (idx != nranks) *island = -1;
  return ncclSuccess;
}

/* HETCCL_ISLANDS names the islands of the ranks of the job's first
 * communicator (its length is that communicator's size). A process keeps
 * the island it got there, per device, and a later communicator of
 * another size (one a program makes for a subset of its ranks, as
 * PyTorch's new_group does) gives its ranks the islands they had. */
#define REMEMBERED_DEVICES 64
static int32_t remembered[REMEMBERED_DEVICES + 1]; /* island + 1 per device (+1: host) */
static pthread_mutex_t remembered_lock = PTHREAD_MUTEX_INITIALIZER;

static int device_slot(int dev) { return dev >= 0 && dev < REMEMBERED_DEVICES ? dev + 1 : 0; }

ncclResult_t hetccl_islands_forced(ncclComm_t comm, int32_t *island) {
  int entries;
  HETCCL_CHECK(listed_island(comm->rank, comm->nranks, island, &entries));
  if (!entries) return ncclSuccess;
  pthread_mutex_lock(&remembered_lock);
  int32_t *slot = &remembered[device_slot(comm->dev)];
  int known = *slot;
  if (entries == comm->nranks && !known) *slot = *island + 1;
  pthread_mutex_unlock(&remembered_lock);
  if (entries == comm->nranks) return ncclSuccess;
  if (known) {
    *island = known - 1; /* a communicator of a subset: the island this rank had */
    return ncclSuccess;
  }
  WARN("HETCCL_ISLANDS=%s gives %d entries for a communicator of %d ranks, and no earlier "
       "communicator of this process had %d", hetccl_knob_str(HETCCL_KNOB_ISLANDS), entries,
       comm->nranks, entries);
  return ncclInvalidArgument;
}

/* Ranks of one GPU kind (all CUDA, or all HIP), served by one version of
 * that kind's vendor library (NCCL, RCCL), in one island. */
int hetccl_islands_one(const hetccl_peer_info_t *peers, int n) {
  hetccl_vendor_id_t vid;
  if (!hetccl_knob_int(HETCCL_KNOB_VENDOR)) return 0;
  if (!hetccl_dev_vendor((hetccl_dev_kind_t)peers[0].dev_kind, &vid)) return 0;
  for (int r = 0; r < n; r++) {
    if (peers[r].dev_kind != peers[0].dev_kind || peers[r].vendor_version == 0) return 0;
    if (peers[r].vendor_version != peers[0].vendor_version) return 0;
    if (peers[r].island != peers[0].island) return 0;
  }
  return 1;
}

/* Each rank on a shared GPU becomes an island of its own, as under
 * HETCCL_ISLANDS=rank, so that the engine or the data plane serves them.
 * Sorting keeps it O(n log n) at scale. */
static int gpu_order(const void *a, const void *b, void *arg) {
  const hetccl_peer_info_t *p = arg, *x = &p[*(const int *)a], *y = &p[*(const int *)b];
  if (x->host_hash != y->host_hash) return x->host_hash < y->host_hash ? -1 : 1;
  if (x->dev_kind != y->dev_kind) return x->dev_kind < y->dev_kind ? -1 : 1;
  int c = strncmp(x->bus_id, y->bus_id, sizeof(x->bus_id));
  return c ? c : *(const int *)a - *(const int *)b;
}

static int same_gpu(const hetccl_peer_info_t *x, const hetccl_peer_info_t *y) {
  return x->dev_kind != HETCCL_DEV_HOST && x->host_hash == y->host_hash &&
         x->dev_kind == y->dev_kind && !strncmp(x->bus_id, y->bus_id, sizeof(x->bus_id));
}

/* An island id no forced list (>= 0), default (-1) or earlier split gives
 * to another rank of this communicator's GPU. */
#define SHARED_GPU_ISLAND(rank) (INT32_MIN + 1 + (rank))

ncclResult_t hetccl_islands_separate_shared_gpus(ncclComm_t comm) {
  int n = comm->nranks, shared = 0, example = -1;
  hetccl_peer_info_t *p = comm->boot.peers;
  /* Without a vendor library (HETCCL_VENDOR=0, or none loaded: its
   * version 0) no island is forwarded, and the engine serves several ranks
   * of one GPU in one island (forced islands keep their meaning). */
  if (!hetccl_knob_int(HETCCL_KNOB_VENDOR)) return ncclSuccess;
  int *order = malloc((size_t)n * sizeof(*order));
  if (!order) {
    WARN("ncclCommInitRank: out of memory for %d ranks' devices", n);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) order[r] = r;
  qsort_r(order, (size_t)n, sizeof(*order), gpu_order, p);
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && same_gpu(&p[order[i]], &p[order[j]])) j++;
    if (j - i > 1 && p[order[i]].vendor_version != 0) {
      for (int k = i; k < j; k++) p[order[k]].island = SHARED_GPU_ISLAND(order[k]);
      shared += j - i;
      if (example < 0) example = order[i];
    }
    i = j;
  }
  free(order);
  if (shared && comm->rank == 0)
    INFO(HETCCL_INIT, "comm %016llx: %d of its %d ranks share a GPU with another rank (rank %d: "
         "%s %s on %s, among others); a vendor library refuses two ranks on one device, so "
         "each of them is an island of its own, served by hetccl's engine and data plane",
         (unsigned long long)comm->comm_id, shared, n, hetccl_user_rank(comm->user_ranks, example),
         hetccl_dev_kind_name((hetccl_dev_kind_t)p[example].dev_kind), p[example].bus_id,
         p[example].hostname);
  return ncclSuccess;
}
