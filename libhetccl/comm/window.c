/* Windows of an engine communicator: ncclCommWindowRegister and the calls
 * that take its handle, on a communicator hetccl runs itself.
 *
 * An NCCL window is a buffer every rank registers so that its peers may
 * load from, store to and put into it (symmetric kernels, one-sided
 * signals). The ranks of an engine communicator have no such access to
 * each other's memory (they are other vendors' devices, other hosts, or
 * CPUs), so its windows keep the one meaning that maps: the buffer is
 * declared for communication, which the transports take exactly as
 * ncclCommRegister (ib: RDMA straight from and into it; transport.h's
 * memory slots, docs/transports.md).
 *
 *   call                               on an engine communicator
 *   ncclCommWindowRegister             the range declared (transport.h), a handle
 *                                      of this file's; local, nothing exchanged
 *   ncclCommWindowDeregister           the range dropped, the handle freed
 *   ncclWinGetUserPtr                  the buffer
 *   ncclGetLsaDevicePointer, rank 0    buffer + offset: the LSA team of an
 *   ncclGetPeerDevicePointer, itself   engine rank is the rank alone
 *   any other window call              ncclInvalidUsage, naming why
 *
 * Handles live in a list, so that a call without a communicator (the
 * device-pointer queries) can tell this file's windows from a vendor's
 * without reading through a pointer it does not own; a communicator's
 * windows still registered when it goes are dropped with it.
 *
 * Any thread: the list has its own lock. */
#include "comm/window.h"

#include <pthread.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "transport/transport.h"
#include "util/check.h"
#include "util/log.h"

struct hetccl_window {
  ncclComm_t comm;
  char *base;
  size_t bytes;
  void *reg;                   /* hetccl_transport_mem_register's handle */
  struct hetccl_window *next;
};

static pthread_mutex_t windows_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hetccl_window *windows;

/* The window behind handle w if it is one of ours, else NULL. Lock held. */
static struct hetccl_window *find(const void *w) {
  for (struct hetccl_window *x = windows; x; x = x->next)
    if ((const void *)x == w) return x;
  return NULL;
}

ncclResult_t hetccl_window_register(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int flags) {
  HETCCL_ARGCHECK(win != NULL, ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  HETCCL_ARGCHECK(buff != NULL || size == 0, ncclInvalidArgument,
                  "ncclCommWindowRegister: buffer is NULL with size %zu", size);
  struct hetccl_window *w = calloc(1, sizeof(*w));
  if (w == NULL) {
    WARN("ncclCommWindowRegister: out of memory for a window of %zu bytes", size);
    return ncclSystemError;
  }
  ncclResult_t res = hetccl_transport_mem_register(buff, size, &w->reg);
  if (res != ncclSuccess) {
    free(w);
    return res;
  }
  w->comm = comm;
  w->base = buff;
  w->bytes = size;
  pthread_mutex_lock(&windows_lock);
  w->next = windows;
  windows = w;
  pthread_mutex_unlock(&windows_lock);
  INFO(HETCCL_INIT, "ncclCommWindowRegister: rank %d: %zu bytes at %p (flags %#x) declared for "
       "RDMA; an engine communicator's window gives no peer access", comm->rank, size, buff,
       (unsigned)flags);
  *win = (ncclWindow_t)w;
  return ncclSuccess;
}

/* Unlink the window behind handle win of comm into *out. Lock held. */
static ncclResult_t unlink_window(ncclComm_t comm, ncclWindow_t win, struct hetccl_window **out) {
  for (struct hetccl_window **p = &windows; *p; p = &(*p)->next) {
    if ((void *)*p != (void *)win) continue;
    if ((*p)->comm != comm) return ncclInvalidArgument;
    *out = *p;
    *p = (*p)->next;
    return ncclSuccess;
  }
  return ncclInvalidArgument;
}

ncclResult_t hetccl_window_deregister(ncclComm_t comm, ncclWindow_t win) {
  struct hetccl_window *w = NULL;
  pthread_mutex_lock(&windows_lock);
  ncclResult_t res = unlink_window(comm, win, &w);
  pthread_mutex_unlock(&windows_lock);
  if (res != ncclSuccess) {
    WARN("ncclCommWindowDeregister: %p is not a window of this communicator (rank %d)",
         (void *)win, comm->rank);
    return res;
  }
  res = hetccl_transport_mem_deregister(w->reg);
  free(w);
  return res;
}

ncclResult_t hetccl_window_user_ptr(ncclComm_t comm, ncclWindow_t win, void **out) {
  HETCCL_ARGCHECK(out != NULL, ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL");
  pthread_mutex_lock(&windows_lock);
  struct hetccl_window *w = find(win);
  int mine = w && w->comm == comm;
  if (mine) *out = w->base;
  pthread_mutex_unlock(&windows_lock);
  if (!mine) {
    WARN("ncclWinGetUserPtr: %p is not a window of this communicator (rank %d)", (void *)win,
         comm->rank);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

int hetccl_window_is_engine(ncclWindow_t win) {
  pthread_mutex_lock(&windows_lock);
  int ours = find(win) != NULL;
  pthread_mutex_unlock(&windows_lock);
  return ours;
}

ncclResult_t hetccl_window_local_ptr(const char *func, ncclWindow_t win, size_t offset, int peer,
                                     int world, void **out) {
  HETCCL_ARGCHECK(out != NULL, ncclInvalidArgument, "%s: outPtr is NULL", func);
  pthread_mutex_lock(&windows_lock);
  struct hetccl_window *w = find(win);
  char *base = w ? w->base : NULL;
  size_t bytes = w ? w->bytes : 0;
  int self = w ? (world ? w->comm->rank : 0) : -1;
  pthread_mutex_unlock(&windows_lock);
  if (w == NULL) {
    WARN("%s: %p is not a window", func, (void *)win);
    return ncclInvalidArgument;
  }
  if (peer != self)
    return hetccl_unsupported(func, "an engine communicator's window is reachable by its own "
                                    "rank only (its LSA team is that rank)");
  HETCCL_ARGCHECK(offset < bytes || (offset == 0 && bytes == 0), ncclInvalidArgument,
                  "%s: offset %zu is past the window's %zu bytes", func, offset, bytes);
  *out = base + offset;
  return ncclSuccess;
}

void hetccl_window_comm_gone(ncclComm_t comm) {
  struct hetccl_window *gone = NULL;
  pthread_mutex_lock(&windows_lock);
  for (struct hetccl_window **p = &windows; *p;) {
    struct hetccl_window *w = *p;
    if (w->comm != comm) {
      p = &w->next;
      continue;
    }
    *p = w->next;
    w->next = gone;
    gone = w;
  }
  pthread_mutex_unlock(&windows_lock);
  while (gone) {
    struct hetccl_window *w = gone;
    gone = w->next;
    INFO(HETCCL_INIT, "window of %zu bytes at %p dropped with its communicator", w->bytes,
         (void *)w->base);
    (void)hetccl_transport_mem_deregister(w->reg);
    free(w);
  }
}
