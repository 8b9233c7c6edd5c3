/* The device-runtime entries (libhetccl/runtime/host.c, cuda.c, hip.c)
 * with no GPU.
 *
 *   test_runtime MODE [FAKE_CUDART FAKE_DRIVER | FAKE_HIP]
 *
 *   host     every table registered with its caps; the host entry's slots
 *            and its "unsupported" stubs; HETCCL_DEVICE=auto in a process
 *            that never loaded CUDA is a host rank (even where libcudart
 *            exists)
 *   nocuda   HETCCL_DEVICE=cuda where CUDA cannot run: current_device fails
 *            with a message naming the CUDA call or library, no crash
 *   fake     stand-in libcudart.so.13 and libcuda.so.1 loaded first (as
 *            PyTorch would): auto picks cuda, and the cuda entry reads the
 *            device, bus id, memory kinds and capture state through them,
 *            registers host memory and creates streams with their flags
 *   ctx      only the stand-in driver loaded, with an active primary
 *            context: the process counts as using CUDA
 *   absent   the stand-in libcudart loaded, its driver not (yet): asking
 *            again and again whether a runtime holds memory searches the
 *            loaded libraries once, and a driver loaded later is seen
 *   hipsys   HETCCL_DEVICE=hip with whatever HIP this machine has and no AMD
 *            GPU: current_device fails with a message naming the HIP call
 *            (libamdhip64 loaded: every symbol resolved, 0 devices) or the
 *            library that could not be loaded; no crash
 *   hipfake  a stand-in libamdhip64.so.N loaded first (ROCm 5 or 6
 *            numbering, by its hipRuntimeGetVersion): auto picks hip, and
 *            the hip entry reads the device, bus id, memory kinds in that
 *            version's numbering, and moves counters on a stream (stream
 *            memory operations on 6, the host-callback fallback on 5)
 * The host mode also checks that asking the kind of a process that never
 * loaded HIP leaves libamdhip64 unloaded (it is installed on some of our
 * machines). Exit 0 pass, 1 fail. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int find_hip(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  return info->dlpi_name && strstr(info->dlpi_name, "libamdhip64") != NULL;
}

/* Is any libamdhip64 mapped in this process? */
static int hip_mapped(void) { return dl_iterate_phdr(find_hip, NULL); }

/* Every table registered (every slot filled), with the caps it claims; the
 * host's missing slots are stubs that WARN naming the runtime and slot. */
static void check_tables(void) {
  for (int k = 0; k < HETCCL_DEV_COUNT; k++)
    EXPECT(hetccl_runtime_get((hetccl_dev_kind_t)k) != NULL, "kind %d not registered", k);
  const unsigned gpu = HETCCL_RT_CAP_STREAMS | HETCCL_RT_CAP_HOST_REGISTER;
  EXPECT(hetccl_runtime_host.caps == 0, "host caps %#x", hetccl_runtime_host.caps);
  /* CUDA flushes a NIC's writes itself (cuFlushGPUDirectRDMAWrites); HIP
   * has no call for it, so ib reads them back (transport/ib/ib_flush.c) */
  EXPECT(hetccl_runtime_cuda.caps == (gpu | HETCCL_RT_CAP_NIC_FLUSH), "cuda caps %#x",
         hetccl_runtime_cuda.caps);
  EXPECT(hetccl_runtime_hip.caps == gpu, "hip caps %#x", hetccl_runtime_hip.caps);
  const hetccl_runtime_t *rt = &hetccl_runtime_host;
  void *event = NULL, *dev = NULL;
  char page[64];
  EXPECT(rt->event_create(&event) == ncclInvalidUsage && !event &&
             strstr(hetccl_last_error(), "host runtime: event_create is not supported"),
         "host event_create: '%s'", hetccl_last_error());
  EXPECT(rt->host_register(page, sizeof(page), &dev) == ncclInvalidUsage && !dev &&
             strstr(hetccl_last_error(), "host runtime: host_register"),
         "host host_register: '%s'", hetccl_last_error());
  /* No device reductions anywhere yet: "no" without a WARN, and why. */
  for (int k = 0; k < HETCCL_DEV_COUNT; k++) {
    const hetccl_runtime_t *r = hetccl_runtime_get((hetccl_dev_kind_t)k);
    char why[128] = "";
    hetccl_last_error_clear();
    EXPECT(r->reduce_available(why, sizeof(why)) == 0 && why[0], "%s reduce_available", r->name);
    EXPECT(r->reduce_async(NULL, page, page, page, 1, HETCCL_REDUCE_FINISH, NULL) ==
                   ncclInvalidUsage && !hetccl_last_error()[0],
           "%s reduce_async: '%s'", r->name, hetccl_last_error());
  }
}

