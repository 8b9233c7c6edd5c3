/* Host buffers in a hierarchical collective whose island a vendor serves.
 *
 * The vendor library (NCCL, RCCL) reads and writes only memory its device
 * can reach; hetccl's engine takes host buffers as they are, and on them a
 * call is blocking (docs/threads.md). A rank of a vendor island handed host
 * memory for a hierarchical form (hier/hier_ops.c) therefore stages the
 * host buffers of the call through device memory, and the forms only ever
 * see device buffers:
 *
 *   begin   each host input (sendbuf; recvbuf of an in-place ncclBcast at
 *           its root) is copied by the CPU into a pinned block, then by the
 *           device into a device block, on the caller's stream;
 *   form    the phases run on the device blocks (their partial results in
 *           the map's device scratch, hier.c);
 *   return  the device copies the result into the pinned block, on the stream;
 *   finish  the caller waits for the stream and the CPU copies the result
 *           into the user's host buffer.
 *
 * Outside a group finish follows at once, so the call is blocking as it is
 * on the engine. Inside a group every deferred form is launched before any
 * finishes (hetccl_hier_run_deferred): one thread may drive several ranks,
 * whose phases need each other's calls.
 *
 *   kind            host inputs staged        result returned
 *   AllReduce       sendbuf (count)           recvbuf (count)
 *   Broadcast       sendbuf at the root       recvbuf (count)
 *   Bcast           buf at the root           buf (count)
 *   Reduce          sendbuf (count)           recvbuf at the root
 *   AllGather       sendbuf (count)           recvbuf (nranks x count)
 *   ReduceScatter   sendbuf (nranks x count)  recvbuf (count)
 *   AlltoAll        sendbuf (nranks x count)  recvbuf (nranks x count)
 *   Gather          sendbuf (count)           recvbuf at the root (nranks x count)
 *   Scatter         sendbuf at the root       recvbuf (count)
 *                   (nranks x count)
 *   Send            sendbuf (count)           -
 *   Recv            -                         recvbuf (count)
 *
 * Each buffer is staged only where it is host memory (a device sendbuf with
 * a host recvbuf stages the recvbuf alone). An in-place call (the two
 * ranges overlap, as NCCL's in-place AllGather and ReduceScatter do) is
 * staged as one area covering both, so the vendor sees it in place too. The blocks come in pairs (a
 * device block and a pinned block of one size) from a pool per
 * communicator kept in its map: a pair is busy from begin to finish, so
 * every pair is idle between calls; a call takes an idle pair large enough,
 * else grows an idle one (at least doubling) or adds one. A pair whose form
 * failed stays busy (work on the stream may still use it) until the
 * communicator goes.
 *
 * Threads: the API caller's, one call at a time per communicator (NCCL's
 * rule), which owns the pool. */
#include <stdlib.h>
#include <string.h>

#include "hier/hier.h"
#include "runtime/reduce.h"
#include "runtime/runtime.h"
#include "util/check.h"
#include "util/log.h"

struct hetccl_hier_stage {
  void *dev, *host; /* device block and pinned block, `bytes` each */
  size_t bytes;
  int busy;
  /* the call being staged (busy) */
  void *stream;
  void *user_recv;          /* the user's host recvbuf; NULL: nothing to return */
  size_t recv_at, recv_len; /* its area in the blocks */
  struct hetccl_hier_stage *next;
};

/* The bytes op reads from sendbuf and writes to recvbuf on this rank, and
 * whether recvbuf is also an input (the table above). */
