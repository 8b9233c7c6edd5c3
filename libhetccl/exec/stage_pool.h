/* Staging blocks for device buffers (exec/devpath.c): a small pool of one
 * kind of memory, each block declared for RDMA and handed back by an event
 * on the stream that last used it.
 *
 *   kind    memory                       what the bytes cross to reach a transport
 *   host    pinned host memory           the GPU's copy engine (device <-> host), then
 *           (runtime host_alloc)         the transport: the CPU, or ib's NIC by RDMA
 *   device  device memory of comm->dev   a copy on the GPU (device <-> device), then
 *           (runtime mem_alloc)          ib's NIC by RDMA straight from or into it
 *                                        (GPUDirect; used only for what ctx_reaches
 *                                        says the NIC reaches, transport.h)
 *
 * Every block is declared to the transports when it is made, exactly as
 * ncclCommRegister would declare it (transport.h: the memory slots), and
 * dropped before it is freed; where no ib context is open that only records
 * the range, and a refused registration leaves the block usable on the
 * copy path (the caller asks ctx_reaches, never assumes).
 *
 * A pool holds at most STAGE_POOL_MAX blocks. Pinning (or allocating
 * device memory) costs about as much as moving it, so once that many are
 * busy the next acquire waits (bounded by the abort flag) for the oldest to
 * come back, instead of making another: the caller runs at most that many
 * batches ahead of its stream. A block too small is replaced by one at
 * least twice its size; the one replaced is kept until the pool is freed,
 * since freeing pinned or device memory waits for the whole device, and a
 * thread driving several ranks would wait there on a stream that needs a
 * launch of another of its ranks, which it has not made yet (sizes at
 * least double, so the retired blocks add up to less than the largest).
 *
 * Threads: the API thread of the communicator (one at a time, NCCL's
 * rule) acquires and releases; free runs at destroy. */
#ifndef HETCCL_EXEC_STAGE_POOL_H
#define HETCCL_EXEC_STAGE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "runtime/runtime.h"

typedef enum { HETCCL_STAGE_HOST, HETCCL_STAGE_DEVICE } hetccl_stage_kind_t;

typedef struct hetccl_stage_block {
  void *mem;          /* host memory or device memory, by the pool's kind */
  size_t bytes;
  void *rdma;         /* the block's declaration (hetccl_transport_mem_register) */
  void *free_event;   /* recorded after the batch's last copy out of the block */
  int busy;           /* free_event recorded and maybe not reached yet */
  uint64_t last_use;  /* the release that last recorded free_event */
  struct hetccl_stage_block *next;
} hetccl_stage_block_t;

typedef struct hetccl_stage_pool {
  const hetccl_runtime_t *rt;
  hetccl_stage_kind_t kind;
  hetccl_stage_block_t *blocks;
  int nblocks;
  hetccl_stage_block_t *retired; /* replaced by larger ones, freed with the pool */
  uint64_t releases;
  size_t max_block; /* no block made larger than this unless asked for more; 0: no bound */
} hetccl_stage_pool_t;

/* An idle block of at least `bytes` (> 0) for comm (its device current
 * while a device block is made): reuse one, else replace an idle one that
 * is too small, else make one; with the pool full, the oldest busy block
 * once it is idle. */
ncclResult_t hetccl_stage_pool_acquire(ncclComm_t comm, hetccl_stage_pool_t *pool, size_t bytes,
                                       hetccl_stage_block_t **out);

/* The block is busy until `stream` has passed everything enqueued on it. */
void hetccl_stage_pool_release(hetccl_stage_pool_t *pool, hetccl_stage_block_t *b, void *stream);

/* Wait up to *waited_ms_left milliseconds in all (decremented) for every
 * block to be idle; 1 if one is still busy (then nothing may be freed). */
int hetccl_stage_pool_drain(hetccl_stage_pool_t *pool, int *waited_ms_left);

/* Free every block (after a drain that returned 0). */
void hetccl_stage_pool_free(hetccl_stage_pool_t *pool);

#endif
