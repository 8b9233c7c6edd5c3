/* What the GPU entries of the device-runtime layer (cuda.c, hip.c, and
 * their run-time compilers rtc_cuda.c, rtc_hip.c) share: finding a library
 * the process already loaded, taking a list of symbols from a library, and
 * the host side of a stream counter when a stream cannot store or wait on
 * one itself.
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

/* The file of a library the process has already loaded (names and prefix
 * as hetccl_gpu_open_loaded; sym: one of its symbols, to find its file);
 * 0 and "" in out when there is none. Leaves nothing open. */
int hetccl_gpu_loaded_file(const char *const *names, size_t nnames, const char *prefix,
                           const char *sym, char *out, size_t len);

/* One function to take from a library: its name, where its address goes,
 * and whether the library can serve without it. */
typedef struct hetccl_gpu_sym {
  const char *name;
  void **slot;
  int optional; /* 1: left NULL when absent */
} hetccl_gpu_sym_t;

/* Takes syms[0..n) from h with dlsym on that handle only, in order, each
 * slot cleared first. An entry whose slot an earlier entry filled is
 * skipped, so that two optional entries for one slot mean "this name, else
 * that one" (cuStreamWaitValue64_v2, then cuStreamWaitValue64). 1 when
 * every required one was found; else 0, with "<lib> lacks <name>" in why
 * (len bytes; why may be NULL), at the first required one missing. */
int hetccl_gpu_take(void *h, const hetccl_gpu_sym_t *syms, size_t n, const char *lib, char *why,
                    size_t len);

/* For a list X(name, return, params, optional) of the calls a file takes:
 * the field of the struct that holds one (its hetccl_gpu_sym_t names the
 * struct: {#name, (void **)&s.name, optional}). */
#define HETCCL_GPU_SYM_FIELD(name, ret, params, optional) ret(*name) params;

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
