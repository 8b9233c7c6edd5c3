/* The data plane's insides (plane.h): channels, programs, executors.
 *
 * Private to plane/. */
#ifndef HETCCL_PLANE_IMPL_H
#define HETCCL_PLANE_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "plane/plane.h"
#include "transport/transport.h"

/* --- channels (channel.c) -------------------------------------------------------- */

#define PLANE_HDR_BYTES 4096u
/* A counter set to this releases every wait on it (failure, teardown). */
#define PLANE_RELEASED (UINT64_MAX >> 2)

/* Page 0 of a channel segment. Each array has one writer: the counters of
 * slot s say which piece last went through it (piece q lives in slot
 * q % slots). Per slot rather than per channel, so that pieces may move on
 * several streams and finish out of order (exec_stream.c): each slot's
 * pieces still pass it one after another.
 *
 * A wide piece (a step of span 2, program.c) is pieces q and q + 1 moved
 * as one: its bytes run on from slot q % slots, into the room of one piece
 * past the last slot where q % slots is the last (segments and stages have
 * that room where the plane allows wide pieces). Writing it waits for both
 * slots' consumed; the writer then sets produced of q + 1 alone, and its
 * reader waits for that one; the reader sets consumed of both. So the
 * counters keep their meaning slot by slot, and a wide piece is two
 * pieces to every narrow one before or after it. */
#define PLANE_MAX_SLOTS 64
typedef struct plane_chan_hdr {
  uint64_t magic;
  uint64_t comm_id;
  int32_t src, dst;
  int32_t slots, pad;
  uint64_t piece;
  uint64_t wide_min;       /* the plane's (0: no wide pieces, no room after the slots) */
  /* produced[s] = q + 1 once piece q is in slot s (src's stream or CPU) */
  _Alignas(128) volatile uint64_t produced[PLANE_MAX_SLOTS];
  /* consumed[s] = q + 1 once piece q has been read out of slot s (dst's) */
  _Alignas(128) volatile uint64_t consumed[PLANE_MAX_SLOTS];
  /* A side that gives up writes its code (ncclResult_t) and rank + 1. */
  _Alignas(128) volatile int32_t src_failed, src_code;
  _Alignas(128) volatile int32_t dst_failed, dst_code;
} plane_chan_hdr_t;

/* A channel to a rank of another host: this side's half (bridge.c). */
typedef struct bridge_piece {
  uint64_t q;              /* the piece's number on its channel */
  uint64_t seq;            /* its number over the plane's bridges (program ends) */
  size_t bytes;
} bridge_piece_t;

typedef struct plane_bridge {
  int peer, sending;
  /* Pieces by count: [done, posted) are on the wire, [posted, queued)
   * wait for their slot; entry i at ring[i % cap]. */
  bridge_piece_t *ring;
  size_t cap;
  uint64_t queued, posted, done;
  hetccl_req_t *reqs;      /* slots entries: piece q's request at q % slots */
  void *declared;          /* the wire's handle for the segment, or NULL */
} plane_bridge_t;

typedef struct plane_chan {
  plane_chan_hdr_t *hdr;   /* host view */
  char *dev;               /* device view of the whole segment (GPU ranks), else NULL */
  char *slots_host;        /* hdr + PLANE_HDR_BYTES */
  size_t bytes;            /* mapped size */
  char name[96];           /* while it still has one (creator only) */
  uint64_t next;           /* pieces numbered so far (API thread, at program build) */
  /* Receive side of a GPU rank that reduces what arrives (args.reduce_copy):
   * device memory for `slots` pieces, the slots' copies that the kernel
   * reads. Piece q lands in stage piece q % slots; the sender cannot
   * write piece q + slots until this rank's stream has consumed q, which
   * it writes after the kernel has read the stage. Made at the first
   * launch that needs it, freed at destroy. */
  char *stage;
  /* The split path's (exec_stream.c): the plane's stage_pieces pieces of
   * device memory, made at the first launch that splits a reduction from
   * this channel, and the split reductions numbered so far (API thread, at
   * enqueue); split reduction i uses piece i % stage_pieces. */
  char *split_stage;
  uint64_t split_next;
  /* After the split stage (and its room), PLANE_MAX_STAGE_PIECES words of
   * device memory that the resident kernel counts its blocks in (the kernel
   * leaves them at zero), then the word where it says which pieces have
   * landed (only raised); zeroed when the stage is made. */
  unsigned *arrive;
  /* A channel to a rank of another host: its segment is this process's
   * own memory and this moves its pieces (bridge.c); NULL for a shared one. */
  plane_bridge_t *bridge;
  /* A channel of captured programs (capture.c): the numbering when the
   * program being enqueued began (set at its build, read at its enqueue),
   * and whether a step of it waits for this channel's pieces (dep_out). */
  uint64_t prog_base;
  int dep_used;
} plane_chan_t;

