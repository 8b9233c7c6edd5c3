/* How a device rank's buffers reach the NIC: the branch each ib context of
 * a device rank takes, decided once at ctx_create and logged at INFO.
 *
 *   branch              when                                  bytes move by
 *   staged, registered  always, for every device buffer but    the GPU's copy engine into
 *                       the sends below                        pinned staging that core
 *                                                              declares as RDMA memory
 *                                                              (exec/devpath.c), then the NIC
 *                                                              by RDMA from it (ib_rdv.c):
 *                                                              no CPU copy for messages of
 *                                                              HETCCL_IB_ZCOPY_THRESHOLD
 *                                                              bytes and more; smaller ones
 *                                                              through ib's slots
 *   GPUDirect, dma-buf  the device runtime exports device      the NIC reading the device
 *                       memory as a dma-buf (runtime            buffer itself: sends from
 *                       dmabuf_export) and this device          device memory the user
 *                       imports it (ibv_reg_dmabuf_mr)          registered (ncclCommRegister,
 *   GPUDirect, peer     else: this device registers device      ncclCommWindowRegister) go
 *     memory            memory by its address (ibv_reg_mr:     unstaged, by RDMA WRITE at any
 *                       a peer-memory client such as            size (req->device_src); the
 *                       nvidia-peermem or amdgpu's is           receiver takes them by RDMA
 *                       loaded)                                 into registered memory; and
 *                                                              receives into registered
 *                                                              device memory of at least
 *                                                              ctx->ask_min bytes go
 *                                                              unstaged (req->device_dst),
 *                                                              the NIC writing them
 *
 * No GPUDirect branch is tried where a rail's NIC lies farther from the GPU
 * on the PCI tree than HETCCL_IB_GDR_LEVEL (else NCCL_NET_GDR_LEVEL; PXB,
 * NCCL's default) allows, by NCCL's path types (ib_near.h): across the
 * CPU's host bridge or another socket, peer-to-peer reads and writes of
 * GPU memory are often slower than the copy engine through host memory.
 * Where sysfs places not both (a VM's NIC), the trial decides alone.
 *
 * Each GPUDirect trial is real, not a version check: PROBE_BYTES of device
 * memory from the runtime, registered with this context's first protection
 * domain the branch's way, then released. Each step that fails names
 * itself in the INFO line (no export call in the driver, the device
 * refuses, the NIC driver refuses the import, HETCCL_IB_DMABUF=0,
 * HETCCL_IB_GDR=0). ctx->gdr keeps the branch: ib_reg.c registers device
 * ranges that way (ib_reg_attach's dma-buf runtime), and ctx_reaches
 * (ib_rdv.c) answers core from it. A receive can go unstaged only if its
 * sender never sends it eager pieces (a CPU copies those, and no CPU may
 * write device memory): with a GPUDirect branch and HETCCL_IB_GDR_RECV,
 * ctx->ask_min (published to the peers) is this rank's
 * HETCCL_IB_ZCOPY_THRESHOLD, and every peer asks first for a message of
 * that size or more (ib_rdv.c, "Receives into device memory"); smaller
 * receives stay staged.
 *
 * Threads: the thread that creates the context (the device is the one
 * current there, as at every other runtime call of init). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "transport/ib/ib.h"
#include "transport/ib/ib_near.h"
#include "util/knobs.h"
#include "util/log.h"

#define PROBE_BYTES (64u << 10)
#define DMABUF_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int dmabuf_wanted(void) {
  return (int)hetccl_knob_int(
      hetccl_knob_or_nccl(HETCCL_KNOB_IB_DMABUF, HETCCL_KNOB_NCCL_DMABUF_ENABLE));
}

static int gdr_wanted(void) { return (int)hetccl_knob_int(HETCCL_KNOB_IB_GDR); }

static int gdr_recv_wanted(void) { return (int)hetccl_knob_int(HETCCL_KNOB_IB_GDR_RECV); }

static int gdr_staging_wanted(void) { return (int)hetccl_knob_int(HETCCL_KNOB_IB_GDR_STAGING); }

/* Whether receives that land in device memory are read back through the
 * NIC before done (ib_flush.c), and how the line says it. */
