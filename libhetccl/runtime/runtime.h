/* Device runtime layer: what hetccl needs from a GPU (or the host).
 *
 * One table per kind (host.c, cuda.c, hip.c). The CUDA and HIP entries load
 * their vendor runtime/driver with dlopen at first use and never link it:
 * the library builds and runs with no GPU stack present, where only the host
 * entry is available.
 *
 * Each slot has a named type below with its contract; every table fills
 * every slot (a slot a runtime lacks is a shared stub, never NULL), and
 * says in `caps` which optional groups of slots really work.
 *
 * Threads: any thread; entries are thread-safe as their vendor runtime is.
 * Errors: a failing vendor call is logged once with its name and code. */
#ifndef HETCCL_RUNTIME_RUNTIME_H
#define HETCCL_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "runtime/reduce.h"

/* id, name, the vendor collective library that serves the kind: a name in
 * HETCCL_VENDORS (vendor_ccl/vendor.h) or NONE. This layer only carries the
 * token; core turns it into a vendor id (core/init.c, hetccl_dev_vendor). */
#define HETCCL_DEVICE_KINDS(X)                                                 \
  X(HOST, "host", NONE)                                                        \
  X(CUDA, "cuda", NCCL)                                                        \
  X(HIP, "hip", RCCL)

typedef enum {
#define HETCCL_DEVKIND_ENUM(id, name, vendor) HETCCL_DEV_##id,
  HETCCL_DEVICE_KINDS(HETCCL_DEVKIND_ENUM)
#undef HETCCL_DEVKIND_ENUM
  HETCCL_DEV_COUNT
} hetccl_dev_kind_t;

const char *hetccl_dev_kind_name(hetccl_dev_kind_t k);

typedef enum { HETCCL_MEM_HOST = 0, HETCCL_MEM_DEVICE, HETCCL_MEM_MANAGED } hetccl_mem_kind_t;

/* What a runtime can do beyond the slots every runtime serves (the caps
 * field). A slot outside a runtime's caps is a stub that WARNs and returns
 * ncclInvalidUsage: ask the cap, never call to find out. */
#define HETCCL_RT_CAP_STREAMS 0x1u       /* events, stream waits and writes on host
                                          * counters, mapped host memory, streams
                                          * of our own */
#define HETCCL_RT_CAP_HOST_REGISTER 0x2u /* host_register / host_unregister */
#define HETCCL_RT_CAP_NIC_FLUSH 0x4u     /* flush_nic_writes calls the runtime (else
                                          * it does nothing: the ib transport reads
                                          * back instead, transport/ib/ib_flush.c) */

/* reduce_async flags: which inputs are pre-multiplied, and whether the
 * final average is taken (see hetccl_rt_reduce_async_fn). */
#define HETCCL_REDUCE_SCALE_A 0x1u
#define HETCCL_REDUCE_SCALE_B 0x2u
#define HETCCL_REDUCE_FINISH 0x4u

/* --- slot types ------------------------------------------------------------
 * Unless a slot says otherwise: any thread may call it (as the vendor
 * runtime allows), it blocks the caller only for as long as the vendor call
 * does, `stream` is a stream of this runtime (cudaStream_t, hipStream_t;
 * NULL: the legacy default stream), outputs mean something only on success,
 * and a failure is WARNed here, once, with the vendor call and its error
 * (ncclUnhandledCudaError; ncclSystemError for the host), so that callers
 * pass the result on without logging again. A slot the runtime lacks is a
 * shared stub (HETCCL_RT_UNSUPPORTED_STUB) returning ncclInvalidUsage. */

/* Can this runtime be used in this process (library loads, >= 1 device)?
 * Cheap after the first call; never logs above INFO. */
typedef int (*hetccl_rt_available_fn)(void);
/* Has this process already started using this runtime on its own (its
 * runtime library loaded, or a driver context current or active)? Never
 * loads or initialises anything; drives HETCCL_DEVICE=auto (host.c). */
typedef int (*hetccl_rt_in_use_fn)(void);
/* Can the process hold memory of this runtime now? CUDA: a context is
 * current on this thread or a primary context is active (no device or
 * pinned memory exists without one); HIP: its runtime is loaded (HIP has
 * no such query that does not initialise it). Never loads or initialises
 * anything. Decides whether a host rank's buffers may be device memory
 * (comm/identity.c): a CPU job whose framework loaded CUDA but never used
 * it stays off the GPU altogether. */
