/* A stand-in for libamdhip64, enough for the device-runtime tests to take
 * the hip entry's paths with no AMD GPU: two devices, device 1 selected;
 * "device", "managed" and "pinned host" memory are the addresses inside
 * the three arenas below. Built twice (hip5/, hip6/) with
 * FAKE_HIP_VERSION as HIP_VERSION (major * 10000000 + minor * 100000 +
 * patch), because the two number hipMemoryType differently:
 *   ROCm 5  host 0, device 1, array 2, unified 3, managed 4; no
 *           hipLaunchHostFunc (5.2 does not export it), and stream memory
 *           operations answer "not supported" (the fallback's path);
 *   ROCm 6  unregistered 0, host 1, device 2, managed 3, array 10,
 *           unified 11; stream memory operations work; device memory
 *           "exports" as a dma-buf (hipMemGetHandleForAddressRange): an
 *           anonymous memfd, which no NIC driver imports, or "not
 *           supported" when FAKE_HIP_DMABUF=refuse. */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

#define V6 (FAKE_HIP_VERSION >= 60000000)

#define ARENA (16 << 20)        /* hetccl stages in blocks of 1 MiB and more, in device */
#define PINNED_ARENA (16 << 20) /* memory too; freeing gives nothing back here */

/* page-aligned, as device allocations are (a dma-buf export takes whole pages) */
FAKE_EXPORT char fake_device_arena[ARENA] __attribute__((aligned(4096))), fake_managed_arena[4096],
    fake_pinned_arena[PINNED_ARENA];
FAKE_EXPORT int fake_callbacks, fake_host_funcs, fake_waits, fake_writes, fake_copies;
FAKE_EXPORT int fake_device_copies; /* those of fake_copies from device to device memory */

static int current = 1;
static size_t device_used, pinned_used;

static int inside(const void *p, const char *arena, size_t size) {
  return (const char *)p >= arena && (const char *)p < arena + size;
}

static int carve(void **p, size_t n, char *arena, size_t size, size_t *used) {
  size_t at = __atomic_fetch_add(used, (n + 63) & ~(size_t)63, __ATOMIC_RELAXED);
  if (at + n > size) return 2; /* hipErrorOutOfMemory */
  *p = arena + at;
  return 0;
}

FAKE_EXPORT const char *hipGetErrorString(int err) { return err ? "fake hip error" : "no error"; }
FAKE_EXPORT int hipGetLastError(void) { return 0; }
FAKE_EXPORT int hipRuntimeGetVersion(int *v) { *v = FAKE_HIP_VERSION; return 0; }
FAKE_EXPORT int hipGetDeviceCount(int *n) { *n = 2; return 0; }
FAKE_EXPORT int hipGetDevice(int *d) { *d = current; return 0; }
FAKE_EXPORT int hipSetDevice(int d) { if (d < 0 || d > 1) return 101; current = d; return 0; }
FAKE_EXPORT int hipDeviceGetPCIBusId(char *b, int len, int d) {
  strncpy(b, d ? "0000:C1:00.0" : "0000:0A:00.0", (size_t)len);
  return 0;
}
/* DEVICE_ORDINAL 9, MEMORY_TYPE 2, IS_MANAGED 8 (written as a one-byte bool);
 * memory HIP does not know: invalid value (1), as the real one answers. */
