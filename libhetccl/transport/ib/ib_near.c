/* NIC affinity: which verbs devices an ib context takes, nearest its GPU
 * first, read from the PCI tree in sysfs (HETCCL_IB_NEAR; docs/transports.md,
 * "Which NICs a rank takes").
 *
 *   the rank                               its rails (ib.h) are
 *   a GPU rank, the distance of some       the devices at the least distance
 *     allowed device known                   among those it can open, in the
 *                                            verbs list's order, HETCCL_IB_RAILS
 *                                            at most; farther ones are left to
 *                                            the GPUs they are near
 *   a host rank; no distance known (a      the allowed devices in the verbs
 *     VM's virtual NIC, no sysfs);           list's order, HETCCL_IB_RAILS at
 *     HETCCL_IB_NEAR=0                       most (as before affinity)
 *
 * On a host of one NIC per GPU, each behind the same PCIe switch as its
 * GPU, every rank then takes its own NIC, as NCCL's topology search does,
 * where the list's order would have had every rank stripe over the same
 * first HETCCL_IB_RAILS devices, the others idle. Two NICs equally near
 * one GPU are both taken, and striped.
 *
 * Distance. A PCI function's resolved sysfs path names the bridges above
 * it, from its root complex down:
 *     /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:17:00.0
 * The distance of two functions is the number of steps up from one to the
 * lowest bridge above both and down to the other. Across root complexes
 * (pci0000:00 and pci0000:80: another socket, as NCCL's SYS) it is the
 * steps up to each root plus HETCCL_IB_PCI_APART, more than any path inside
 * one. The order is NCCL's PIX < PXB < PHB < SYS; the numbers are not
 * NCCL's.
 *
 * The paths: the GPU's from its bus id (<sysfs>/bus/pci/devices/<id>),
 * a NIC's from <sysfs>/class/infiniband/<name>/device, links resolved.
 * <sysfs> is HETCCL_SYSFS ("/sys"), which tests point at a tree of their
 * own (tests/c/transport/test_ib_near.c).
 *
 * No verbs here (ib_dev.c opens the devices in this order). */
#include "transport/ib/ib_near.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH (HETCCL_IB_PCI_APART / 2)

/* The components of `path` from its PCI root ("pci0000:00") down, into
 * parts (pointers into buf); returns their count, 0 if there is no root. */
static int pci_parts(const char *path, char *buf, size_t len, char **parts) {
  if (!path || !path[0] || strlen(path) >= len) return 0;
  strcpy(buf, path);
  int n = 0, rooted = 0;
  for (char *save = NULL, *tok = strtok_r(buf, "/", &save); tok && n < MAX_DEPTH;
       tok = strtok_r(NULL, "/", &save)) {
    if (!rooted) {
      rooted = strncmp(tok, "pci", 3) == 0 && isxdigit((unsigned char)tok[3]);
      if (!rooted) continue;
    }
    parts[n++] = tok;
  }
  return n;
}

int hetccl_ib_pci_distance(const char *a, const char *b) {
  char abuf[PATH_MAX], bbuf[PATH_MAX];
  char *ap[MAX_DEPTH], *bp[MAX_DEPTH];
  int an = pci_parts(a, abuf, sizeof(abuf), ap), bn = pci_parts(b, bbuf, sizeof(bbuf), bp);
  if (an == 0 || bn == 0) return -1;
  if (strcmp(ap[0], bp[0]) != 0) return HETCCL_IB_PCI_APART + (an - 1) + (bn - 1);
  int common = 1;
  while (common < an && common < bn && strcmp(ap[common], bp[common]) == 0) common++;
  return (an - common) + (bn - common);
}

int hetccl_ib_pci_path_type(const char *a, const char *b) {
  char abuf[PATH_MAX], bbuf[PATH_MAX];
  char *ap[MAX_DEPTH], *bp[MAX_DEPTH];
  int an = pci_parts(a, abuf, sizeof(abuf), ap), bn = pci_parts(b, bbuf, sizeof(bbuf), bp);
  if (an == 0 || bn == 0) return -1;
  if (strcmp(ap[0], bp[0]) != 0) return HETCCL_IB_PATH_SYS;
  int common = 1;
  while (common < an && common < bn && strcmp(ap[common], bp[common]) == 0) common++;
  if (common == 1) return HETCCL_IB_PATH_PHB; /* only the root complex above both */
  return an - common <= 2 && bn - common <= 2 ? HETCCL_IB_PATH_PIX : HETCCL_IB_PATH_PXB;
}

const char *hetccl_ib_path_name(int type) {
  static const char *const names[] = {"LOC", "PIX", "PXB", "PHB", "SYS"};
  return type >= 0 && type <= HETCCL_IB_PATH_SYS ? names[type] : "?";
}

static void resolve(const char *path, char *out, size_t len) {
  out[0] = '\0';
  char *real = realpath(path, NULL);
  if (real && strlen(real) < len) strcpy(out, real);
  free(real);
}

void hetccl_ib_pci_path_of_busid(const char *sysfs, const char *busid, char *out, size_t len) {
  char id[64], path[PATH_MAX];
  size_t i = 0;
  out[0] = '\0';
  if (!busid || !busid[0]) return;
  /* sysfs spells the domain in 4 digits, where some tools print 8. */
  const char *colon = strchr(busid, ':');
  if (colon && colon - busid > 4) busid = colon - 4;
  for (; busid[i] && i + 1 < sizeof(id); i++) id[i] = (char)tolower((unsigned char)busid[i]);
  id[i] = '\0';
  snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", sysfs, id);
  resolve(path, out, len);
}

void hetccl_ib_pci_path_of_dev(const char *sysfs, const char *name, char *out, size_t len) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/class/infiniband/%s/device", sysfs, name);
  resolve(path, out, len);
}

int hetccl_ib_near_order(const char *sysfs, const char *gpu, const char *const *names, int n,
                         int *order, int *dist) {
  int known = 0;
  for (int i = 0; i < n; i++) {
    char nic[PATH_MAX];
    dist[i] = -1;
    order[i] = i;
    if (!gpu || !gpu[0]) continue;
    hetccl_ib_pci_path_of_dev(sysfs, names[i], nic, sizeof(nic));
    dist[i] = hetccl_ib_pci_distance(gpu, nic);
    known |= dist[i] >= 0;
  }
  if (!known) return 0;
  /* Stable insertion sort: nearest first, unknown last, ties in list order. */
  for (int i = 1; i < n; i++) {
    int v = order[i], j = i;
    unsigned key = (unsigned)dist[v]; /* -1: the largest */
    while (j > 0 && (unsigned)dist[order[j - 1]] > key) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = v;
  }
  return 1;
}