ncclResult_t plane_chan_create(hetccl_plane_t *p, int dst, plane_chan_t *c);
ncclResult_t plane_chan_open(hetccl_plane_t *p, int src, plane_chan_t *c);
/* Channel src -> dst of captured programs (capture.c), a segment of its
 * own whose counters start as mailboxes (every slot free): made by the
 * first of its two ranks to need it, opened by the other (channel.c). */
ncclResult_t plane_chan_graph(hetccl_plane_t *p, int src, int dst, plane_chan_t *c);
ncclResult_t plane_chan_register(hetccl_plane_t *p, plane_chan_t *c);
void plane_chan_close(hetccl_plane_t *p, plane_chan_t *c);

/* bridge.c: open this side of a channel to rank `peer` of another host
 * (sending: this rank is its src); close before the memory goes. */
ncclResult_t plane_bridge_open(hetccl_plane_t *p, int peer, int sending, plane_chan_t *c);
void plane_bridge_close(hetccl_plane_t *p, plane_chan_t *c);
/* Program build: piece q of c, `bytes` long, will cross. */
ncclResult_t plane_bridge_queue(hetccl_plane_t *p, plane_chan_t *c, uint64_t q, size_t bytes);
/* The mark of everything queued so far (a program's end, after its build). */
uint64_t plane_bridge_mark(hetccl_plane_t *p);
/* One sweep: completions, posts, the wire's progress. *idle: nothing moved
 * (always, on a plane without bridges). */
ncclResult_t plane_bridge_progress(hetccl_plane_t *p, int *idle);
/* Every piece queued before `mark` has crossed (always, on a plane without
 * bridges, and for mark 0). */
int plane_bridge_passed(hetccl_plane_t *p, uint64_t mark);

/* Host and device addresses of a piece's slot / of a counter. */
static inline char *plane_slot_host(const hetccl_plane_t *p, const plane_chan_t *c, uint64_t q);
static inline char *plane_slot_dev(const hetccl_plane_t *p, const plane_chan_t *c, uint64_t q);

/* --- programs (program.c) ------------------------------------------------------- */

typedef enum {
  STEP_SEND,   /* src (user buffer) -> slot of `out` piece out_q; scaled by op's
                * scalar on the way when op is a PreMulSum */
  STEP_RECV,   /* slot of `in` piece in_q -> dst */
  STEP_REDUCE, /* dst (or, dst NULL, the slot of `out` piece out_q) = op(a, slot of `in`) */
  STEP_COPY,   /* src -> dst on this rank */
  STEP_SCALE,  /* dst = src scaled as flags say: HETCCL_REDUCE_SCALE_A by op's PreMulSum
                * scalar, HETCCL_REDUCE_FINISH as op finishes (Avg's division); a copy
                * where neither applies to op */
} plane_step_kind_t;

typedef struct plane_step {
  uint8_t kind;
  uint8_t swap;            /* REDUCE: the slot is the first operand */
  uint8_t graph;           /* a captured program's: its channels are mailboxes (capture.c) */
  /* Pieces this step numbers on each of its channels: 1, or 2 for a wide
   * piece (in_q and in_q + 1, out_q and out_q + 1; program.c). */
  uint8_t span;
  uint16_t flags;          /* REDUCE, SCALE: HETCCL_REDUCE_SCALE_A / _B / FINISH */
  int32_t in, out;         /* peer rank of the channel read / written; -1: none */
  plane_chan_t *ic, *oc;   /* those channels (the plane's, or its captured programs') */
  uint64_t in_q, out_q;
  const void *src;         /* SEND / COPY source; REDUCE local operand */
  void *dst;
  size_t bytes;
  /* Also wait until piece dep_q - 1 of this rank's channel to dep_out is
   * in its slot (-1: no such wait): e.g. an in-place reduction must not
   * overwrite what the send lane has not copied out yet. */
  int32_t dep_out;
  uint64_t dep_q;
  const hetccl_redop_t *op; /* REDUCE, SCALE; SEND of a reducing collective */
} plane_step_t;

typedef struct plane_lane {
  plane_step_t *steps;
  int n, cap;
} plane_lane_t;

/* Lanes of a phase: 0 is the ring lane; 1 + 2p sends to rank p, 2 + 2p
 * receives from rank p. */