typedef int (*hetccl_rt_holds_memory_fn)(void);
/* For `hetccl info`: loads the runtime as available() does and says in one
 * line which files it uses and how many devices it sees, or why it cannot
 * be loaded. Static text, valid for the life of the process. */
typedef const char *(*hetccl_rt_describe_fn)(void);

/* The device the calling thread has selected (cudaGetDevice, hipGetDevice)
 * and its PCI bus id ("0000:1b:00.0", lower case) into busid (>= 16 bytes;
 * may be NULL). The host: -1 and "". */
typedef ncclResult_t (*hetccl_rt_current_device_fn)(int *dev, char *busid, size_t busid_len);
/* Select dev for the calling thread (per-thread state: a thread that issues
 * device work calls it itself). */
typedef ncclResult_t (*hetccl_rt_set_device_fn)(int dev);
/* What memory is ptr, and on which device (-1 for host memory)? Host
 * memory unknown to the runtime is HETCCL_MEM_HOST, not an error. Leaves
 * no error behind in the application's runtime state. */
typedef ncclResult_t (*hetccl_rt_mem_kind_fn)(const void *ptr, hetccl_mem_kind_t *kind,
                                              int *dev);
/* Device memory on the current device; the caller owns it and frees it
 * with mem_free. Synchronous. */
typedef ncclResult_t (*hetccl_rt_mem_alloc_fn)(void **ptr, size_t bytes);
typedef ncclResult_t (*hetccl_rt_mem_free_fn)(void *ptr);
/* Pinned (page-locked) host memory, for copies that overlap; the caller
 * owns it and frees it with host_free (which also frees host_alloc_mapped
 * memory). */
typedef ncclResult_t (*hetccl_rt_host_alloc_fn)(void **ptr, size_t bytes);
typedef ncclResult_t (*hetccl_rt_host_free_fn)(void *ptr);
/* Enqueue a copy of bytes from src to dst (host or device, either way) on
 * stream; never waits for it (the host: copies before returning, which
 * keeps stream order trivially). Both buffers belong to the caller and
 * must stay valid until the stream passes the copy. */
typedef ncclResult_t (*hetccl_rt_memcpy_async_fn)(void *dst, const void *src, size_t bytes,
                                                  void *stream);
/* Block the calling thread until all work enqueued on stream has finished. */
typedef ncclResult_t (*hetccl_rt_stream_sync_fn)(void *stream);
/* Is stream being captured into a graph (then nothing may wait on the
 * host for it)? */
typedef ncclResult_t (*hetccl_rt_stream_capturing_fn)(void *stream, int *capturing);
/* While a stream of the process is captured in the runtime's global mode,
 * the runtime refuses, on threads in that mode, calls that could disturb
 * the capture (allocation, registration, stream creation, module loads).
 * Sets the calling thread's mode to *mode and returns its former one
 * there (cudaThreadExchangeStreamCaptureMode): HETCCL_RT_CAPTURE_RELAXED
 * lets lazy set-up run during a capture, and exchanging again gives the
 * thread its mode back. A runtime without capture modes does nothing. */
typedef ncclResult_t (*hetccl_rt_capture_mode_exchange_fn)(int *mode);
#define HETCCL_RT_CAPTURE_RELAXED 2 /* cudaStreamCaptureModeRelaxed, hipStreamCaptureModeRelaxed */

/* HETCCL_RT_CAP_STREAMS: what staging device buffers through host memory
 * needs (core/devpath.c). */

/* An event that any thread may record and query (no timing). The caller
 * owns it; event_destroy may be called while work recorded on it is still
 * pending (released once reached). */
typedef ncclResult_t (*hetccl_rt_event_create_fn)(void **event);
typedef ncclResult_t (*hetccl_rt_event_destroy_fn)(void *event);
/* Mark event on stream after the work enqueued so far. Never blocks. */
typedef ncclResult_t (*hetccl_rt_event_record_fn)(void *event, void *stream);
/* *done = 1 once the work recorded before the event has finished, else 0
 * ("not ready" is an answer, not an error). Never blocks. */
typedef ncclResult_t (*hetccl_rt_event_query_fn)(void *event, int *done);
/* Work enqueued on stream after this call waits for event. Never blocks
 * the calling thread. */
typedef ncclResult_t (*hetccl_rt_stream_wait_event_fn)(void *stream, void *event);
/* Pinned host memory mapped into the device: *host for the CPU, *dev for
 * stream operations and kernels. The caller owns it; freed with host_free. */
