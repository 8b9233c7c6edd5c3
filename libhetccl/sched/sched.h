/* sched/: schedules. A collective written once as steps on peers, with
 * the order between them, and run by an executor that owns the waiting.
 *
 *   step          does                                            done when
 *   SEND          `bytes` of src to `peer`                        the transport is done with src
 *   RECV          `bytes` from `peer` into dst                    dst holds them
 *   RECV_REDUCE   `bytes` from `peer` reduced into dst as they    dst holds the result
 *                 land: dst = in (op) incoming, or incoming
 *                 (op) in with HETCCL_STEP_IN_RIGHT (in may be
 *                 dst)
 *   REDUCE        dst = a (op) b, `bytes` of elements             at once
 *   COPY          dst = src (src == dst allowed)                  at once
 *   PREPARE       dst = src scaled by op's PreMulSum scalar       at once
 *                 (a plain copy for other operators)
 *   FINISH        dst scaled in place as op finishes (Avg's       at once
 *                 division; nothing for other operators)
 *
 * Order. A step starts once every step it names in `after` is done, and
 * not before the steps ahead of it in the schedule that talk to the same
 * peer in the same direction have started: messages between two ranks are
 * matched in posting order (p2p/engine.h), so both ranks post a pair's
 * messages in the order their schedules list them. Nothing else orders
 * steps: two steps with no path between them may run in either order, or
 * overlap. A builder lists steps so that every `after` names an earlier
 * step; the executor starts any step that may start, lowest index first.
 *
 * Transient results (HETCCL_STEP_FORWARD on a RECV_REDUCE or a PREPARE):
 * the step's dst is read by the next step alone, which sends it (a
 * RECV_REDUCE's or a PREPARE's) or reduces with it as its `in` (a
 * PREPARE's). An executor that can fuse the two never writes dst (it may
 * then be NULL). The data plane's lowering fuses every transient; the host
 * executor fuses a PREPARE of an operator that does not scale (the next
 * step reads its source), a scaling PREPARE that a RECV_REDUCE takes as
 * its `in` (the receive scales it as the bytes land), and writes the
 * others to dst, refusing a schedule that left one without a buffer.
 * Likewise a FINISH right after a RECV_REDUCE of the same dst and bytes
 * may be fused into it.
 *
 * Lanes: how the device executor places steps, which the host executor
 * ignores. With `one_lane` every step runs on one lane in the order
 * listed (rings and chains: each piece passes through every step in
 * turn); without it each peer and direction has a lane of its own and
 * local steps share one. Steps on one lane run one after another; an
 * `after` across lanes must name a SEND (its piece's counter is the
 * wait). A builder still names every data dependency in `after`, within a
 * lane too (the lowering drops those): the host executor knows no other
 * order.
 *
 * What a schedule does not say: which thread runs it, how it waits, how
 * messages move. Two executors run schedules: sched_host.c on the calling
 * thread over the engine's point-to-point plane, and the data plane's
 * lowering (plane/program.c) onto its lanes of pieces on device streams or
 * a host thread (plane/exec_*.c). The forms the data plane runs are
 * built in algo/pieces.c.
 *
 * Results: an executor adds nothing to a schedule's arithmetic. A schedule
 * whose every element is reduced in an order that depends on the ranks
 * alone gives the same bits on every run (algo/algo_impl.h's rule).
 *
 * Memory: a schedule lives in memory its builder provides
 * (hetccl_sched_bytes(max_steps), 16-byte aligned; the algorithms take it
 * from the engine's scratch), so building and running one never allocates.
 *
 * Thread: whichever thread drives the engine. */
#ifndef HETCCL_SCHED_SCHED_H
#define HETCCL_SCHED_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "p2p/engine.h"
#include "runtime/reduce.h"

typedef enum {
  HETCCL_STEP_SEND,
  HETCCL_STEP_RECV,
  HETCCL_STEP_RECV_REDUCE,
  HETCCL_STEP_REDUCE,
  HETCCL_STEP_COPY,
  HETCCL_STEP_PREPARE,
  HETCCL_STEP_FINISH,
} hetccl_step_kind_t;

/* Step flags (above): RECV_REDUCE's operand order; a transient result;
 * a RECV_REDUCE that scales its `in` by op's PreMulSum scalar as it
 * reduces (dst = scaled in, then dst (op)= incoming): for the host
 * executor alone, set by it where it fuses a transient PREPARE, or by a
 * host builder (ring.c) whose own contribution enters that way. */
enum { HETCCL_STEP_IN_RIGHT = 1, HETCCL_STEP_FORWARD = 2, HETCCL_STEP_SCALE_IN = 4 };

/* Steps a step may wait for, besides the order of its pair's messages. */
#define HETCCL_STEP_MAX_AFTER 3
/* No step (an `after` slot left empty, a builder's failed append). */
#define HETCCL_STEP_NONE (-1)

