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
 *           supported" when FAKE_HIP_DMABUF=refuse; graphs (below).
 * Every stream operation runs as it is enqueued (a copy memmoves, a wait
 * spins, at most 60 s, a write stores, a host function is called); events
 * do nothing, and every stream is the one object.
 *
 * Graph capture (ROCm 6 only): one capture at a time, for the whole
 * process, whatever stream began it (all streams are one here, and the
 * caller's work forks onto others with events): while it is open every
 * stream operation of every stream is recorded instead of run, and
 * hipStreamIsCapturing says so for any stream. hipGraphLaunch runs the
 * recorded operations in order, at once, as they would have run when
 * enqueued. As the real runtime does, while a capture of global mode is
 * open, hipMalloc, hipHostMalloc, hipHostRegister and
 * hipStreamCreateWithPriority fail (900, hipErrorStreamCaptureUnsupported)
 * on a thread whose own mode (hipThreadExchangeStreamCaptureMode) is
 * global, or on the thread that began it unless that thread's mode is
 * relaxed (which a thread-local capture also asks); fake_capture_refusals
 * counts them, fake_graph_ops the operations recorded, fake_graph_launches
 * the launches run. */
#define _GNU_SOURCE /* memfd_create */
#include <pthread.h>
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

/* A stream operation, run now or recorded into a graph. */
enum { OP_COPY, OP_WAIT, OP_WRITE, OP_HOST_FUNC, OP_CALLBACK };
typedef struct {
  int kind;
  void *stream, *dst;
  const void *src;
  size_t bytes;
  uint64_t value, mask;
  void (*fn)(void *);
  void (*cb)(void *, int, void *);
  void *arg;
} fake_op_t;

static int run_op(const fake_op_t *op) {
  switch (op->kind) {
  case OP_COPY:
    __atomic_add_fetch(&fake_copies, 1, __ATOMIC_RELAXED);
    if (inside(op->dst, fake_device_arena, ARENA) && inside(op->src, fake_device_arena, ARENA))
      __atomic_add_fetch(&fake_device_copies, 1, __ATOMIC_RELAXED);
    memmove(op->dst, op->src, op->bytes);
    return 0;
  case OP_WAIT: {
    __atomic_add_fetch(&fake_waits, 1, __ATOMIC_RELAXED);
    struct timespec now, end, nap = {0, 1000};
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += 60; /* at most a minute, then "invalid value" */
    do {
      if ((__atomic_load_n((volatile uint64_t *)op->dst, __ATOMIC_ACQUIRE) & op->mask) >=
          op->value)
        return 0;
      nanosleep(&nap, NULL);
      clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec < end.tv_sec);
    return 1;
  }
  case OP_WRITE:
    __atomic_add_fetch(&fake_writes, 1, __ATOMIC_RELAXED);
    __atomic_store_n((volatile uint64_t *)op->dst, op->value, __ATOMIC_RELEASE);
    return 0;
  case OP_HOST_FUNC:
    __atomic_add_fetch(&fake_host_funcs, 1, __ATOMIC_RELAXED);
    op->fn(op->arg);
    return 0;
  case OP_CALLBACK:
    __atomic_add_fetch(&fake_callbacks, 1, __ATOMIC_RELAXED);
    op->cb(op->stream, 0, op->arg);
    return 0;
  }
  return 1;
}

#if V6
typedef struct {
  fake_op_t *ops;
  size_t n, cap;
} fake_graph_t;

FAKE_EXPORT int fake_capture_refusals, fake_graph_launches, fake_graph_ops;
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static fake_graph_t *capture;   /* the open capture, or NULL */
static int capture_mode;        /* its mode: 0 global, 1 thread-local, 2 relaxed */
static pthread_t capture_thread; /* the thread that began it */
static __thread int thread_mode; /* hipThreadExchangeStreamCaptureMode's; 0 global */

static int append(fake_graph_t *g, const fake_op_t *op) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 64;
    fake_op_t *ops = realloc(g->ops, cap * sizeof(*ops));
    if (!ops) return 2; /* hipErrorOutOfMemory */
    g->ops = ops;
    g->cap = cap;
  }
  g->ops[g->n++] = *op;
  __atomic_add_fetch(&fake_graph_ops, 1, __ATOMIC_RELAXED);
  return 0;
}

