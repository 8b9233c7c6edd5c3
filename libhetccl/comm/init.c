/* Communicator life cycle (init.h).
 *
 * Init in three steps: publish what this rank is (bootstrap), decide the
 * islands from what everyone published (every rank reaches the same answer
 * from the same table), then either create the vendor communicator (one
 * island: its unique id travels over our bootstrap) or connect the engine's
 * transports. */
#include "comm/init.h"

#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "exec/dataplane.h"
#include "exec/devpath.h"
#include "hier/hier.h"
#include "comm/proxy.h"
#include "trace/trace.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- identity of this rank -------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* Same host and same IPC namespace <=> same value: hostname, boot id and
 * the IPC namespace inode all enter the hash. */
static uint64_t host_hash(char *hostname, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (gethostname(hostname, len) != 0) snprintf(hostname, len, "unknown");
  hostname[len - 1] = 0;
  h = fnv1a(h, hostname, strlen(hostname));
  char buf[128] = {0};
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n > 0) h = fnv1a(h, buf, (size_t)n);
    close(fd);
  }
  struct stat st;
  if (stat("/proc/self/ns/ipc", &st) == 0) h = fnv1a(h, &st.st_ino, sizeof(st.st_ino));
  return h;
}

/* HETCCL_ISLANDS: "" (none), "rank" (one island per rank) or a comma list
 * giving each rank's island. */
/* The island HETCCL_ISLANDS gives `rank`; *entries: how many the list has
 * (0 for none or 'rank'). A list of another length than nranks leaves
 * *island -1 without a message: the caller decides (list_island). */
static ncclResult_t forced_island(int rank, int nranks, int *island, int *entries) {
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
    if (idx == rank) *island = (int)v;
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

static ncclResult_t list_island(ncclComm_t comm, int *island) {
  int entries;
  HETCCL_CHECK(forced_island(comm->rank, comm->nranks, island, &entries));
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

/* The device-kind table's vendor column (runtime/runtime.h) as vendor ids;
 * NONE, a kind no vendor library serves, reads as HETCCL_VENDOR_COUNT. */
#define HETCCL_VENDOR_NONE HETCCL_VENDOR_COUNT
static const hetccl_vendor_id_t kind_vendor[HETCCL_DEV_COUNT] = {
#define KIND_VENDOR(id, name, vendor) [HETCCL_DEV_##id] = HETCCL_VENDOR_##vendor,
    HETCCL_DEVICE_KINDS(KIND_VENDOR)
#undef KIND_VENDOR
};
#undef HETCCL_VENDOR_NONE

int hetccl_dev_vendor(hetccl_dev_kind_t kind, hetccl_vendor_id_t *id) {
  if ((unsigned)kind >= HETCCL_DEV_COUNT || kind_vendor[kind] == HETCCL_VENDOR_COUNT) return 0;
  *id = kind_vendor[kind];
  return 1;
}

/* GPU kinds, in the order the rules below ask them. */
static const hetccl_dev_kind_t gpu_kinds[] = {HETCCL_DEV_CUDA, HETCCL_DEV_HIP};
#define NGPU_KINDS (sizeof(gpu_kinds) / sizeof(gpu_kinds[0]))

/* Does this process link kind's real vendor library (libnccl.so.2,
 * librccl.so.1 mapped, not hetccl)? Looks, never loads. */
static int links_vendor_of(hetccl_dev_kind_t kind) {
  hetccl_vendor_id_t v;
  return hetccl_dev_vendor(kind, &v) && hetccl_vendor_foreign_mapped(v);
}

hetccl_dev_kind_t hetccl_process_dev_kind(void) {
  hetccl_dev_kind_t k = hetccl_runtime_detect();
  if (k != HETCCL_DEV_HOST || hetccl_knob_is_set(HETCCL_KNOB_DEVICE)) return k;
  /* Only a process that links the vendor library loads its runtime here. */
  for (size_t i = 0; i < NGPU_KINDS; i++)
    if (links_vendor_of(gpu_kinds[i]) && hetccl_runtime_get(gpu_kinds[i])->available())
      return gpu_kinds[i];
  return k;
}

/* The runtime that can tell a host rank's device pointers from host ones:
 * one the process already uses, or whose vendor library it links, and that
 * has a usable device (a CUDA build of PyTorch on a machine with no driver
 * links NCCL, yet every pointer it hands over is host memory). */
static hetccl_dev_kind_t host_pointer_kind(void) {
  for (size_t i = 0; i < NGPU_KINDS; i++) {
    const hetccl_runtime_t *rt = hetccl_runtime_get(gpu_kinds[i]);
    if ((links_vendor_of(gpu_kinds[i]) || rt->in_use()) && rt->available())
      return gpu_kinds[i];
  }
  return HETCCL_DEV_HOST;
}

/* How many shared objects the process has loaded so far: the loader keeps
 * the count on every entry it reports, so the first one says. */
static int first_entry_loads(struct dl_phdr_info *info, size_t size, void *out) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
    *(unsigned long long *)out = info->dlpi_adds;
  return 1;
}

hetccl_dev_kind_t hetccl_late_pointer_kind(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static unsigned long long asked_at = ULLONG_MAX; /* the loads when last asked */
  static hetccl_dev_kind_t answer = HETCCL_DEV_HOST;
  unsigned long long loads = 0;
  dl_iterate_phdr(first_entry_loads, &loads);
  pthread_mutex_lock(&lock);
  if (loads == 0 || loads != asked_at) {
    answer = host_pointer_kind();
    asked_at = loads;
  }
  hetccl_dev_kind_t k = answer;
  pthread_mutex_unlock(&lock);
  return k;
}

/* --- create / free ------------------------------------------------------ */

static ncclResult_t config_resolve(ncclComm_t comm, const ncclConfig_t *config) {
  ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  comm->config = def;
  comm->blocking = 1;
  if (!config) return ncclSuccess;
  if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize)) {
    WARN("ncclConfig_t not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x, size %zu)",
         config->magic, config->size);
    return ncclInvalidArgument;
  }
  /* Older callers pass a smaller struct: copy what they have. */
  size_t n = config->size < sizeof(ncclConfig_t) ? config->size : sizeof(ncclConfig_t);
  memcpy(&comm->config, config, n);
  if (config->size <= sizeof(comm->user_config)) {
    memcpy(comm->user_config, config, config->size);
    comm->has_user_config = 1;
  }
  comm->config.size = sizeof(ncclConfig_t);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (config->blocking != 0 && config->blocking != 1) {
      WARN("ncclConfig_t.blocking = %d: must be 0 or 1", config->blocking);
      return ncclInvalidArgument;
    }
    comm->blocking = config->blocking;
  }
  return ncclSuccess;
}