static void extents(ncclComm_t comm, const hetccl_op_t *op, size_t *send, size_t *recv,
                    int *recv_in) {
  size_t n = op->count * hetccl_dtype_size(op->dtype), all = (size_t)comm->nranks * n;
  int root = comm->rank == op->root;
  *recv_in = 0;
  switch (op->kind) {
    case HETCCL_OP_AllReduce: *send = n, *recv = n; break;
    case HETCCL_OP_Broadcast: *send = root ? n : 0, *recv = n; break;
    case HETCCL_OP_Bcast: *send = 0, *recv = n, *recv_in = root; break;
    case HETCCL_OP_Reduce: *send = n, *recv = root ? n : 0; break;
    case HETCCL_OP_AllGather: *send = n, *recv = all; break;
    case HETCCL_OP_ReduceScatter: *send = all, *recv = n; break;
    case HETCCL_OP_AlltoAll: *send = all, *recv = all; break;
    case HETCCL_OP_Gather: *send = n, *recv = root ? all : 0; break;
    case HETCCL_OP_Scatter: *send = root ? all : 0, *recv = n; break;
    case HETCCL_OP_Send: *send = n, *recv = 0; break;
    case HETCCL_OP_Recv: *send = 0, *recv = n; break;
    default: *send = *recv = 0; break;
  }
}

/* Is the `len` bytes at p host memory (none at all: no)? */
static ncclResult_t is_host(ncclComm_t comm, const void *p, size_t len, int *host) {
  int device = 1;
  if (p && len) HETCCL_CHECK(hetccl_hier_on_device(comm, p, &device));
  *host = !device;
  return ncclSuccess;
}

static void pair_free(ncclComm_t comm, const hetccl_runtime_t *rt, hetccl_hier_stage_t *s) {
  if (s->dev) (void)hetccl_hier_device_block(comm, &s->dev, 0);
  if (s->host) (void)rt->host_free(s->host);
  s->dev = s->host = NULL;
  s->bytes = 0;
}

/* An idle pair of at least `bytes` from comm's pool. */
static ncclResult_t pair_take(ncclComm_t comm, const hetccl_runtime_t *rt, size_t bytes,
                              hetccl_hier_stage_t **out) {
  hetccl_hier_map_t *m = comm->hier.map;
  hetccl_hier_stage_t *s, *idle = NULL;
  for (s = m->stages; s; s = s->next) {
    if (s->busy) continue;
    if (s->bytes >= bytes) {
      *out = s;
      return ncclSuccess;
    }
    if (!idle) idle = s;
  }
  if (idle) { /* grow it: idle, so nothing on a stream uses it */
    if (bytes < 2 * idle->bytes) bytes = 2 * idle->bytes;
    pair_free(comm, rt, idle);
    s = idle;
  } else {
    s = calloc(1, sizeof(*s));
    if (!s) {
      WARN("rank %d: out of memory", comm->rank);
      return ncclSystemError;
    }
    s->next = m->stages;
    m->stages = s;
  }
  ncclResult_t res = hetccl_hier_device_block(comm, &s->dev, bytes);
  if (res == ncclSuccess) res = rt->host_alloc(&s->host, bytes);
  if (res != ncclSuccess) { /* the runtime logged why */
    hetccl_last_error_prefix("rank %d: no %zu bytes of device and pinned host memory to stage "
                             "host buffers for its island's %s", comm->rank, bytes,
                             comm->hier.island->forward.vendor->name);
    pair_free(comm, rt, s);
    return res;
  }
  s->bytes = bytes;
  *out = s;
  return ncclSuccess;
}

