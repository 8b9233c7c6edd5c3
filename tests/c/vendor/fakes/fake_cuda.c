/* Stand-ins for the CUDA runtime (libcudart.so.13) and driver
 * (libcuda.so.1), enough for the device-runtime tests to take the cuda
 * entry's paths with no GPU: two devices, device 1 selected, and "device
 * memory" being the addresses inside fake_device_arena. Device 1's primary
 * context is active, unless FAKE_CUDA_NO_CONTEXT is set (a process that
 * loaded CUDA and never used it: a CUDA build of PyTorch on CPU tensors).
 * fake_device_counts and fake_inits count what would initialise CUDA. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

#ifdef FAKE_CUDART
static int current = 1;
FAKE_EXPORT const char *cudaGetErrorString(int err) { return err ? "fake error" : "no error"; }
FAKE_EXPORT int cudaGetLastError(void) { return 0; }
FAKE_EXPORT int fake_device_counts;
FAKE_EXPORT int cudaGetDeviceCount(int *n) { fake_device_counts++; *n = 2; return 0; }
FAKE_EXPORT int cudaGetDevice(int *d) { *d = current; return 0; }
FAKE_EXPORT int cudaSetDevice(int d) { if (d < 0 || d > 1) return 101; current = d; return 0; }
FAKE_EXPORT int cudaDeviceGetPCIBusId(char *b, int len, int d) {
  strncpy(b, d ? "0000:1B:00.0" : "0000:0A:00.0", (size_t)len);
  return 0;
}
FAKE_EXPORT int cudaMalloc(void **p, size_t n) { (void)p; (void)n; return 2; }
FAKE_EXPORT int cudaFree(void *p) { (void)p; return 0; }
FAKE_EXPORT int cudaMallocHost(void **p, size_t n) { (void)p; (void)n; return 2; }
FAKE_EXPORT int cudaFreeHost(void *p) { (void)p; return 0; }
FAKE_EXPORT int cudaMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) {
  (void)k; (void)st; memmove(d, s, n); return 0;
}
FAKE_EXPORT int cudaStreamSynchronize(void *s) { (void)s; return 0; }
FAKE_EXPORT int cudaStreamIsCapturing(void *s, int *st) { *st = s == (void *)0x1 ? 1 : 0; return 0; }
/* Events complete at once; pinned allocations fail as cudaMallocHost does. */
static char fake_event;
FAKE_EXPORT int cudaEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = &fake_event; return 0; }
FAKE_EXPORT int cudaEventDestroy(void *e) { (void)e; return 0; }
FAKE_EXPORT int cudaEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
FAKE_EXPORT int cudaEventQuery(void *e) { (void)e; return 0; }
FAKE_EXPORT int cudaStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; return 0; }
FAKE_EXPORT int cudaHostAlloc(void **p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return 2; }
FAKE_EXPORT int cudaHostGetDevicePointer(void **d, void *h, unsigned f) { (void)f; *d = h; return 0; }
FAKE_EXPORT int cudaLaunchHostFunc(void *s, void (*fn)(void *), void *arg) { (void)s; fn(arg); return 0; }
/* Registration and streams succeed and leave their flags for the test. */
FAKE_EXPORT unsigned fake_register_flags, fake_stream_flags;
FAKE_EXPORT int fake_registered, fake_streams;
FAKE_EXPORT int cudaHostRegister(void *p, size_t n, unsigned f) {
  (void)p; (void)n; fake_register_flags = f; fake_registered++; return 0;
}
FAKE_EXPORT int cudaHostUnregister(void *p) { (void)p; fake_registered--; return 0; }
FAKE_EXPORT int fake_stream_priority;
FAKE_EXPORT int cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0; *greatest = -5; return 0;
}
FAKE_EXPORT int cudaStreamCreateWithPriority(void **s, unsigned f, int prio) {
  fake_stream_flags = f; fake_stream_priority = prio; fake_streams++; *s = &fake_event; return 0;
}
FAKE_EXPORT int cudaStreamDestroy(void *s) { (void)s; fake_streams--; return 0; }
#endif

#ifdef FAKE_DRIVER
FAKE_EXPORT char fake_device_arena[4096];
FAKE_EXPORT int fake_inits;
FAKE_EXPORT int cuInit(unsigned f) { (void)f; fake_inits++; return 0; }
FAKE_EXPORT int cuGetErrorString(int e, const char **s) { (void)e; *s = "fake driver error"; return 0; }
FAKE_EXPORT int cuCtxGetCurrent(void **c) { *c = NULL; return 0; }
FAKE_EXPORT int cuDeviceGetCount(int *n) { *n = 2; return 0; }
FAKE_EXPORT int cuDeviceGet(int *d, int o) { *d = o; return 0; }
FAKE_EXPORT int cuDevicePrimaryCtxGetState(int d, unsigned *f, int *a) {
  *f = 0; *a = d == 1 && !getenv("FAKE_CUDA_NO_CONTEXT"); return 0;
}
FAKE_EXPORT int cuPointerGetAttributes(unsigned n, int *attrs, void **data, unsigned long long p) {
  int inside = p >= (uintptr_t)fake_device_arena && p < (uintptr_t)fake_device_arena + 4096;
  for (unsigned i = 0; i < n; i++) {
    if (attrs[i] == 2) *(unsigned *)data[i] = inside ? 2 : 0;  /* MEMORY_TYPE */
    if (attrs[i] == 9) *(int *)data[i] = inside ? 1 : -2;      /* DEVICE_ORDINAL */
    if (attrs[i] == 8) *(unsigned char *)data[i] = 0;          /* IS_MANAGED (bool) */
  }
  return 0;
}
#endif
