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
  /* The device the calling thread has selected (cudaGetDevice), its PCI bus
   * id ("0000:1b:00.0") into busid (>= 16 bytes). */
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
} hetccl_runtime_t;

extern const hetccl_runtime_t hetccl_runtime_host;
extern const hetccl_runtime_t hetccl_runtime_cuda;

/* The table for kind (host always; cuda only if compiled in). */
const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind);

/* The device kind this process presents at comm init: HETCCL_DEVICE knob,
 * else (auto) cuda if the process already uses CUDA and has a device, else
 * host. The full rule is at the top of host.c. */
hetccl_dev_kind_t hetccl_runtime_detect(void);

#endif
