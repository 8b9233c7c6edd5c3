/* Which verbs devices, ports and GIDs a context uses, its rails (ib.h;
 * HETCCL_IB_HCA or NCCL_IB_HCA, read in ib_hca.c; HETCCL_IB_RAILS,
 * HETCCL_IB_GID_INDEX). Runs on the thread that creates the communicator;
 * only queries the devices. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ib/ib.h"
#include "transport/ib/ib_hca.h"
#include "transport/ib/ib_near.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

static const char *port_state_str(enum ibv_port_state s) {
  switch (s) {
  case IBV_PORT_DOWN: return "down";
  case IBV_PORT_INIT: return "init";
  case IBV_PORT_ARMED: return "armed";
  case IBV_PORT_ACTIVE: return "active";
  default: return "not active";
  }
}

/* verbs.h's ibv_query_port is an inline wrapper that calls the exported
 * ibv_query_port with the compat struct (a prefix of ibv_port_attr) when
 * the provider has no extended query: we call the exported function the
 * same way, with the whole struct zeroed. */
static int port_query(const hetccl_ib_verbs_t *v, struct ibv_context *c, uint8_t port,
                      struct ibv_port_attr *attr) {
  memset(attr, 0, sizeof(*attr));
  return v->query_port(c, port, (struct _compat_ibv_port_attr *)attr);
}

