/* How a device rank's buffers reach the NIC: the branch each ib context of
 * a device rank takes, decided once at ctx_create and logged at INFO.
 *
 *   branch               when                               bytes move by
 *   staged, registered   always (today's only data path)    the GPU's copy engine into
 *                                                           pinned staging that core
 *                                                           declares as RDMA memory
 *                                                           (core/devpath.c), then the NIC
 *                                                           by RDMA from it (ib_rdv.c):
 *                                                           no CPU copy for messages of
 *                                                           HETCCL_IB_ZCOPY_THRESHOLD
 *                                                           bytes and more (a reduction's
 *                                                           land in the receiver's bounce
 *                                                           buffer); smaller ones through
 *                                                           ib's slots
 *   GPUDirect (dma-buf)  probed: the device runtime exports  the NIC reading and writing
 *                        device memory as a dma-buf           device memory itself
 *                        (runtime dmabuf_export) and this
 *                        device imports it
 *                        (ibv_reg_dmabuf_mr)
 *
 * The probe is a real trial, not a version check: PROBE_BYTES of device
 * memory from the runtime, exported, registered with this context's
 * protection domain, then released. Each step that fails names itself in
 * the INFO line (no export call in the driver, the device refuses, the
 * NIC driver refuses the import, HETCCL_IB_DMABUF=0). The data path does
 * not use a passed probe yet: the line says so, and ctx->dmabuf records it
 * for that path and for `hetccl info`-style reports.
 *
 * Threads: the thread that creates the context (the device is the one
 * current there, as at every other runtime call of init). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "transport/ib/ib.h"
#include "util/knobs.h"
#include "util/log.h"

#define PROBE_BYTES (64u << 10)
#define DMABUF_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int dmabuf_wanted(void) {
  return (int)hetccl_knob_int(
      hetccl_knob_or_nccl(HETCCL_KNOB_IB_DMABUF, HETCCL_KNOB_NCCL_DMABUF_ENABLE));
}

/* 1 if device memory registers through dma-buf on ctx's domain; else 0 and
 * why. */
static int dmabuf_probe(hetccl_tctx_t *ctx, char *why, size_t len) {
  const hetccl_runtime_t *rt = ctx->args.device;
  if (!dmabuf_wanted()) {
    snprintf(why, len, "not tried (HETCCL_IB_DMABUF=0 or NCCL_DMABUF_ENABLE=0)");
    return 0;
  }
  if (ctx->v->reg_dmabuf_mr == NULL) {
    snprintf(why, len, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 adds it)");
    return 0;
  }
  void *mem = NULL;
  if (rt->mem_alloc(&mem, PROBE_BYTES) != ncclSuccess) {
    snprintf(why, len, "%s could not allocate %u bytes to try it", rt->name, PROBE_BYTES);
    return 0;
  }
  int fd = -1, ok = 0;
  uint64_t offset = 0;
  if (rt->dmabuf_export(mem, PROBE_BYTES, &fd, &offset, why, len)) {
    struct ibv_mr *mr = ctx->v->reg_dmabuf_mr(ctx->rail[0].pd, offset, PROBE_BYTES,
                                              (uint64_t)(uintptr_t)mem, fd, DMABUF_ACCESS);
    if (mr) {
      ok = 1;
      ctx->v->dereg_mr(mr);
    } else {
      snprintf(why, len, "ibv_reg_dmabuf_mr on %s refused %s memory: %s", ctx->rail[0].dev.name,
               rt->name, strerror(errno));
    }
    close(fd);
  }
  rt->mem_free(mem);
  return ok;
}

void hetccl_ib_devmem_decide(hetccl_tctx_t *ctx) {
  char why[384] = "";
  ctx->dmabuf = dmabuf_probe(ctx, why, sizeof(why));
  if (ctx->dmabuf)
    snprintf(why, sizeof(why), "works here (a %u-byte trial registration passed), not yet used "
             "by the data path", PROBE_BYTES);
  INFO(HETCCL_INIT | HETCCL_NET, "ib rank %d: %s device buffers reach %s through registered "
       "pinned staging (the GPU's copy engine, then RDMA WRITE without a CPU copy for "
       "messages of %zu bytes and more); "
       "GPUDirect RDMA through dma-buf: %s",
       ctx->rank_user, ctx->args.device->name, ctx->rail[0].dev.name, ctx->zcopy_min, why);
}
