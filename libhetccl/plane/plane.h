/* The cross-island data plane: collectives between ranks whose buffers
 * live on different devices (or on the host), moved by the devices' copy
 * engines and reduced on the devices, with no CPU thread touching device
 * payload. Ranks of one host share segments; a channel to a rank of
 * another host is bridged by the pair's transport (bridge.c; by default,
 * unless HETCCL_PLANE_HOSTS=one).
 *
 * The channels. Every ordered pair of ranks (src -> dst) has one channel:
 * a /dev/shm segment that both processes map and every GPU rank registers
 * with its device runtime (pinned, mapped into the device). It holds
 * `slots` slots of `piece` bytes and two counters per slot:
 *
 *   produced[s]   1 + the piece src last wrote into slot s (src only)
 *   consumed[s]   1 + the piece dst last read out of slot s (dst only)
 *
 * Piece number q (counted over the channel's life) lives in slot
 * s = q % slots. Writing piece q waits until consumed[s] >= q + 1 - slots;
 * reading it waits until produced[s] >= q + 1. A GPU rank does both on its
 * streams (several per peer, the pieces spread over them: hence counters
 * per slot, whose pieces still pass one after another): stream
 * waits on the counters, a copy-engine copy (or a reduction kernel that
 * reads the slot through its mapping and writes device memory, or the next
 * channel's slot), a stream write of the counter. A host rank does the same
 * with its CPU. Neither side ever asks the other's runtime anything: the
 * counters are the only protocol, so an NVIDIA, an AMD and a CPU rank can
 * share one segment.
 *
 * Ranks of other hosts (args.hosts): their channels are bridged, a
 * segment on each side whose pieces cross by the caller's wire, with the
 * same counters (bridge.c); nothing else here tells them apart.
 *
 * Programs. An operation (or one communicator's share of a group) becomes a
 * program (program.h): phases run one after the other, each a few lanes of
 * steps; within a lane steps run in order, lanes run concurrently. A GPU
 * rank runs each lane on a stream of its own, forked from and joined back
 * to the caller's stream (exec_stream.c); a host rank, or a GPU rank whose
 * buffers are host memory, runs the lanes round-robin on one thread
 * (exec_host.c). Both number the pieces the same way, so any mix works.
 *
 * Failures. A GPU rank's call returns once enqueued; a watch (run by the
 * communicator's proxy thread, hetccl_plane_watch) waits for the program's
 * end and meanwhile looks at the abort flag, the peers (a rank whose
 * process is gone, or that left a failure mark in a channel) and the
 * timeout. On any of them it marks every channel of this rank failed (so
 * peers learn it at once) and releases this rank's streams by setting the
 * counters they wait on past any value: the caller's stream always moves
 * on, the outputs are undefined, and the error is the communicator's.
 *
 * Threads: set-up and destroy on the thread that inits / destroys the
 * communicator; launch on the API thread; watch and host runs on one
 * thread at a time (the caller's, or the proxy's). */
#ifndef HETCCL_PLANE_H
#define HETCCL_PLANE_H

#include <stddef.h>
#include <stdint.h>

#include "algo/algo.h"
#include "nccl.h"
#include "runtime/runtime.h"
#include "transport/transport.h"

typedef struct hetccl_plane hetccl_plane_t;

/* How pieces cross to a rank of another host (plane/bridge.c): the
 * caller's point-to-point messages between the pair, in order per pair and
 * direction, each received with its exact size. Posting never blocks; poll
 * moves every posted request one sweep (*idle: nothing moved); errors fail
 * the plane. declare / retract (optional) offer a segment for transfers in
 * place (ib: RDMA WRITE from one segment into the other). */
typedef struct hetccl_plane_wire {
  void *ctx;
  ncclResult_t (*isend)(void *ctx, int peer, const void *buf, size_t bytes, hetccl_req_t *req);
  ncclResult_t (*irecv)(void *ctx, int peer, void *buf, size_t bytes, hetccl_req_t *req);
  ncclResult_t (*poll)(void *ctx, int *idle);
  ncclResult_t (*declare)(void *base, size_t bytes, void **handle);
  void (*retract)(void *handle);
  /* This rank failed (on the thread that drives the wire): make the ranks
   * across it learn, e.g. by closing its connections with a note. */
  void (*fail)(void *ctx, ncclResult_t res);
} hetccl_plane_wire_t;

