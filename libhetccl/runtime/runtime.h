/* Device runtime layer: what hetccl needs from a GPU (or the host).
 *
 * One table per kind (host.c, cuda.c, hip.c). The CUDA and HIP entries load
 * their vendor runtime/driver with dlopen at first use and never link it:
 * the library builds and runs with no GPU stack present, where only the host
 * entry is available.
 *
 * Threads: any thread; entries are thread-safe as their vendor runtime is.
 * Errors: a failing vendor call is logged once with its name and code. */
#ifndef HETCCL_RUNTIME_RUNTIME_H
#define HETCCL_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define HETCCL_DEVICE_KINDS(X)                                                 \
  X(HOST, "host")                                                              \
  X(CUDA, "cuda")                                                              \
  X(HIP, "hip")

typedef enum {
#define HETCCL_DEVKIND_ENUM(id, name) HETCCL_DEV_##id,
  HETCCL_DEVICE_KINDS(HETCCL_DEVKIND_ENUM)
#undef HETCCL_DEVKIND_ENUM
  HETCCL_DEV_COUNT
} hetccl_dev_kind_t;

const char *hetccl_dev_kind_name(hetccl_dev_kind_t k);

typedef enum { HETCCL_MEM_HOST = 0, HETCCL_MEM_DEVICE, HETCCL_MEM_MANAGED } hetccl_mem_kind_t;

typedef struct hetccl_runtime {
  hetccl_dev_kind_t kind;
  const char *name;
  /* Can this runtime be used in this process (library loads, >= 1 device)?
   * Cheap after the first call; never logs above INFO. */
  int (*available)(void);
  /* Has this process already started using this runtime on its own (its
   * runtime library loaded, or a driver context current or active)? Never
   * loads or initialises anything; drives HETCCL_DEVICE=auto (host.c). */
  int (*in_use)(void);
  /* For `hetccl info`: loads the runtime as available() does and says in
   * one line which files it uses and how many devices it sees, or why it
   * cannot be loaded. Static text, valid for the life of the process. */
  const char *(*describe)(void);
  /* The device the calling thread has selected (cudaGetDevice,
   * hipGetDevice), its PCI bus id ("0000:1b:00.0") into busid (>= 16
   * bytes). */
  ncclResult_t (*current_device)(int *dev, char *busid, size_t busid_len);
  ncclResult_t (*set_device)(int dev);
  /* What memory is ptr? Host memory unknown to the runtime is HETCCL_MEM_HOST. */
  ncclResult_t (*mem_kind)(const void *ptr, hetccl_mem_kind_t *kind, int *dev);
  ncclResult_t (*mem_alloc)(void **ptr, size_t bytes);  /* device memory */
  ncclResult_t (*mem_free)(void *ptr);
  ncclResult_t (*host_alloc)(void **ptr, size_t bytes); /* pinned host memory */
  ncclResult_t (*host_free)(void *ptr);
  /* Stream-ordered copies and synchronisation (stream is the vendor's). */
  ncclResult_t (*memcpy_async)(void *dst, const void *src, size_t bytes, void *stream);
  ncclResult_t (*stream_sync)(void *stream);
  /* Is the stream being captured into a graph? */
  ncclResult_t (*stream_capturing)(void *stream, int *capturing);

  /* What the engine's staging of device buffers needs (core/devpath.c):
   * events that any thread may query, host memory the device can read, and
   * a stream that waits for a host-written counter. NULL in the host entry. */
  ncclResult_t (*event_create)(void **event);
  ncclResult_t (*event_destroy)(void *event);
  ncclResult_t (*event_record)(void *event, void *stream);
  /* *done = 1 once the work recorded before the event has finished. */
  ncclResult_t (*event_query)(void *event, int *done);
  ncclResult_t (*stream_wait_event)(void *stream, void *event);
  /* Pinned host memory mapped into the device: *host for the CPU, *dev for
   * stream operations. Freed with host_free. */
  ncclResult_t (*host_alloc_mapped)(void **host, void **dev, size_t bytes);
  /* Work enqueued on stream after this call waits until the 64-bit counter
   * (host_alloc_mapped: host / dev) holds a value >= `value`. Never blocks
   * the calling thread. */
  ncclResult_t (*stream_wait_counter)(void *stream, volatile uint64_t *host, void *dev,
                                      uint64_t value);
  /* Once the work enqueued before it has finished (its writes visible to
   * the host), the stream stores `value` into the counter. The host polls
   * the counter without calling the runtime. */
  ncclResult_t (*stream_write_counter)(void *stream, volatile uint64_t *host, void *dev,
                                       uint64_t value);
} hetccl_runtime_t;

extern const hetccl_runtime_t hetccl_runtime_host;
extern const hetccl_runtime_t hetccl_runtime_cuda;
extern const hetccl_runtime_t hetccl_runtime_hip;

/* The table for kind (NULL only for a kind out of range). */
const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind);

/* The device kind this process presents at comm init: HETCCL_DEVICE knob,
 * else (auto) cuda or hip if the process already uses that runtime and
 * has a device, else host. The full rule is at the top of host.c. */
hetccl_dev_kind_t hetccl_runtime_detect(void);

#endif