typedef ncclResult_t (*hetccl_rt_host_alloc_mapped_fn)(void **host, void **dev, size_t bytes);
/* Work enqueued on stream after this call waits until the 64-bit counter
 * (host_alloc_mapped: host / dev) holds a value >= `value`. Never blocks
 * the calling thread. */
typedef ncclResult_t (*hetccl_rt_stream_wait_counter_fn)(void *stream, volatile uint64_t *host,
                                                         void *dev, uint64_t value);
/* Once the work enqueued before it has finished (its writes visible to the
 * host), the stream stores `value` into the counter. The host polls the
 * counter without calling the runtime. Never blocks the calling thread. */
typedef ncclResult_t (*hetccl_rt_stream_write_counter_fn)(void *stream, volatile uint64_t *host,
                                                          void *dev, uint64_t value);
/* A stream of our own on the current device that does not synchronise
 * with the legacy default stream (cudaStreamNonBlocking); with `urgent`,
 * at the device's greatest priority, so that its kernels take SMs ahead of
 * the application's compute as they free up. The caller owns it and
 * destroys it with stream_destroy, which returns at once; work still
 * pending on it completes first. */
typedef ncclResult_t (*hetccl_rt_stream_create_fn)(void **stream, int urgent);
typedef ncclResult_t (*hetccl_rt_stream_destroy_fn)(void *stream);

/* HETCCL_RT_CAP_HOST_REGISTER: page-lock and map into the device host
 * memory that someone else allocated (a mapped /dev/shm segment), for
 * every device (portable); *dev is its address for copies and kernels.
 * The caller keeps owning the memory: it must stay mapped until
 * host_unregister(ptr), which the caller calls before unmapping it.
 * Synchronous; ptr and bytes may need to be page-aligned. */
typedef ncclResult_t (*hetccl_rt_host_register_fn)(void *ptr, size_t bytes, void **dev);
typedef ncclResult_t (*hetccl_rt_host_unregister_fn)(void *ptr);

/* Enqueue on stream, for i < count:
 *   dst[i] = FIN(OP(PRE_A(a[i]), PRE_B(b[i])))
 * in op->dtype, where OP is op->kind; PRE_A / PRE_B multiply by the
 * PreMulSum scalar (op->scalar_dev when set, else op's host copy) when
 * flags has HETCCL_REDUCE_SCALE_A / _B and op->premul; FIN divides by
 * op->nranks when flags has HETCCL_REDUCE_FINISH and op->average. a, b and
 * dst are device-accessible (device memory, or mapped host memory's device
 * address) and belong to the caller until the stream passes the kernel;
 * dst may equal a or b. b may be NULL: then dst[i] = FIN(PRE_A(a[i]))
 * (data scaled on its way out). count 0 enqueues nothing but compiles
 * and loads the kernel for these arguments: a caller about to enqueue work
 * that another rank's later calls must release does that first, since
 * loading a kernel may wait for the device context's running work (two
 * ranks of one process on one GPU would wait on each other). Otherwise it
 * never blocks the calling thread. Where the runtime
 * has no device compiler (reduce_available says why) it returns
 * ncclInvalidUsage WITHOUT a WARN: the caller decides whether that is an
 * error (it may reduce on the host instead). */
typedef ncclResult_t (*hetccl_rt_reduce_async_fn)(const hetccl_redop_t *op, void *dst,
                                                  const void *a, const void *b, size_t count,
                                                  unsigned flags, void *stream);
/* A run of reductions for one resident kernel (the data plane's resident
 * path, plane/exec_stream.c): step k of `steps` computes elements
 * [k * per, min((k + 1) * per, count)) of dst = OP(local, piece) (the
 * piece first with `swap`), where the piece is stage piece
 * (first + k * span) % depth of `stage` (slot_bytes each; a step of span 2,
 * the last one's span last_span, runs on into the next), once
 * staged[(end - 1) % depth] >= end (end: that piece's split number plus its
 * span) and, with dep, dep[(dq - 1) % dep_slots] >= dq for dq = dep_first +
 * k * span + the step's span; after the step the kernel sets *reduced =
 * end. staged, reduced and dep are device addresses of mapped host
 * counters; arrive is device memory of `depth` words, zero, that the
 * kernel leaves at zero; seen is a device-memory word, zero at first and
 * then only raised, where one thread says which pieces have landed.
 * `blocks` blocks stay on the device for the whole run, waiting between
 * steps. */
