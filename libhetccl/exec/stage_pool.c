/* Staging blocks for device buffers (stage_pool.h). */
#include "exec/stage_pool.h"

#include <stdlib.h>
#include <time.h>

#include "comm/comm.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/log.h"

#define STAGE_ALIGN 256            /* copies like aligned addresses; so do NICs */
#define STAGE_MIN_BLOCK (1u << 20) /* smallest block made */
#define STAGE_POOL_MAX 3           /* blocks per pool at most (stage_pool.h) */

static const char *kind_name(hetccl_stage_kind_t kind) {
  return kind == HETCCL_STAGE_DEVICE ? "device memory" : "pinned host memory";
}

static int block_idle(hetccl_stage_pool_t *pool, hetccl_stage_block_t *b) {
  if (!b->busy) return 1;
  int done = 0;
  if (pool->rt->event_query(b->free_event, &done) != ncclSuccess) return 0;
  if (done) b->busy = 0;
  return done;
}

static void block_free(hetccl_stage_pool_t *pool, hetccl_stage_block_t *b) {
  if (b->rdma) hetccl_transport_mem_deregister(b->rdma); /* before the memory goes */
  if (b->free_event) pool->rt->event_destroy(b->free_event);
  if (b->mem) {
    if (pool->kind == HETCCL_STAGE_DEVICE)
      pool->rt->mem_free(b->mem);
    else
      pool->rt->host_free(b->mem);
  }
  free(b);
}

/* Wait (bounded by the abort flag) until the block the stream has held
 * longest is idle, and return its link. */
static ncclResult_t wait_oldest(ncclComm_t comm, hetccl_stage_pool_t *pool,
                                hetccl_stage_block_t ***out) {
  hetccl_stage_block_t **oldest = &pool->blocks;
  for (hetccl_stage_block_t **pb = &pool->blocks; *pb; pb = &(*pb)->next)
    if ((*pb)->last_use < (*oldest)->last_use) oldest = pb;
  struct timespec nap = {0, 20000};
  while (!block_idle(pool, *oldest)) {
    if (__atomic_load_n(&comm->state.abort_flag, __ATOMIC_ACQUIRE)) {
      WARN("rank %d: aborted while waiting for a staging block", comm->rank);
      return ncclInvalidUsage;
    }
    nanosleep(&nap, NULL);
  }
  *out = oldest;
  return ncclSuccess;
}

/* The memory and event of a new block, made with comm's device current
 * (a thread driving several ranks may have another one current). */
static ncclResult_t block_make(ncclComm_t comm, hetccl_stage_pool_t *pool,
                               hetccl_stage_block_t *b) {
  const hetccl_runtime_t *rt = pool->rt;
  int saved = -1;
  ncclResult_t res = ncclSuccess;
  if (comm->dev >= 0) {
    char busid[32];
    res = rt->current_device(&saved, busid, sizeof(busid));
    if (res == ncclSuccess && saved != comm->dev) res = rt->set_device(comm->dev);
  }
  if (res == ncclSuccess)
    res = pool->kind == HETCCL_STAGE_DEVICE ? rt->mem_alloc(&b->mem, b->bytes)
                                            : rt->host_alloc(&b->mem, b->bytes);
  if (res != ncclSuccess) b->mem = NULL;
  if (res == ncclSuccess) res = rt->event_create(&b->free_event);
  if (res != ncclSuccess) b->free_event = NULL;
  if (saved >= 0 && saved != comm->dev) (void)rt->set_device(saved);
  return res;
}

ncclResult_t hetccl_stage_pool_acquire(ncclComm_t comm, hetccl_stage_pool_t *pool, size_t bytes,
                                       hetccl_stage_block_t **out) {
  hetccl_stage_block_t **small = NULL;
  for (hetccl_stage_block_t **pb = &pool->blocks; *pb; pb = &(*pb)->next) {
    if (!block_idle(pool, *pb)) continue;
    if ((*pb)->bytes >= bytes) {
      *out = *pb;
      return ncclSuccess;
    }
    if (!small) small = pb;
  }
  if (!small && pool->nblocks >= STAGE_POOL_MAX) {
    HETCCL_CHECK(wait_oldest(comm, pool, &small));
    if ((*small)->bytes >= bytes) {
      *out = *small;
      return ncclSuccess;
    }
  }
  size_t at_least = STAGE_MIN_BLOCK;
  if (small) { /* keep the pool from growing with every larger size */
    hetccl_stage_block_t *b = *small;
    *small = b->next;
    b->next = pool->retired;
    pool->retired = b;
    pool->nblocks--;
    at_least = 2 * b->bytes;
  }
  hetccl_stage_block_t *b = calloc(1, sizeof(*b));
  if (!b) {
    WARN("staging: out of memory");
    return ncclSystemError;
  }
  size_t aligned = (bytes + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
  b->bytes = aligned < at_least ? at_least : aligned;
  if (pool->max_block && b->bytes > pool->max_block)
    b->bytes = aligned > pool->max_block ? aligned : pool->max_block;
  ncclResult_t res = block_make(comm, pool, b);
  if (res != ncclSuccess) { /* the runtime logged why */
    hetccl_last_error_prefix("rank %d: cannot allocate a staging block of %zu bytes of %s",
                             comm->rank, b->bytes, kind_name(pool->kind));
    block_free(pool, b);
    return res;
  }
  /* Declared as RDMA memory, as ncclCommRegister would (stage_pool.h). */
  if (hetccl_transport_mem_register(b->mem, b->bytes, &b->rdma) != ncclSuccess) b->rdma = NULL;
  b->next = pool->blocks;
  pool->blocks = b;
  pool->nblocks++;
  INFO(HETCCL_ALLOC, "rank %d: staging block of %zu bytes of %s (%d in the pool)", comm->rank,
       b->bytes, kind_name(pool->kind), pool->nblocks);
  *out = b;
  return ncclSuccess;
}

void hetccl_stage_pool_release(hetccl_stage_pool_t *pool, hetccl_stage_block_t *b, void *stream) {
  if (pool->rt->event_record(b->free_event, stream) == ncclSuccess) {
    b->busy = 1;
    b->last_use = ++pool->releases;
  }
}

int hetccl_stage_pool_drain(hetccl_stage_pool_t *pool, int *waited_ms_left) {
  struct timespec nap = {0, 1000000};
  int stuck = 0;
  hetccl_stage_block_t *lists[2] = {pool->blocks, pool->retired};
  for (int i = 0; i < 2; i++)
    for (hetccl_stage_block_t *b = lists[i]; b; b = b->next) {
      while (!block_idle(pool, b) && *waited_ms_left > 0) {
        nanosleep(&nap, NULL);
        (*waited_ms_left)--;
      }
      stuck |= b->busy;
    }
  return stuck;
}

void hetccl_stage_pool_free(hetccl_stage_pool_t *pool) {
  hetccl_stage_block_t **lists[2] = {&pool->blocks, &pool->retired};
  for (int i = 0; i < 2; i++)
    while (*lists[i]) {
      hetccl_stage_block_t *b = *lists[i];
      *lists[i] = b->next;
      block_free(pool, b);
    }
  pool->nblocks = 0;
}
