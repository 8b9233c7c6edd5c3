/* Hierarchical communicators: the island and leaders communicators of a
 * communicator that spans several islands, their map, teardown and
 * failure (hier/hier.h). The forms of the collectives: hier/hier_ops.c. */
#include "hier/hier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

static int same_island(const hetccl_peer_info_t *a, const hetccl_peer_info_t *b) {
  return a->island == b->island && a->dev_kind == b->dev_kind &&
         a->vendor_version == b->vendor_version;
}

/* The lowest rank of r's island. */
static int island_leader(const ncclComm_t comm, int r) {
  for (int q = 0; q < r; q++)
    if (same_island(&comm->boot.peers[q], &comm->boot.peers[r])) return q;
  return r;
}

/* The map of the islands (hier.h), from each rank's leader. */
static ncclResult_t make_map(ncclComm_t comm, const int *lead, hetccl_hier_map_t **out) {
  int n = comm->nranks;
  hetccl_hier_map_t *m = calloc(1, sizeof(*m));
  if (m) {
    m->first = malloc((size_t)n * sizeof(int));
    m->size = calloc((size_t)n, sizeof(int));
    m->of = malloc((size_t)n * sizeof(int));
    m->index = malloc((size_t)n * sizeof(int));
  }
  if (!m || !m->first || !m->size || !m->of || !m->index) {
    hetccl_hier_map_free(comm, m);
    WARN("ncclCommInitRank: out of memory for %d ranks' islands", n);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) {
    if (lead[r] == r) m->first[m->islands++] = r;
    int i = 0;
    while (m->first[i] != lead[r]) i++; /* leaders come in rank order */
    m->of[r] = i;
    m->index[r] = m->size[i]++;
  }
  m->contiguous = m->equal = 1;
  for (int r = 1; r < n; r++)
    if (m->of[r] != m->of[r - 1] && m->of[r] != m->of[r - 1] + 1) m->contiguous = 0;
  for (int i = 1; i < m->islands; i++)
    if (m->size[i] != m->size[0]) m->equal = 0;
  *out = m;
  return ncclSuccess;
}

ncclResult_t hetccl_hier_setup(ncclComm_t comm) {
  int n = comm->nranks;
  if (!hetccl_knob_int(HETCCL_KNOB_HIER) || n < 3) return ncclSuccess;
  int *lead = malloc((size_t)n * sizeof(*lead));
  if (!lead) {
    WARN("ncclCommInitRank: out of memory for %d ranks' islands", n);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) lead[r] = island_leader(comm, r);
  hetccl_hier_map_t *m = NULL;
  ncclResult_t res = make_map(comm, lead, &m);
  free(lead);
  if (res != ncclSuccess) return res;
  int biggest = 0;
  for (int i = 0; i < m->islands; i++)
    if (m->size[i] > biggest) biggest = m->size[i];
  if (m->islands < 2 || biggest < 2) {
    hetccl_hier_map_free(comm, m);
    return ncclSuccess;
  }
  comm->hier.map = m;
  int mine = m->of[comm->rank], leader = m->first[mine], size = m->size[mine];
  /* Internal communicators block: a host-buffer phase has finished when
   * its call returns, so the next phase may start. */
  ncclConfig_t config = comm->config;
  config.blocking = 1;
  HETCCL_CHECK(hetccl_comm_split_internal(comm, size > 1 ? leader : NCCL_SPLIT_NOCOLOR,
                                          comm->rank, &config, leader, &comm->hier.island));
  HETCCL_CHECK(hetccl_comm_split_internal(comm, comm->rank == leader ? 0 : NCCL_SPLIT_NOCOLOR,
                                          comm->rank, &config, comm->rank, &comm->hier.leaders));
  /* Rail j: index j of every island, numbered by island as the leaders
   * are; rail 0 is the leaders themselves. */
  int index = m->index[comm->rank];
  if (m->equal && size > 1 && hetccl_knob_int(HETCCL_KNOB_HIER_RAILS)) {
    HETCCL_CHECK(hetccl_comm_split_internal(comm, index > 0 ? index : NCCL_SPLIT_NOCOLOR, mine,
                                            &config, comm->rank, &comm->hier.rail));
    m->rails = 1;
  }
  comm->hier.enabled = 1;
  const hetccl_vendor_t *v = comm->hier.island ? comm->hier.island->forward.vendor : NULL;
  const char *inside = !comm->hier.island ? "no one else" : v ? v->backend : "engine";
  char rail[64] = "";
  if (m->rails) snprintf(rail, sizeof(rail), "; %d rails, this rank on rail %d", size, index);
  INFO(HETCCL_INIT, "rank %d of %d: hierarchical, %d islands (%s, %s sizes); mine has %d ranks "
       "led by rank %d (inside it: %s)%s%s", comm->rank, n, m->islands,
       m->contiguous ? "contiguous" : "interleaved", m->equal ? "equal" : "unequal", size, leader,
       inside, comm->hier.leaders ? "; this rank joins the leaders" : "", rail);
  return ncclSuccess;
}

