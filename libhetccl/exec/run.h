/* Running one communicator's tasks on the calling thread, which must be
 * the one driving its engine (the API caller for a blocking share, the
 * proxy for a handed-off or staged one): the data plane's host share on
 * the plane, collectives in call order, then every send and receive posted
 * together and waited together, so that a rank may send to and receive
 * from every peer in one group. */
#ifndef HETCCL_EXEC_RUN_H
#define HETCCL_EXEC_RUN_H

#include "exec/task.h"

/* Run tasks (comm's, call order) and free them. Marks the communicator
 * failed on error; with it failed already, only frees. */
ncclResult_t hetccl_tasks_run(ncclComm_t comm, hetccl_task_t *tasks);

#endif