/* 1 when a capture is open (op then recorded into it, *err its result). */
static int recorded(const fake_op_t *op, int *err) {
  pthread_mutex_lock(&capture_lock);
  int open = capture != NULL;
  if (open) *err = append(capture, op);
  pthread_mutex_unlock(&capture_lock);
  return open;
}

/* The runtime's rule for calls unsafe during a capture, on this thread. */
static int refused(void) {
  pthread_mutex_lock(&capture_lock);
  int mine = capture && pthread_equal(capture_thread, pthread_self());
  int no = capture && ((capture_mode == 0 && thread_mode == 0) ||
                       (mine && capture_mode != 2 && thread_mode != 2));
  pthread_mutex_unlock(&capture_lock);
  if (no) __atomic_add_fetch(&fake_capture_refusals, 1, __ATOMIC_RELAXED);
  return no;
}
#else
static int recorded(const fake_op_t *op, int *err) { (void)op; (void)err; return 0; }
static int refused(void) { return 0; }
#endif

/* A stream operation: into the open capture, else run now. */
static int enqueue(const fake_op_t *op) {
  int err = 0;
  return recorded(op, &err) ? err : run_op(op);
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
FAKE_EXPORT int hipMalloc(void **p, size_t n) {
  if (refused()) return 900; /* hipErrorStreamCaptureUnsupported */
  return carve(p, n, fake_device_arena, ARENA, &device_used);
}
FAKE_EXPORT int hipFree(void *p) { (void)p; return 0; }
FAKE_EXPORT int hipHostMalloc(void **p, size_t n, unsigned f) {
  (void)f;
  if (refused()) return 900;
  return carve(p, n, fake_pinned_arena, PINNED_ARENA, &pinned_used);
}
FAKE_EXPORT int hipHostFree(void *p) { (void)p; return 0; }
FAKE_EXPORT int hipHostGetDevicePointer(void **d, void *h, unsigned f) { (void)f; *d = h; return 0; }
/* Registration and streams succeed and leave their flags for the test. */
FAKE_EXPORT unsigned fake_register_flags, fake_stream_flags;
FAKE_EXPORT int fake_registered, fake_streams;
static char fake_stream;
FAKE_EXPORT int hipHostRegister(void *p, size_t n, unsigned f) {
  if (refused()) return 900;
  (void)p; (void)n; fake_register_flags = f; fake_registered++; return 0;
}
FAKE_EXPORT int hipHostUnregister(void *p) { (void)p; fake_registered--; return 0; }
FAKE_EXPORT int fake_stream_priority;
FAKE_EXPORT int hipDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0; *greatest = -5; return 0;
}
FAKE_EXPORT int hipStreamCreateWithPriority(void **s, unsigned f, int prio) {
  if (refused()) return 900;
  fake_stream_flags = f; fake_stream_priority = prio; fake_streams++; *s = &fake_stream; return 0;
}
FAKE_EXPORT int hipStreamDestroy(void *s) { (void)s; fake_streams--; return 0; }
FAKE_EXPORT int hipMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) {
  (void)k;
  return enqueue(&(fake_op_t){.kind = OP_COPY, .stream = st, .dst = d, .src = s, .bytes = n});
}
FAKE_EXPORT int hipStreamSynchronize(void *s) { (void)s; return 0; }
/* 1: hipStreamCaptureStatusActive (any stream while a capture is open, and
 * (void *)0x1 always, for the runtime's unit test) */
