/* The registration table: host ranges the user declared (ib_mem.h) and
 * their memory regions, one per ib protection domain open in the process.
 *
 * Threads: any. The API thread declares and drops ranges (ncclMemAlloc,
 * ncclMemFree, ncclCommRegister, ncclCommDeregister); the thread that
 * creates or destroys a communicator attaches and detaches its domain; the
 * thread that drives a communicator looks ranges up once per large message
 * (hetccl_ib_reg_find). One mutex guards the table; ibv_reg_mr and
 * ibv_dereg_mr run under it, so a lookup never sees a region half made or
 * half undone. Nothing here blocks on a peer.
 *
 * Invalidation. Only declared memory is ever registered: a range lives from
 * its declaration to its retraction, and retraction (ncclCommDeregister, or
 * ncclMemFree of the block around it) deregisters every region of it
 * before the call returns, so a block freed and allocated again at the same
 * address is looked up afresh. Plain malloc memory is never registered and
 * never cached: it takes the copy path whatever its address. What the table
 * cannot see is memory given back behind its back (free() of a range still
 * registered with ncclCommRegister): NCCL asks the same, deregister first.
 *
 * Bound. Each domain holds at most HETCCL_IB_REG_CACHE bytes of regions;
 * a range that would pass it is left unregistered there (one INFO line per
 * domain) and its messages take the copy path. Nothing is evicted: a
 * region is in use by the NIC whenever a message on it is in flight, and
 * only the user knows when none is. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "transport/ib/ib.h"
#include "transport/ib/ib_mem.h"
#include "util/knobs.h"
#include "util/log.h"

/* remote reads: the read back of a receive into device memory (ib_flush.c) */
#define REG_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

typedef struct reg_domain {
  struct ibv_pd *pd;
  const hetccl_ib_verbs_t *v;
  const hetccl_runtime_t *dmabuf; /* device memory registers here through dma-buf */
  int rank_user;         /* for messages */
  size_t registered;     /* bytes of regions on this domain */
  int told_full;         /* the INFO line about the bound was written */
  struct reg_domain *next;
} reg_domain_t;

typedef struct reg_region {
  reg_domain_t *dom;
  struct ibv_mr *mr;
  struct reg_region *next;
} reg_region_t;

typedef struct reg_range {
  uintptr_t id;          /* the handle; 0 for a block of ncclMemAlloc */
  char *base;
  size_t bytes;
  int block;             /* from ncclMemAlloc: ncclMemFree(base) drops it */
  reg_region_t *regions;
  struct reg_range *next;
} reg_range_t;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_range_t *ranges;
static reg_domain_t *domains;
static uintptr_t next_id = 1;

static size_t reg_bound(void) { return (size_t)hetccl_knob_int(HETCCL_KNOB_IB_REG_CACHE); }

/* Range r as device memory of d's runtime, through a dma-buf of it (a
 * range ibv_reg_mr refused, where the context found that GPUDirect works
 * this way: ib_devmem.c). NULL if it is not such memory. Lock held. */
static struct ibv_mr *dmabuf_region(reg_domain_t *d, const reg_range_t *r) {
  char why[256];
  int fd = -1;
  uint64_t offset = 0;
  if (!d->dmabuf->dmabuf_export(r->base, r->bytes, &fd, &offset, why, sizeof(why))) return NULL;
  struct ibv_mr *mr = d->v->reg_dmabuf_mr(d->pd, offset, r->bytes, (uint64_t)(uintptr_t)r->base,
                                          fd, REG_ACCESS);
  close(fd); /* the region keeps its own reference to the buffer */
  return mr;
}

/* Register range r with domain d, if the bound allows. Lock held. */
static void region_add(reg_range_t *r, reg_domain_t *d) {
  if (r->bytes == 0) return;
  if (d->registered + r->bytes > reg_bound()) {
    if (!d->told_full)
      INFO(HETCCL_NET, "ib rank %d: %zu bytes at %p stay on the copy path: HETCCL_IB_REG_CACHE=%zu "
           "bytes are registered already", d->rank_user, r->bytes, (void *)r->base, reg_bound());
    d->told_full = 1;
    return;
  }
  reg_region_t *g = calloc(1, sizeof(*g));
  if (g == NULL) return; /* a hint lost, not an error */
  g->mr = d->v->reg_mr(d->pd, r->base, r->bytes, REG_ACCESS);
  if (g->mr == NULL && d->dmabuf) g->mr = dmabuf_region(d, r);
  if (g->mr == NULL) {
    INFO(HETCCL_NET, "ib rank %d: ibv_reg_mr of %zu bytes at %p failed (%s): they stay on the "
         "copy path", d->rank_user, r->bytes, (void *)r->base, strerror(errno));
    free(g);
    return;
  }
  g->dom = d;
  g->next = r->regions;
  r->regions = g;
  d->registered += r->bytes;
}

static void region_drop(reg_range_t *r, reg_region_t *g) {
  if (g->dom->v->dereg_mr(g->mr) != 0)
    INFO(HETCCL_NET, "ib rank %d: ibv_dereg_mr of %zu bytes at %p failed", g->dom->rank_user,
         r->bytes, (void *)r->base);
  g->dom->registered -= r->bytes;
  free(g);
}

