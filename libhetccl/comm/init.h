/* Communicator life cycle: create, init (bootstrap, islands, vendor or
 * engine), split, shrink, destroy, abort.
 *
 * hetccl_comm_create runs on the API thread (it captures the caller's
 * device); hetccl_comm_init may run on any thread (the caller, a proxy thread
 * for grouped or nonblocking init). */
#ifndef HETCCL_CORE_INIT_H
#define HETCCL_CORE_INIT_H

#include "comm/comm.h"

/* The device kind this process presents: hetccl_runtime_detect(), except
 * that a process which links a real NCCL (the NCCL library is mapped, as
 * in PyTorch and CuPy under LD_PRELOAD) and can use CUDA is a CUDA process
 * even before it touched the CUDA runtime: it is an NCCL program. Likewise
 * a process that links a real RCCL and can use HIP is a HIP process. */
hetccl_dev_kind_t hetccl_process_dev_kind(void);

/* The runtime that tells device pointers from host ones for a host rank
 * whose communicator found none at init (ptr_kind host): one the process
 * has come to use since, or HETCCL_DEV_HOST. Asked again only when the
 * process has loaded a shared object since the last answer (a runtime
 * comes into use by being loaded), so a host rank's call pays one look at
 * the loader's count. Threads: any. */
hetccl_dev_kind_t hetccl_late_pointer_kind(void);

/* The vendor library that serves ranks of a device kind (cuda: NCCL,
 * hip: RCCL): 1 and *id, or 0 for kinds without one (host). */
int hetccl_dev_vendor(hetccl_dev_kind_t kind, hetccl_vendor_id_t *id);

/* No device kind given: the process's (hetccl_process_dev_kind). */
#define HETCCL_DEV_AUTO HETCCL_DEV_COUNT

/* Allocate and register a communicator for (rank, nranks); config may be
 * NULL. Validates config. kind: what the rank is (HETCCL_DEV_AUTO: the
 * process's kind). Captures the calling thread's device of that kind. */
ncclResult_t hetccl_comm_create(int nranks, int rank, const ncclConfig_t *config,
                                hetccl_dev_kind_t kind, ncclComm_t *out);

/* Join the communicator described by id: bootstrap, islands, then vendor
 * communicator or engine transports. Blocking; bounded by timeouts. */
ncclResult_t hetccl_comm_init(ncclComm_t comm, const ncclUniqueId *id);

/* The proxy-job form of hetccl_comm_init; arg is a heap ncclUniqueId. */
ncclResult_t hetccl_comm_init_job(ncclComm_t comm, void *arg);

/* Free a communicator that never got (or no longer has) users: stop its
 * proxy, tear down what init made. Used by init and core/reshape.c. */
void hetccl_comm_release(ncclComm_t comm);

/* Local teardown; never blocks on peers. abort also stops work in flight. */
ncclResult_t hetccl_comm_destroy(ncclComm_t comm);
ncclResult_t hetccl_comm_abort(ncclComm_t comm);
ncclResult_t hetccl_comm_finalize(ncclComm_t comm);

ncclResult_t hetccl_comm_split(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               const ncclConfig_t *config);
/* A split for hetccl's own use (core/hier.c): the child presents `island`
 * as its forced island at init, whatever HETCCL_ISLANDS says. */
ncclResult_t hetccl_comm_split_internal(ncclComm_t comm, int color, int key,
                                        const ncclConfig_t *config, int32_t island,
                                        ncclComm_t *newcomm);
ncclResult_t hetccl_comm_shrink(ncclComm_t comm, const int *exclude, int nexclude,
                                ncclComm_t *newcomm, const ncclConfig_t *config, int flags);
/* ncclCommGrow for a member of the parent (rank -1 given): every member
 * calls it; `id` (from ncclCommGetUniqueId on one of them) may be NULL on
 * all but that one, as the members pass it round over the parent's
 * bootstrap. Members keep their ranks in the new communicator of nranks;
 * the joining ranks come in through ncclCommInitRank's path with the id. */
ncclResult_t hetccl_comm_grow(ncclComm_t parent, int nranks, const ncclUniqueId *id, int rank,
                              ncclComm_t *newcomm, const ncclConfig_t *config);

/* Number of API calls currently running on comm (abort waits for them). */
void hetccl_comm_enter(ncclComm_t comm);
void hetccl_comm_leave(ncclComm_t comm);

#endif
