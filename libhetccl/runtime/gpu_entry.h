/* The body of the GPU entries of the device-runtime layer (cuda.c, hip.c):
 * the slots that CUDA and HIP serve alike, written once over a table of the
 * vendor's runtime calls (hetccl_gpu_api_t, taken with dlsym from its
 * runtime library) and a description of the vendor (hetccl_gpu_vendor_t:
 * its names for those calls and for itself, its library files, and hooks
 * for the few steps that differ). HIP's runtime API copies CUDA's call for
 * call and flag for flag (hipMemcpyDefault = cudaMemcpyDefault = 4, ...),
 * so between those slots only the names differ: HETCCL_GPU_API lists them
 * side by side.
 *
 * What is not alike stays in the vendor's file: CUDA's driver API (pointer
 * queries, stream memory operations, dma-buf export, the NIC flush), HIP's
 * version check and its version-dependent numbering, the calls a vendor
 * has that the other lacks, and describe.
 *
 * Loading: the runtime library is looked for in two ways: "only if already
 * loaded" (in_use, which must never load or initialise the runtime) and
 * "load it" (every other slot): the one the process already loaded (the
 * same runtime instance PyTorch or CuPy use, so that device selection and
 * streams are shared), else the vendor's sonames in order. A library found
 * either way is kept for the life of the process; a failed load is
 * remembered so that it is reported, not retried.
 *
 * Errors: every runtime call goes through one adapter (hetccl_gpu_result)
 * that WARNs "<vendor>: <call> failed: <the runtime's text> (error N)" and
 * returns ncclUnhandledCudaError (what RCCL also returns for a HIP error);
 * it also clears the runtime's last error, which belongs to the
 * application.
 *
 * Threads: any. Loading is serialised by the vendor's mutex and published
 * with an atomic pointer; the table is read-only afterwards. */
#ifndef HETCCL_RUNTIME_GPU_ENTRY_H
#define HETCCL_RUNTIME_GPU_ENTRY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "runtime/gpu.h"
#include "runtime/runtime.h"

/* X(slot, return, params, CUDA's name, HIP's name): the runtime calls both
 * vendors have, with the same arguments, each under its vendor's name; all
 * but the first return the vendor's error code (an int, 0 for success).
 * HIP copied CUDA's API, so the names are all that differ. */
#define HETCCL_GPU_API(X)                                                                         \
  X(get_error_string, const char *, (int err), cudaGetErrorString, hipGetErrorString)             \
  X(get_last_error, int, (void), cudaGetLastError, hipGetLastError)                               \
  X(get_device_count, int, (int *count), cudaGetDeviceCount, hipGetDeviceCount)                   \
  X(get_device, int, (int *dev), cudaGetDevice, hipGetDevice)                                     \
  X(set_device, int, (int dev), cudaSetDevice, hipSetDevice)                                      \
  X(device_get_pci_bus_id, int, (char *busid, int len, int dev),                                  \
    cudaDeviceGetPCIBusId, hipDeviceGetPCIBusId)                                                  \
  X(malloc, int, (void **ptr, size_t bytes), cudaMalloc, hipMalloc)                               \
  X(free, int, (void *ptr), cudaFree, hipFree)                                                    \
  X(free_host, int, (void *ptr), cudaFreeHost, hipHostFree)                                       \
  X(memcpy_async, int, (void *dst, const void *src, size_t bytes, int kind, void *stream),        \
    cudaMemcpyAsync, hipMemcpyAsync)                                                              \
  X(stream_synchronize, int, (void *stream), cudaStreamSynchronize, hipStreamSynchronize)         \
  X(stream_is_capturing, int, (void *stream, int *status),                                        \
    cudaStreamIsCapturing, hipStreamIsCapturing)                                                  \
  X(event_create_with_flags, int, (void **event, unsigned flags),                                 \
    cudaEventCreateWithFlags, hipEventCreateWithFlags)                                            \
  X(event_destroy, int, (void *event), cudaEventDestroy, hipEventDestroy)                         \
  X(event_record, int, (void *event, void *stream), cudaEventRecord, hipEventRecord)              \
  X(event_query, int, (void *event), cudaEventQuery, hipEventQuery)                               \
  X(stream_wait_event, int, (void *stream, void *event, unsigned flags),                          \
    cudaStreamWaitEvent, hipStreamWaitEvent)                                                      \
  X(host_alloc, int, (void **ptr, size_t bytes, unsigned flags), cudaHostAlloc, hipHostMalloc)    \
  X(host_get_device_pointer, int, (void **dev, void *host, unsigned flags),                       \
    cudaHostGetDevicePointer, hipHostGetDevicePointer)                                            \
  X(host_register, int, (void *ptr, size_t bytes, unsigned flags),                                \
    cudaHostRegister, hipHostRegister)                                                            \
  X(host_unregister, int, (void *ptr), cudaHostUnregister, hipHostUnregister)                     \
  X(stream_create_with_priority, int, (void **stream, unsigned flags, int priority),              \
    cudaStreamCreateWithPriority, hipStreamCreateWithPriority)                                    \
  X(device_get_stream_priority_range, int, (int *least, int *greatest),                           \
    cudaDeviceGetStreamPriorityRange, hipDeviceGetStreamPriorityRange)                            \
  X(stream_destroy, int, (void *stream), cudaStreamDestroy, hipStreamDestroy)

