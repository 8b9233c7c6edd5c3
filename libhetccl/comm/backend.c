/* The backend tables (backend.h), checked once before anyone uses them:
 * every slot filled. Any thread. */
#include "comm/backend.h"

#include <pthread.h>

#include "util/log.h"

static const hetccl_backend_ops_t *const backends[HETCCL_BACKEND_COUNT] = {
#define BACKEND_SLOT(id, sym) [HETCCL_BACKEND_##id] = &sym,
    HETCCL_BACKENDS(BACKEND_SLOT)
#undef BACKEND_SLOT
};

static const char *const backend_names[HETCCL_BACKEND_COUNT] = {
#define BACKEND_NAME(id, sym) [HETCCL_BACKEND_##id] = #id,
    HETCCL_BACKENDS(BACKEND_NAME)
#undef BACKEND_NAME
};

#define REQUIRED_SLOTS(X)                                                                   \
  X(name) X(start) X(finalize) X(shutdown) X(release) X(revoke) X(dispatch) X(submit)       \
  X(redop_create) X(redop_destroy) X(async_error) X(count) X(user_rank) X(cu_device)        \
  X(properties)                                                                             \
  X(mem_stats) X(last_error) X(describe) X(mem_register) X(mem_deregister)                  \
  X(window_register) X(window_deregister) X(win_user_ptr) X(suspend) X(resume) X(split)     \
  X(shrink) X(grow) X(grow_id) X(dev_comm_create) X(dev_comm_destroy) X(team) X(team_rank)  \
  X(gin_barrier) X(put_signal) X(signal) X(wait_signal)

/* Every slot of the struct is listed above: a slot added to the struct and
 * not here fails this. */
#define COUNT_SLOT(slot) +1
_Static_assert(sizeof(hetccl_backend_ops_t) == (0 REQUIRED_SLOTS(COUNT_SLOT)) * sizeof(void *),
               "hetccl_backend_ops_t has a slot REQUIRED_SLOTS does not check");
#undef COUNT_SLOT

static int backend_valid[HETCCL_BACKEND_COUNT];
static pthread_once_t backend_once = PTHREAD_ONCE_INIT;

static void backend_check(void) {
  for (int id = 0; id < HETCCL_BACKEND_COUNT; id++) {
    const hetccl_backend_ops_t *b = backends[id];
    int ok = 1;
#define CHECK_SLOT(slot)                                                       \
  if (b->slot == NULL) {                                                       \
    WARN("backend %s: slot '" #slot "' is NULL; backend not usable", backend_names[id]); \
    ok = 0;                                                                    \
  }
    REQUIRED_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
    backend_valid[id] = ok;
  }
}

const hetccl_backend_ops_t *hetccl_backend_get(hetccl_backend_id_t id) {
  if ((int)id < 0 || id >= HETCCL_BACKEND_COUNT) return NULL;
  pthread_once(&backend_once, backend_check);
  return backend_valid[id] ? backends[id] : NULL;
}