/* The communicator's own count of payload bytes its CPU copied, per
 * transport (hetcclCommCopiedBytes adds the internal ones), at INFO. */
static void log_copied(ncclComm_t comm) {
  if (!comm->engine || !HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_INIT | HETCCL_NET)) return;
  char line[192] = "";
  size_t used = 0;
  for (int t = 0; t < HETCCL_COPIED_PATHS && used < sizeof(line); t++)
    used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%s %llu", t ? ", " : "",
                             hetccl_copied_path_name(t),
                             (unsigned long long)__atomic_load_n(&comm->copied[t],
                                                                 __ATOMIC_RELAXED));
  INFO(HETCCL_INIT | HETCCL_NET, "rank %d of %d: payload bytes copied by the CPU: %s",
       hetccl_user_rank(comm->user_ranks, comm->rank), comm->nranks, line);
}

void hetccl_comm_release(ncclComm_t comm) {
  log_copied(comm);
  hetccl_hier_release(comm, 1);
  hetccl_proxy_stop(comm);
  hetccl_devpath_destroy(comm);
  hetccl_dataplane_destroy(comm);
  hetccl_engine_destroy(comm->engine);
  hetccl_bootstrap_destroy(comm->bs);
  free(comm->peers);
  free(comm->user_ranks);
  free(comm->boot_ids);
  pthread_mutex_destroy(&comm->lock);
  free(comm);
}

