/* Buffers and streams: host memory, or CUDA memory through a libcudart
 * found at run time (so the binary needs no CUDA to build or to run on
 * host memory). A CUDA failure ends the program: a benchmark that cannot
 * allocate or copy has nothing to report. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "perf.h"

#define PERF_HUGE_FROM (4u << 20) /* numpy's threshold for MADV_HUGEPAGE */
#define PERF_HUGE_PAGE (2u << 20)
#define CUDA_MEMCPY_DEFAULT 4
#define CUDA_STREAM_NON_BLOCKING 1

static struct {
  enum perf_mem_kind kind;
  void *handle;
  int (*SetDevice)(int);
  int (*GetDeviceCount)(int *);
  int (*Malloc)(void **, size_t);
  int (*Free)(void *);
  int (*Memcpy)(void *, const void *, size_t, int);
  int (*StreamCreateWithFlags)(cudaStream_t *, unsigned int);
  int (*StreamDestroy)(cudaStream_t);
  int (*StreamSynchronize)(cudaStream_t);
  const char *(*GetErrorString)(int);
  int (*DeviceGetPCIBusId)(char *, int, int);
} cuda;

static void cuda_check(int err, const char *what)
{
  if (err == 0)
    return;
  fprintf(stderr, "hetccl-perf: %s failed: %s (%d)\n", what,
          cuda.GetErrorString ? cuda.GetErrorString(err) : "?", err);
  exit(1);
}

static int cuda_load(void)
{
  const char *names[] = {getenv("HETCCL_PERF_CUDART"), "libcudart.so", "libcudart.so.13",
                         "libcudart.so.12"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !cuda.handle; i++)
    if (names[i] && *names[i])
      cuda.handle = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
  if (!cuda.handle) {
    fprintf(stderr, "hetccl-perf: --mem_type cuda needs libcudart.so (.13, .12) on the library "
                    "path or $HETCCL_PERF_CUDART: %s\n", dlerror());
    return -1;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
    {(void **)&cuda.SetDevice, "cudaSetDevice"},
    {(void **)&cuda.GetDeviceCount, "cudaGetDeviceCount"},
    {(void **)&cuda.Malloc, "cudaMalloc"},
    {(void **)&cuda.Free, "cudaFree"},
    {(void **)&cuda.Memcpy, "cudaMemcpy"},
    {(void **)&cuda.StreamCreateWithFlags, "cudaStreamCreateWithFlags"},
    {(void **)&cuda.StreamDestroy, "cudaStreamDestroy"},
    {(void **)&cuda.StreamSynchronize, "cudaStreamSynchronize"},
    {(void **)&cuda.GetErrorString, "cudaGetErrorString"},
    {(void **)&cuda.DeviceGetPCIBusId, "cudaDeviceGetPCIBusId"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(cuda.handle, syms[i].name);
    if (!*syms[i].slot) {
      fprintf(stderr, "hetccl-perf: libcudart has no %s\n", syms[i].name);
      return -1;
    }
  }
  return 0;
}

int perf_mem_init(enum perf_mem_kind kind)
{
  cuda.kind = kind;
  return kind == PERF_MEM_CUDA ? cuda_load() : 0;
}

int perf_mem_device_count(void)
{
  int n = 0;
  if (cuda.kind == PERF_MEM_CUDA)
    cuda_check(cuda.GetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}

void perf_mem_set_device(int dev)
{
  if (cuda.kind == PERF_MEM_CUDA)
    cuda_check(cuda.SetDevice(dev), "cudaSetDevice");
}

void *perf_mem_alloc(size_t bytes)
{
  void *p = NULL;
  if (bytes == 0)
    bytes = 1;
  if (cuda.kind == PERF_MEM_CUDA) {
    cuda_check(cuda.Malloc(&p, bytes), "cudaMalloc");
    return p;
  }
  /* Large buffers as numpy makes them (and so the OpenMPI peer's,
   * tools/peers/mpi_bench.py): from 4 MiB on, 2 MiB-aligned and advised to
   * use transparent huge pages. It matters for what the kernel does per
   * page, e.g. process_vm_readv pins each page it copies. */
  size_t align = bytes >= PERF_HUGE_FROM ? PERF_HUGE_PAGE : 4096;
  bytes = (bytes + align - 1) & ~(align - 1);
  p = aligned_alloc(align, bytes);
  if (!p) {
    fprintf(stderr, "hetccl-perf: cannot allocate %zu bytes of host memory\n", bytes);
    exit(1);
  }
#ifdef MADV_HUGEPAGE
  if (align == PERF_HUGE_PAGE)
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice only: no THP is fine */
#endif
  memset(p, 0, bytes); /* touch the pages before timing */
  return p;
}

void perf_mem_free(void *ptr)
{
  if (cuda.kind == PERF_MEM_CUDA)
    cuda.Free(ptr);
  else
    free(ptr);
}

void perf_mem_to_device(void *dst, const void *src, size_t bytes)
{
  if (bytes == 0 || dst == src)
    return;
  if (cuda.kind == PERF_MEM_CUDA)
    cuda_check(cuda.Memcpy(dst, src, bytes, CUDA_MEMCPY_DEFAULT), "cudaMemcpy");
  else
    memcpy(dst, src, bytes);
}

void perf_mem_to_host(void *dst, const void *src, size_t bytes)
{
  perf_mem_to_device(dst, src, bytes);
}

cudaStream_t perf_mem_stream_create(void)
{
  cudaStream_t s = NULL;
  if (cuda.kind == PERF_MEM_CUDA)
    cuda_check(cuda.StreamCreateWithFlags(&s, CUDA_STREAM_NON_BLOCKING), "cudaStreamCreate");
  return s;
}

void perf_mem_stream_destroy(cudaStream_t stream)
{
  if (cuda.kind == PERF_MEM_CUDA && stream)
    cuda.StreamDestroy(stream);
}

void perf_mem_stream_sync(cudaStream_t stream)
{
  if (cuda.kind == PERF_MEM_CUDA)
    cuda_check(cuda.StreamSynchronize(stream), "cudaStreamSynchronize");
}

void perf_mem_device_name(int dev, char *buf, size_t len)
{
  if (cuda.kind != PERF_MEM_CUDA || dev < 0) {
    snprintf(buf, len, "host");
    return;
  }
  if (cuda.DeviceGetPCIBusId(buf, (int)len, dev) != 0)
    snprintf(buf, len, "cuda:%d", dev);
}