/* host_register maps for every device (portable) and into the device
 * (mapped), and gives the device address; stream_create asks for a stream
 * that does not wait on the legacy default stream, at the greatest
 * priority when urgent. handle: the stand-in
 * runtime, which keeps the flags it was given. */
static void check_register_and_streams(const hetccl_runtime_t *rt, void *handle) {
  static char segment[4096];
  void *dev = NULL, *stream = NULL;
  int *registered = dlsym(handle, "fake_registered"), *streams = dlsym(handle, "fake_streams");
  unsigned *reg_flags = dlsym(handle, "fake_register_flags");
  unsigned *stream_flags = dlsym(handle, "fake_stream_flags");
  EXPECT(registered && streams && reg_flags && stream_flags, "stand-in counters");
  if (failures) return;
  EXPECT(rt->host_register(segment, sizeof(segment), &dev) == ncclSuccess && dev == segment &&
             *reg_flags == 0x3 && *registered == 1,
         "%s host_register: dev %p flags %#x", rt->name, dev, *reg_flags);
  EXPECT(rt->host_unregister(segment) == ncclSuccess && *registered == 0, "%s host_unregister",
         rt->name);
  int *prio = dlsym(handle, "fake_stream_priority");
  EXPECT(prio != NULL, "stand-in priority");
  if (failures) return;
  for (int urgent = 0; urgent < 2; urgent++) {
    EXPECT(rt->stream_create(&stream, urgent) == ncclSuccess && stream && *stream_flags == 0x1 &&
               *streams == 1 && *prio == (urgent ? -5 : 0),
           "%s stream_create(urgent %d): flags %#x priority %d", rt->name, urgent, *stream_flags,
           *prio);
    EXPECT(rt->stream_destroy(stream) == ncclSuccess && *streams == 0, "%s stream_destroy",
           rt->name);
  }
}

static void mode_host(void) {
  check_tables();
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HOST);
  EXPECT(rt && rt->kind == HETCCL_DEV_HOST && strcmp(rt->name, "host") == 0, "host table");
  EXPECT(strcmp(hetccl_dev_kind_name(HETCCL_DEV_CUDA), "cuda") == 0, "kind name");
  EXPECT(strcmp(hetccl_dev_kind_name((hetccl_dev_kind_t)99), "unknown") == 0, "bad kind name");
  EXPECT(hetccl_runtime_get(HETCCL_DEV_CUDA) == &hetccl_runtime_cuda, "cuda table");
  EXPECT(strcmp(hetccl_dev_kind_name(HETCCL_DEV_HIP), "hip") == 0, "hip kind name");
  EXPECT(hetccl_runtime_get(HETCCL_DEV_HIP) == &hetccl_runtime_hip, "hip table");
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HOST, "auto without CUDA loaded is host");
  EXPECT(!hetccl_runtime_cuda.in_use(), "cuda in use without being loaded");
  EXPECT(!hetccl_runtime_hip.in_use(), "hip in use without being loaded");
  EXPECT(!hip_mapped(), "a host process loaded libamdhip64");
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

/* Every dlopen of this process comes here first (the executable's
 * definition leads the global scope, for the library's calls too); the
 * searches among the loaded libraries only (RTLD_NOLOAD) are counted. */
static int noload_searches;

void *dlopen(const char *file, int mode) {
  static void *(*real)(const char *, int);
  if (!real) real = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
  if (mode & RTLD_NOLOAD) __atomic_fetch_add(&noload_searches, 1, __ATOMIC_RELAXED);
  return real(file, mode);
}

static void *preload(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  EXPECT(h != NULL, "dlopen %s: %s", path, dlerror());
  return h;
}