ncclResult_t hetccl_comm_create(int nranks, int rank, const ncclConfig_t *config,
                                hetccl_dev_kind_t kind, ncclComm_t *out) {
  ncclResult_t res = hetccl_knobs_check();
  if (res == ncclSuccess) res = hetccl_trace_setup();
  if (res != ncclSuccess) return res;
  ncclComm_t comm = calloc(1, sizeof(*comm));
  if (!comm) {
    WARN("ncclCommInitRank: out of memory");
    return ncclSystemError;
  }
  pthread_mutex_init(&comm->lock, NULL);
  comm->magic = HETCCL_COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->dev = -1;
  HETCCL_CHECK_GOTO(config_resolve(comm, config), res, fail);
  comm->dev_kind = kind == HETCCL_DEV_AUTO ? hetccl_process_dev_kind() : kind;
  comm->ptr_kind = comm->dev_kind;
  if (comm->ptr_kind == HETCCL_DEV_HOST) comm->ptr_kind = host_pointer_kind();
  if (comm->dev_kind != HETCCL_DEV_HOST) {
    /* The runtime (or the registry, for a missing table) WARNed the cause
     * (a library missing, no device); this adds where, not a second line. */
    const hetccl_runtime_t *rt = hetccl_runtime_get(comm->dev_kind);
    res = rt ? rt->current_device(&comm->dev, comm->busid, sizeof(comm->busid))
             : ncclInternalError;
    if (res != ncclSuccess) {
      hetccl_last_error_prefix("ncclCommInitRank: cannot read the current %s device",
                               hetccl_dev_kind_name(comm->dev_kind));
      goto fail;
    }
  }
  HETCCL_CHECK_GOTO(hetccl_comm_register(comm), res, fail);
  *out = comm;
  return ncclSuccess;
fail:
  pthread_mutex_destroy(&comm->lock);
  free(comm);
  return res;
}

/* --- init ----------------------------------------------------------------- */

/* Under HETCCL_TRANSPORT=auto, ib serves a pair on two hosts where both
 * ranks have an active port, unless NCCL_IB_DISABLE=1. */
static int ib_wanted(void) {
  return !strcmp(hetccl_knob_str(HETCCL_KNOB_TRANSPORT), "auto") &&
         !hetccl_knob_int(HETCCL_KNOB_IB_DISABLE);
}

static int ib_usable(void) {
  const hetccl_transport_t *ib = hetccl_transport_get(HETCCL_TRANSPORT_ib);
  return ib && (!ib->usable || ib->usable());
}

static ncclResult_t fill_info(ncclComm_t comm, hetccl_peer_info_t *me) {
  memset(me, 0, sizeof(*me));
  me->rank = comm->rank;
  me->pid = (int32_t)getpid();
  me->host_hash = host_hash(me->hostname, sizeof(me->hostname));
  me->dev_kind = comm->dev_kind;
  me->dev = comm->dev;
  me->blocking = comm->blocking;
  me->user_rank = comm->island_forced ? comm->self_user_rank : comm->rank;
  me->stages = comm->ptr_kind != HETCCL_DEV_HOST;
  me->ib_usable = ib_wanted() && ib_usable();
  if (comm->dev_kind != HETCCL_DEV_HOST) {
    /* Peers tell devices apart by bus id: never publish an empty one. */
    const hetccl_runtime_t *rt = hetccl_runtime_get(comm->dev_kind);
    int dev = -1;
    ncclResult_t res = rt ? rt->current_device(&dev, me->bus_id, sizeof(me->bus_id))
                          : ncclInternalError;
    if (res != ncclSuccess) {
      hetccl_last_error_prefix("rank %d: cannot read the bus id of its %s device %d", comm->rank,
                               hetccl_dev_kind_name(comm->dev_kind), comm->dev);
      return res;
    }
    hetccl_vendor_id_t vid;
    if (hetccl_dev_vendor(comm->dev_kind, &vid) && hetccl_knob_int(HETCCL_KNOB_VENDOR)) {
      const hetccl_vendor_t *v = NULL;
      if (hetccl_vendor_load(vid, &v) == ncclSuccess && v)
        me->vendor_version = v->version;
      else
        snprintf(me->vendor_err, sizeof(me->vendor_err), "%s", hetccl_last_error());
    }
  }
  if (comm->island_forced || comm->island_inherited) {
    me->island = comm->island_force_id;
    return ncclSuccess;
  }
  return list_island(comm, &me->island);
}

/* One island covering everyone: ranks of one GPU kind (all CUDA, or all
 * HIP), served by one version of that kind's vendor library (NCCL, RCCL). */