typedef struct hetccl_reduce_run {
  void *dst;
  const void *local, *stage;
  uint64_t count, per, steps;
  int swap;
  uint64_t first, span, last_span, depth, slot_bytes;
  const volatile uint64_t *staged;
  volatile uint64_t *reduced;
  const volatile uint64_t *dep; /* NULL: no such wait */
  uint64_t dep_first, dep_slots;
  unsigned *arrive;
  volatile uint64_t *seen;
  unsigned blocks;
} hetccl_reduce_run_t;
/* Enqueue one run (above) on `stream`; flags and errors as reduce_async
 * (ncclInvalidUsage without a WARN where there is no device compiler). */
typedef ncclResult_t (*hetccl_rt_reduce_run_async_fn)(const hetccl_redop_t *op, unsigned flags,
                                                      const hetccl_reduce_run_t *run,
                                                      void *stream);
/* 1 if reduce_async can run here (a device compiler loaded and working);
 * else 0 and, in why (len bytes, may be NULL), one line saying why, for an
 * INFO. May load the compiler the first time; cheap afterwards. */
typedef int (*hetccl_rt_reduce_available_fn)(char *why, size_t len);

/* GPUDirect RDMA through dma-buf: a file descriptor for the device memory
 * [ptr, ptr + bytes) (from mem_alloc) that a NIC driver can import
 * (ibv_reg_dmabuf_mr). The exported range is [ptr - *offset, ...), whole
 * pages; the caller closes *fd. 1 on success; else 0 and, in why (len
 * bytes, may be NULL), one line naming what is missing (the driver's
 * export call, the device's support) or the call that failed, for an INFO.
 * Never WARNs: a missing export is a reason to stage, not an error. */
typedef int (*hetccl_rt_dmabuf_export_fn)(void *ptr, size_t bytes, int *fd, uint64_t *offset,
                                          char *why, size_t len);

/* GPUDirect RDMA receives: make what a NIC has written into the current
 * device's memory (its writes completed) visible to that device before
 * anything on it reads them; blocks until then. Called on the thread that
 * saw the completions, with the device current. Where the platform orders
 * a NIC's writes before its completions anyway, or the runtime has no such
 * call, it does nothing (INFO once for the latter). */
typedef ncclResult_t (*hetccl_rt_flush_nic_writes_fn)(void);

typedef struct hetccl_runtime {
  hetccl_dev_kind_t kind;
  const char *name;
  unsigned caps; /* HETCCL_RT_CAP_* */
  hetccl_rt_available_fn available;
  hetccl_rt_in_use_fn in_use;
  hetccl_rt_holds_memory_fn holds_memory;
  hetccl_rt_describe_fn describe;
  hetccl_rt_current_device_fn current_device;
  hetccl_rt_set_device_fn set_device;
  hetccl_rt_mem_kind_fn mem_kind;
  hetccl_rt_mem_alloc_fn mem_alloc;
  hetccl_rt_mem_free_fn mem_free;
  hetccl_rt_host_alloc_fn host_alloc;
  hetccl_rt_host_free_fn host_free;
  hetccl_rt_memcpy_async_fn memcpy_async;
  hetccl_rt_stream_sync_fn stream_sync;
  hetccl_rt_stream_capturing_fn stream_capturing;
  hetccl_rt_capture_mode_exchange_fn capture_mode_exchange;
  /* HETCCL_RT_CAP_STREAMS */
  hetccl_rt_event_create_fn event_create;
  hetccl_rt_event_destroy_fn event_destroy;
  hetccl_rt_event_record_fn event_record;
  hetccl_rt_event_query_fn event_query;
  hetccl_rt_stream_wait_event_fn stream_wait_event;
  hetccl_rt_host_alloc_mapped_fn host_alloc_mapped;
  hetccl_rt_stream_wait_counter_fn stream_wait_counter;
  hetccl_rt_stream_write_counter_fn stream_write_counter;
  hetccl_rt_stream_create_fn stream_create;
  hetccl_rt_stream_destroy_fn stream_destroy;
  /* HETCCL_RT_CAP_HOST_REGISTER */
  hetccl_rt_host_register_fn host_register;
  hetccl_rt_host_unregister_fn host_unregister;
  /* device reductions (ask reduce_available) */
  hetccl_rt_reduce_async_fn reduce_async;
  hetccl_rt_reduce_available_fn reduce_available;
  hetccl_rt_reduce_run_async_fn reduce_run_async;
  /* device memory for a NIC (0 with why where it cannot) */
  hetccl_rt_dmabuf_export_fn dmabuf_export;
  hetccl_rt_flush_nic_writes_fn flush_nic_writes;
} hetccl_runtime_t;