static void mode_fake(const char *cudart, const char *driver) {
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HOST, "cuda before CUDA was loaded");
  void *hd = preload(driver);
  void *hrt = preload(cudart);
  if (failures) return;
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_CUDA, "auto with libcudart loaded is not cuda");
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_CUDA);
  const char *said = rt->describe();
  EXPECT(strstr(said, cudart) && strstr(said, driver) && strstr(said, ": 2 devices"),
         "describe '%s'", said);
  EXPECT(!hip_mapped(), "a CUDA process loaded libamdhip64");
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
  /* The stand-in driver has no stream memory operations: counters move
   * through host functions on the stream (which the stand-in runs at once). */
  volatile uint64_t counter = 0;
  EXPECT(rt->stream_write_counter(NULL, &counter, (void *)&counter, 9) == ncclSuccess &&
             counter == 9,
         "write_counter %llu", (unsigned long long)counter);
  EXPECT(rt->stream_wait_counter(NULL, &counter, (void *)&counter, 9) == ncclSuccess, "wait");
  check_register_and_streams(rt, hrt);
  /* With no HETCCL_NVRTC_LIBRARY, NVRTC is looked for beside the loaded
   * libcudart too, its major version first; the search reads each soname
   * within bounds, libnvrtc.so too (a sanitized build checks). */
  char why[2048] = "", beside[600];
  const char *slash = strrchr(cudart, '/');
  snprintf(beside, sizeof(beside), "%.*s/libnvrtc.so.13", slash ? (int)(slash - cudart) : 0,
           cudart);
  EXPECT(rt->reduce_available(why, sizeof(why)) == 0 && why[0], "reduce_available: '%s'", why);
  if (strstr(why, "no NVRTC found"))
    EXPECT(strstr(why, "tried libnvrtc.so.13, ") && strstr(why, beside), "search: '%s'", why);
}

static void mode_hipsys(void) {
  setenv("HETCCL_DEVICE", "hip", 1);
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HIP, "HETCCL_DEVICE=hip not honoured");
  const hetccl_runtime_t *rt = &hetccl_runtime_hip;
  int dev = -1;
  char busid[32];
  ncclResult_t res = rt->current_device(&dev, busid, sizeof(busid));
  EXPECT(res == ncclUnhandledCudaError, "current_device %d", res);
  char msg[1024];
  snprintf(msg, sizeof(msg), "%s", hetccl_last_error());
  EXPECT(!rt->available(), "HIP available on a machine without an AMD GPU?");
  const char *said = rt->describe();
  if (hip_mapped()) { /* the library loaded, every symbol resolved: no device */
    EXPECT(rt->in_use(), "loaded but not in use");
    EXPECT(strstr(msg, "hip: hipGetDevice failed"), "message '%s'", msg);
    EXPECT(strstr(said, "libamdhip64") && strstr(said, "(HIP ") && strstr(said, ": 0 devices"),
           "describe '%s'", said);
    hetccl_mem_kind_t k;
    int local = 0;
    EXPECT(rt->mem_kind(&local, &k, &dev) == ncclUnhandledCudaError, "mem_kind without a device");
  } else { /* no library: the message says which were tried */
    EXPECT(strstr(msg, "could not be loaded") && strstr(msg, "libamdhip64.so"), "message '%s'",
           msg);
    EXPECT(strncmp(said, "not found: ", 11) == 0 && strstr(said, "libamdhip64.so.5"),
           "describe '%s'", said);
  }
  printf("as expected: %s\n  describe: %s\n", msg, said);
}

/* dmabuf_export through the stand-in: ROCm 6 exports (a memfd stands for
 * the dma-buf) with the page offset of the pointer; ROCm 5 says why not;
 * the host table never exports. */
static void check_dmabuf(const hetccl_runtime_t *rt, int v6) {
  void *mem = NULL;
  int fd = -1;
  uint64_t offset = 0;
  char why[256] = "";
  EXPECT(rt->mem_alloc(&mem, 3 * 4096) == ncclSuccess, "hipMalloc");
  int got = rt->dmabuf_export((char *)mem + 4096 + 100, 200, &fd, &offset, why, sizeof(why));
  if (v6) {
    EXPECT(got == 1 && fd >= 0 && offset == ((uintptr_t)mem + 100) % 4096, "export: %d fd %d "
           "offset %llu (%s)", got, fd, (unsigned long long)offset, why);
    if (fd >= 0) close(fd);
  } else {
    EXPECT(got == 0 && strstr(why, "has no hipMemGetHandleForAddressRange"), "rocm 5: %d %s",
           got, why);
  }
  EXPECT(hetccl_runtime_host.dmabuf_export(mem, 1, &fd, &offset, why, sizeof(why)) == 0 &&
             strstr(why, "host memory"), "host: %s", why);
}

