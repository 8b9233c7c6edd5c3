/* NIC affinity (transport/ib/ib_near.c): distances on the PCI tree and the
 * order a GPU rank takes its verbs devices in, against a sysfs tree this
 * test builds in a temporary directory (HETCCL_SYSFS's layout: devices/,
 * bus/pci/devices/ and class/infiniband/<name>/device as links), shaped as
 * a two-socket host with a PCIe switch per GPU:
 *
 *   pci0000:00 - 00:01.0 - 01:00.0 (switch) - 02:08.0 - 17:00.0  GPU 0
 *                                            - 02:00.0 - 18:00.0  mlx5_0
 *                                            - 02:0c.0 - 19:00.0  mlx5_3
 *              - 00:03.0 - 31:00.0 (switch) - 32:00.0 - 33:00.0  GPU 1
 *                                            - 32:04.0 - 34:00.0  mlx5_1
 *   pci0000:80 - 80:01.0 - 81:00.0                                mlx5_2
 *   rxe0: no device link (a software device)
 *
 * usage: test_ib_near   (exit status 0 on success; prints every failure)
 *        test_ib_near BUSID...   on this machine's /sys: each bus id's
 *        resolved path and the distance and path type of every pair (exit status 1 if
 *        one does not resolve under a PCI root); the GPU machine's check
 *        that real GPUs' bus ids resolve as the tree above does. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/ib/ib_near.h"

static int failures;
static char root[PATH_MAX];

#define CHECK(cond, ...)              \
  do {                                \
    if (!(cond)) {                    \
      printf("FAIL: " __VA_ARGS__);   \
      printf("\n");                   \
      failures++;                     \
    }                                 \
  } while (0)

static void mkdirs(const char *rel) {
  char path[2 * PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(path, 0755);
    *p = '/';
  }
  (void)mkdir(path, 0755);
}

/* link <root>/<rel> -> <root>/<target> */
static void link_to(const char *rel, const char *target) {
  char from[2 * PATH_MAX], to[2 * PATH_MAX];
  snprintf(from, sizeof(from), "%s/%s", root, rel);
  snprintf(to, sizeof(to), "%s/%s", root, target);
  if (symlink(to, from) != 0) {
    printf("FAIL: symlink %s: %s\n", from, strerror(errno));
    failures++;
  }
}

#define GPU0 "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:17:00.0"
#define GPU1 "devices/pci0000:00/0000:00:03.0/0000:31:00.0/0000:32:00.0/0000:33:00.0"
#define NIC0 "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:18:00.0"
#define NIC1 "devices/pci0000:00/0000:00:03.0/0000:31:00.0/0000:32:04.0/0000:34:00.0"
#define NIC2 "devices/pci0000:80/0000:80:01.0/0000:81:00.0"
#define NIC3 "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:0c.0/0000:19:00.0"

static void build_tree(void) {
  const char *dirs[] = {GPU0, GPU1, NIC0, NIC1, NIC2, NIC3, "bus/pci/devices",
                        "class/infiniband/mlx5_0", "class/infiniband/mlx5_1",
                        "class/infiniband/mlx5_2", "class/infiniband/mlx5_3",
                        "class/infiniband/rxe0"};
  for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) mkdirs(dirs[i]);
  link_to("bus/pci/devices/0000:17:00.0", GPU0);
  link_to("bus/pci/devices/0000:33:00.0", GPU1);
  link_to("class/infiniband/mlx5_0/device", NIC0);
  link_to("class/infiniband/mlx5_1/device", NIC1);
  link_to("class/infiniband/mlx5_2/device", NIC2);
  link_to("class/infiniband/mlx5_3/device", NIC3);
}

static void order_is(const char *what, const char *busid, const char *const *names, int n,
                     int want_known, const int *want_order, const int *want_dist) {
  char gpu[PATH_MAX];
  int order[HETCCL_IB_NEAR_MAX], dist[HETCCL_IB_NEAR_MAX];
  hetccl_ib_pci_path_of_busid(root, busid, gpu, sizeof(gpu));
  int known = hetccl_ib_near_order(root, gpu, names, n, order, dist);
  CHECK(known == want_known, "%s: known %d, want %d", what, known, want_known);
  for (int i = 0; i < n; i++) {
    CHECK(order[i] == want_order[i], "%s: order[%d] = %d (%s), want %d (%s)", what, i, order[i],
          names[order[i]], want_order[i], names[want_order[i]]);
    CHECK(dist[i] == want_dist[i], "%s: %s at distance %d, want %d", what, names[i], dist[i],
          want_dist[i]);
  }
}