FAKE_EXPORT int hipStreamIsCapturing(void *s, int *st) {
#if V6
  pthread_mutex_lock(&capture_lock);
  *st = capture != NULL || s == (void *)0x1;
  pthread_mutex_unlock(&capture_lock);
#else
  *st = s == (void *)0x1 ? 1 : 0;
#endif
  return 0;
}
static char fake_event;
FAKE_EXPORT int hipEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = &fake_event; return 0; }
FAKE_EXPORT int hipEventDestroy(void *e) { (void)e; return 0; }
FAKE_EXPORT int hipEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
FAKE_EXPORT int hipEventQuery(void *e) { return e == &fake_event ? 0 : 600; }
FAKE_EXPORT int hipStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; return 0; }
FAKE_EXPORT int hipStreamWaitValue64(void *s, void *p, uint64_t v, unsigned f, uint64_t m) {
  (void)f;
  if (!V6) return 801;
  return enqueue(&(fake_op_t){.kind = OP_WAIT, .stream = s, .dst = p, .value = v, .mask = m});
}
FAKE_EXPORT int hipStreamWriteValue64(void *s, void *p, uint64_t v, unsigned f) {
  (void)f;
  if (!V6) return 801;
  return enqueue(&(fake_op_t){.kind = OP_WRITE, .stream = s, .dst = p, .value = v});
}
FAKE_EXPORT int hipStreamAddCallback(void *s, void (*fn)(void *, int, void *), void *arg,
                                     unsigned f) {
  (void)f;
  return enqueue(&(fake_op_t){.kind = OP_CALLBACK, .stream = s, .cb = fn, .arg = arg});
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
  return enqueue(&(fake_op_t){.kind = OP_HOST_FUNC, .stream = s, .fn = fn, .arg = arg});
}

/* Graphs: a captured graph and its instance alike are a fake_graph_t (an
 * instance a copy of the graph's operations, so that either may be
 * destroyed first). */
FAKE_EXPORT int hipThreadExchangeStreamCaptureMode(int *mode) {
  if (!mode || *mode < 0 || *mode > 2) return 1;
  int old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return 0;
}
FAKE_EXPORT int hipStreamBeginCapture(void *s, int mode) {
  (void)s;
  if (mode < 0 || mode > 2) return 1;
  fake_graph_t *g = calloc(1, sizeof(*g));
  if (!g) return 2;
  pthread_mutex_lock(&capture_lock);
  int busy = capture != NULL;
  if (!busy) {
    capture = g;
    capture_mode = mode;
    capture_thread = pthread_self();
  }
  pthread_mutex_unlock(&capture_lock);
  if (busy) free(g);
  return busy ? 900 : 0;
}
FAKE_EXPORT int hipStreamEndCapture(void *s, void **graph) {
  (void)s;
  pthread_mutex_lock(&capture_lock);
  fake_graph_t *g = capture;
  capture = NULL;
  pthread_mutex_unlock(&capture_lock);
  if (!g) return 401; /* hipErrorIllegalState: no capture open */
  *graph = g;
  return 0;
}
static int instantiate(void **exec, void *graph) {
  const fake_graph_t *g = graph;
  fake_graph_t *e = calloc(1, sizeof(*e));
  if (!g || !e || (g->n && !(e->ops = malloc(g->n * sizeof(*e->ops))))) {
    free(e);
    return g ? 2 : 1;
  }
  if (g->n) memcpy(e->ops, g->ops, g->n * sizeof(*e->ops));
  e->n = e->cap = g->n;
  *exec = e;
  return 0;
}
FAKE_EXPORT int hipGraphInstantiate(void **exec, void *graph, void *err_node, char *log,
                                    size_t len) {
  (void)err_node;
  if (log && len) log[0] = 0;
  return instantiate(exec, graph);
}
FAKE_EXPORT int hipGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long f) {
  (void)f;
  return instantiate(exec, graph);
}
/* Runs every operation in order (the first failure is the result, the
 * rest still run, as they would have on a stream); into an open capture,
 * its operations are recorded there (and fake_graph_launches, which counts
 * the launches run, is not moved). */
FAKE_EXPORT int hipGraphLaunch(void *exec, void *s) {
  (void)s;
  const fake_graph_t *e = exec;
  if (!e) return 1;
  int res = 0, ran = 0;
  for (size_t i = 0; i < e->n; i++) {
    int err = 0, r = recorded(&e->ops[i], &err) ? err : (ran = 1, run_op(&e->ops[i]));
    if (r && !res) res = r;
  }
  if (ran || !e->n) __atomic_add_fetch(&fake_graph_launches, 1, __ATOMIC_RELAXED);
  return res;
}
static int destroy(void *graph) {
  fake_graph_t *g = graph;
  if (!g) return 1;
  free(g->ops);
  free(g);
  return 0;
}
FAKE_EXPORT int hipGraphExecDestroy(void *exec) { return destroy(exec); }
FAKE_EXPORT int hipGraphDestroy(void *graph) { return destroy(graph); }
#endif
