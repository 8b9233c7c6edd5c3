/* The slots CUDA and HIP serve alike (gpu_entry.h).
 *
 * Threads: any. Loading is serialised by the vendor's mutex; what the
 * slots remember (available's answer, the stream memory operations turned
 * off) is written with atomics or is the same answer from any thread. */
#include "runtime/gpu_entry.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/check.h"
#include "util/log.h"

/* Values HIP took over from CUDA unchanged (cudaMemcpyDefault and
 * hipMemcpyDefault, cudaHostAllocMapped and hipHostMallocMapped, ...). */
enum { MEMCPY_DEFAULT = 4 };
enum { ERROR_NOT_READY = 600 };
enum { EVENT_DISABLE_TIMING = 0x2 };
enum { HOST_ALLOC_PORTABLE = 0x1, HOST_ALLOC_MAPPED = 0x2 };
enum { HOST_REGISTER_PORTABLE = 0x1, HOST_REGISTER_MAPPED = 0x2 };
enum { STREAM_NON_BLOCKING = 0x1 };
enum { STREAM_CAPTURE_STATUS_NONE = 0 };

/* --- loading ------------------------------------------------------------------ */

/* Fill g from handle h (name: h in messages); 0 with the reason in g->why
 * if it cannot serve. */
static int gpu_fill(hetccl_gpu_t *g, void *h, const char *name) {
  const hetccl_gpu_vendor_t *v = g->vendor;
  const hetccl_gpu_sym_t shared[] = {
#define SHARED_SYM(slot, ret, params, cuda, hip) {v->calls.slot, (void **)&g->api.slot, 0},
#define OPTIONAL_SYM(slot, ret, params, cuda, hip) {v->calls.slot, (void **)&g->api.slot, 1},
      HETCCL_GPU_API(SHARED_SYM) HETCCL_GPU_API_OPTIONAL(OPTIONAL_SYM)
#undef OPTIONAL_SYM
#undef SHARED_SYM
  };
  if (!hetccl_gpu_take(h, shared, sizeof(shared) / sizeof(shared[0]), name, g->why,
                       sizeof(g->why)) ||
      !hetccl_gpu_take(h, v->own, v->nown, name, g->why, sizeof(g->why)))
    return 0;
  g->handle = h;
  hetccl_gpu_where_loaded((void *)g->api.get_device, g->path, sizeof(g->path), name);
  return !v->accept || v->accept(g, g->why, sizeof(g->why));
}

const hetccl_gpu_t *hetccl_gpu_get(hetccl_gpu_t *g, int may_load) {
  hetccl_gpu_t *r = __atomic_load_n(&g->ready, __ATOMIC_ACQUIRE);
  if (r || (may_load && __atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))) return r;
  /* Not loaded when last looked for, and nothing loaded since (runtime.h) */
  unsigned long long loads = hetccl_runtime_loads();
  if (!may_load && loads && __atomic_load_n(&g->absent_at, __ATOMIC_RELAXED) == loads)
    return NULL;
  const hetccl_gpu_vendor_t *v = g->vendor;
  pthread_mutex_lock(g->lock);
  if (!g->ready && !(may_load && g->failed)) {
    /* a versioned file name (libcudart.so.13.0.96) matches no soname */
    void *h = hetccl_gpu_open_loaded(v->libs, v->nlibs, v->lib_prefix);
    if (!h) __atomic_store_n(&g->absent_at, loads, __ATOMIC_RELAXED);
    const char *how = "already loaded";
    if (h && !gpu_fill(g, h, v->loaded_name)) {
      dlclose(h);
      h = NULL;
    }
    size_t off = 0;
    for (size_t i = 0; !h && may_load && i < v->nlibs; i++) {
      h = dlopen(v->libs[i], RTLD_NOW | RTLD_LOCAL);
      how = "loaded by name";
      if (!h) {
        const char *e = dlerror();
        if (off < sizeof(g->why))
          off += snprintf(g->why + off, sizeof(g->why) - off, "%s%s", off ? "; " : "",
                          e ? e : v->libs[i]);
      } else if (!gpu_fill(g, h, v->libs[i])) {
        dlclose(h);
        h = NULL;
      }
    }
    if (h) {
      v->announce(g, how);
      __atomic_store_n(&g->ready, g, __ATOMIC_RELEASE);
    } else if (may_load) {
      __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
    }
  }
  r = g->ready;
  pthread_mutex_unlock(g->lock);
  return r;
}

ncclResult_t hetccl_gpu_need(hetccl_gpu_t *g, const char *what) {
  if (hetccl_gpu_get(g, 1)) return ncclSuccess;
  WARN("%s: %s needs the %s runtime, which could not be loaded: %s", g->vendor->tag, what,
       g->vendor->product, g->why);
  return ncclUnhandledCudaError;
}

