/* Host memory the user declared for RDMA: what the ib transport may use in
 * place (docs/transports.md, "zero-copy RDMA WRITE"). These are the ib
 * table's memory slots (transport.h: mem_register, mem_deregister,
 * mem_allocated, mem_freed, whose contracts they keep); core reaches them
 * through hetccl_transport_mem_* only. Private to transport/ib/: ib.c
 * names them in its table, ib_reg.c implements them (a build without verbs,
 * ib_none.c, takes the shared no-op stubs instead).
 *
 * Any thread: the table behind these calls (ib_reg.c) is process-wide and
 * takes its own lock. Each range is registered at once with every ib
 * protection domain open in the process, and with each one opened later
 * when it opens, up to HETCCL_IB_REG_CACHE bytes per domain; a range that
 * does not fit, or whose registration fails, stays on the copy path there
 * (INFO, never an error: registration is a hint). */
#ifndef HETCCL_TRANSPORT_IB_MEM_H
#define HETCCL_TRANSPORT_IB_MEM_H

#include <stddef.h>

#include "nccl.h"

/* ncclCommRegister: declare [base, base + bytes) and return an opaque,
 * non-NULL handle for hetccl_ib_mem_deregister. bytes == 0 declares
 * nothing and still returns a handle. */
ncclResult_t hetccl_ib_mem_register(void *base, size_t bytes, void **handle);
/* ncclCommDeregister: drop the range (every registration of it is undone
 * before this returns). A handle whose range was already dropped by
 * hetccl_ib_mem_freed is accepted; one never returned is
 * ncclInvalidArgument. */
ncclResult_t hetccl_ib_mem_deregister(void *handle);
/* ncclMemAlloc on a host rank: the new block is declared as a range. */
void hetccl_ib_mem_allocated(void *base, size_t bytes);
/* ncclMemFree, before the block is returned: drops the block's range and
 * every range declared inside it (ncclCommRegister'd parts the caller did
 * not deregister), so that no registration outlives the memory. */
void hetccl_ib_mem_freed(void *base);

#endif