/* Unlink and free range *pr with its regions. Lock held. */
static void range_drop(reg_range_t **pr) {
  reg_range_t *r = *pr;
  *pr = r->next;
  while (r->regions) {
    reg_region_t *g = r->regions;
    r->regions = g->next;
    region_drop(r, g);
  }
  free(r);
}

static reg_range_t *range_add(void *base, size_t bytes, int block) {
  reg_range_t *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  r->base = base;
  r->bytes = bytes;
  r->block = block;
  for (reg_domain_t *d = domains; d; d = d->next) region_add(r, d);
  r->next = ranges;
  ranges = r;
  return r;
}

/* ---- ib_mem.h ---------------------------------------------------------------- */

ncclResult_t hetccl_ib_mem_register(void *base, size_t bytes, void **handle) {
  pthread_mutex_lock(&reg_lock);
  uintptr_t id = next_id++;
  reg_range_t *r = bytes ? range_add(base, bytes, 0) : NULL;
  if (r) r->id = id;
  pthread_mutex_unlock(&reg_lock);
  if (bytes && r == NULL) {
    WARN("ncclCommRegister: out of memory for the registration of %zu bytes at %p", bytes, base);
    return ncclSystemError;
  }
  *handle = (void *)id;
  return ncclSuccess;
}

ncclResult_t hetccl_ib_mem_deregister(void *handle) {
  uintptr_t id = (uintptr_t)handle;
  pthread_mutex_lock(&reg_lock);
  int known = id != 0 && id < next_id;
  reg_range_t **pr = &ranges;
  while (known && *pr && (*pr)->id != id) pr = &(*pr)->next;
  if (known && *pr) range_drop(pr);
  pthread_mutex_unlock(&reg_lock);
  if (!known) {
    WARN("ncclCommDeregister: %p is not a handle ncclCommRegister returned", handle);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

void hetccl_ib_mem_allocated(void *base, size_t bytes) {
  pthread_mutex_lock(&reg_lock);
  if (base && bytes && range_add(base, bytes, 1) == NULL)
    INFO(HETCCL_NET, "ncclMemAlloc: out of memory for the registration of %zu bytes at %p: "
         "they stay on the copy path", bytes, base);
  pthread_mutex_unlock(&reg_lock);
}

void hetccl_ib_mem_freed(void *base) {
  pthread_mutex_lock(&reg_lock);
  reg_range_t *blk = ranges;
  while (blk && !(blk->block && blk->base == (char *)base)) blk = blk->next;
  if (blk) {
    char *lo = blk->base, *hi = blk->base + blk->bytes;
    for (reg_range_t **pr = &ranges; *pr;) {
      if ((*pr)->base >= lo && (*pr)->base + (*pr)->bytes <= hi) range_drop(pr);
      else pr = &(*pr)->next;
    }
  }
  pthread_mutex_unlock(&reg_lock);
}

/* ---- the transport's side (ib.h) ----------------------------------------------- */

ncclResult_t hetccl_ib_reg_attach(const hetccl_ib_verbs_t *v, struct ibv_pd *pd, int rank_user,
                                  const hetccl_runtime_t *dmabuf) {
  reg_domain_t *d = calloc(1, sizeof(*d));
  if (d == NULL) {
    WARN("ib: rank %d: out of memory for the registration table", rank_user);
    return ncclSystemError;
  }
  d->pd = pd;
  d->v = v;
  d->dmabuf = dmabuf;
  d->rank_user = rank_user;
  pthread_mutex_lock(&reg_lock);
  for (reg_range_t *r = ranges; r; r = r->next) region_add(r, d);
  d->next = domains;
  domains = d;
  pthread_mutex_unlock(&reg_lock);
  return ncclSuccess;
}

void hetccl_ib_reg_detach(struct ibv_pd *pd) {
  pthread_mutex_lock(&reg_lock);
  reg_domain_t **pd_link = &domains;
  while (*pd_link && (*pd_link)->pd != pd) pd_link = &(*pd_link)->next;
  reg_domain_t *d = *pd_link;
  if (d) {
    for (reg_range_t *r = ranges; r; r = r->next)
      for (reg_region_t **pg = &r->regions; *pg;) {
        reg_region_t *g = *pg;
        if (g->dom != d) {
          pg = &g->next;
          continue;
        }
        *pg = g->next;
        region_drop(r, g);
      }
    *pd_link = d->next;
    free(d);
  }
  pthread_mutex_unlock(&reg_lock);
}

int hetccl_ib_reg_find(struct ibv_pd *pd, const void *buf, size_t bytes, uint32_t *lkey,
                       uint32_t *rkey) {
  const char *lo = buf, *hi = (const char *)buf + bytes;
  int found = 0;
  pthread_mutex_lock(&reg_lock);
  for (reg_range_t *r = ranges; r && !found; r = r->next) {
    if (lo < r->base || hi > r->base + r->bytes) continue;
    for (reg_region_t *g = r->regions; g; g = g->next)
      if (g->dom->pd == pd) {
        *lkey = g->mr->lkey;
        *rkey = g->mr->rkey;
        found = 1;
        break;
      }
  }
  pthread_mutex_unlock(&reg_lock);
  return found;
}
