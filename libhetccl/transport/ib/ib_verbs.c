/* libibverbs, loaded at run time: dlopen("libibverbs.so.1") once per
 * process and every function taken with dlsym on that handle, so that
 * libhetccl.so neither links nor needs rdma-core. dlsym returns each
 * symbol's default version, the one a program built against this verbs.h
 * would bind. The handle is never closed: provider libraries keep threads
 * and state behind it. Any thread. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "transport/ib/ib.h"
#include "util/log.h"

#define IB_VERBS_LIB "libibverbs.so.1"

/* member, exported name, required */
#define IB_VERBS_SYMS(X)                                                       \
  X(get_device_list, "ibv_get_device_list", 1)                                 \
  X(free_device_list, "ibv_free_device_list", 1)                               \
  X(get_device_name, "ibv_get_device_name", 1)                                 \
  X(open_device, "ibv_open_device", 1)                                         \
  X(close_device, "ibv_close_device", 1)                                       \
  X(query_device, "ibv_query_device", 1)                                       \
  X(query_port, "ibv_query_port", 1)                                           \
  X(query_gid, "ibv_query_gid", 1)                                             \
  X(alloc_pd, "ibv_alloc_pd", 1)                                               \
  X(dealloc_pd, "ibv_dealloc_pd", 1)                                           \
  X(reg_mr, "ibv_reg_mr", 1)                                                   \
  X(dereg_mr, "ibv_dereg_mr", 1)                                               \
  X(create_cq, "ibv_create_cq", 1)                                             \
  X(destroy_cq, "ibv_destroy_cq", 1)                                           \
  X(create_qp, "ibv_create_qp", 1)                                             \
  X(destroy_qp, "ibv_destroy_qp", 1)                                           \
  X(modify_qp, "ibv_modify_qp", 1)                                             \
  X(wc_status_str, "ibv_wc_status_str", 1)                                     \
  X(query_gid_ex, "_ibv_query_gid_ex", 0)                                      \
  X(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 0)

static hetccl_ib_verbs_t verbs;
static char load_error[512]; /* why loading failed; "" = loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void verbs_load(void) {
  void *h = dlopen(IB_VERBS_LIB, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    snprintf(load_error, sizeof(load_error), "cannot load %s (is rdma-core installed?): %s",
             IB_VERBS_LIB, e ? e : "unknown error");
    return;
  }
  /* A function pointer from a void *: POSIX guarantees the conversion. */
#define IB_VERBS_LOOKUP(member, sym, required)                                 \
  *(void **)&verbs.member = dlsym(h, sym);                                     \
  if (verbs.member == NULL && required) {                                      \
    snprintf(load_error, sizeof(load_error), "%s has no symbol %s", IB_VERBS_LIB, sym); \
    return;                                                                    \
  }
  IB_VERBS_SYMS(IB_VERBS_LOOKUP)
#undef IB_VERBS_LOOKUP
}

const hetccl_ib_verbs_t *hetccl_ib_verbs_try(void) {
  pthread_once(&load_once, verbs_load);
  if (load_error[0]) {
    TRACE(HETCCL_NET, "ib: %s", load_error);
    return NULL;
  }
  return &verbs;
}

ncclResult_t hetccl_ib_verbs_load(const hetccl_ib_verbs_t **out) {
  pthread_once(&load_once, verbs_load);
  if (load_error[0]) {
    WARN("ib: %s", load_error);
    return ncclSystemError;
  }
  *out = &verbs;
  return ncclSuccess;
}