typedef struct hetccl_step {
  uint8_t kind;             /* hetccl_step_kind_t */
  uint8_t flags;            /* HETCCL_STEP_IN_RIGHT (RECV_REDUCE), HETCCL_STEP_FORWARD */
  uint8_t state;            /* the executor's */
  int32_t peer;             /* SEND, RECV, RECV_REDUCE */
  int32_t after[HETCCL_STEP_MAX_AFTER];
  int32_t same_pair;        /* the previous step of this peer and direction (the builder's) */
  void *dst;
  const void *src;          /* SEND, COPY, PREPARE; REDUCE's a; RECV_REDUCE's in */
  const void *src2;         /* REDUCE's b */
  size_t bytes;
  const hetccl_redop_t *op; /* RECV_REDUCE, REDUCE, PREPARE, FINISH: the schedule's */
  hetccl_req_t req;         /* the executor's, for messages */
} hetccl_step_t;

typedef struct hetccl_sched {
  hetccl_engine_t *e;       /* the host executor's (NULL: built for the data plane) */
  int rank, nranks;
  const hetccl_redop_t *op; /* the reducing steps' operator (NULL: none reduce) */
  size_t esize;             /* bytes per element of op's type */
  /* The receives of this schedule's plain messages (RECV) copy, so a
   * pulling transport may read a SEND's source in place (engine.h:
   * pull_ok); a schedule with RECV_REDUCE steps on pulling transports
   * sets it too (pull_rs.c: the reader reduces what it reads). A pulled
   * send is done only once its peer has read it, so the host executor
   * copies anyway where the i-th receive from p names the j-th send to p
   * in `after`, j >= i (both ranks would wait for each other: an in-place
   * AlltoAll); a builder names such a wait directly, not through a step
   * between. */
  int pull_ok;
  int one_lane;             /* the device executor's placement (above) */
  int nsteps, cap;
  int wanted;               /* steps appended or refused: a build with cap 0 counts them */
  int failed;               /* an append past cap: the run refuses */
  int32_t *last_send, *last_recv; /* per peer, while building */
  hetccl_step_t *steps;
  /* The host executor's working memory, carved from the schedule's: */
  hetccl_req_t **posted;    /* the messages in flight, for the engine's wait */
  int32_t *inflight;        /* ... their steps */
  int32_t *pending;         /* per step: dependencies not yet met */
  int32_t *dep_off, *deps;  /* per step: the steps that depend on it (sched_host.c) */
  int32_t *ready;           /* steps that may start, lowest index first (a heap) */
  hetccl_msg_t msg;         /* the host executor's: how its sends go (tag, pull_ok) */
} hetccl_sched_t;

/* Bytes of memory for a schedule of up to max_steps steps on n ranks. */
size_t hetccl_sched_bytes(int max_steps, int nranks);

/* An empty schedule in mem (hetccl_sched_bytes(max_steps, n) bytes,
 * 16-aligned) for engine e's ranks, reducing with op (NULL: no
 * reduction). */
void hetccl_sched_init(hetccl_sched_t *s, void *mem, int max_steps, hetccl_engine_t *e,
                       const hetccl_redop_t *op);
/* The same for `rank` of `nranks` with no engine: a schedule for the data
 * plane (plane/program.c). mem may be NULL with max_steps 0, to count the
 * steps a builder takes (`wanted`) before sizing one. */
void hetccl_sched_init_ranks(hetccl_sched_t *s, void *mem, int max_steps, int rank, int nranks,
                             const hetccl_redop_t *op);

/* Append a step; returns its index, to name in later steps' `after`
 * (HETCCL_STEP_NONE where it did not fit: the run then fails, saying so).
 * a0..a2: steps it waits for, HETCCL_STEP_NONE for none. A message of
 * zero bytes and a local step of zero bytes are still steps (they order
 * others) but move nothing. */
int hetccl_sched_send(hetccl_sched_t *s, int peer, const void *src, size_t bytes, int a0, int a1);
int hetccl_sched_recv(hetccl_sched_t *s, int peer, void *dst, size_t bytes, int a0, int a1);
int hetccl_sched_recv_reduce(hetccl_sched_t *s, int peer, void *dst, const void *in,
                             int flags, size_t bytes, int a0, int a1);
int hetccl_sched_reduce(hetccl_sched_t *s, void *dst, const void *a, const void *b, size_t bytes,
                        int a0, int a1, int a2);
int hetccl_sched_copy(hetccl_sched_t *s, void *dst, const void *src, size_t bytes, int a0, int a1);
int hetccl_sched_prepare(hetccl_sched_t *s, void *dst, const void *src, size_t bytes, int a0,
                         int a1);
int hetccl_sched_finish(hetccl_sched_t *s, void *dst, size_t bytes, int a0, int a1);
/* One more step that `step` waits for, in its first empty `after` slot
 * (nothing where either is HETCCL_STEP_NONE, as in a counting build; no
 * slot left fails the schedule, saying so). */
void hetccl_sched_also_after(hetccl_sched_t *s, int step, int a);


/* hetccl_reduce, and its REDUCE event when tracing (trace/trace.h): every
 * host reduction of the schedules and the algorithms goes through here. */
void hetccl_sched_reduce_traced(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                                size_t count);

/* sched_host.c: run s to completion on this thread over its engine
 * (blocking; the engine's timeout and abort apply), every message signed
 * `tag` (the operation's, p2p/engine.h: hetccl_msg_t). A failure fails
 * the engine (every later call on it returns the error). */
ncclResult_t hetccl_sched_run_host(hetccl_sched_t *s, uint64_t tag);

#endif
