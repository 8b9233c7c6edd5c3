/* What the GPU entries of the device-runtime layer (cuda.c, hip.c) share:
 * finding a runtime library the process already loaded, and the host side
 * of a stream counter when a stream cannot store or wait on one itself.
 *
 * Threads: any; nothing here keeps state. */
#ifndef HETCCL_RUNTIME_GPU_H
#define HETCCL_RUNTIME_GPU_H

#include <stddef.h>
#include <stdint.h>

/* A handle on a library the process has already loaded, never loading one:
 * the first of names loaded (RTLD_NOLOAD), else the first mapped object
 * whose file name starts with prefix (a versioned file such as
 * libcudart.so.13.0.96 that no soname matches). NULL when none. */
void *hetccl_gpu_open_loaded(const char *const *names, size_t nnames, const char *prefix);

/* The file the library holding sym was loaded from, else fallback. */
void hetccl_gpu_where_loaded(const void *sym, char *out, size_t len, const char *fallback);

/* A counter operation for a host function on a stream (the fallback for
 * stream memory operations): store value into *counter, or (write == 0)
 * wait until *counter >= value. NULL when out of memory. */
void *hetccl_gpu_counter_job(volatile uint64_t *counter, uint64_t value, int write);

/* The host function: runs the job and frees it. It makes no runtime call;
 * a waiting one holds the runtime's callback thread until the counter
 * moves, which is why it is only the fallback. */
void hetccl_gpu_counter_fn(void *job);

/* The whole pages around [ptr, ptr + bytes): what a dma-buf export asks
 * (both runtimes want page-aligned ranges); offset = ptr - base. */
typedef struct hetccl_gpu_range {
  uintptr_t base;
  size_t bytes;
  uint64_t offset;
} hetccl_gpu_range_t;
hetccl_gpu_range_t hetccl_gpu_page_range(const void *ptr, size_t bytes);

/* Writes the printf-style reason into why (len bytes, may be NULL) and
 * returns 0: the "cannot, because" answer of the runtime slots that say
 * why (dmabuf_export). */
int hetccl_gpu_why(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
