/* The per-operation trace: where the time of each call goes, as Chrome
 * trace-event JSON that Perfetto and chrome://tracing open (docs/trace.md).
 *
 * Contract.
 *   - Off unless HETCCL_TRACE names a file pattern. The knob is read once,
 *     at the first communicator's creation (hetccl_trace_setup); the flag
 *     it sets never changes after. Off, every trace point is one branch on
 *     hetccl_trace_on: no clock read, no allocation, no thread-local access.
 *   - On, a trace point records one complete event (start, end, what) into
 *     the calling thread's own buffer: no lock, no I/O. A thread's buffer is
 *     allocated at its first event (HETCCL_TRACE_EVENTS events); when full,
 *     later events are dropped and counted, and the count is written in the
 *     file's metadata. A thread that exits leaves its buffer to the next
 *     thread that traces, so the memory is bounded by the threads alive at
 *     once, not by the threads ever started.
 *   - Files are written when the user destroys or aborts a communicator and
 *     at process exit (hetccl_trace_flush): one file per rank, each holding
 *     every event recorded so far for that rank (rewritten whole, through a
 *     temporary name, so a reader never sees half a file).
 *   - Times are CLOCK_MONOTONIC, which every process of one host shares, so
 *     the files of one host's ranks line up when merged (`hetccl trace`).
 *   - Text fields (names, types, operators) must be static strings: they
 *     are kept as pointers and read at write time.
 *
 * Lanes. pid is the rank + 1 (Perfetto takes pid 0 for the kernel's idle
 * task; process_name says "rank R"), the rank being the one in the
 * communicator the user called (an island's, leaders' or rail's
 * communicator counts as its parent's); tid is the thread that ran the event (the API thread, a proxy thread), or,
 * for messages, a lane per peer and direction ("send to rank 2"): messages
 * to one peer overlap in flight, so each is drawn from when it was posted,
 * or when the one before it on its lane finished if later, to when the
 * engine saw it done.
 *
 * The events (cat / name as in the file):
 *
 *   kind    cat     name                   where, and what it covers
 *   CALL    call    AllReduce, Send, ...   entry/dispatch.c: an NCCL call on the user's
 *                                          communicator, entry to return (on a stream:
 *                                          the launch, not the device's work)
 *   GROUP   call    GroupEnd               entry/entry_group.c: the outermost ncclGroupEnd,
 *                                          where a group's engine work and deferred
 *                                          hierarchical collectives run
 *   PHASE   phase   island, leaders, rail  hier/hier_ops.c: one phase of a hierarchical
 *                                          collective (args.op: the phase's collective,
 *                                          args.step: its place in the call, from 0)
 *   ENGINE  engine  AllReduce, ..., p2p    exec/run.c: one collective, or one batch of
 *                                          sends and receives, run by the engine, on the
 *                                          thread that drives it
 *   PLANE   engine  plane                  exec/run.c: the data plane's share of a
 *                                          batch of host buffers
 *   SEND    piece   send                   p2p/engine.c: one message sent (args.peer,
 *   RECV    piece   recv                   args.bytes) or received; empty signature
 *                                          messages are left out
 *   REDUCE  reduce  reduce                 algo/: a host reduction (args.bytes of
 *                                          output, args.dtype, args.op)
 *   STAGE   stage   stage wait             exec/devpath.c: the proxy waiting for the
 *                                          stream to stage a batch's device inputs into
 *                                          host memory (the copies themselves run on the
 *                                          stream, where the host cannot time them)
 *
 * Threads: any thread may record; hetccl_trace_flush may run on any
 * thread, concurrently with recording (it reads what was published). */