static int flush_read_wanted(const hetccl_runtime_t *rt, char *how, size_t len) {
  int mode = hetccl_knob_enum(HETCCL_KNOB_IB_GDR_FLUSH);
  int native = (rt->caps & HETCCL_RT_CAP_NIC_FLUSH) != 0;
  int read = mode == HETCCL_KNOB_IB_GDR_FLUSH_read ||
             (mode == HETCCL_KNOB_IB_GDR_FLUSH_auto && !native);
  snprintf(how, len, "; the NIC's writes into device memory are %s",
           read && native ? "read back through it and flushed by the runtime"
           : read         ? "read back through it"
           : native       ? "flushed by the runtime"
                          : "not flushed (HETCCL_IB_GDR_FLUSH=off)");
  return read;
}

/* A word of HETCCL_IB_GDR_LEVEL / NCCL_NET_GDR_LEVEL as a path type of the
 * PCI tree (ib_near.h). */
static int path_level(int word) {
  switch (word) {
    case HETCCL_KNOB_IB_GDR_LEVEL_LOC: return HETCCL_IB_PATH_LOC;
    case HETCCL_KNOB_IB_GDR_LEVEL_PIX: return HETCCL_IB_PATH_PIX;
    case HETCCL_KNOB_IB_GDR_LEVEL_PXB: return HETCCL_IB_PATH_PXB;
    case HETCCL_KNOB_IB_GDR_LEVEL_PHB: return HETCCL_IB_PATH_PHB;
    default: return HETCCL_IB_PATH_SYS;
  }
}

/* 1 if every rail's NIC is near enough the GPU for GPUDirect RDMA
 * (HETCCL_IB_GDR_LEVEL, else NCCL_NET_GDR_LEVEL: NCCL's path types), or
 * its place is unknown; else 0 and why. A NIC across the CPU's host bridge
 * or another socket reads and writes GPU memory peer to peer through the
 * CPU, often far slower than the copy engine and host memory. */
static int level_allows(const hetccl_tctx_t *ctx, char *why, size_t len) {
  hetccl_knob_t knob =
      hetccl_knob_or_nccl(HETCCL_KNOB_IB_GDR_LEVEL, HETCCL_KNOB_NCCL_NET_GDR_LEVEL);
  int level = path_level(hetccl_knob_enum(knob));
  if (level == HETCCL_IB_PATH_LOC) {
    snprintf(why, len, "not tried (%s=LOC)", hetccl_knob_desc(knob)->env);
    return 0;
  }
  for (int r = 0; r < ctx->rails; r++) {
    const hetccl_ib_dev_t *d = &ctx->rail[r].dev;
    if (d->path > level) {
      snprintf(why, len, "not tried: %s is %s from the GPU, beyond %s=%s", d->name,
               hetccl_ib_path_name(d->path), hetccl_knob_desc(knob)->env,
               hetccl_ib_path_name(level));
      return 0;
    }
  }
  return 1;
}

/* 1 if device memory registers through dma-buf on ctx's domain; else 0 and
 * why. */
