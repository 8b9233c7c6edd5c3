/* The transport registry: the tables named in HETCCL_TRANSPORTS, checked
 * once (every required slot filled) before anyone uses them, and completed
 * where a slot has a shared default: the memory slots (transport.h) a
 * table leaves out get the no-op stubs, so that no caller meets a NULL
 * slot. Callers get the completed copy. Any thread. */
#include <pthread.h>
#include <stddef.h>

#include "transport/transport.h"
#include "util/log.h"

static const hetccl_transport_t *const registry[HETCCL_TRANSPORT_COUNT] = {
#define HETCCL_TRANSPORT_SLOT(tname, sym) [HETCCL_TRANSPORT_##tname] = &sym,
    HETCCL_TRANSPORTS(HETCCL_TRANSPORT_SLOT)
#undef HETCCL_TRANSPORT_SLOT
};

static const char *const registry_names[HETCCL_TRANSPORT_COUNT] = {
#define HETCCL_TRANSPORT_NAME(tname, sym) [HETCCL_TRANSPORT_##tname] = #tname,
    HETCCL_TRANSPORTS(HETCCL_TRANSPORT_NAME)
#undef HETCCL_TRANSPORT_NAME
};

static hetccl_transport_t completed[HETCCL_TRANSPORT_COUNT];
static int registry_valid[HETCCL_TRANSPORT_COUNT];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

#define REQUIRED_SLOTS(X)                                                      \
  X(name) X(can_connect) X(ctx_create) X(connect) X(isend) X(irecv)            \
  X(progress) X(ep_close) X(ctx_destroy)

/* slot, its default */
#define DEFAULTED_SLOTS(X)                                                     \
  X(mem_register, hetccl_transport_mem_register_none)                          \
  X(mem_deregister, hetccl_transport_mem_deregister_none)                      \
  X(mem_allocated, hetccl_transport_mem_allocated_none)                        \
  X(mem_freed, hetccl_transport_mem_freed_none)

/* --- the shared stubs (transport.h) ----------------------------------------------- */

ncclResult_t hetccl_transport_mem_register_none(void *base, size_t bytes, void **handle) {
  static char none;
  (void)bytes;
  *handle = base ? base : &none; /* never NULL, as ncclCommDeregister requires */
  return ncclSuccess;
}

ncclResult_t hetccl_transport_mem_deregister_none(void *handle) {
  (void)handle;
  return ncclSuccess;
}

void hetccl_transport_mem_allocated_none(void *base, size_t bytes) {
  (void)base;
  (void)bytes;
}

void hetccl_transport_mem_freed_none(void *base) { (void)base; }

/* --- the registry ----------------------------------------------------------------- */

static void registry_check(void) {
  for (int id = 0; id < HETCCL_TRANSPORT_COUNT; id++) {
    const hetccl_transport_t *t = registry[id];
    int ok = 1;
#define CHECK_SLOT(slot)                                                       \
  if (t->slot == NULL) {                                                       \
    WARN("transport %s: slot '" #slot "' is NULL; transport not registered",   \
         registry_names[id]);                                                  \
    ok = 0;                                                                    \
  }
    REQUIRED_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
    completed[id] = *t;
#define DEFAULT_SLOT(slot, stub)                                               \
  if (completed[id].slot == NULL) completed[id].slot = stub;
    DEFAULTED_SLOTS(DEFAULT_SLOT)
#undef DEFAULT_SLOT
    registry_valid[id] = ok;
  }
}

const hetccl_transport_t *hetccl_transport_get(hetccl_transport_id_t id) {
  if ((int)id < 0 || id >= HETCCL_TRANSPORT_COUNT) return NULL;
  pthread_once(&registry_once, registry_check);
  return registry_valid[id] ? &completed[id] : NULL;
}