static int gid_is_v4_mapped(const union ibv_gid *g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

static int gid_is_zero(const union ibv_gid *g) {
  static const uint8_t zero[16];
  return memcmp(g->raw, zero, sizeof(zero)) == 0;
}

/* The default GID index: on Ethernet (RoCE), the first IPv4-mapped GID,
 * preferring RoCE v2 where the library can tell the type (v2 is routable;
 * v1 is not); else 0. */
static int gid_pick(const hetccl_ib_verbs_t *v, hetccl_ib_dev_t *dev, int tbl_len) {
  int v4_any = -1;
  if (dev->link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  for (int i = 0; i < tbl_len; i++) {
    union ibv_gid g;
    if (v->query_gid(dev->vctx, dev->port, i, &g) != 0 || gid_is_zero(&g) ||
        !gid_is_v4_mapped(&g))
      continue;
    if (v->query_gid_ex == NULL) return i;
    struct ibv_gid_entry e;
    memset(&e, 0, sizeof(e));
    if (v->query_gid_ex(dev->vctx, dev->port, (uint32_t)i, &e, 0, sizeof(e)) == 0 &&
        e.gid_type == IBV_GID_TYPE_ROCE_V2)
      return i;
    if (v4_any < 0) v4_any = i;
  }
  return v4_any >= 0 ? v4_any : 0;
}

/* First active port of an open device that `hca` allows; 0 if none.
 * Appends what it saw to `seen` for the message when nothing fits. */
static int port_find(const hetccl_ib_verbs_t *v, struct ibv_context *c, const char *name,
                     const hetccl_ib_hca_t *hca, struct ibv_port_attr *attr, char *seen,
                     size_t seen_len) {
  struct ibv_device_attr da;
  if (v->query_device(c, &da) != 0) return 0;
  for (int p = 1; p <= da.phys_port_cnt; p++) {
    if (!hetccl_ib_hca_allows(hca, name, p)) continue;
    size_t used = strlen(seen);
    if (port_query(v, c, (uint8_t)p, attr) != 0) {
      snprintf(seen + used, seen_len - used, " %s:%d (query failed)", name, p);
      continue;
    }
    snprintf(seen + used, seen_len - used, " %s:%d (%s)", name, p, port_state_str(attr->state));
    if (attr->state == IBV_PORT_ACTIVE) return p;
  }
  return 0;
}

/* Opens up to `max` devices that `hca` allows with an allowed active port:
 * fills each one's vctx, port, name and path type from `gpu` (the rank's
 * GPU's resolved sysfs path, "" for none), and attrs[i]. In the verbs
 * list's order, or, with near_wanted, where `gpu` places some of them
 * (ib_near.c), nearest first and only those as near as the first one
 * opened. Returns how many (what it saw is in `seen`, with each
 * device's distance when known), -1 if the devices cannot be listed.
 * *allowed counts the devices the list allows. */
static int dev_find(const hetccl_ib_verbs_t *v, const hetccl_ib_hca_t *hca, const char *gpu,
                    int near_wanted, hetccl_ib_dev_t *devs, struct ibv_port_attr *attrs, int max,
                    char *seen, size_t seen_len, int *allowed) {
  int ndev = 0, found = 0;
  struct ibv_device **list = v->get_device_list(&ndev);
  if (list == NULL) return -1;
  memset(devs, 0, (size_t)max * sizeof(*devs));
  *allowed = 0;
  struct ibv_device *ok[HETCCL_IB_NEAR_MAX];
  const char *names[HETCCL_IB_NEAR_MAX];
  for (int i = 0; i < ndev && *allowed < HETCCL_IB_NEAR_MAX; i++) {
    const char *name = v->get_device_name(list[i]);
    if (!hetccl_ib_hca_allows(hca, name, 0)) continue;
    ok[*allowed] = list[i];
    names[(*allowed)++] = name;
  }
  int order[HETCCL_IB_NEAR_MAX], dist[HETCCL_IB_NEAR_MAX], nearest = -1;
  int near = hetccl_ib_near_order(hetccl_knob_str(HETCCL_KNOB_SYSFS), near_wanted ? gpu : "",
                                  names, *allowed, order, dist);
  for (int k = 0; k < *allowed; k++) {
    int i = order[k];
    const char *name = names[i];
    if (found == max) continue; /* counted, not opened */
    if (near && found > 0 && dist[i] != nearest) {
      size_t used = strlen(seen);
      snprintf(seen + used, seen_len - used, " %s (distance %d from the GPU, not %d: left to "
               "ranks nearer it)", name, dist[i], nearest);
      continue;
    }
    struct ibv_context *c = v->open_device(ok[i]);
    if (c == NULL) {
      size_t used = strlen(seen);
      snprintf(seen + used, seen_len - used, " %s (cannot open: %s)", name, strerror(errno));
      continue;
    }
    int port = port_find(v, c, name, hca, &attrs[found], seen, seen_len);
    if (port != 0 && found > 0 && attrs[found].link_layer != attrs[0].link_layer) {
      /* Rail i meets the peer's rail i: one kind of fabric for all. */
      size_t used = strlen(seen);
      snprintf(seen + used, seen_len - used, " %s:%d (not %s like %s: not a rail)", name, port,
               attrs[0].link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
               devs[0].name);
      port = 0;
    }
    if (port == 0) {
      v->close_device(c);
      continue;
    }
    hetccl_ib_dev_t *dev = &devs[found++];
    dev->vctx = c;
    dev->port = (uint8_t)port;
    dev->distance = near ? dist[i] : -1;
    dev->path = -1;
    if (gpu && gpu[0]) {
      char nic[PATH_MAX];
      hetccl_ib_pci_path_of_dev(hetccl_knob_str(HETCCL_KNOB_SYSFS), name, nic, sizeof(nic));
      dev->path = hetccl_ib_pci_path_type(gpu, nic);
    }
    if (found == 1) nearest = dev->distance;
    snprintf(dev->name, sizeof(dev->name), "%s", name);
  }
  v->free_device_list(list);
  return found;
}

int hetccl_ib_dev_usable(void) {
  char seen[512] = "";
  const hetccl_ib_verbs_t *v = hetccl_ib_verbs_try();
  if (v == NULL) return 0;
  hetccl_ib_hca_t hca;
  if (hetccl_ib_hca_get(&hca) != ncclSuccess) return 0;
  hetccl_ib_dev_t dev;
  struct ibv_port_attr attr;
  int allowed;
  int found = dev_find(v, &hca, "", 0, &dev, &attr, 1, seen, sizeof(seen), &allowed);
  TRACE(HETCCL_NET | HETCCL_INIT, "ib: %s active port%s%s%s%s (found:%s)",
        found > 0 ? "an" : "no", hca.n ? " allowed by " : "", hca.n ? hca.knob : "",
        hca.n ? "=" : "", hca.spec, seen[0] ? seen : " none");
  if (found > 0) hetccl_ib_dev_close(v, &dev);
  return found > 0;
}

/* The port's addressing, and its GID (HETCCL_IB_GID_INDEX, else picked). */
static ncclResult_t dev_address(const hetccl_ib_verbs_t *v, int rank, hetccl_ib_dev_t *dev,
                                const struct ibv_port_attr *attr) {
  dev->link_layer = attr->link_layer;
  dev->mtu = (uint8_t)attr->active_mtu;
  dev->lid = attr->lid;
  int gid_index = (int)hetccl_knob_int(HETCCL_KNOB_IB_GID_INDEX);
  if (gid_index < 0) gid_index = gid_pick(v, dev, attr->gid_tbl_len);
  if (v->query_gid(dev->vctx, dev->port, gid_index, &dev->gid) != 0) {
    WARN("ib: rank %d: %s port %d has no GID at index %d (HETCCL_IB_GID_INDEX): %s", rank,
         dev->name, dev->port, gid_index, strerror(errno));
    return ncclSystemError;
  }
  dev->gid_index = gid_index;
  return ncclSuccess;
}

ncclResult_t hetccl_ib_devs_open(const hetccl_ib_verbs_t *v, int rank, const char *busid,
                                 hetccl_ib_dev_t *devs, int max, int *n) {
  char seen[1024] = "", gpu[PATH_MAX] = "";
  hetccl_ib_hca_t hca;
  HETCCL_CHECK(hetccl_ib_hca_get(&hca));
  struct ibv_port_attr attrs[IB_RAILS_MAX];
  int allowed;
  if (max > IB_RAILS_MAX) max = IB_RAILS_MAX;
  /* The GPU's place: for affinity (HETCCL_IB_NEAR) and for how far
   * GPUDirect may reach (HETCCL_IB_GDR_LEVEL, ib_devmem.c). */
  if (busid && busid[0])
    hetccl_ib_pci_path_of_busid(hetccl_knob_str(HETCCL_KNOB_SYSFS), busid, gpu, sizeof(gpu));
  int found = dev_find(v, &hca, gpu, (int)hetccl_knob_int(HETCCL_KNOB_IB_NEAR), devs, attrs, max,
                       seen, sizeof(seen), &allowed);
  if (found < 0) {
    WARN("ib: rank %d: cannot list verbs devices (no RDMA stack in this kernel?): %s", rank,
         strerror(errno));
    return ncclSystemError;
  }
  if (found == 0) {
    WARN("ib: rank %d: no verbs device with an active port%s%s%s%s (found:%s)", rank,
         hca.n ? " allowed by " : "", hca.n ? hca.knob : "", hca.n ? "=" : "", hca.spec,
         seen[0] ? seen : " none");
    return ncclSystemError;
  }
  if (allowed > found)
    INFO(HETCCL_NET | HETCCL_INIT, "ib rank %d: %d devices allowed%s%s%s%s, %d used (HETCCL_IB_RAILS "
         "= %d at most, each with an active port and the first one's link layer%s; seen:%s)", rank,
         allowed, hca.n ? " by " : "", hca.n ? hca.knob : "", hca.n ? "=" : "", hca.spec, found,
         max, devs[0].distance >= 0 ? ", the nearest the GPU" : "", seen[0] ? seen : " none");
  if (devs[0].distance >= 0) {
    char used[256] = "";
    for (int i = 0; i < found; i++) {
      size_t u = strlen(used);
      snprintf(used + u, sizeof(used) - u, "%s%s", i ? ", " : "", devs[i].name);
    }
    int d = devs[0].distance, apart = d >= HETCCL_IB_PCI_APART;
    INFO(HETCCL_NET | HETCCL_INIT, "ib rank %d: GPU %s takes %s, the nearest it on the PCI tree: "
         "%d step%s%s (HETCCL_IB_NEAR)", rank, busid, used, apart ? d - HETCCL_IB_PCI_APART : d,
         d == 1 ? "" : "s", apart ? " to its root complex and across to another" : " from it");
  }
  for (int i = 0; i < found; i++) {
    if (dev_address(v, rank, &devs[i], &attrs[i]) == ncclSuccess) continue;
    for (int j = 0; j < found; j++) hetccl_ib_dev_close(v, &devs[j]);
    return ncclSystemError;
  }
  *n = found;
  return ncclSuccess;
}

void hetccl_ib_dev_close(const hetccl_ib_verbs_t *v, hetccl_ib_dev_t *dev) {
  if (dev->vctx) v->close_device(dev->vctx);
  dev->vctx = NULL;
}
