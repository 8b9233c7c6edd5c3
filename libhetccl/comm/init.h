/* Communicator life cycle: create, init (bootstrap, islands, then the
 * backend that serves it: comm/backend.h), communicators made from one
 * (split, shrink, grow), finalize, destroy, abort.
 *
 * hetccl_comm_create runs on the API thread (it captures the caller's
 * device); hetccl_comm_init may run on any thread (the caller, a proxy thread
 * for grouped or nonblocking init). */
#ifndef HETCCL_COMM_INIT_H
#define HETCCL_COMM_INIT_H

#include "comm/comm.h"

/* No device kind given: the process's (hetccl_process_dev_kind). */
#define HETCCL_DEV_AUTO HETCCL_DEV_COUNT

/* Allocate and register a communicator for (rank, nranks); config may be
 * NULL. Validates config. kind: what the rank is (HETCCL_DEV_AUTO: the
 * process's kind). Captures the calling thread's device of that kind. Its
 * backend is the engine's until init decides (backend.h). */
ncclResult_t hetccl_comm_create(int nranks, int rank, const ncclConfig_t *config,
                                hetccl_dev_kind_t kind, ncclComm_t *out);

/* Join the communicator described by id: bootstrap, islands, then the
 * backend's start (the vendor's communicator, or the engine's transports,
 * data plane and hierarchy). Blocking; bounded by timeouts. */
ncclResult_t hetccl_comm_init(ncclComm_t comm, const ncclUniqueId *id);

/* The proxy-job form of hetccl_comm_init; arg is a heap ncclUniqueId. */
ncclResult_t hetccl_comm_init_job(ncclComm_t comm, void *arg);

/* Free a communicator that never got (or no longer has) users: stop its
 * proxy, tear down what init made. Used by init and the splits. */
void hetccl_comm_release(ncclComm_t comm);

/* Local teardown (teardown.c); never blocks on peers. abort also stops
 * work in flight. */
ncclResult_t hetccl_comm_destroy(ncclComm_t comm);
ncclResult_t hetccl_comm_abort(ncclComm_t comm);
ncclResult_t hetccl_comm_finalize(ncclComm_t comm);

/* Communicators made from an engine communicator (reshape.c): the engine
 * backend's split, shrink and grow slots (backend.h has their contracts). */
ncclResult_t hetccl_comm_split_engine(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                      const ncclConfig_t *config);
ncclResult_t hetccl_comm_shrink_engine(ncclComm_t comm, const int *exclude, int nexclude,
                                       ncclComm_t *newcomm, const ncclConfig_t *config,
                                       int flags);
/* ncclCommGrow for a member of the parent (rank -1 given): every member
 * calls it; `id` (from ncclCommGetUniqueId on one of them) may be NULL on
 * all but that one, as the members pass it round over the parent's
 * bootstrap. Members keep their ranks in the new communicator of nranks;
 * the joining ranks come in through ncclCommInitRank's path with the id. */
ncclResult_t hetccl_comm_grow_engine(ncclComm_t parent, int nranks, const ncclUniqueId *id,
                                     int rank, ncclComm_t *newcomm, const ncclConfig_t *config);
/* A split for hetccl's own use (hier/hier.c): the child presents `island`
 * as its forced island at init, whatever HETCCL_ISLANDS says. */
ncclResult_t hetccl_comm_split_internal(ncclComm_t comm, int color, int key,
                                        const ncclConfig_t *config, int32_t island,
                                        ncclComm_t *newcomm);

/* Number of API calls currently running on comm (abort waits for them). */
void hetccl_comm_enter(ncclComm_t comm);
void hetccl_comm_leave(ncclComm_t comm);

#endif