/* The same for calls a runtime may lack (older ones): NULL then, and the
 * slot that uses one says what it does without. */
#define HETCCL_GPU_API_OPTIONAL(X)                                                                \
  X(thread_exchange_stream_capture_mode, int, (int *mode), cudaThreadExchangeStreamCaptureMode,   \
    hipThreadExchangeStreamCaptureMode)

typedef struct hetccl_gpu_api {
#define HETCCL_GPU_API_FIELD(slot, ret, params, cuda, hip) ret(*slot) params;
  HETCCL_GPU_API(HETCCL_GPU_API_FIELD)
  HETCCL_GPU_API_OPTIONAL(HETCCL_GPU_API_FIELD)
#undef HETCCL_GPU_API_FIELD
} hetccl_gpu_api_t;

/* The vendor's name of each call ("cudaMalloc", "hipMalloc"): the symbol
 * to take, and the call's name in messages. HETCCL_GPU_NAMES(CUDA) and
 * HETCCL_GPU_NAMES(HIP) are the vendors' columns of the list above. */
typedef struct hetccl_gpu_names {
#define HETCCL_GPU_NAME_FIELD(slot, ret, params, cuda, hip) const char *slot;
  HETCCL_GPU_API(HETCCL_GPU_NAME_FIELD)
  HETCCL_GPU_API_OPTIONAL(HETCCL_GPU_NAME_FIELD)
#undef HETCCL_GPU_NAME_FIELD
} hetccl_gpu_names_t;