static int is_homogeneous(const hetccl_peer_info_t *peers, int n) {
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

/* Ranks that share a GPU are never one vendor island: NCCL and RCCL refuse
 * two ranks on one device. Each rank on a shared GPU becomes an island of
 * its own, as under HETCCL_ISLANDS=rank, so that the engine or the data
 * plane serves them. Every rank reaches the same answer from the same
 * table; sorting keeps it O(n log n) at scale. */
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

static ncclResult_t separate_shared_gpus(ncclComm_t comm) {
  int n = comm->nranks, shared = 0, example = -1;
  hetccl_peer_info_t *p = comm->peers;
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
    if (j - i > 1) {
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

static ncclResult_t init_vendor(ncclComm_t comm) {
  const hetccl_vendor_t *v = NULL;
  hetccl_vendor_id_t vid;
  if (!hetccl_dev_vendor(comm->dev_kind, &vid)) {
    WARN("vendor: rank %d is a %s rank, which has no vendor library", comm->rank,
         hetccl_dev_kind_name(comm->dev_kind));
    return ncclInternalError;
  }
  HETCCL_CHECK(hetccl_vendor_load(vid, &v));
  struct {
    int32_t status;
    ncclUniqueId id;
  } msg;
  memset(&msg, 0, sizeof(msg));
  if (comm->rank == 0) msg.status = HETCCL_VENDOR_CALL(v, GetUniqueId, &msg.id);
  HETCCL_CHECK(hetccl_bootstrap_bcast(comm->bs, &msg, sizeof(msg), 0));
  if (msg.status != ncclSuccess) {
    WARN("vendor %s: rank 0 could not create a unique id (%d): %s", v->name, msg.status,
         comm->rank == 0 ? hetccl_last_error() : "see rank 0's log");
    return (ncclResult_t)msg.status;
  }
  ncclComm_t vcomm = NULL;
  ncclResult_t res;
  if (comm->has_user_config) {
    res = HETCCL_VENDOR_CALL(v, CommInitRankConfig, &vcomm, comm->nranks, msg.id, comm->rank,
                             (ncclConfig_t *)comm->user_config);
  } else {
    res = HETCCL_VENDOR_CALL(v, CommInitRank, &vcomm, comm->nranks, msg.id, comm->rank);
  }
  if (res == ncclInProgress) {
    /* A nonblocking vendor init: we are already off the API thread, wait. */
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress && !__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
      if (HETCCL_VENDOR_CALL(v, CommGetAsyncError, vcomm, &st) != ncclSuccess) break;
      if (st == ncclInProgress) sched_yield();
    }
    res = st;
  }
  if (res != ncclSuccess) {
    WARN("vendor %s: ncclCommInitRank (rank %d of %d) failed: %s", v->name, comm->rank,
         comm->nranks, HETCCL_VENDOR_CALL(v, GetErrorString, res));
    return res;
  }
  comm->vcomm = vcomm;
  __atomic_store_n(&comm->vendor, v, __ATOMIC_RELEASE); /* readers test vendor, then use vcomm */
  INFO(HETCCL_INIT | HETCCL_VENDOR, "rank %d of %d: one island, forwarding to %s %d (%s)",
       comm->rank, comm->nranks, v->name, v->version, v->path);
  return ncclSuccess;
}

/* HETCCL_TRANSPORT: the transport it names, HETCCL_TRANSPORT_COUNT for
 * auto (the knob table allows no other word). */
static hetccl_transport_id_t transport_forced(void) {
  const char *s = hetccl_knob_str(HETCCL_KNOB_TRANSPORT);
#define TRANSPORT_MATCH(name, sym)                                             \
  if (!strcmp(s, #name)) return HETCCL_TRANSPORT_##name;
  HETCCL_TRANSPORTS(TRANSPORT_MATCH)
#undef TRANSPORT_MATCH
  return HETCCL_TRANSPORT_COUNT;
}

/* The transport of the pair (a, b): a pure function of what both
 * published, so both ends choose alike. Forced (HETCCL_TRANSPORT=name):
 * that one for every pair, and init fails where it cannot serve (ib's
 * ctx_create names what it found). auto: shm on one host; else ib where
 * both have an active port (fill_info asks only when ib is wanted), else
 * socket. */
static hetccl_transport_id_t pair_transport(const hetccl_peer_info_t *a,
                                            const hetccl_peer_info_t *b,
                                            hetccl_transport_id_t forced) {
  if (forced != HETCCL_TRANSPORT_COUNT) return forced;
  if (a->host_hash == b->host_hash) return HETCCL_TRANSPORT_shm;
  return a->ib_usable && b->ib_usable ? HETCCL_TRANSPORT_ib : HETCCL_TRANSPORT_socket;
}

/* One INFO line per communicator (rank 0's): how many pairs each
 * transport serves, and under auto the ranks on another host than some
 * peer that had no active ib port, whose pairs went to socket. */
static void log_pairs(ncclComm_t comm, hetccl_transport_id_t forced) {
  if (comm->rank != 0 || !HETCCL_LOG_ENABLED(HETCCL_LOG_INFO, HETCCL_INIT | HETCCL_NET)) return;
  int n = comm->nranks, pairs[HETCCL_TRANSPORT_COUNT] = {0};
  char line[256] = "", noib[160] = "";
  size_t used = 0, nused = 0;
  int nnoib = 0;
  for (int a = 0; a < n; a++) {
    int remote = 0;
    for (int b = 0; b < n; b++) {
      remote |= comm->peers[a].host_hash != comm->peers[b].host_hash;
      if (b > a) pairs[pair_transport(&comm->peers[a], &comm->peers[b], forced)]++;
    }
    if (forced == HETCCL_TRANSPORT_COUNT && ib_wanted() && remote && !comm->peers[a].ib_usable) {
      if (nnoib++ < 8 && nused < sizeof(noib))
        nused += (size_t)snprintf(noib + nused, sizeof(noib) - nused, "%s%d",
                                  nnoib > 1 ? "," : "", hetccl_user_rank(comm->user_ranks, a));
      else if (nnoib == 9 && nused < sizeof(noib))
        nused += (size_t)snprintf(noib + nused, sizeof(noib) - nused, ",...");
    }
  }
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT && used < sizeof(line); t++)
    used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%s %d", t ? ", " : "",
                             hetccl_transport_get((hetccl_transport_id_t)t)->name, pairs[t]);
  int disabled = forced == HETCCL_TRANSPORT_COUNT && hetccl_knob_int(HETCCL_KNOB_IB_DISABLE);
  INFO(HETCCL_INIT | HETCCL_NET,
       "comm %016llx of %d ranks: pairs by transport: %s (HETCCL_TRANSPORT=%s%s%s%s)",
       (unsigned long long)comm->comm_id, n, line, hetccl_knob_str(HETCCL_KNOB_TRANSPORT),
       disabled ? ", NCCL_IB_DISABLE=1" : "", nnoib ? "; no active ib port on ranks " : "",
       nnoib ? noib : "");
}

/* HETCCL_RUNTIME_CONNECT, else NCCL_RUNTIME_CONNECT (the same meaning). */
static int runtime_connect(void) {
  return (int)hetccl_knob_int(
      hetccl_knob_or_nccl(HETCCL_KNOB_RUNTIME_CONNECT, HETCCL_KNOB_NCCL_RUNTIME_CONNECT));
}

static hetccl_transport_id_t transport_id_of(const hetccl_transport_t *tp) {
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (hetccl_transport_get((hetccl_transport_id_t)t) == tp) return (hetccl_transport_id_t)t;
  return HETCCL_TRANSPORT_COUNT;
}

static ncclResult_t init_engine(ncclComm_t comm, uint64_t comm_id, uint64_t secret) {
  int n = comm->nranks, me = comm->rank;
  ncclResult_t res = ncclSuccess;
  hetccl_transport_id_t forced = transport_forced();
  uint8_t *use = calloc((size_t)HETCCL_TRANSPORT_COUNT * n, 1);
  uint8_t *addrs = calloc((size_t)n * HETCCL_TRANSPORT_COUNT, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *mine = calloc(HETCCL_TRANSPORT_COUNT, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *taddrs = calloc(n, HETCCL_TRANSPORT_ADDR_BYTES);
  uint8_t *peer_addrs = calloc(n, HETCCL_TRANSPORT_ADDR_BYTES);
  hetccl_peer_locality_t *loc = calloc(n, sizeof(*loc));
  hetccl_ep_t **eps = calloc(n, sizeof(*eps));
  hetccl_ep_t **teps = calloc(n, sizeof(*teps));
  const hetccl_transport_t **tps = calloc(n, sizeof(*tps));
  hetccl_tctx_t *ctx[HETCCL_TRANSPORT_COUNT] = {0};
  int used[HETCCL_TRANSPORT_COUNT] = {0};
  if (!use || !addrs || !mine || !taddrs || !peer_addrs || !loc || !eps || !teps || !tps) {
    WARN("engine init: out of memory for %d ranks", n);
    res = ncclSystemError;
    goto out;
  }
  for (int p = 0; p < n; p++) {
    loc[p].host_hash = comm->peers[p].host_hash;
    loc[p].pid = comm->peers[p].pid;
  }
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    hetccl_transport_id_t t = pair_transport(&comm->peers[me], &comm->peers[p], forced);
    const hetccl_transport_t *tp = hetccl_transport_get(t);
    if (!tp) { /* the registry logged which slot is missing */
      res = ncclInternalError;
      goto out;
    }
    if (!tp->can_connect(&loc[me], &loc[p])) {
      WARN("transport %s cannot connect rank %d (%s) to rank %d (%s)", tp->name, me,
           comm->peers[me].hostname, p, comm->peers[p].hostname);
      res = ncclInvalidUsage;
      goto out;
    }
    use[t * n + p] = 1;
    used[t] = 1;
    tps[p] = tp;
  }
  log_pairs(comm, forced);
  /* More ranks of ours on this host than CPUs: the CPUs, not the memory,
   * are what the ranks wait on (see the spin and HETCCL_SHM_CMA defaults). */
  int local = 0;
  for (int p = 0; p < n; p++) local += comm->peers[p].host_hash == comm->peers[me].host_hash;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int oversubscribed = ncpu > 0 && local > ncpu;
  hetccl_transport_args_t args = {
      .rank = me, .nranks = n, .comm_id = comm_id, .secret = secret,
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000,
      .abort_flag = &comm->abort_flag,
      .ifname = hetccl_knob_str(HETCCL_KNOB_SOCKET_IFNAME), .peer_note = &comm->peer_note,
      .mismatch = &comm->mismatch, .oversubscribed = oversubscribed,
      .user_ranks = comm->user_ranks,
      .device = comm->ptr_kind == HETCCL_DEV_HOST ? NULL : hetccl_runtime_get(comm->ptr_kind),
      .busid = comm->busid};
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    if (!used[t]) continue;
    args.copied = &comm->copied[t];
    HETCCL_CHECK_GOTO(hetccl_transport_get(t)->ctx_create(&args, &ctx[t],
                                                          mine + t * HETCCL_TRANSPORT_ADDR_BYTES),
                      res, out);
  }
  size_t blob = (size_t)HETCCL_TRANSPORT_COUNT * HETCCL_TRANSPORT_ADDR_BYTES;
  HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(comm->bs, mine, addrs, blob), res, out);
  /* Connections on first use (p2p/connect.c): a transport that can make
   * them connects nothing here; the engine keeps each peer's address. */
  int lazy = runtime_connect();
  for (int p = 0; p < n; p++)
    if (tps[p])
      memcpy(taddrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
             addrs + p * blob + (size_t)transport_id_of(tps[p]) * HETCCL_TRANSPORT_ADDR_BYTES,
             HETCCL_TRANSPORT_ADDR_BYTES);
  if (lazy) memcpy(peer_addrs, taddrs, (size_t)n * HETCCL_TRANSPORT_ADDR_BYTES);
  /* Same order on every rank, so no rank waits on a transport its peer has
   * not reached yet. */
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    if (!used[t] || (lazy && hetccl_transport_get(t)->ep_open)) continue;
    for (int p = 0; p < n; p++)
      memcpy(taddrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
             addrs + p * blob + (size_t)t * HETCCL_TRANSPORT_ADDR_BYTES, HETCCL_TRANSPORT_ADDR_BYTES);
    memset(teps, 0, n * sizeof(*teps));
    HETCCL_CHECK_GOTO(hetccl_transport_get(t)->connect(ctx[t], use + t * n, taddrs, loc, teps),
                      res, out);
    for (int p = 0; p < n; p++)
      if (use[t * n + p]) eps[p] = teps[p];
  }
  /* Oversubscribed: a spinning rank only delays the peer it waits for, so
   * yield at once unless HETCCL_SPIN says otherwise. */
  int spin = (int)hetccl_knob_int(HETCCL_KNOB_SPIN);
  if (oversubscribed && !hetccl_knob_is_set(HETCCL_KNOB_SPIN)) spin = 0;
  hetccl_engine_args_t eargs = {
      .rank = me, .nranks = n, .eps = eps, .transports = tps,
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_TIMEOUT) * 1000, .spin = spin,
      .abort_flag = &comm->abort_flag, .comm_error = &comm->error, .ctxs = ctx,
      .peer_note = &comm->peer_note, .mismatch = &comm->mismatch,
      .describe_tag = hetccl_comm_tag_describe, .user_ranks = comm->user_ranks,
      .peer_addrs = lazy ? peer_addrs : NULL, .localities = loc};
  HETCCL_CHECK_GOTO(hetccl_engine_create(&eargs, &comm->engine), res, out);
  int stages = (int)hetccl_knob_int(HETCCL_KNOB_STAGE_PIECE_HOST);
  for (int p = 0; p < n; p++) stages |= comm->peers[p].stages;
  comm->stage_piece = stages ? (size_t)hetccl_knob_int(HETCCL_KNOB_STAGE_PIECE) : 0;
  /* The engine owns endpoints and contexts now. */
  memset(eps, 0, n * sizeof(*eps));
  memset(ctx, 0, sizeof(ctx));
  char mine_line[128] = "";
  size_t mused = 0;
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT && mused < sizeof(mine_line); t++) {
    int k = 0;
    for (int p = 0; p < n; p++) k += use[t * n + p];
    mused += (size_t)snprintf(mine_line + mused, sizeof(mine_line) - mused, "%s%s %d",
                              t ? ", " : "",
                              hetccl_transport_get((hetccl_transport_id_t)t)->name, k);
  }
  INFO(HETCCL_INIT, "rank %d of %d: engine ready (peers by transport: %s; %s)", me, n, mine_line,
       lazy ? "pairs connect on first use" : "every pair connected at init");