static void mode_hipfake(const char *lib) {
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HOST, "hip before HIP was loaded");
  EXPECT(!hetccl_runtime_hip.in_use(), "in use before it was loaded");
  void *h = preload(lib);
  if (failures) return;
  EXPECT(hetccl_runtime_hip.in_use(), "loaded but not in use");
  EXPECT(hetccl_runtime_detect() == HETCCL_DEV_HIP, "auto with libamdhip64 loaded is not hip");
  const hetccl_runtime_t *rt = hetccl_runtime_get(HETCCL_DEV_HIP);
  int v6 = strstr(lib, ".so.6") != NULL;
  const char *said = rt->describe();
  EXPECT(strstr(said, lib) && strstr(said, v6 ? "(HIP 6.2.42134)" : "(HIP 5.2.21153)") &&
             strstr(said, ": 2 devices"),
         "describe '%s'", said);
  int dev = -1;
  char busid[32] = "";
  EXPECT(rt->current_device(&dev, busid, sizeof(busid)) == ncclSuccess && dev == 1 &&
             strcmp(busid, "0000:c1:00.0") == 0,
         "current_device %d '%s'", dev, busid);
  EXPECT(rt->set_device(0) == ncclSuccess, "set_device 0");
  EXPECT(rt->current_device(&dev, NULL, 0) == ncclSuccess && dev == 0, "device %d", dev);
  ncclResult_t res = rt->set_device(7);
  EXPECT(res == ncclUnhandledCudaError && strstr(hetccl_last_error(), "hipSetDevice") &&
             strstr(hetccl_last_error(), "fake hip error"),
         "set_device 7: %d '%s'", res, hetccl_last_error());
  char *device = dlsym(h, "fake_device_arena"), *managed = dlsym(h, "fake_managed_arena");
  char *pinned = dlsym(h, "fake_pinned_arena");
  hetccl_mem_kind_t k;
  int kd = -5, local = 0;
  EXPECT(rt->mem_kind(device + 100, &k, &kd) == ncclSuccess && k == HETCCL_MEM_DEVICE && kd == 1,
         "device pointer: kind %d dev %d", k, kd);
  EXPECT(rt->mem_kind(managed, &k, &kd) == ncclSuccess && k == HETCCL_MEM_MANAGED && kd == 1,
         "managed pointer: kind %d dev %d", k, kd);
  EXPECT(rt->mem_kind(pinned, &k, &kd) == ncclSuccess && k == HETCCL_MEM_HOST && kd == -1,
         "pinned pointer: kind %d dev %d", k, kd);
  EXPECT(rt->mem_kind(&local, &k, &kd) == ncclSuccess && k == HETCCL_MEM_HOST && kd == -1,
         "host pointer: kind %d dev %d", k, kd);
  int capturing = 0;
  EXPECT(rt->stream_capturing((void *)1, &capturing) == ncclSuccess && capturing, "capturing");
  EXPECT(rt->stream_capturing(NULL, &capturing) == ncclSuccess && !capturing, "not capturing");
  void *event = NULL;
  int done = 0;
  EXPECT(rt->event_create(&event) == ncclSuccess && rt->event_record(event, NULL) == ncclSuccess &&
             rt->event_query(event, &done) == ncclSuccess && done,
         "event");
  char src[16] = "hello", dst[16] = "";
  EXPECT(rt->memcpy_async(dst, src, 6, NULL) == ncclSuccess && strcmp(dst, "hello") == 0, "copy");
  void *host = NULL, *mapped = NULL;
  EXPECT(rt->host_alloc_mapped(&host, &mapped, 64) == ncclSuccess && host == pinned &&
             mapped == pinned,
         "host_alloc_mapped %p %p", host, mapped);
  volatile uint64_t *counter = host;
  *counter = 0;
  EXPECT(rt->stream_write_counter(NULL, counter, mapped, 5) == ncclSuccess && *counter == 5,
         "write_counter: %llu", (unsigned long long)*counter);
  EXPECT(rt->stream_wait_counter(NULL, counter, mapped, 3) == ncclSuccess, "wait_counter");
  int callbacks = *(int *)dlsym(h, "fake_callbacks"), waits = *(int *)dlsym(h, "fake_waits");
  int writes = *(int *)dlsym(h, "fake_writes"), funcs = *(int *)dlsym(h, "fake_host_funcs");
  if (v6) /* stream memory operations, no host function */
    EXPECT(writes == 1 && waits == 1 && callbacks == 0 && funcs == 0,
           "writes %d waits %d callbacks %d", writes, waits, callbacks);
  else /* refused: stream callbacks (5.2 has no hipLaunchHostFunc) */
    EXPECT(writes == 0 && waits == 0 && callbacks == 2, "writes %d waits %d callbacks %d",
           writes, waits, callbacks);
  check_register_and_streams(rt, h);
  check_dmabuf(rt, v6);
}