#define HETCCL_GPU_NAME_CUDA(slot, ret, params, cuda, hip) .slot = #cuda,
#define HETCCL_GPU_NAME_HIP(slot, ret, params, cuda, hip) .slot = #hip,
#define HETCCL_GPU_NAMES(vendor)                                                                  \
  {HETCCL_GPU_API(HETCCL_GPU_NAME_##vendor) HETCCL_GPU_API_OPTIONAL(HETCCL_GPU_NAME_##vendor)}

typedef struct hetccl_gpu hetccl_gpu_t;

typedef struct hetccl_gpu_vendor {
  const char *tag;     /* "cuda": the first word of its messages */
  const char *product; /* "CUDA": "... needs the CUDA runtime, which ..." */
  /* The runtime library: its sonames, in the order they are tried; the
   * start of a mapped file's name that no soname matches (a versioned
   * libcudart.so.13.0.96); what to call one the process had loaded. */
  const char *const *libs;
  size_t nlibs;
  const char *lib_prefix;
  const char *loaded_name;
  hetccl_gpu_names_t calls;
  /* Calls of its own, taken after the shared ones (the vendor's file keeps
   * where they go). */
  const hetccl_gpu_sym_t *own;
  size_t nown;
  /* Called once every symbol of a library was found (g->path is set): 0,
   * with the reason in why, refuses it. NULL: every such library serves. */
  int (*accept)(hetccl_gpu_t *g, char *why, size_t len);
  /* Says at INFO which library was published; how: "already loaded" or
   * "loaded by name". */
  void (*announce)(const hetccl_gpu_t *g, const char *how);
  /* Moves a stream counter (stream_wait_counter, stream_write_counter)
   * with the device's own stream memory operation on dev. Where it cannot,
   * it sets *fallback (0 on entry) and returns ncclSuccess: a host
   * function on the stream does it then. It sets g->mem_ops_off when the
   * device refuses the operations for good; not called once that is set. */
  ncclResult_t (*counter_op)(hetccl_gpu_t *g, void *stream, void *dev, uint64_t value, int write,
                             int *fallback);
  /* Enqueues hetccl_gpu_counter_fn(job) on the stream; it owns job only on
   * success. */
  ncclResult_t (*launch_host)(hetccl_gpu_t *g, void *stream, void *job);
  const char *counter_calls[2]; /* [write]: the counter operation in messages */
} hetccl_gpu_vendor_t;

/* One vendor's runtime library and what the slots remember. Defined by the
 * vendor's file with HETCCL_GPU_INIT. */
struct hetccl_gpu {
  const hetccl_gpu_vendor_t *vendor;
  pthread_mutex_t *lock; /* serialises loading (shared with the vendor's other loads) */
  /* The library: written under lock before it is published, read-only
   * after. */
  void *handle;
  char path[512];
  hetccl_gpu_api_t api;
  hetccl_gpu_t *ready; /* this, published (atomic) once filled */
  int failed;          /* a full load was tried and failed (atomic) */
  unsigned long long absent_at; /* hetccl_runtime_loads() when a search among the loaded
                                 * libraries last found none (atomic; 0: not since) */
  char why[768];       /* what was tried, or why a library cannot serve */
  int available;       /* available's answer, -1 until asked (atomic) */
  int devices;         /* the device count it saw, for describe */
  int devices_err;     /* the count's error (0: none) */
  int mem_ops_off;     /* the stream memory operations were refused once (atomic) */
};

#define HETCCL_GPU_INIT(vendor_, lock_) {.vendor = (vendor_), .lock = (lock_), .available = -1}

/* The library, loading it if may_load; NULL when absent (not an error for
 * may_load == 0). */
const hetccl_gpu_t *hetccl_gpu_get(hetccl_gpu_t *g, int may_load);

/* The library for a slot; a WARN naming what was tried when there is none. */
ncclResult_t hetccl_gpu_need(hetccl_gpu_t *g, const char *what);

/* The one adapter from the vendor's error to ours. */
ncclResult_t hetccl_gpu_result(const hetccl_gpu_t *g, int err, const char *call);

#define HETCCL_GPU_CALL(g, slot, ...)                                                             \
  hetccl_gpu_result((g), (g)->api.slot(__VA_ARGS__), (g)->vendor->calls.slot)

/* The available slot: loads the library, counts the devices once. */
int hetccl_gpu_available(hetccl_gpu_t *g);

/* mem_kind's answer: k in *kind, and in *dev the ordinal for device or
 * managed memory, -1 for host memory (either output may be NULL). */
ncclResult_t hetccl_gpu_mem_kind_answer(hetccl_mem_kind_t k, int ordinal, hetccl_mem_kind_t *kind,
                                        int *dev);

/* X(rt, g, slot, params, args): the slots of hetccl_runtime_t (runtime.h)
 * that are the same for both vendors; ncclResult_t hetccl_gpu_<slot>(g,
 * params) serves each. */
#define HETCCL_GPU_SLOTS(X, rt, g)                                                                \
  X(rt, g, current_device, (int *dev, char *busid, size_t busid_len), (dev, busid, busid_len))    \
  X(rt, g, set_device, (int dev), (dev))                                                          \
  X(rt, g, mem_alloc, (void **ptr, size_t bytes), (ptr, bytes))                                   \
  X(rt, g, mem_free, (void *ptr), (ptr))                                                          \
  X(rt, g, host_free, (void *ptr), (ptr))                                                         \
  X(rt, g, memcpy_async, (void *dst, const void *src, size_t bytes, void *stream),                \
    (dst, src, bytes, stream))                                                                    \
  X(rt, g, stream_sync, (void *stream), (stream))                                                 \
  X(rt, g, stream_capturing, (void *stream, int *capturing), (stream, capturing))                 \
  X(rt, g, capture_mode_exchange, (int *mode), (mode))                                            \
  X(rt, g, event_create, (void **event), (event))                                                 \
  X(rt, g, event_destroy, (void *event), (event))                                                 \
  X(rt, g, event_record, (void *event, void *stream), (event, stream))                            \
  X(rt, g, event_query, (void *event, int *done), (event, done))                                  \
  X(rt, g, stream_wait_event, (void *stream, void *event), (stream, event))                       \
  X(rt, g, host_alloc_mapped, (void **host, void **dev, size_t bytes), (host, dev, bytes))        \
  X(rt, g, stream_wait_counter,                                                                   \
    (void *stream, volatile uint64_t *host, void *dev, uint64_t value),                           \
    (stream, host, dev, value))                                                                   \
  X(rt, g, stream_write_counter,                                                                  \
    (void *stream, volatile uint64_t *host, void *dev, uint64_t value),                           \
    (stream, host, dev, value))                                                                   \
  X(rt, g, stream_create, (void **stream, int urgent), (stream, urgent))                          \
  X(rt, g, stream_destroy, (void *stream), (stream))                                              \
  X(rt, g, host_register, (void *ptr, size_t bytes, void **dev), (ptr, bytes, dev))               \
  X(rt, g, host_unregister, (void *ptr), (ptr))

#define HETCCL_GPU_UNPAREN(...) __VA_ARGS__

#define HETCCL_GPU_DECLARE(rt_, g_, slot, params, args)                                           \
  ncclResult_t hetccl_gpu_##slot(hetccl_gpu_t *g, HETCCL_GPU_UNPAREN params);
HETCCL_GPU_SLOTS(HETCCL_GPU_DECLARE, _, _)
#undef HETCCL_GPU_DECLARE

/* HETCCL_GPU_BIND(rt, g) defines, for each slot above, static
 * rt_<slot>(params) calling hetccl_gpu_<slot>(g, args): the functions a
 * vendor's table names (its slots take no argument saying which vendor);
 * HETCCL_GPU_TABLE(rt) is their designated initializers. */
#define HETCCL_GPU_BIND_ONE(rt, g, slot, params, args)                                            \
  static ncclResult_t rt##_##slot params { return hetccl_gpu_##slot(g, HETCCL_GPU_UNPAREN args); }
#define HETCCL_GPU_BIND(rt, g) HETCCL_GPU_SLOTS(HETCCL_GPU_BIND_ONE, rt, g)
#define HETCCL_GPU_TABLE_ONE(rt, g, slot, params, args) .slot = rt##_##slot,
#define HETCCL_GPU_TABLE(rt) HETCCL_GPU_SLOTS(HETCCL_GPU_TABLE_ONE, rt, _)

#endif