ncclResult_t hetccl_gpu_result(const hetccl_gpu_t *g, int err, const char *call) {
  if (err == 0) return ncclSuccess;
  const char *text = g->api.get_error_string(err);
  g->api.get_last_error(); /* the error was ours: leave none for the application */
  WARN("%s: %s failed: %s (error %d)", g->vendor->tag, call, text ? text : "unknown error", err);
  return ncclUnhandledCudaError;
}

/* --- the slots that are one call ------------------------------------------------- */

/* ONE_CALL(slot, params, call, args...): hetccl_gpu_<slot>(g, params) is
 * the library, then call(args) through the adapter. */
#define ONE_CALL(slot, params, call, ...)                                                         \
  ncclResult_t hetccl_gpu_##slot(hetccl_gpu_t *g, HETCCL_GPU_UNPAREN params) {                    \
    HETCCL_CHECK(hetccl_gpu_need(g, #slot));                                                      \
    return HETCCL_GPU_CALL(g, call, __VA_ARGS__);                                                 \
  }
ONE_CALL(set_device, (int dev), set_device, dev)
ONE_CALL(mem_alloc, (void **ptr, size_t bytes), malloc, ptr, bytes)
ONE_CALL(mem_free, (void *ptr), free, ptr)
ONE_CALL(host_free, (void *ptr), free_host, ptr)
ONE_CALL(host_unregister, (void *ptr), host_unregister, ptr)
ONE_CALL(stream_sync, (void *stream), stream_synchronize, stream)
ONE_CALL(stream_wait_event, (void *stream, void *event), stream_wait_event, stream, event, 0)
ONE_CALL(stream_destroy, (void *stream), stream_destroy, stream)
ONE_CALL(event_create, (void **event), event_create_with_flags, event, EVENT_DISABLE_TIMING)
ONE_CALL(event_destroy, (void *event), event_destroy, event)
ONE_CALL(event_record, (void *event, void *stream), event_record, event, stream)
#undef ONE_CALL

/* --- devices --------------------------------------------------------------------- */

int hetccl_gpu_available(hetccl_gpu_t *g) {
  int a = __atomic_load_n(&g->available, __ATOMIC_ACQUIRE);
  if (a >= 0) return a;
  int n = 0;
  if (hetccl_gpu_get(g, 1)) {
    int err = g->api.get_device_count(&n);
    if (err != 0) {
      g->devices_err = err; /* describe tells it */
      g->api.get_last_error();
      n = 0;
    }
  }
  a = n > 0;
  g->devices = n;
  INFO(HETCCL_RUNTIME, "%s: %s (%d device%s)", g->vendor->tag, a ? "available" : "not available",
       n, n == 1 ? "" : "s");
  __atomic_store_n(&g->available, a, __ATOMIC_RELEASE);
  return a;
}

ncclResult_t hetccl_gpu_current_device(hetccl_gpu_t *g, int *dev, char *busid, size_t busid_len) {
  HETCCL_CHECK(hetccl_gpu_need(g, "current_device"));
  int d = -1;
  HETCCL_CHECK(HETCCL_GPU_CALL(g, get_device, &d));
  if (busid && busid_len) {
    char buf[64] = "";
    HETCCL_CHECK(HETCCL_GPU_CALL(g, device_get_pci_bus_id, buf, (int)sizeof(buf), d));
    /* NCCL writes bus ids in lower case; so do we, so that they compare. */
    for (char *c = buf; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(busid, busid_len, "%s", buf);
  }
  if (dev) *dev = d;
  return ncclSuccess;
}

/* --- memory and copies ----------------------------------------------------------- */

ncclResult_t hetccl_gpu_mem_kind_answer(hetccl_mem_kind_t k, int ordinal, hetccl_mem_kind_t *kind,
                                        int *dev) {
  if (kind) *kind = k;
  if (dev) *dev = k == HETCCL_MEM_HOST ? -1 : ordinal;
  return ncclSuccess;
}

ncclResult_t hetccl_gpu_memcpy_async(hetccl_gpu_t *g, void *dst, const void *src, size_t bytes,
                                     void *stream) {
  HETCCL_CHECK(hetccl_gpu_need(g, "memcpy_async"));
  if (bytes == 0) return ncclSuccess;
  return HETCCL_GPU_CALL(g, memcpy_async, dst, src, bytes, MEMCPY_DEFAULT, stream);
}

ncclResult_t hetccl_gpu_host_alloc_mapped(hetccl_gpu_t *g, void **host, void **dev, size_t bytes) {
  HETCCL_CHECK(hetccl_gpu_need(g, "host_alloc_mapped"));
  HETCCL_CHECK(
      HETCCL_GPU_CALL(g, host_alloc, host, bytes, HOST_ALLOC_PORTABLE | HOST_ALLOC_MAPPED));
  ncclResult_t res = HETCCL_GPU_CALL(g, host_get_device_pointer, dev, *host, 0);
  if (res != ncclSuccess) {
    g->api.free_host(*host);
    *host = NULL;
  }
  return res;
}

/* Registering host memory someone else mapped (a /dev/shm segment). */
ncclResult_t hetccl_gpu_host_register(hetccl_gpu_t *g, void *ptr, size_t bytes, void **dev) {
  HETCCL_CHECK(hetccl_gpu_need(g, "host_register"));
  HETCCL_CHECK(HETCCL_GPU_CALL(g, host_register, ptr, bytes,
                               HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED));
  void *d = NULL;
  ncclResult_t res = HETCCL_GPU_CALL(g, host_get_device_pointer, &d, ptr, 0);
  if (res != ncclSuccess) {
    g->api.host_unregister(ptr);
    g->api.get_last_error(); /* the WARN above told the failure; leave the application none */
    return res;
  }
  *dev = d;
  return ncclSuccess;
}

/* --- streams and events (staging support, core/devpath.c) ------------------------ */

ncclResult_t hetccl_gpu_stream_capturing(hetccl_gpu_t *g, void *stream, int *capturing) {
  HETCCL_CHECK(hetccl_gpu_need(g, "stream_capturing"));
  int status = STREAM_CAPTURE_STATUS_NONE;
  HETCCL_CHECK(HETCCL_GPU_CALL(g, stream_is_capturing, stream, &status));
  if (capturing) *capturing = status != STREAM_CAPTURE_STATUS_NONE;
  return ncclSuccess;
}

ncclResult_t hetccl_gpu_capture_mode_exchange(hetccl_gpu_t *g, int *mode) {
  HETCCL_CHECK(hetccl_gpu_need(g, "capture_mode_exchange"));
  if (!g->api.thread_exchange_stream_capture_mode) return ncclSuccess; /* no modes to relax */
  return HETCCL_GPU_CALL(g, thread_exchange_stream_capture_mode, mode);
}

ncclResult_t hetccl_gpu_event_query(hetccl_gpu_t *g, void *event, int *done) {
  HETCCL_CHECK(hetccl_gpu_need(g, "event_query"));
  int err = g->api.event_query(event);
  *done = err == 0;
  if (err == ERROR_NOT_READY) {
    g->api.get_last_error(); /* "not ready" is an answer, not an error to leave behind */
    return ncclSuccess;
  }
  return hetccl_gpu_result(g, err, g->vendor->calls.event_query);
}

ncclResult_t hetccl_gpu_stream_create(hetccl_gpu_t *g, void **stream, int urgent) {
  int least = 0, greatest = 0;
  HETCCL_CHECK(hetccl_gpu_need(g, "stream_create"));
  if (urgent) HETCCL_CHECK(HETCCL_GPU_CALL(g, device_get_stream_priority_range, &least, &greatest));
  return HETCCL_GPU_CALL(g, stream_create_with_priority, stream, STREAM_NON_BLOCKING,
                         urgent ? greatest : least);
}

/* Counters on a stream: the vendor's stream memory operation on the
 * mapped counter, or where it cannot (the vendor's counter_op says when)
 * a host function on the stream (gpu.h). */
static ncclResult_t counter_op(hetccl_gpu_t *g, void *stream, volatile uint64_t *host, void *dev,
                               uint64_t value, int write) {
  const hetccl_gpu_vendor_t *v = g->vendor;
  const char *name = v->counter_calls[write];
  if (!__atomic_load_n(&g->mem_ops_off, __ATOMIC_RELAXED)) {
    int fallback = 0;
    ncclResult_t res = v->counter_op(g, stream, dev, value, write, &fallback);
    if (!fallback) return res;
  }
  HETCCL_CHECK(hetccl_gpu_need(g, name));
  /* A graph would replay the host function's job, which is freed when it
   * has run once. */
  int capturing = 0;
  HETCCL_CHECK(hetccl_gpu_stream_capturing(g, stream, &capturing));
  if (capturing) {
    WARN("%s: %s is not available here, and a stream being captured into a graph cannot take "
         "the host function that stands in for it", v->tag, name);
    return ncclInvalidUsage;
  }
  void *job = hetccl_gpu_counter_job(host, value, write);
  if (!job) {
    WARN("%s: %s: out of memory", v->tag, name);
    return ncclSystemError;
  }
  ncclResult_t res = v->launch_host(g, stream, job);
  if (res != ncclSuccess) free(job);
  return res;
}

ncclResult_t hetccl_gpu_stream_wait_counter(hetccl_gpu_t *g, void *stream, volatile uint64_t *host,
                                            void *dev, uint64_t value) {
  return counter_op(g, stream, host, dev, value, 0);
}

ncclResult_t hetccl_gpu_stream_write_counter(hetccl_gpu_t *g, void *stream,
                                             volatile uint64_t *host, void *dev, uint64_t value) {
  return counter_op(g, stream, host, dev, value, 1);
}
