/* Who this rank is: its host and the kind of device it presents.
 *
 * The host hash tells ranks of one host (and one IPC namespace) apart from
 * the others; the device kind decides which runtime reads a rank's
 * pointers and which vendor library could serve it. Every answer here is
 * local (nothing is exchanged): comm/init.c publishes them.
 *
 * Threads: any. Never loads a library it does not find mapped already,
 * except a runtime asked whether it has a device. */
#ifndef HETCCL_COMM_IDENTITY_H
#define HETCCL_COMM_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/runtime.h"
#include "vendor_ccl/vendor.h"

/* Same host and same IPC namespace <=> same value: hostname, boot id and
 * the IPC namespace inode all enter the hash. Writes the host name (NUL
 * terminated, "unknown" when it cannot be read) into hostname. */
uint64_t hetccl_host_hash(char *hostname, size_t len);

/* The device kind this process presents: hetccl_runtime_detect(), except
 * that a process which links a real NCCL (the NCCL library is mapped, as
 * in PyTorch and CuPy under LD_PRELOAD) and can use CUDA is a CUDA process
 * even before it touched the CUDA runtime: it is an NCCL program. Likewise
 * a process that links a real RCCL and can use HIP is a HIP process. */
hetccl_dev_kind_t hetccl_process_dev_kind(void);

/* The runtime that can tell a host rank's device pointers from host ones:
 * one in which the process can hold memory now (runtime.h: holds_memory:
 * for CUDA, a context made) and that has a usable device; else
 * HETCCL_DEV_HOST. Loading a runtime is not enough: a CUDA build of
 * PyTorch loads CUDA (and links NCCL) in every process, yet a job of CPU
 * tensors never makes a context, and its host ranks then never touch the
 * GPU (no CUDA initialisation, no data plane: every pointer is host
 * memory). */
hetccl_dev_kind_t hetccl_host_pointer_kind(void);

/* The same for a host rank whose communicator found none at init (ptr_kind
 * host): one the process has come to use since, or HETCCL_DEV_HOST. A
 * call pays one look at the loader's count where no GPU runtime is loaded
 * (a runtime comes into use by being loaded); where one is loaded but
 * holds no memory yet, the runtime's query (CUDA: the driver's context
 * state) until it does. */
hetccl_dev_kind_t hetccl_late_pointer_kind(void);

/* The vendor library that serves ranks of a device kind (cuda: NCCL,
 * hip: RCCL): 1 and *id, or 0 for kinds without one (host). */
int hetccl_dev_vendor(hetccl_dev_kind_t kind, hetccl_vendor_id_t *id);

#endif
