/* Windows of an engine communicator (window.c has the table of what each
 * window call does there). */
#ifndef HETCCL_COMM_WINDOW_H
#define HETCCL_COMM_WINDOW_H

#include <stddef.h>

#include "nccl.h"

/* ncclCommWindowRegister / ncclCommWindowDeregister / ncclWinGetUserPtr on
 * engine communicator comm (checked live by the caller). */
ncclResult_t hetccl_window_register(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int flags);
ncclResult_t hetccl_window_deregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t hetccl_window_user_ptr(ncclComm_t comm, ncclWindow_t win, void **out);

/* Is win a handle hetccl_window_register returned (and not yet dropped)? */
int hetccl_window_is_engine(ncclWindow_t win);

/* A device-pointer query (func names it) on an engine window: buffer +
 * offset where `peer` is the window's own rank (a rank of the world when
 * `world`, else of the LSA team, whose only member is 0), else
 * ncclInvalidUsage. */
ncclResult_t hetccl_window_local_ptr(const char *func, ncclWindow_t win, size_t offset, int peer,
                                     int world, void **out);

/* comm is going: drop the windows still registered on it. */
void hetccl_window_comm_gone(ncclComm_t comm);

#endif
