/* Memory declared for communication, to every transport at once
 * (transport.h: hetccl_transport_mem_*).
 *
 * A declaration is one record holding each transport's own handle; the
 * handle core hands out is the record's number, never its address, so
 * that a handle deregistered already (or never returned) is told apart
 * without reading memory that may be gone: numbers below the next one are
 * known, and a known number whose record is gone was deregistered.
 *
 * Any thread: the records have their own lock, never held while a
 * transport runs (each transport's table takes its own). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "transport/transport.h"
#include "util/log.h"

typedef struct mem_decl {
  uintptr_t id;
  void *handles[HETCCL_TRANSPORT_COUNT]; /* each transport's, for its deregister */
  struct mem_decl *next;
} mem_decl_t;

static pthread_mutex_t decl_lock = PTHREAD_MUTEX_INITIALIZER;
static mem_decl_t *decls;
static uintptr_t next_id = 1;

/* Every transport's deregister of d, the first failure returned (each has
 * logged its own). */
static ncclResult_t undeclare(const mem_decl_t *d, int upto) {
  ncclResult_t first = ncclSuccess;
  for (int t = 0; t < upto; t++) {
    const hetccl_transport_t *tp = hetccl_transport_get((hetccl_transport_id_t)t);
    if (!tp) continue;
    ncclResult_t res = tp->mem_deregister(d->handles[t]);
    if (first == ncclSuccess) first = res;
  }
  return first;
}

ncclResult_t hetccl_transport_mem_register(void *base, size_t bytes, void **handle) {
  mem_decl_t *d = calloc(1, sizeof(*d));
  if (!d) {
    WARN("ncclCommRegister: out of memory for the registration of %zu bytes at %p", bytes, base);
    return ncclSystemError;
  }
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    /* A table the registry refused serves nothing: nothing to declare. */
    const hetccl_transport_t *tp = hetccl_transport_get((hetccl_transport_id_t)t);
    ncclResult_t res = tp ? tp->mem_register(base, bytes, &d->handles[t]) : ncclSuccess;
    if (res != ncclSuccess) {
      (void)undeclare(d, t);
      free(d);
      return res;
    }
  }
  pthread_mutex_lock(&decl_lock);
  d->id = next_id++;
  d->next = decls;
  decls = d;
  pthread_mutex_unlock(&decl_lock);
  *handle = (void *)d->id;
  return ncclSuccess;
}

ncclResult_t hetccl_transport_mem_deregister(void *handle) {
  uintptr_t id = (uintptr_t)handle;
  mem_decl_t *d = NULL;
  pthread_mutex_lock(&decl_lock);
  int known = id != 0 && id < next_id;
  for (mem_decl_t **p = &decls; known && *p; p = &(*p)->next) {
    if ((*p)->id != id) continue;
    d = *p;
    *p = d->next;
    break;
  }
  pthread_mutex_unlock(&decl_lock);
  if (!known) {
    WARN("ncclCommDeregister: %p is not a handle ncclCommRegister returned", handle);
    return ncclInvalidArgument;
  }
  if (!d) return ncclSuccess; /* deregistered already */
  ncclResult_t res = undeclare(d, HETCCL_TRANSPORT_COUNT);
  free(d);
  return res;
}

void hetccl_transport_mem_allocated(void *base, size_t bytes) {
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    const hetccl_transport_t *tp = hetccl_transport_get((hetccl_transport_id_t)t);
    if (tp) tp->mem_allocated(base, bytes);
  }
}

void hetccl_transport_mem_freed(void *base) {
  for (int t = 0; t < HETCCL_TRANSPORT_COUNT; t++) {
    const hetccl_transport_t *tp = hetccl_transport_get((hetccl_transport_id_t)t);
    if (tp) tp->mem_freed(base);
  }
}