/* A block the scratch outgrew. */
typedef struct hetccl_hier_retired {
  void *ptr;
  int on_device;
  struct hetccl_hier_retired *next;
} hier_retired_t;

ncclResult_t hetccl_hier_device_block(ncclComm_t comm, void **ptr, size_t bytes) {
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  int saved = -1;
  ncclResult_t res = rt->current_device(&saved, NULL, 0);
  if (res == ncclSuccess && saved != comm->dev) res = rt->set_device(comm->dev);
  if (res == ncclSuccess) res = bytes ? rt->mem_alloc(ptr, bytes) : rt->mem_free(*ptr);
  if (saved >= 0 && saved != comm->dev) (void)rt->set_device(saved);
  return res;
}

static void block_free(ncclComm_t comm, void *ptr, int device) {
  if (!device) free(ptr);
  else if (ptr) (void)hetccl_hier_device_block(comm, &ptr, 0);
}

ncclResult_t hetccl_hier_on_device(ncclComm_t comm, const void *ptr, int *device) {
  const hetccl_runtime_t *rt =
      comm->ptr_kind == HETCCL_DEV_HOST ? NULL : hetccl_runtime_get(comm->ptr_kind);
  hetccl_mem_kind_t kind = HETCCL_MEM_HOST;
  int dev;
  if (rt && ptr) HETCCL_CHECK(rt->mem_kind(ptr, &kind, &dev));
  *device = kind != HETCCL_MEM_HOST;
  return ncclSuccess;
}

ncclResult_t hetccl_hier_scratch(ncclComm_t comm, size_t bytes, const void *like, void **out) {
  hetccl_hier_map_t *m = comm->hier.map;
  int device;
  HETCCL_CHECK(hetccl_hier_on_device(comm, like, &device));
  if (m->scratch && m->scratch_bytes >= bytes && m->scratch_on_device == device) {
    *out = m->scratch;
    return ncclSuccess;
  }
  if (m->scratch) {
    hier_retired_t *r = malloc(sizeof(*r));
    if (!r) {
      WARN("rank %d: out of memory", comm->rank);
      return ncclSystemError;
    }
    *r = (hier_retired_t){m->scratch, m->scratch_on_device, m->retired};
    m->retired = r;
    if (bytes < 2 * m->scratch_bytes) bytes = 2 * m->scratch_bytes;
    m->scratch = NULL;
    m->scratch_bytes = 0;
  }
  if (!device) {
    m->scratch = malloc(bytes);
    if (!m->scratch) {
      WARN("rank %d: no %zu bytes of host memory for a hierarchical collective's partial "
           "results", comm->rank, bytes);
      return ncclSystemError;
    }
  } else {
    ncclResult_t res = hetccl_hier_device_block(comm, &m->scratch, bytes);
    if (res != ncclSuccess) { /* the runtime logged why */
      m->scratch = NULL;
      hetccl_last_error_prefix("rank %d: no %zu bytes of device memory for a hierarchical "
                               "collective's partial results", comm->rank, bytes);
      return res;
    }
  }
  m->scratch_bytes = bytes;
  m->scratch_on_device = device;
  *out = m->scratch;
  return ncclSuccess;
}