out:
  for (int p = 0; p < n && eps; p++)
    if (eps[p]) tps[p]->ep_close(eps[p]);
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++)
    if (ctx[t]) hetccl_transport_get(t)->ctx_destroy(ctx[t]);
  free(use); free(addrs); free(mine); free(taddrs); free(peer_addrs); free(loc); free(eps);
  free(teps); free(tps);
  return res;
}

/* An internal communicator names its ranks in messages as the user does:
 * by their ranks in the communicator it serves. */
static ncclResult_t user_ranks_from_peers(ncclComm_t comm) {
  comm->user_ranks = malloc((size_t)comm->nranks * sizeof(*comm->user_ranks));
  if (!comm->user_ranks) {
    WARN("ncclCommInitRank: out of memory for %d ranks", comm->nranks);
    return ncclSystemError;
  }
  for (int r = 0; r < comm->nranks; r++) comm->user_ranks[r] = comm->peers[r].user_rank;
  return ncclSuccess;
}

ncclResult_t hetccl_comm_init(ncclComm_t comm, const ncclUniqueId *id) {
  int n = comm->nranks;
  hetccl_peer_info_t me;
  HETCCL_CHECK(fill_info(comm, &me));
  comm->peers = calloc(n, sizeof(*comm->peers));
  if (!comm->peers) {
    WARN("ncclCommInitRank: out of memory for %d ranks", n);
    return ncclSystemError;
  }
  comm->comm_id = hetccl_bootstrap_id_comm_id(id);
  hetccl_bootstrap_opts_t opts = {
      .timeout_ms = (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000,
      .abort_flag = &comm->abort_flag};
  /* Several ids (ncclCommInitRankScalable): id is the first, the rest
   * wait on the communicator. */
  int nids = comm->boot_nids > 1 ? comm->boot_nids : 1;
  ncclUniqueId *ids = &(ncclUniqueId){{0}};
  if (nids > 1) {
    if ((ids = malloc((size_t)nids * sizeof(*ids))) == NULL) {
      WARN("ncclCommInitRankScalable: out of memory for %d ids", nids);
      return ncclSystemError;
    }
    memcpy(&ids[1], comm->boot_ids, (size_t)(nids - 1) * sizeof(*ids));
  }
  ids[0] = *id;
  ncclResult_t bres = hetccl_bootstrap_init(ids, nids, comm->rank, n, &me, sizeof(me),
                                            comm->peers, &opts, &comm->bs);
  if (nids > 1) free(ids);
  if (bres != ncclSuccess) return bres;
  for (int r = 0; r < n; r++) {
    if (comm->peers[r].rank != r) {
      WARN("bootstrap: table entry %d claims rank %d", r, comm->peers[r].rank);
      return ncclInternalError;
    }
  }
  if (comm->island_forced) HETCCL_CHECK(user_ranks_from_peers(comm));
  HETCCL_CHECK(separate_shared_gpus(comm));
  if (is_homogeneous(comm->peers, n)) {
    HETCCL_CHECK(init_vendor(comm));
    /* The vendor has its own bootstrap from here on. */
    hetccl_bootstrap_destroy(comm->bs);
    comm->bs = NULL;
    return ncclSuccess;
  }
  for (int r = 0; r < n; r++) {
    hetccl_vendor_id_t vid;
    const hetccl_peer_info_t *p = &comm->peers[r];
    if (hetccl_dev_vendor((hetccl_dev_kind_t)p->dev_kind, &vid) && p->vendor_version == 0 &&
        hetccl_knob_int(HETCCL_KNOB_VENDOR)) {
      WARN("rank %d (%s) is a %s rank but could not load %s: %s. Point %s at a working %s, or "
           "set HETCCL_VENDOR=0 to run on hetccl's engine (device buffers staged through host "
           "memory, far slower than %s)", r, p->hostname,
           hetccl_dev_kind_name((hetccl_dev_kind_t)p->dev_kind), hetccl_vendor_title(vid),
           p->vendor_err, hetccl_knob_desc(hetccl_vendor_knob(vid))->env,
           hetccl_vendor_title(vid), hetccl_vendor_title(vid));
      return ncclSystemError;
    }
  }
  HETCCL_CHECK(init_engine(comm, comm->comm_id, hetccl_bootstrap_id_secret(id)));
  HETCCL_CHECK(hetccl_dataplane_setup(comm));
  HETCCL_CHECK(hetccl_hier_setup(comm));
  uint64_t msgs, bytes;
  hetccl_bootstrap_stats(comm->bs, &msgs, &bytes);
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d stats: %llu messages, %llu bytes", comm->rank,
       (unsigned long long)msgs, (unsigned long long)bytes);
  return ncclSuccess;
}

