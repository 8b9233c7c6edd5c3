/* Per-call cost of the NCCL API through a given library: the real NCCL, or
 * hetccl forwarding to it. Times calls that reach the library but start no
 * GPU work (ncclCommGetAsyncError; ncclAllReduce of 0 elements; a group
 * around it), so that the difference between two runs is the forwarding
 * overhead itself, free of kernel-launch and GPU timing noise.
 *
 *   gcc -O2 tools/device/overhead.c -ldl -o overhead
 *   ./overhead /path/to/libnccl.so.2      # the real library
 *   ./overhead build/libhetccl/libhetccl.so  (HETCCL_DEVICE=cuda, HETCCL_NCCL_LIBRARY=real)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*init_all_fn)(void **comms, int n, const int *devs);
typedef int (*async_fn)(void *comm, int *err);
typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*group_fn)(void);
typedef int (*destroy_fn)(void *);

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s LIBRARY [iterations]\n", argv[0]);
    return 2;
  }
  long iters = argc > 2 ? atol(argv[2]) : 1000000;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  init_all_fn init_all = (init_all_fn)dlsym(h, "ncclCommInitAll");
  async_fn async = (async_fn)dlsym(h, "ncclCommGetAsyncError");
  allreduce_fn allreduce = (allreduce_fn)dlsym(h, "ncclAllReduce");
  group_fn gstart = (group_fn)dlsym(h, "ncclGroupStart"), gend = (group_fn)dlsym(h, "ncclGroupEnd");
  destroy_fn destroy = (destroy_fn)dlsym(h, "ncclCommDestroy");
  void *comm = NULL;
  int rc = init_all(&comm, 1, NULL);
  if (rc) {
    fprintf(stderr, "ncclCommInitAll: %d\n", rc);
    return 1;
  }
  int err;
  float buf[1];
  for (int w = 0; w < 1000; w++) async(comm, &err);
  double t0 = now();
  for (long i = 0; i < iters; i++) async(comm, &err);
  double t1 = now();
  for (long i = 0; i < iters / 10; i++) allreduce(buf, buf, 0, 7, 0, comm, NULL);
  double t2 = now();
  for (long i = 0; i < iters / 10; i++) {
    gstart();
    allreduce(buf, buf, 0, 7, 0, comm, NULL);
    gend();
  }
  double t3 = now();
  printf("%-60s async_error %7.1f ns  allreduce(0) %7.1f ns  group+allreduce(0) %7.1f ns\n",
         argv[1], (t1 - t0) / iters * 1e9, (t2 - t1) / (iters / 10) * 1e9,
         (t3 - t2) / (iters / 10) * 1e9);
  destroy(comm);
  return 0;
}