typedef struct hetccl_plane_args {
  int rank, nranks;
  uint64_t comm_id;
  const int32_t *pids;       /* each rank's process id (liveness, segment names) */
  const int32_t *user_ranks; /* how messages name ranks; NULL: as they are */
  /* Each rank's host (any value equal for ranks of one host); NULL: all
   * are on this one. A channel to a rank of another host is bridged
   * (plane/bridge.c) through `wire`, which is then required. */
  const uint64_t *hosts;
  hetccl_plane_wire_t wire;
  /* This rank's device runtime and device; NULL / -1 for a host rank. */
  const hetccl_runtime_t *rt;
  int dev;
  size_t piece;              /* bytes per slot (multiple of 4 KiB) */
  int slots;                 /* slots per channel (>= 2) */
  /* Bytes per channel from which a message moves in wide pieces, each
   * two slots' worth (program.c); 0: never. Ignored with fewer than 4
   * slots, or with ranks of other hosts (their bridges move one slot a
   * piece). */
  size_t wide_min;
  int timeout_ms;
  volatile int *abort_flag;
  /* Every GPU rank of the communicator reduces on its device; else the
   * caller keeps reducing collectives with device buffers off the plane. */
  int device_reduce;
  /* A reduction first copies the peer's piece from its slot into device
   * memory with the copy engine (else the kernel reads the slot over the
   * bus: half the copy engine's speed or less on a PCIe host). */
  int reduce_copy;
  /* Streams per lane to or from one peer, pieces spread over them
   * (exec_stream.c); lowered to divide `slots`. */
  int lane_streams;
  /* The plane's own streams at the device's greatest priority. */
  int urgent_streams;
  /* Device memory per receiving channel for pieces that wait for their
   * reduction off the copy lane (exec_stream.c, the split path); 0: none,
   * reductions hold their slot until their kernel has run. */
  size_t stage_bytes;
  /* Blocks of a resident reduction kernel per run of split reductions
   * (exec_stream.c): launched with the run, it reduces each piece as it
   * lands; 0: a kernel per piece, launched behind a stream wait. */
  unsigned resident_blocks;
  /* Programs of this rank that may be on its streams at once: a launch
   * beyond them first waits (up to PACE_MAX_MS, plane.c) for the oldest
   * to end; 0: no limit. */
  int inflight;
  /* Payload bytes this rank's CPU copies into and out of slots (the host
   * executor's sends and receives) are added here; may be NULL. */
  uint64_t *copied;
  /* A barrier over every rank (the caller's bootstrap). */
  ncclResult_t (*barrier)(void *ctx);
  void *barrier_ctx;
  /* The first rank that presents itself as a host rank (its CPU moves
   * its pieces, HETCCL_DEVICE=host included), -1 when there is none:
   * only then may programs be captured. */
  int host_rank;
  /* The plane failed on a thread of its own (capture.c's guard, while
   * graphs may replay): the communicator learns it here. */
  void (*on_failure)(void *ctx, ncclResult_t res);
  void *failure_ctx;
} hetccl_plane_args_t;

/* Collective over all ranks (calls args->barrier): create this rank's
 * outgoing channels, map everyone's, register them with the device
 * runtime. args (and the arrays it points to) must outlive the plane. */
ncclResult_t hetccl_plane_create(const hetccl_plane_args_t *args, hetccl_plane_t **out);

/* One task of a program, as the engine would run it (algo.h), with where
 * this rank's buffers are. */
typedef enum { HETCCL_PLANE_COLL, HETCCL_PLANE_SEND, HETCCL_PLANE_RECV } hetccl_plane_kind_t;
typedef struct hetccl_plane_task {
  hetccl_plane_kind_t kind;
  hetccl_coll_t coll;        /* COLL */
  int peer;                  /* SEND / RECV */
  void *buf;
  size_t bytes;
} hetccl_plane_task_t;

/* Does this task reduce device data, which needs device_reduce? */
int hetccl_plane_task_reduces(const hetccl_plane_task_t *t);

/* What hetccl_plane_watch waits for: the stream past the program, and
 * every piece the program bridges to another host across. */
typedef struct hetccl_plane_ticket {
  uint64_t prog;
  uint64_t bridged;
} hetccl_plane_ticket_t;

/* Called by hetccl_plane_launch once the program is numbered and before
 * any of it is enqueued: start hetccl_plane_watch(ticket) on the thread
 * that drives the communicator (post it, never run it here). */
typedef ncclResult_t (*hetccl_plane_watch_fn)(void *ctx, hetccl_plane_ticket_t ticket);

/* Enqueue tasks (one communicator's share of a group, call order; buffers
 * in device memory) on `stream` and return at once; `watch` is asked to
 * start the program's watch first. On an error nothing of it was enqueued
 * except what the failure releases.
 *
 * A stream being captured into a graph takes a captured program instead
 * (plane/capture.c: its own channels, whose counters each replay moves on
 * the device; no watch). */
ncclResult_t hetccl_plane_launch(hetccl_plane_t *p, const hetccl_plane_task_t *tasks, int ntasks,
                                 void *stream, hetccl_plane_watch_fn watch, void *watch_ctx);

/* Can this rank's programs be captured into a graph? 0, with why (naming
 * the reason for the user) where they cannot. */
int hetccl_plane_capturable(const hetccl_plane_t *p, char *why, size_t len);

/* Wait (bounded, see above) until the stream has passed the program and its
 * bridged pieces have crossed; moves the bridges meanwhile, so it runs on
 * the thread that drives the communicator (its proxy). */
ncclResult_t hetccl_plane_watch(hetccl_plane_t *p, hetccl_plane_ticket_t ticket);

/* Run tasks (host buffers) to completion on the calling thread. */
ncclResult_t hetccl_plane_run_host(hetccl_plane_t *p, const hetccl_plane_task_t *tasks,
                                   int ntasks);

/* Fail every channel of this rank with `code` and release its streams (an
 * abort, or a failure the caller saw first). Any thread; idempotent. */
void hetccl_plane_fail(hetccl_plane_t *p, ncclResult_t code);

/* After the proxy has stopped: release, wait (bounded) for the streams to
 * pass everything enqueued, unregister and unmap. NULL is fine. */
void hetccl_plane_destroy(hetccl_plane_t *p);

#endif