#ifndef HETCCL_TRACE_TRACE_H
#define HETCCL_TRACE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* id, category */
#define HETCCL_TRACE_KINDS(X)                                                  \
  X(CALL, "call")                                                              \
  X(GROUP, "call")                                                             \
  X(PHASE, "phase")                                                            \
  X(ENGINE, "engine")                                                          \
  X(PLANE, "engine")                                                           \
  X(SEND, "piece")                                                             \
  X(RECV, "piece")                                                             \
  X(REDUCE, "reduce")                                                          \
  X(STAGE, "stage")

typedef enum {
#define HETCCL_TRACE_KIND_ENUM(id, cat) HETCCL_TRACE_##id,
  HETCCL_TRACE_KINDS(HETCCL_TRACE_KIND_ENUM)
#undef HETCCL_TRACE_KIND_ENUM
  HETCCL_TRACE_KIND_COUNT
} hetccl_trace_kind_t;

#define HETCCL_TRACE_NONE (-1) /* an int field that does not apply */
#define HETCCL_TRACE_NO_SEQ UINT32_MAX

/* What one event says. rank, comm and seq left as NONE / 0 / NO_SEQ are
 * taken from the thread's context (hetccl_trace_context). */
typedef struct hetccl_trace_ev {
  hetccl_trace_kind_t kind;
  const char *name;         /* static text */
  const char *op;           /* a phase's or task's collective, a reduction's operator; or NULL */
  const char *dtype;        /* or NULL */
  uint64_t comm;            /* communicator id; 0: the context's */
  uint64_t bytes;
  int rank;                 /* NONE: the context's */
  int peer, root, step;     /* NONE where they do not apply */
  uint32_t seq;             /* the call's number on its communicator; NO_SEQ: the context's */
} hetccl_trace_ev_t;

/* Nonzero once HETCCL_TRACE turned tracing on; never changes after. */
extern int hetccl_trace_on;
#define HETCCL_TRACE_ON() __builtin_expect(__atomic_load_n(&hetccl_trace_on, __ATOMIC_RELAXED), 0)

/* Reads HETCCL_TRACE once per process; comm init calls it. A pattern whose
 * directory cannot be written fails with ncclInvalidArgument (WARN naming
 * the file), every time it is called. */
ncclResult_t hetccl_trace_setup(void);

/* Nanoseconds of CLOCK_MONOTONIC, never 0. */
uint64_t hetccl_trace_now(void);

/* The start of an event: now when tracing, else 0 (no clock read). */
#define HETCCL_TRACE_BEGIN() (HETCCL_TRACE_ON() ? hetccl_trace_now() : 0)

/* An event of the thread's context, from t0 to now. */
void hetccl_trace_record(uint64_t t0, const hetccl_trace_ev_t *ev);
/* The same with both ends given (a piece whose lane was busy until t0). */
void hetccl_trace_record_span(uint64_t t0, uint64_t t1, const hetccl_trace_ev_t *ev);

/* The thread's context, which events that leave rank, comm or seq unset
 * inherit: set by a call and by the engine before it runs a task. Returns
 * now, the start of the event that sets it. */
uint64_t hetccl_trace_context(int rank, uint64_t comm, uint32_t seq);
/* The context's rank, or NONE before any. */
int hetccl_trace_context_rank(void);

/* Calls: the outermost call on a thread opens a frame (its rank, comm and
 * seq become the context) and returns its start; a call made inside it (a
 * hierarchical phase runs as calls on the island, leaders and rail
 * communicators) returns 0 and records nothing. call_end records the call
 * (ev says its rank, comm and seq) and closes the frame. hetccl_trace_seq:
 * the context's seq, which the engine tasks a call makes carry. */
uint64_t hetccl_trace_call_begin(int rank, uint64_t comm, uint32_t seq);
void hetccl_trace_call_end(uint64_t t0, const hetccl_trace_ev_t *ev);
uint32_t hetccl_trace_seq(void);

/* Names this thread's lane ("proxy thread"; default "API thread"). name
 * is static text. */
void hetccl_trace_thread_name(const char *name);

/* Write every rank's file now (a no-op when off). */
void hetccl_trace_flush(void);

#endif