static int real_tree(int argc, char **argv) {
  char paths[16][PATH_MAX];
  int n = argc - 1 < 16 ? argc - 1 : 16, bad = 0;
  for (int i = 0; i < n; i++) {
    hetccl_ib_pci_path_of_busid("/sys", argv[i + 1], paths[i], sizeof(paths[i]));
    int self = hetccl_ib_pci_distance(paths[i], paths[i]);
    printf("%s: %s%s\n", argv[i + 1], paths[i][0] ? paths[i] : "(not resolved)",
           self == 0 ? "" : " (no PCI root)");
    bad |= self != 0;
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      printf("distance %s - %s: %d (%s)\n", argv[i + 1], argv[j + 1],
             hetccl_ib_pci_distance(paths[i], paths[j]),
             hetccl_ib_path_name(hetccl_ib_pci_path_type(paths[i], paths[j])));
  return bad;
}

int main(int argc, char **argv) {
  if (argc > 1) return real_tree(argc, argv);
  /* Distances of paths alone. */
  CHECK(hetccl_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0",
                               "/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0") == 0,
        "a function is at distance 0 from itself");
  CHECK(hetccl_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0",
                               "/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.1") == 2,
        "two functions under one bridge: 2");
  CHECK(hetccl_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0",
                               "/sys/devices/pci0000:80/0000:80:01.0") ==
            HETCCL_IB_PCI_APART + 2,
        "one under each root complex: apart + 1 + 1");
  CHECK(hetccl_ib_pci_distance("", "/sys/devices/pci0000:00/0000:00:01.0") == -1,
        "an empty path is unknown");
  CHECK(hetccl_ib_pci_distance("/sys/devices/virtual/net/eth0",
                               "/sys/devices/pci0000:00/0000:00:01.0") == -1,
        "a path without a PCI root is unknown");

  /* NCCL's path types (HETCCL_IB_GDR_LEVEL), on the tree drawn above. */
  const char *gpu0 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:17:00.0";
  struct {
    const char *what, *nic;
    int want;
  } paths[] = {
      {"mlx5_0, behind GPU 0's switch", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                        "0000:02:00.0/0000:18:00.0", HETCCL_IB_PATH_PIX},
      {"a second function of GPU 0's card", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                            "0000:02:08.0/0000:17:00.1", HETCCL_IB_PATH_PIX},
      {"a NIC behind a second switch under GPU 0's", "/sys/devices/pci0000:00/0000:00:01.0/"
       "0000:01:00.0/0000:02:04.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", HETCCL_IB_PATH_PXB},
      {"mlx5_1, under another root port", "/sys/devices/pci0000:00/0000:00:03.0/0000:31:00.0/"
                                          "0000:32:04.0/0000:34:00.0", HETCCL_IB_PATH_PHB},
      {"mlx5_2, under the other root complex", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0",
       HETCCL_IB_PATH_SYS},
      {"a software device", "", -1},
  };
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
    int got = hetccl_ib_pci_path_type(gpu0, paths[i].nic);
    CHECK(got == paths[i].want, "GPU 0 to %s: %s, want %s", paths[i].what,
          hetccl_ib_path_name(got), hetccl_ib_path_name(paths[i].want));
    CHECK(hetccl_ib_pci_path_type(paths[i].nic, gpu0) == got, "%s: not symmetric",
          paths[i].what);
  }
  CHECK(!strcmp(hetccl_ib_path_name(HETCCL_IB_PATH_PXB), "PXB") &&
            !strcmp(hetccl_ib_path_name(-1), "?"),
        "path names");

  snprintf(root, sizeof(root), "%s/hetccl-near-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(root)) {
    printf("FAIL: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  build_tree();

  const char *names[] = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "rxe0"};
  /* GPU 0: its switch's two NICs (tie, list order), then GPU 1's through
   * the root complex, then the other socket's, then the unknown one. */
  const int apart = HETCCL_IB_PCI_APART;
  int o0[] = {0, 3, 1, 2, 4}, d0[] = {4, 8, apart + 6, 4, -1};
  order_is("GPU 0", "0000:17:00.0", names, 5, 1, o0, d0);
  /* The bus id as CUDA may print it: upper case, 8-digit domain. */
  order_is("GPU 0 (00000000:17:00.0)", "00000000:17:00.0", names, 5, 1, o0, d0);
  /* GPU 1: mlx5_1 beside it. */
  int o1[] = {1, 0, 3, 2, 4}, d1[] = {8, 4, apart + 6, 8, -1};
  order_is("GPU 1", "0000:33:00.0", names, 5, 1, o1, d1);
  /* A host rank, a bus id sysfs does not know, a list of unknown devices:
   * the list's order, nothing known. */
  int oid[] = {0, 1, 2, 3, 4}, dun[] = {-1, -1, -1, -1, -1};
  order_is("host rank", "", names, 5, 0, oid, dun);
  order_is("unknown bus id", "0000:99:00.0", names, 5, 0, oid, dun);
  const char *soft[] = {"rxe0", "rxe1"};
  order_is("software devices", "0000:17:00.0", soft, 2, 0, oid, dun);

  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  if (system(cmd) != 0) printf("note: could not remove %s\n", root);
  if (failures) printf("%d failures\n", failures);
  else printf("ib near: all checks passed\n");
  return failures ? 1 : 0;
}