ncclResult_t hetccl_hier_host_begin(ncclComm_t comm, hetccl_op_t *op,
                                    hetccl_hier_stage_t **out) {
  *out = NULL;
  if (!comm->hier.island || !comm->hier.island->forward.vendor || comm->ptr_kind == HETCCL_DEV_HOST)
    return ncclSuccess;
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  if (!rt) return ncclSuccess;
  size_t send_len, recv_len;
  int recv_in, send_host, recv_host;
  extents(comm, op, &send_len, &recv_len, &recv_in);
  HETCCL_CHECK(is_host(comm, op->sendbuf, send_len, &send_host));
  HETCCL_CHECK(is_host(comm, op->recvbuf, recv_len, &recv_host));
  if (!send_host && !recv_host) return ncclSuccess;
  int capturing = 0;
  HETCCL_CHECK(rt->stream_capturing(op->stream, &capturing));
  if (capturing) {
    WARN("%s: host buffers on rank %d, whose island %s serves, while stream %p is being "
         "captured into a graph: staging them needs the host", op->fn, comm->rank,
         comm->hier.island->forward.vendor->name, op->stream);
    return ncclInvalidUsage;
  }
  /* In place (the two ranges overlap): one area covering both, copied in
   * whole, so that the vendor sees the call in place as it was made. Else
   * the send area, then the receive area. */
  const char *sb = op->sendbuf, *rb = op->recvbuf;
  int in_place = send_host && recv_host && send_len && recv_len && sb < rb + recv_len &&
                 rb < sb + send_len;
  const char *lo = in_place ? (sb < rb ? sb : rb) : NULL;
  size_t whole = in_place ? (size_t)((sb + send_len > rb + recv_len ? sb + send_len
                                                                     : rb + recv_len) - lo)
                          : 0;
  size_t send_at = in_place ? (size_t)(sb - lo) : 0;
  size_t recv_at = in_place ? (size_t)(rb - lo) : send_host ? hetccl_hier_align(send_len) : 0;
  size_t in_at = in_place ? 0 : send_at, in_len = in_place ? whole : send_host ? send_len : 0;
  hetccl_hier_stage_t *s;
  HETCCL_CHECK(pair_take(comm, rt, in_place ? whole : recv_at + (recv_host ? recv_len : 0), &s));
  TRACE(HETCCL_COLL, "%s rank %d: host %s staged through device memory for %s", op->fn,
        comm->rank,
        in_place ? "buffer (in place)" : send_host && recv_host ? "buffers"
        : send_host ? "sendbuf" : "recvbuf",
        comm->hier.island->forward.vendor->name);
  ncclResult_t res = ncclSuccess;
  if (in_len) {
    memcpy((char *)s->host + in_at, in_place ? lo : sb, in_len);
    res = rt->memcpy_async((char *)s->dev + in_at, (char *)s->host + in_at, in_len, op->stream);
  }
  char *recv_dev = (char *)s->dev + recv_at;
  if (res == ncclSuccess && recv_host && recv_in && !in_place) {
    memcpy((char *)s->host + recv_at, rb, recv_len);
    res = rt->memcpy_async(recv_dev, (char *)s->host + recv_at, recv_len, op->stream);
  }
  s->busy = 1; /* on failure too: the copies may have been queued, so never reused */
  if (res != ncclSuccess) return res;
  s->stream = op->stream;
  s->user_recv = recv_host ? op->recvbuf : NULL;
  s->recv_at = recv_at;
  s->recv_len = recv_host ? recv_len : 0;
  if (send_host) op->sendbuf = (char *)s->dev + send_at;
  if (recv_host) op->recvbuf = recv_dev;
  *out = s;
  return ncclSuccess;
}

ncclResult_t hetccl_hier_host_return(ncclComm_t comm, hetccl_hier_stage_t *s) {
  if (!s->user_recv) return ncclSuccess;
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  return rt->memcpy_async((char *)s->host + s->recv_at, (char *)s->dev + s->recv_at,
                          s->recv_len, s->stream);
}

ncclResult_t hetccl_hier_host_finish(ncclComm_t comm, hetccl_hier_stage_t *s) {
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->ptr_kind);
  HETCCL_CHECK(rt->stream_sync(s->stream)); /* failed: stays busy */
  if (s->user_recv) memcpy(s->user_recv, (char *)s->host + s->recv_at, s->recv_len);
  s->busy = 0;
  s->user_recv = NULL;
  return ncclSuccess;
}

void hetccl_hier_host_free(ncclComm_t comm, hetccl_hier_map_t *m) {
  const hetccl_runtime_t *rt =
      comm->ptr_kind == HETCCL_DEV_HOST ? NULL : hetccl_runtime_get(comm->ptr_kind);
  while (m->stages) {
    hetccl_hier_stage_t *s = m->stages;
    m->stages = s->next;
    if (rt) pair_free(comm, rt, s);
    free(s);
  }
}