#define PLANE_LANE_RING 0
#define PLANE_LANE_OUT(p) (1 + 2 * (p))
#define PLANE_LANE_IN(p) (2 + 2 * (p))

typedef struct plane_phase {
  plane_lane_t *lanes;     /* nlanes entries */
  int nlanes;
  struct plane_phase *next;
} plane_phase_t;

typedef struct plane_prog {
  plane_phase_t *head, *tail;
  int graph;               /* built for a capture: on the captured programs' channels */
  hetccl_redop_t *ops;     /* the reductions steps point to (one per task) */
  int nops;
  uint64_t bridge_end;     /* plane_bridge_mark after the build */
} plane_prog_t;

/* Number the pieces of tasks and lay them out as phases: collectives one
 * phase each in call order, then every send and receive in one phase.
 * graph: on the channels of captured programs (p->gout, p->gin), a slot a
 * piece. */
ncclResult_t plane_prog_build(hetccl_plane_t *p, const hetccl_plane_task_t *tasks, int ntasks,
                              int graph, plane_prog_t *prog);
void plane_prog_free(plane_prog_t *prog);

/* --- executors --------------------------------------------------------------------- */

/* exec_stream.c: enqueue prog on stream (this rank's device current). */
ncclResult_t plane_exec_stream(hetccl_plane_t *p, const plane_prog_t *prog, void *stream);
ncclResult_t plane_streams_create(hetccl_plane_t *p);
void plane_streams_destroy(hetccl_plane_t *p);
/* Free the channels' stages (device memory), this rank's device made
 * current for it. */
void plane_stages_free(hetccl_plane_t *p);
/* exec_host.c: run prog to completion here. */
ncclResult_t plane_exec_host(hetccl_plane_t *p, const plane_prog_t *prog);

/* liveness (plane.c): ncclSuccess while every peer is there and nothing
 * failed; else the error (logged once, naming who). `since_ns` is when a
 * counter this rank waits on last moved, for the timeout. `waited`
 * (nranks flags, or NULL for all): the peers whose exit is a failure now;
 * a peer that has done its part of every program and left is not one. */
ncclResult_t plane_check(hetccl_plane_t *p, int64_t since_ns, const uint8_t *waited);
/* The same without the timeout, for a thread other than the one that
 * drives the communicator: *last_ns is that caller's own time of its last
 * look at the peers' processes. */
ncclResult_t plane_peers_check(hetccl_plane_t *p, int64_t *last_ns, const uint8_t *waited);

/* --- captured programs (capture.c) ----------------------------------------------------- */

/* Enqueue tasks on `stream`, which is being captured into a graph. */
ncclResult_t plane_capture_launch(hetccl_plane_t *p, const hetccl_plane_task_t *tasks,
                                  int ntasks, void *stream);
/* Every mailbox of the captured programs' channels released (failure). */
void plane_capture_release(hetccl_plane_t *p);
/* Stop the guard, close the channels (destroy). */
void plane_capture_destroy(hetccl_plane_t *p);
/* The local counters of captured programs' waits on their own pieces:
 * channel to rank q, slot s. */
static inline volatile uint64_t *plane_gdep(const hetccl_plane_t *p, int q, uint64_t s);
static inline void *plane_gdep_dev(const hetccl_plane_t *p, volatile uint64_t *host);
int64_t plane_now_ns(void);

/* --- the plane ---------------------------------------------------------------------- */

struct hetccl_plane {
  hetccl_plane_args_t a;
  plane_chan_t *out, *in;  /* nranks each; [rank] unused */
  size_t seg_bytes;
  /* args.wide_min where wide pieces may be used, else 0. With it, every
   * segment and stage holds one piece more than its slots (above). */
  size_t wide_min;
  int gpu;                 /* this rank runs programs on streams */
  /* streams (exec_stream.c): lane_streams per lane, events to fork and
   * join; lane_streams divides the slot count */
  void **lane_stream;
  void **lane_event;
  int lane_streams;
  void *fork_event;
  int nlanes;
  /* the split path (exec_stream.c): a reduction stream per receiving lane,
   * stage_pieces pieces of device stage per channel, and this rank's
   * counters per channel in mapped host memory: for rank q, staged[j]
   * (stage piece j holds split reduction staged[j] - 1) at
   * ctr[q * PLANE_CTR_STRIDE + j], reduced (reductions done) after them */
  void **reduce_stream;
  void **reduce_event;
  int stage_pieces;
  volatile uint64_t *ctr;
  char *ctr_dev;
  /* programs launched on streams: `done` is a mapped counter the caller's
   * stream sets to a program's ticket as it passes its end */
  volatile uint64_t *done;
  void *done_dev;
  uint64_t launched;
  /* host executor scratch: two pieces (scaled operands) */
  void *scratch;
  volatile int failed;     /* ncclResult_t this rank failed with, 0 while healthy */
  int64_t last_peer_check_ns;
  /* bridges (bridge.c): how many ranks of other hosts have them (a bridge
   * out and one in each), their lock, the pieces queued over all of them */
  int bridges;
  pthread_mutex_t bridge_lock;
  uint64_t bridge_seq;
  /* captured programs (capture.c): their channels (nranks each, mapped
   * when a capture first uses them), this rank's local counters for their
   * waits on its own pieces (nranks x PLANE_MAX_SLOTS, mapped host memory,
   * and their device view), and the guard thread that watches the peers
   * while graphs may replay */
  plane_chan_t *gout, *gin;
  volatile uint64_t *gdep;
  char *gdep_dev;
  pthread_t guard;
  int guard_started;
  pthread_mutex_t guard_lock;
  pthread_cond_t guard_cond;
  int guard_stop;
};