/* The real CUDA runtime and driver on a GPU machine (tools/device): device
 * memory exports as a dma-buf where the device says it can, and otherwise
 * the answer says why; the flush of a NIC's writes into device memory
 * succeeds. */
static void mode_gpu(void) {
  const hetccl_runtime_t *rt = &hetccl_runtime_cuda;
  if (!rt->available()) {
    printf("gpu: no CUDA device here: skipped\n");
    exit(77);
  }
  void *mem = NULL;
  EXPECT(rt->mem_alloc(&mem, 2u << 20) == ncclSuccess, "cudaMalloc");
  int fd = -1;
  uint64_t offset = 99;
  char why[256] = "", link[128] = "", path[64];
  if (rt->dmabuf_export((char *)mem + 4096, 8192, &fd, &offset, why, sizeof(why))) {
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    link[n > 0 ? n : 0] = 0;
    printf("gpu: dma-buf export of device memory: fd %d (%s), offset %llu\n", fd, link,
           (unsigned long long)offset);
    EXPECT(strstr(link, "dmabuf") != NULL && offset == 0, "fd %d is %s, offset %llu", fd, link,
           (unsigned long long)offset);
    close(fd);
  } else {
    printf("gpu: no dma-buf export here: %s\n", why);
    EXPECT(why[0] != 0, "a refusal without a reason");
  }
  /* The flush a GPUDirect receive ends with: succeeds, or does nothing
   * where the platform has nothing to flush (INFO once). */
  EXPECT(rt->flush_nic_writes() == ncclSuccess, "flush_nic_writes");
  printf("gpu: flush_nic_writes: ok\n");
  EXPECT(rt->mem_free(mem) == ncclSuccess, "cudaFree");
}

static void mode_ctx(const char *driver) {
  EXPECT(!hetccl_runtime_cuda.in_use(), "in use before the driver was loaded");
  EXPECT(!hetccl_runtime_cuda.holds_memory(), "memory before the driver was loaded");
  preload(driver);
  EXPECT(hetccl_runtime_cuda.in_use(), "active primary context not seen");
  EXPECT(hetccl_runtime_cuda.holds_memory(), "active primary context holds no memory");
}

/* A process that loaded a CUDA runtime but not its driver, as a GPU build
 * of PyTorch does before its first CUDA call: a host rank asks on every
 * collective whether some GPU runtime holds memory by now
 * (comm/identity.c). The loaded libraries are searched once, not again
 * until something more is loaded (each search looks names up in the
 * loader's cache and path: 61-89 us a collective on the 2-core machine
 * when every call searched); a driver loaded later is seen. */
static void mode_absent(const char *cudart, const char *driver) {
  const hetccl_runtime_t *cuda = &hetccl_runtime_cuda, *hip = &hetccl_runtime_hip;
  preload(cudart);
  EXPECT(cuda->in_use() && !cuda->holds_memory() && !hip->in_use(), "first ask");
  int first = noload_searches;
  for (int i = 0; i < 100; i++)
    EXPECT(!cuda->holds_memory() && !hip->holds_memory() && !hip->in_use(), "ask %d", i);
  EXPECT(first > 0, "no search seen: the library's dlopen does not come here");
  EXPECT(noload_searches == first, "%d searches among the loaded libraries for 100 asks, "
         "%d for the first", noload_searches - first, first);
  preload(driver);
  EXPECT(cuda->holds_memory(), "the driver loaded since (a primary context active) not seen");
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  unsetenv("HETCCL_DEVICE");
  if (strcmp(mode, "host") == 0) mode_host();
  else if (strcmp(mode, "nocuda") == 0) mode_nocuda();
  else if (strcmp(mode, "fake") == 0 && argc > 3) mode_fake(argv[2], argv[3]);
  else if (strcmp(mode, "ctx") == 0 && argc > 3) mode_ctx(argv[3]);
  else if (strcmp(mode, "absent") == 0 && argc > 3) mode_absent(argv[2], argv[3]);
  else if (strcmp(mode, "hipsys") == 0) mode_hipsys();
  else if (strcmp(mode, "hipfake") == 0 && argc > 2) mode_hipfake(argv[2]);
  else if (strcmp(mode, "gpu") == 0) mode_gpu();
  else {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  printf("%s: %s\n", mode, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