FAKE_EXPORT int hipPointerGetAttribute(void *data, int attr, void *p) {
  int dev = inside(p, fake_device_arena, ARENA), man = inside(p, fake_managed_arena, 4096),
      pin = inside(p, fake_pinned_arena, PINNED_ARENA);
  if (!dev && !man && !pin) {
    if (attr == 9) *(int *)data = -2;
    return 1;
  }
  if (attr == 9) *(int *)data = 1;
  /* managed memory reads as host memory here, as in ROCm: IS_MANAGED tells */
  if (attr == 2) *(uint32_t *)data = dev ? (V6 ? 2 : 1) : (V6 ? 1 : 0);
  if (attr == 8) *(unsigned char *)data = (unsigned char)man;
  return 0;
}
FAKE_EXPORT int hipMalloc(void **p, size_t n) { return carve(p, n, fake_device_arena, ARENA, &device_used); }
FAKE_EXPORT int hipFree(void *p) { (void)p; return 0; }
FAKE_EXPORT int hipHostMalloc(void **p, size_t n, unsigned f) {
  (void)f;
  return carve(p, n, fake_pinned_arena, PINNED_ARENA, &pinned_used);
}
FAKE_EXPORT int hipHostFree(void *p) { (void)p; return 0; }
FAKE_EXPORT int hipHostGetDevicePointer(void **d, void *h, unsigned f) { (void)f; *d = h; return 0; }
/* Registration and streams succeed and leave their flags for the test. */
FAKE_EXPORT unsigned fake_register_flags, fake_stream_flags;
FAKE_EXPORT int fake_registered, fake_streams;
static char fake_stream;
FAKE_EXPORT int hipHostRegister(void *p, size_t n, unsigned f) {
  (void)p; (void)n; fake_register_flags = f; fake_registered++; return 0;
}
FAKE_EXPORT int hipHostUnregister(void *p) { (void)p; fake_registered--; return 0; }
FAKE_EXPORT int fake_stream_priority;
FAKE_EXPORT int hipDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0; *greatest = -5; return 0;
}
FAKE_EXPORT int hipStreamCreateWithPriority(void **s, unsigned f, int prio) {
  fake_stream_flags = f; fake_stream_priority = prio; fake_streams++; *s = &fake_stream; return 0;
}
FAKE_EXPORT int hipStreamDestroy(void *s) { (void)s; fake_streams--; return 0; }
FAKE_EXPORT int hipMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) {
  (void)k; (void)st;
  __atomic_add_fetch(&fake_copies, 1, __ATOMIC_RELAXED);
  if (inside(d, fake_device_arena, ARENA) && inside(s, fake_device_arena, ARENA))
    __atomic_add_fetch(&fake_device_copies, 1, __ATOMIC_RELAXED);
  memmove(d, s, n);
  return 0;
}
FAKE_EXPORT int hipStreamSynchronize(void *s) { (void)s; return 0; }
FAKE_EXPORT int hipStreamIsCapturing(void *s, int *st) { *st = s == (void *)0x1 ? 1 : 0; return 0; }
static char fake_event;
FAKE_EXPORT int hipEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = &fake_event; return 0; }
FAKE_EXPORT int hipEventDestroy(void *e) { (void)e; return 0; }
FAKE_EXPORT int hipEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
FAKE_EXPORT int hipEventQuery(void *e) { return e == &fake_event ? 0 : 600; }
FAKE_EXPORT int hipStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; return 0; }
FAKE_EXPORT int hipStreamWaitValue64(void *s, void *p, uint64_t v, unsigned f, uint64_t m) {
  (void)s; (void)f;
  if (!V6) return 801;
  __atomic_add_fetch(&fake_waits, 1, __ATOMIC_RELAXED);
  struct timespec now, end, nap = {0, 1000};
  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += 60; /* at most a minute, then "invalid value" */
  do {
    if ((__atomic_load_n((volatile uint64_t *)p, __ATOMIC_ACQUIRE) & m) >= v) return 0;
    nanosleep(&nap, NULL);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (now.tv_sec < end.tv_sec);
  return 1;
}
FAKE_EXPORT int hipStreamWriteValue64(void *s, void *p, uint64_t v, unsigned f) {
  (void)s; (void)f;
  if (!V6) return 801;
  __atomic_add_fetch(&fake_writes, 1, __ATOMIC_RELAXED);
  __atomic_store_n((volatile uint64_t *)p, v, __ATOMIC_RELEASE);
  return 0;
}
FAKE_EXPORT int hipStreamAddCallback(void *s, void (*fn)(void *, int, void *), void *arg,
                                     unsigned f) {
  (void)f;
  fake_callbacks++;
  fn(s, 0, arg);
  return 0;
}
#if V6
FAKE_EXPORT int fake_dmabuf_exports;
FAKE_EXPORT int hipMemGetHandleForAddressRange(void *handle, void *p, size_t n, int type,
                                               unsigned long long flags) {
  (void)flags;
  const char *mode = getenv("FAKE_HIP_DMABUF");
  if (type != 1 || !inside(p, fake_device_arena, ARENA) || (mode && !strcmp(mode, "refuse")))
    return 801; /* hipErrorNotSupported */
  int fd = memfd_create("fake-dmabuf", 0);
  if (fd < 0) return 1;
  (void)n;
  fake_dmabuf_exports++;
  *(int *)handle = fd;
  return 0;
}
FAKE_EXPORT int hipLaunchHostFunc(void *s, void (*fn)(void *), void *arg) {
  (void)s;
  fake_host_funcs++;
  fn(arg);
  return 0;
}
#endif
