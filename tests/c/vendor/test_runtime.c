/* The device-runtime entries (libhetccl/runtime/host.c, cuda.c) with no GPU.
 *
 *   test_runtime MODE [FAKE_CUDART FAKE_DRIVER]
 *
 *   host     the host entry's slots; HETCCL_DEVICE=auto in a process that
 *            never loaded CUDA is a host rank (even where libcudart exists)
 *   nocuda   HETCCL_DEVICE=cuda where CUDA cannot run: current_device fails
 *            with a message naming the CUDA call or library, no crash
 *   fake     stand-in libcudart.so.13 and libcuda.so.1 loaded first (as
 *            PyTorch would): auto picks cuda, and the cuda entry reads the
 *            device, bus id, memory kinds and capture state through them
 *   ctx      only the stand-in driver loaded, with an active primary
 *            context: the process counts as using CUDA
 * Exit 0 pass, 1 fail. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "util/log.h"

static int failures;

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static void mode_host(void) {
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  EXPECT(rt && rt->kind == HETCCL_DEV_HOST && strcmp(rt->name, "host") == 0, "host table");
  EXPECT(strcmp(hetccl_dev_kind_name(HETCCL_DEV_CUDA), "cuda") == 0, "kind name");
  EXPECT(strcmp(hetccl_dev_kind_name((hetccl_dev_kind_t)99), "unknown") == 0, "bad kind name");
  EXPECT(hetccl_runtime_get(HETCCL_DEV_CUDA) == &hetccl_runtime_cuda, "cuda table");
  EXPECT(hetccl_runtime_get(HETCCL_DEV_HIP) == NULL, "no hip table yet");
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HOST, "auto without CUDA loaded is host");
  EXPECT(!hetccl_runtime_cuda.in_use(), "cuda in use without being loaded");
  void *a = NULL, *b = NULL;
  EXPECT(rt->mem_alloc(&a, 1000) == ncclSuccess && a, "mem_alloc");
  EXPECT(rt->host_alloc(&b, 0) == ncclSuccess && b, "host_alloc of 0");
  memset(a, 7, 1000);
  EXPECT(rt->memcpy_async(b, a, 0, NULL) == ncclSuccess, "copy of 0 bytes");
  rt->host_free(b);
  EXPECT(rt->host_alloc(&b, 1000) == ncclSuccess, "host_alloc");
  EXPECT(rt->memcpy_async(b, a, 1000, NULL) == ncclSuccess && memcmp(a, b, 1000) == 0, "copy");
  EXPECT(rt->stream_sync(NULL) == ncclSuccess, "sync");
  hetccl_mem_kind_t k = HETCCL_MEM_DEVICE;
  int dev = 5, capturing = 1;
  EXPECT(rt->mem_kind(a, &k, &dev) == ncclSuccess && k == HETCCL_MEM_HOST && dev == -1,
         "mem_kind %d dev %d", k, dev);
  EXPECT(rt->stream_capturing(NULL, &capturing) == ncclSuccess && !capturing, "capturing");
  char busid[32] = "x";
  EXPECT(rt->current_device(&dev, busid, sizeof(busid)) == ncclSuccess && dev == -1 && !busid[0],
         "current_device %d '%s'", dev, busid);
  rt->mem_free(a);
  rt->host_free(b);
  setenv("HETCCL_DEVICE", "host", 1);
}

static void mode_nocuda(void) {
  setenv("HETCCL_DEVICE", "cuda", 1);
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_CUDA, "HETCCL_DEVICE=cuda not honoured");
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_CUDA);
  int dev = -1;
  char busid[32];
  ncclResult_t res = rt->current_device(&dev, busid, sizeof(busid));
  EXPECT(res == ncclUnhandledCudaError, "current_device %d", res);
  const char *msg = hetccl_last_error();
  EXPECT(strstr(msg, "cuda") && (strstr(msg, "cudaGetDevice") || strstr(msg, "libcudart")),
         "message '%s'", msg);
  printf("as expected: %s\n", msg);
  EXPECT(!rt->available(), "CUDA available on a machine without a GPU?");
}

static void *preload(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  EXPECT(h != NULL, "dlopen %s: %s", path, dlerror());
  return h;
}

static void mode_fake(const char *cudart, const char *driver) {
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HOST, "cuda before CUDA was loaded");
  void *hd = preload(driver);
  preload(cudart);
  if (failures) return;
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_CUDA, "auto with libcudart loaded is not cuda");
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_CUDA);
  int dev = -1;
  char busid[32] = "";
  EXPECT(rt->current_device(&dev, busid, sizeof(busid)) == ncclSuccess && dev == 1 &&
             strcmp(busid, "0000:1b:00.0") == 0,
         "current_device %d '%s'", dev, busid);
  EXPECT(rt->set_device(0) == ncclSuccess, "set_device 0");
  EXPECT(rt->current_device(&dev, NULL, 0) == ncclSuccess && dev == 0, "device %d", dev);
  ncclResult_t res = rt->set_device(7);
  EXPECT(res == ncclUnhandledCudaError && strstr(hetccl_last_error(), "cudaSetDevice") &&
             strstr(hetccl_last_error(), "fake error"),
         "set_device 7: %d '%s'", res, hetccl_last_error());
  void *p = NULL;
  res = rt->mem_alloc(&p, 64);
  EXPECT(res == ncclUnhandledCudaError && strstr(hetccl_last_error(), "cudaMalloc"), "cudaMalloc");
  char *arena = dlsym(hd, "fake_device_arena");
  hetccl_mem_kind_t k;
  int kd = -5;
  EXPECT(rt->mem_kind(arena + 100, &k, &kd) == ncclSuccess && k == HETCCL_MEM_DEVICE && kd == 1,
         "device pointer: kind %d dev %d", k, kd);
  int local = 0;
  EXPECT(rt->mem_kind(&local, &k, &kd) == ncclSuccess && k == HETCCL_MEM_HOST && kd == -1,
         "host pointer: kind %d dev %d", k, kd);
  int capturing = 0;
  EXPECT(rt->stream_capturing((void *)1, &capturing) == ncclSuccess && capturing, "capturing");
  EXPECT(rt->stream_capturing(NULL, &capturing) == ncclSuccess && !capturing, "not capturing");
  char src[16] = "hello", dst[16] = "";
  EXPECT(rt->memcpy_async(dst, src, 6, NULL) == ncclSuccess && strcmp(dst, "hello") == 0, "copy");
}

static void mode_ctx(const char *driver) {
  EXPECT(!hetccl_runtime_cuda.in_use(), "in use before the driver was loaded");
  preload(driver);
  EXPECT(hetccl_runtime_cuda.in_use(), "active primary context not seen");
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  unsetenv("HETCCL_DEVICE");
  if (strcmp(mode, "host") == 0) mode_host();
  else if (strcmp(mode, "nocuda") == 0) mode_nocuda();
  else if (strcmp(mode, "fake") == 0 && argc > 3) mode_fake(argv[2], argv[3]);
  else if (strcmp(mode, "ctx") == 0 && argc > 3) mode_ctx(argv[3]);
  else {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  printf("%s: %s\n", mode, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