/* Every counter of channel c set past any value a stream or CPU waits
 * for (failure, teardown); a channel not mapped is left alone. */
static inline void plane_chan_release(plane_chan_t *c) {
  for (int s = 0; c->hdr && s < PLANE_MAX_SLOTS; s++) {
    __atomic_store_n(&c->hdr->produced[s], PLANE_RELEASED, __ATOMIC_RELEASE);
    __atomic_store_n(&c->hdr->consumed[s], PLANE_RELEASED, __ATOMIC_RELEASE);
  }
}

/* Is rank r on another host than this rank (its channels bridged)? */
static inline int plane_remote(const hetccl_plane_t *p, int r) {
  return p->a.hosts && p->a.hosts[r] != p->a.hosts[p->a.rank];
}

static inline char *plane_slot_host(const hetccl_plane_t *p, const plane_chan_t *c, uint64_t q) {
  return c->slots_host + (q % (uint64_t)p->a.slots) * p->a.piece;
}
static inline char *plane_slot_dev(const hetccl_plane_t *p, const plane_chan_t *c, uint64_t q) {
  return c->dev + PLANE_HDR_BYTES + (q % (uint64_t)p->a.slots) * p->a.piece;
}
/* The counters that say piece q is in its slot / has left it. Reading
 * piece q waits for *plane_produced(q) >= q + 1; writing it, for
 * *plane_consumed(q) >= q + 1 - slots (the slot's previous piece gone). */
static inline volatile uint64_t *plane_produced(const hetccl_plane_t *p, const plane_chan_t *c,
                                                uint64_t q) {
  return &c->hdr->produced[q % (uint64_t)p->a.slots];
}
static inline volatile uint64_t *plane_consumed(const hetccl_plane_t *p, const plane_chan_t *c,
                                                uint64_t q) {
  return &c->hdr->consumed[q % (uint64_t)p->a.slots];
}

/* A counter's device address, from its host address in channel c. */
static inline void *plane_counter_dev(const plane_chan_t *c, volatile uint64_t *host) {
  return c->dev + ((const char *)host - (const char *)c->hdr);
}

/* The split path's counters (above). */
#define PLANE_MAX_STAGE_PIECES 64
#define PLANE_CTR_STRIDE (PLANE_MAX_STAGE_PIECES + 16u)
static inline volatile uint64_t *plane_staged(const hetccl_plane_t *p, int q, uint64_t i) {
  return p->ctr + (size_t)q * PLANE_CTR_STRIDE + i % (uint64_t)p->stage_pieces;
}
static inline volatile uint64_t *plane_reduced(const hetccl_plane_t *p, int q) {
  return p->ctr + (size_t)q * PLANE_CTR_STRIDE + PLANE_MAX_STAGE_PIECES;
}
static inline void *plane_ctr_dev(const hetccl_plane_t *p, volatile uint64_t *host) {
  return p->ctr_dev + ((const char *)host - (const char *)p->ctr);
}

static inline volatile uint64_t *plane_gdep(const hetccl_plane_t *p, int q, uint64_t s) {
  return p->gdep + (size_t)q * PLANE_MAX_SLOTS + s % (uint64_t)p->a.slots;
}
static inline void *plane_gdep_dev(const hetccl_plane_t *p, volatile uint64_t *host) {
  return p->gdep_dev + ((const char *)host - (const char *)p->gdep);
}

/* Name rank r as the user does. */
static inline int plane_user_rank(const hetccl_plane_t *p, int r) {
  return p->a.user_ranks ? p->a.user_ranks[r] : r;
}

#endif
