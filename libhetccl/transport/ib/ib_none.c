/* The ib transport of a build without <infiniband/verbs.h>: the table
 * exists (HETCCL_TRANSPORTS names it) and says why it cannot serve, and
 * user registrations register nothing (the shared no-op memory slots,
 * transport.h): no device can use them.
 * Any thread; no state. */
#include <stddef.h>

#include "transport/transport.h"
#include "util/log.h"

static int none_can_connect(const hetccl_peer_locality_t *me, const hetccl_peer_locality_t *peer) {
  (void)me;
  (void)peer;
  return 1; /* ctx_create says why not, with a message */
}

static ncclResult_t none_ctx_create(const hetccl_transport_args_t *args, hetccl_tctx_t **ctx,
                                    void *addr) {
  (void)ctx;
  (void)addr;
  WARN("ib: rank %d: hetccl was built without verbs headers (infiniband/verbs.h, from "
       "libibverbs-dev / rdma-core-devel); rebuild with them to use HETCCL_TRANSPORT=ib",
       hetccl_user_rank(args->user_ranks, args->rank));
  return ncclSystemError;
}

/* No context is ever made, so nothing below is reached. */
static ncclResult_t none_connect(hetccl_tctx_t *ctx, const uint8_t *use, const uint8_t *addrs,
                                 const hetccl_peer_locality_t *localities, hetccl_ep_t **eps) {
  (void)ctx; (void)use; (void)addrs; (void)localities; (void)eps;
  WARN("ib: built without verbs headers");
  return ncclInternalError;
}

static ncclResult_t none_post(hetccl_ep_t *ep, hetccl_req_t *req) {
  (void)ep; (void)req;
  WARN("ib: built without verbs headers");
  return ncclInternalError;
}

static ncclResult_t none_progress(hetccl_ep_t *ep, int *idle) {
  (void)ep;
  if (idle) *idle = 1;
  WARN("ib: built without verbs headers");
  return ncclInternalError;
}

/* Never chosen per pair; HETCCL_TRANSPORT=ib still reaches ctx_create. */
static int none_usable(void) { return 0; }

static void none_ep_close(hetccl_ep_t *ep) { (void)ep; }
static void none_ctx_destroy(hetccl_tctx_t *ctx) { (void)ctx; }

const hetccl_transport_t hetccl_transport_ib = {
    .name = "ib",
    .can_connect = none_can_connect,
    .ctx_create = none_ctx_create,
    .connect = none_connect,
    .isend = none_post,
    .irecv = none_post,
    .progress = none_progress,
    .ep_close = none_ep_close,
    .ctx_destroy = none_ctx_destroy,
    .usable = none_usable,
    .mem_register = hetccl_transport_mem_register_none,
    .mem_deregister = hetccl_transport_mem_deregister_none,
    .mem_allocated = hetccl_transport_mem_allocated_none,
    .mem_freed = hetccl_transport_mem_freed_none,
};