/* Every slot, for the check at registration (host.c): none may be NULL. */
#define HETCCL_RT_SLOTS(X)                                                     \
  X(available) X(in_use) X(holds_memory) X(describe) X(current_device)     \
  X(set_device) X(mem_kind) X(mem_alloc) X(mem_free) X(host_alloc)            \
  X(host_free)                                                                 \
  X(memcpy_async) X(stream_sync) X(stream_capturing) X(capture_mode_exchange)  \
  X(event_create)                                                              \
  X(event_destroy) X(event_record) X(event_query) X(stream_wait_event)         \
  X(host_alloc_mapped) X(stream_wait_counter) X(stream_write_counter)          \
  X(stream_create) X(stream_destroy) X(host_register) X(host_unregister)       \
  X(reduce_async) X(reduce_available) X(reduce_run_async) X(dmabuf_export)    \
  X(flush_nic_writes)

/* --- shared stubs for slots a runtime lacks -------------------------------- */

/* WARN "<runtime> runtime: <slot> is not supported" and return
 * ncclInvalidUsage. */
ncclResult_t hetccl_rt_unsupported(const char *runtime, const char *slot);

/* Defines static rt##_##slot(params) returning hetccl_rt_unsupported(#rt,
 * #slot), for a table of runtime rt to name in place of NULL. */
#define HETCCL_RT_UNSUPPORTED_STUB(rt, slot, params)                           \
  static ncclResult_t rt##_##slot params { return hetccl_rt_unsupported(#rt, #slot); }

/* reduce_async / reduce_available of a runtime without device reductions:
 * ncclInvalidUsage without a WARN (the slot's contract), and 0 with why. */
ncclResult_t hetccl_rt_reduce_async_none(const hetccl_redop_t *op, void *dst,
                                         const void *a, const void *b, size_t count,
                                         unsigned flags, void *stream);
int hetccl_rt_reduce_available_none(char *why, size_t len);
ncclResult_t hetccl_rt_reduce_run_async_none(const hetccl_redop_t *op, unsigned flags,
                                             const hetccl_reduce_run_t *run, void *stream);
/* flush_nic_writes of a runtime with nothing to flush (host memory). */
ncclResult_t hetccl_rt_flush_nic_writes_none(void);
/* dmabuf_export of the host runtime: 0, "host memory is registered as it is". */
int hetccl_rt_dmabuf_export_none(void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why,
                                 size_t len);

extern const hetccl_runtime_t hetccl_runtime_host;
extern const hetccl_runtime_t hetccl_runtime_cuda;
extern const hetccl_runtime_t hetccl_runtime_hip;

/* The table for kind; NULL for a kind out of range, or a table with a NULL
 * slot (WARNed once, naming it: a build error that the unit tests catch). */
const hetccl_runtime_t *hetccl_runtime_get(hetccl_dev_kind_t kind);

/* The device kind this process presents at comm init: HETCCL_DEVICE knob,
 * else (auto) cuda or hip if the process already uses that runtime and
 * has a device, else host. The full rule is at the top of host.c. */
hetccl_dev_kind_t hetccl_runtime_detect(void);

/* Make `to` wait for the work enqueued so far on `from` (an event recorded
 * on one, waited on by the other, released once reached). Needs
 * HETCCL_RT_CAP_STREAMS. */
ncclResult_t hetccl_runtime_stream_join(const hetccl_runtime_t *rt, void *to, void *from);

/* How many objects the process's loader has loaded so far (the count
 * dl_iterate_phdr reports; it only grows): a search among the loaded
 * libraries that found nothing finds nothing again while it is unchanged.
 * That search is no cheap question: a dlopen of a name with RTLD_NOLOAD
 * still looks the name up in the loader's cache and path (an mmap and
 * opens), 30 us a name on the 2-core machine; asked on every collective of
 * a host rank in a process that had loaded a CUDA runtime but not the
 * driver (a GPU build of PyTorch, CPU tensors), it added 61 us a call.
 * 0 where the loader does not count. */
unsigned long long hetccl_runtime_loads(void);

#endif
