/* HETCCL_IB_HCA / NCCL_IB_HCA, read as NCCL reads it (transport/ib/ib_hca.c):
 * every form of the list against device names and ports, and the values
 * that must be refused. No verbs device is needed: this is the selection
 * logic alone (tests/test_ib.py runs it against rxe0 in the VM).
 *
 * usage: test_ib_hca   (exit status 0 on success; prints every failure) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ib/ib_hca.h"

static int failures;

static void expect(const char *spec, const char *dev, int port, int want) {
  hetccl_ib_hca_t h;
  if (hetccl_ib_hca_parse("NCCL_IB_HCA", spec, &h) != ncclSuccess) {
    printf("FAIL: \"%s\" refused\n", spec);
    failures++;
    return;
  }
  int got = hetccl_ib_hca_allows(&h, dev, port);
  if (got != want) {
    printf("FAIL: \"%s\" allows %s port %d: %d, want %d\n", spec, dev, port, got, want);
    failures++;
  }
}

static void refused(const char *spec) {
  hetccl_ib_hca_t h;
  if (hetccl_ib_hca_parse("NCCL_IB_HCA", spec, &h) != ncclInvalidArgument) {
    printf("FAIL: \"%s\" accepted\n", spec);
    failures++;
  }
}

int main(void) {
  /* unset or empty: everything */
  expect(NULL, "mlx5_0", 1, 1);
  expect("", "rxe0", 0, 1);
  /* prefixes */
  expect("mlx5", "mlx5_0", 0, 1);
  expect("mlx5", "mlx5_1", 2, 1);
  expect("mlx5", "rxe0", 0, 0);
  expect("mlx5_1", "mlx5_10", 0, 1); /* NCCL's prefix rule: mlx5_1 names mlx5_10 too */
  /* exact */
  expect("=mlx5_1", "mlx5_10", 0, 0);
  expect("=mlx5_1", "mlx5_1", 0, 1);
  expect("=rxe0", "rxe", 0, 0);
  /* lists and ports */
  expect("mlx5_0:1,mlx5_1:1", "mlx5_1", 1, 1);
  expect("mlx5_0:1,mlx5_1:1", "mlx5_1", 2, 0);
  expect("mlx5_0:1,mlx5_1:1", "mlx5_1", 0, 1); /* the device, for one of its ports */
  expect("mlx5_0:1,mlx5_1:1", "mlx5_2", 0, 0);
  expect("rxe0:1", "rxe0", 1, 1);
  expect("rxe0:2", "rxe0", 1, 0);
  /* exclusion */
  expect("^mlx5_2", "mlx5_0", 1, 1);
  expect("^mlx5_2", "mlx5_2", 1, 0);
  expect("^mlx5_2", "mlx5_2", 0, 0);
  expect("^=mlx5_2", "mlx5_20", 0, 1);
  expect("^=mlx5_2", "mlx5_2", 0, 0);
  expect("^mlx5_2:1", "mlx5_2", 1, 0);
  expect("^mlx5_2:1", "mlx5_2", 2, 1); /* its other ports stay */
  expect("^mlx5_2:1", "mlx5_2", 0, 1); /* and so does the device */
  expect("^rxe0", "rxe0", 0, 0);
  /* malformed */
  refused("^");
  refused("=");
  refused("^=");
  refused("mlx5_0:");
  refused("mlx5_0:0");
  refused("mlx5_0:256");
  refused("mlx5_0:1x");
  refused(":1");
  refused("mlx5_0,,mlx5_1");
  refused("a_name_longer_than_sixty_three_characters_is_no_verbs_device_name_at_all");
  if (failures) {
    printf("%d failure(s)\n", failures);
    return 1;
  }
  printf("test_ib_hca: every case passed\n");
  return 0;
}