static int dmabuf_probe(hetccl_tctx_t *ctx, void *mem, char *why, size_t len) {
  const hetccl_runtime_t *rt = ctx->args.device;
  if (!dmabuf_wanted()) {
    snprintf(why, len, "not tried (HETCCL_IB_DMABUF=0 or NCCL_DMABUF_ENABLE=0)");
    return 0;
  }
  if (ctx->v->reg_dmabuf_mr == NULL) {
    snprintf(why, len, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 adds it)");
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
  return ok;
}

/* 1 if the device registers device memory by its address; else 0 and why. */
static int peermem_probe(hetccl_tctx_t *ctx, void *mem, char *why, size_t len) {
  struct ibv_mr *mr = ctx->v->reg_mr(ctx->rail[0].pd, mem, PROBE_BYTES, DMABUF_ACCESS);
  if (mr == NULL) {
    snprintf(why, len, "ibv_reg_mr on %s refused %s memory (no peer-memory client): %s",
             ctx->rail[0].dev.name, ctx->args.device->name, strerror(errno));
    return 0;
  }
  ctx->v->dereg_mr(mr);
  return 1;
}

void hetccl_ib_devmem_decide(hetccl_tctx_t *ctx) {
  const hetccl_runtime_t *rt = ctx->args.device;
  char dmabuf_why[384] = "", peer_why[256] = "";
  void *mem = NULL;
  ctx->gdr = IB_GDR_NONE;
  if (!gdr_wanted()) {
    snprintf(dmabuf_why, sizeof(dmabuf_why), "not tried (HETCCL_IB_GDR=0)");
  } else if (!level_allows(ctx, dmabuf_why, sizeof(dmabuf_why))) {
    /* too far on the PCI tree: the staged path */
  } else if (rt->mem_alloc(&mem, PROBE_BYTES) != ncclSuccess) {
    snprintf(dmabuf_why, sizeof(dmabuf_why), "%s could not allocate %u bytes to try it",
             rt->name, PROBE_BYTES);
    mem = NULL;
  } else if (dmabuf_probe(ctx, mem, dmabuf_why, sizeof(dmabuf_why))) {
    ctx->gdr = IB_GDR_DMABUF;
  } else if (peermem_probe(ctx, mem, peer_why, sizeof(peer_why))) {
    ctx->gdr = IB_GDR_PEERMEM;
  }
  if (mem) rt->mem_free(mem);
  ctx->ask_min = ctx->gdr != IB_GDR_NONE && gdr_recv_wanted() ? ctx->zcopy_min : 0;
  ctx->gdr_staging = ctx->gdr != IB_GDR_NONE && gdr_staging_wanted();
  char recv[192] = "", staging[256] = "", flush[128] = "";
  ctx->flush_read = ctx->ask_min && flush_read_wanted(rt, flush, sizeof(flush));
  if (ctx->ask_min)
    snprintf(recv, sizeof(recv), ", and receives of %zu bytes and more into registered device "
             "memory are written there by the NIC (its peers ask first)", ctx->ask_min);
  else if (ctx->gdr)
    snprintf(recv, sizeof(recv), "; receives into device memory are staged (HETCCL_IB_GDR_RECV=0)");
  if (ctx->gdr_staging)
    snprintf(staging, sizeof(staging), "; unregistered device memory: %s of %zu bytes and more "
             "staged in registered device memory (a copy on the GPU)",
             ctx->ask_min ? "sends and receives" : "sends", ctx->zcopy_min);
  else if (ctx->gdr)
    snprintf(staging, sizeof(staging), "; unregistered device memory staged in host memory "
             "(HETCCL_IB_GDR_STAGING=0)");
  const char *how = ctx->gdr == IB_GDR_DMABUF    ? "through dma-buf"
                    : ctx->gdr == IB_GDR_PEERMEM ? "by peer memory (ibv_reg_mr of device memory)"
                                                 : "off";
  INFO(HETCCL_INIT | HETCCL_NET, "ib rank %d: GPUDirect RDMA %s: %s device buffers reach %s "
       "through registered pinned staging (the GPU's copy engine, then RDMA WRITE without a CPU "
       "copy for messages of %zu bytes and more)%s%s%s%s; dma-buf: %s%s%s",
       ctx->rank_user, how, rt->name, ctx->rail[0].dev.name, ctx->zcopy_min,
       ctx->gdr ? ", but sends from registered device memory (ncclCommRegister) go unstaged, "
                  "the NIC reading them"
                : "",
       recv, staging, ctx->ask_min ? flush : "",
       ctx->gdr == IB_GDR_DMABUF ? "works" : dmabuf_why,
       peer_why[0] ? "; peer memory: " : "", peer_why);
}