ncclResult_t hetccl_comm_init_job(ncclComm_t comm, void *arg) {
  return hetccl_comm_init(comm, (const ncclUniqueId *)arg);
}

/* --- in-flight accounting, teardown --------------------------------------- */

void hetccl_comm_enter(ncclComm_t comm) { __atomic_add_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL); }
void hetccl_comm_leave(ncclComm_t comm) { __atomic_sub_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL); }

/* Calls on other threads that are still inside the communicator (blocked
 * in the engine, say) must leave before it is freed; the abort flag makes
 * them leave within milliseconds. Bounded in case one never does. */
static void wait_inflight(ncclComm_t comm, int allowed) {
  struct timespec ts = {0, 1000000};
  for (int i = 0; i < 10000 && __atomic_load_n(&comm->inflight, __ATOMIC_ACQUIRE) > allowed; i++)
    nanosleep(&ts, NULL);
}

ncclResult_t hetccl_comm_finalize(ncclComm_t comm) {
  if (comm->vendor) return HETCCL_VENDOR_CALL(comm->vendor, CommFinalize, comm->vcomm);
  hetccl_proxy_drain(comm);
  hetccl_hier_finalize(comm);
  comm->finalized = 1;
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
  return err == ncclInProgress ? ncclSuccess : err;
}

ncclResult_t hetccl_comm_destroy(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  if (comm->vendor && comm->vcomm) res = HETCCL_VENDOR_CALL(comm->vendor, CommDestroy, comm->vcomm);
  hetccl_proxy_drain(comm);
  hetccl_comm_unregister(comm);
  wait_inflight(comm, 0);
  hetccl_hier_release(comm, 0);
  hetccl_comm_release(comm);
  return res;
}

ncclResult_t hetccl_comm_abort(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
  hetccl_hier_set_abort(comm); /* a call blocked in a phase returns */
  hetccl_dataplane_abort(comm); /* streams waiting on the data plane move on */
  if (comm->vendor && comm->vcomm) res = HETCCL_VENDOR_CALL(comm->vendor, CommAbort, comm->vcomm);
  hetccl_comm_unregister(comm);
  wait_inflight(comm, 0);
  hetccl_comm_release(comm);
  return res;
}
