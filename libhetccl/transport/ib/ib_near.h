/* Which of the verbs devices a rank may use lie nearest its GPU on the PCI
 * tree (the table and the distance are at the top of ib_near.c). No verbs
 * types here: built in every configuration, unit-tested
 * (tests/c/transport/test_ib_near.c). */
#ifndef HETCCL_TRANSPORT_IB_NEAR_H
#define HETCCL_TRANSPORT_IB_NEAR_H

#include <stddef.h>

/* Allowed devices considered per rank, at most. */
#define HETCCL_IB_NEAR_MAX 64
/* Added to the distance of two functions under different root complexes:
 * more than any path under one (at most 32 levels each side are read). */
#define HETCCL_IB_PCI_APART 64

/* Steps on the PCI tree between two PCI functions given as resolved sysfs
 * paths ("/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0"): up from one
 * to the closest bridge above both, and down to the other; under different
 * root complexes, HETCCL_IB_PCI_APART + the steps up to each root. -1
 * where either is empty or not under a PCI root ("pci" and a domain). */
int hetccl_ib_pci_distance(const char *a, const char *b);

/* NCCL's path types between a GPU and a NIC, nearest first (NCCL_NET_GDR_LEVEL's
 * words; LOC, no path at all, is 0). */
enum { HETCCL_IB_PATH_LOC = 0, HETCCL_IB_PATH_PIX = 1, HETCCL_IB_PATH_PXB = 2,
       HETCCL_IB_PATH_PHB = 3, HETCCL_IB_PATH_SYS = 4 };

/* The path type between two PCI functions given as resolved sysfs paths:
 * SYS under different root complexes; PHB under one root complex with no
 * bridge in common below it (the path goes through the host bridge: the
 * CPU); else through the lowest bridge above both: PIX when each is at
 * most two steps below it (one switch between them, or functions of one
 * card), PXB when farther (several switches). -1 where either is empty or
 * not under a PCI root. */
int hetccl_ib_pci_path_type(const char *a, const char *b);
/* "LOC", "PIX", "PXB", "PHB", "SYS"; "?" for anything else. */
const char *hetccl_ib_path_name(int type);

/* The resolved sysfs path of the PCI function with bus id `busid`
 * ("0000:1b:00.0"; any case) under sysfs root `sysfs` ("/sys"), into out;
 * "" where it cannot be resolved. */
void hetccl_ib_pci_path_of_busid(const char *sysfs, const char *busid, char *out, size_t len);
/* The same for verbs device `name` (<sysfs>/class/infiniband/<name>/device). */
void hetccl_ib_pci_path_of_dev(const char *sysfs, const char *name, char *out, size_t len);

/* The order in which a rank takes the n devices `names` (the verbs list's
 * order, already filtered by HETCCL_IB_HCA): order[] gets indices into
 * names, nearest the PCI function `gpu` first (its resolved sysfs path; ""
 * for a host rank), devices at equal distance and those whose distance is
 * unknown (last) in list order; dist[i] is names[i]'s distance, -1 unknown.
 * Returns 1 if some distance is known (then a rank takes only devices at
 * the least distance among those it can open), 0 if none is (then it takes
 * them in list order, as without a GPU). */
int hetccl_ib_near_order(const char *sysfs, const char *gpu, const char *const *names, int n,
                         int *order, int *dist);

#endif