void hetccl_hier_map_free(ncclComm_t comm, hetccl_hier_map_t *m) {
  if (!m) return;
  hetccl_hier_host_free(comm, m);
  if (m->scratch_done) (void)hetccl_runtime_get(comm->ptr_kind)->event_destroy(m->scratch_done);
  block_free(comm, m->scratch, m->scratch_on_device);
  while (m->retired) {
    hier_retired_t *r = m->retired;
    m->retired = r->next;
    block_free(comm, r->ptr, r->on_device);
    free(r);
  }
  free(m->first);
  free(m->size);
  free(m->of);
  free(m->index);
  free(m->plan);
  free(m);
}

/* An internal communicator's state, as its backend reports it (blocking,
 * so "in progress" is only ever an init's, and not an error). */
static ncclResult_t child_error(ncclComm_t c) {
  if (!c) return ncclSuccess;
  ncclResult_t err = ncclSuccess;
  if (hetccl_backend_of(c)->async_error(c, &err) != ncclSuccess) return ncclInternalError;
  return err == ncclInProgress ? ncclSuccess : err;
}

/* The internal communicators this rank belongs to: those across the
 * islands first (teardown's order), then its island. */
#define HIER_KIDS 3
static void kids_of(ncclComm_t comm, ncclComm_t kids[HIER_KIDS]) {
  kids[0] = comm->hier.leaders;
  kids[1] = comm->hier.rail;
  kids[2] = comm->hier.island;
}

ncclResult_t hetccl_hier_error(ncclComm_t comm) {
  ncclComm_t kids[HIER_KIDS];
  kids_of(comm, kids);
  ncclResult_t err = ncclSuccess;
  for (int i = 0; i < HIER_KIDS && err == ncclSuccess; i++) err = child_error(kids[i]);
  return err;
}

void hetccl_hier_finalize(ncclComm_t comm) { /* the island first, as before the rails */
  ncclComm_t kids[HIER_KIDS];
  kids_of(comm, kids);
  for (int i = HIER_KIDS - 1; i >= 0; i--)
    if (kids[i]) (void)hetccl_comm_finalize(kids[i]);
}

void hetccl_hier_set_abort(ncclComm_t comm) {
  ncclComm_t kids[HIER_KIDS];
  kids_of(comm, kids);
  for (int i = 0; i < HIER_KIDS; i++)
    if (kids[i]) __atomic_store_n(&kids[i]->state.abort_flag, 1, __ATOMIC_RELEASE);
}

void hetccl_hier_release(ncclComm_t comm, int abort) {
  ncclComm_t kids[HIER_KIDS];
  kids_of(comm, kids);
  comm->hier.leaders = comm->hier.island = comm->hier.rail = NULL;
  hetccl_hier_map_free(comm, comm->hier.map);
  comm->hier.map = NULL;
  for (int i = 0; i < HIER_KIDS; i++) {
    if (!kids[i]) continue;
    if (abort) (void)hetccl_comm_abort(kids[i]);
    else (void)hetccl_comm_destroy(kids[i]);
  }
}

/* A phase failed here: fail the engines of the sibling communicators too
 * (and the parent's), on their proxies, so that ranks waiting on this one
 * in another phase learn it now, with `why`, instead of at HETCCL_TIMEOUT.
 * A vendor island is left to the vendor, as NCCL leaves its own peers. */
typedef struct hier_fail {
  ncclResult_t res;
  char why[HETCCL_FAIL_TEXT];
} hier_fail_t;

static ncclResult_t fail_job(ncclComm_t c, void *arg) {
  const hier_fail_t *f = arg;
  if (c->engine.p2p) (void)hetccl_engine_fail(c->engine.p2p, f->res, f->why);
  return ncclSuccess;
}

static void fail_engine_of(ncclComm_t c, ncclResult_t res, const char *why) {
  if (!c || !c->engine.p2p) return;
  hier_fail_t *f = malloc(sizeof(*f));
  if (!f) return; /* the peers then wait out HETCCL_TIMEOUT */
  f->res = res;
  snprintf(f->why, sizeof(f->why), "%s", why);
  (void)hetccl_proxy_post(c, fail_job, f, NULL, NULL);
}

void hetccl_hier_fail(ncclComm_t comm, ncclResult_t res, const char *why) {
  ncclComm_t kids[HIER_KIDS];
  kids_of(comm, kids);
  for (int i = 0; i < HIER_KIDS; i++) fail_engine_of(kids[i], res, why);
  fail_engine_of(comm, res, why);
}
