/* Shared pieces of the algorithm files (algo/ only; not an interface).
 *
 * Thread: whichever thread drives the engine (see p2p/engine.h). Nothing
 * here allocates: temporaries come from hetccl_engine_scratch, requested
 * once per collective (a second request may move the buffer).
 *
 * Determinism: every algorithm reduces in an order that is a function of
 * the ranks only (never of arrival times), so repeated runs give bitwise
 * equal results, and AllReduce gives bitwise equal results on all ranks. */
#ifndef HETCCL_ALGO_IMPL_H
#define HETCCL_ALGO_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "algo/algo.h"
#include "sched/sched.h"
#include "trace/trace.h"
#include "util/check.h"

/* Requests in flight per direction for the pairwise (a2a) exchanges, and
 * about the waves in flight of a ring or chain's schedule (ring.c). */
#define HETCCL_ALGO_WINDOW 4

static inline size_t algo_min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t algo_round_up(size_t a, size_t m) { return (a + m - 1) / m * m; }
static inline int algo_mod(int a, int n) { return ((a % n) + n) % n; }

/* A run of messages to one peer, HETCCL_ALGO_WINDOW in flight: what
 * message j of the run waits for, the one HETCCL_ALGO_WINDOW earlier
 * (`window` holds the run's steps by j % HETCCL_ALGO_WINDOW; message j's
 * goes in window[j % HETCCL_ALGO_WINDOW] once appended). */
static inline int algo_window_after(const int *window, int j) {
  return j >= HETCCL_ALGO_WINDOW ? window[j % HETCCL_ALGO_WINDOW] : HETCCL_STEP_NONE;
}

/* How c's messages go (p2p/engine.h): its signature, and whether the
 * receives that match may pull the sends in place (1 where they copy). */
static inline hetccl_msg_t algo_msg(const hetccl_coll_t *c, int pull_ok) {
  return (hetccl_msg_t){c->tag, pull_ok};
}

/* Split count elements into n blocks of nearly equal size, each start
 * aligned to 64 bytes where possible. Block b is [*off, *off + *cnt). */
void hetccl_algo_block(size_t count, size_t esize, int n, int b, size_t *off, size_t *cnt);

/* Piece size (elements) for pipelining blocks of at most `block` elements:
 * a multiple of 64 bytes, at most the engine's pipeline chunk, small
 * enough that a mid-sized block still splits into a few pieces. */
size_t hetccl_algo_piece(const hetccl_engine_t *e, size_t block, size_t esize);

/* --- schedules (sched/sched.h) for the algorithm files ----------------------
 *
 * One scratch request holds a schedule of up to max_steps steps and, after
 * it, `data` bytes for the algorithm (64-aligned; *data NULL where 0 were
 * asked). NULL on OOM (logged). */
hetccl_sched_t *hetccl_algo_sched(hetccl_engine_t *e, const hetccl_redop_t *op, int max_steps,
                                  size_t data, void **datap);

/* Steps a pairwise exchange takes (hetccl_algo_sched_pairwise). */
static inline int algo_pairwise_steps(int n) { return 2 * n + 1; }

/* Append a pairwise exchange with every other rank: step k sends
 * sbase + (rank + k) * sstride to rank + k and receives into
 * rbase + (rank - k) * rstride from rank - k, `bytes` each (a stride of 0
 * sends the same buffer to all), at most HETCCL_ALGO_WINDOW of each in
 * flight; every step after `after` (HETCCL_STEP_NONE: none). With
 * copy_own, also this rank's own block, once the first steps are posted
 * (peers that pull read meanwhile). recv_at[p], where given, gets the
 * index of the receive from p, and recv_at[rank] that of the own block's
 * copy (HETCCL_STEP_NONE without copy_own). */
void hetccl_algo_sched_pairwise(hetccl_sched_t *s, const char *sbase, size_t sstride,
                                char *rbase, size_t rstride, size_t bytes, int copy_own,
                                int after, int *recv_at);

/* Every host reduction, traced (sched/sched.h). */
static inline void algo_reduce(const hetccl_redop_t *op, void *dst, const void *a, const void *b,
                               size_t count) {
  hetccl_sched_reduce_traced(op, dst, a, b, count);
}

/* Local copy that tolerates src == dst (in-place conventions). */
static inline void algo_copy(void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memmove(dst, src, bytes);
}

/* --- rings and chains as schedules (ring.c) ---------------------------------
 *
 * A ring/chain collective is S steps over P pieces. At step s of piece p
 * every rank receives from its left neighbour and sends to its right one
 * (either may be absent). The send of (p, s) may read what the receive of
 * (p, s-1) wrote, so it waits for it; everything else runs concurrently.
 * Pieces move as a wavefront (wave t = every (p, s) with p + s = t) with
 * at most HETCCL_ALGO_WINDOW pieces in flight per step, so piece p+1 of
 * step 0 overlaps piece p of step 1, and so on. Both neighbours enumerate
 * the same (p, s) in the same order, which is what the transports'
 * in-order matching needs. A plan says what each (p, s) moves (its io
 * function); ring.c writes it as a schedule for the host executor. */
typedef struct ring_io {
  const void *send;          /* NULL or sbytes == 0: no send */
  size_t sbytes;
  void *recv;                /* NULL or rbytes == 0: no receive */
  size_t rbytes;
  const void *in;            /* non-NULL: recv = in (op) incoming */
  /* local work just before the send is posted */
  void *prep_dst;            /* prep_count elements: hetccl_reduce_prepare, or */
  const void *prep_src;      /* a plain copy when prep_copy */
  size_t prep_count;
  int prep_copy;
  void *fin_buf;             /* finish (average) fin_count elements */
  size_t fin_count;
} ring_io_t;

typedef struct ring_plan ring_plan_t;
typedef void (*ring_io_fn)(const ring_plan_t *pl, int p, int s, ring_io_t *io);

struct ring_plan {
  hetccl_engine_t *e;
  const hetccl_coll_t *c;
  int rank, nranks, left, right;
  int npieces, nsteps;
  size_t esize, piece;       /* piece size in elements */
  ring_io_fn io;
  int finish_last;           /* finish (average) each piece once its last step has landed */
  /* what the io function needs */
  size_t count;              /* elements split into blocks (AllReduce, Reduce) */
  size_t blockcount;         /* fixed block size (ReduceScatter, AllGather) */
  const char *in;            /* contributions (sendbuf or a prepared copy) */
  char *out;                 /* recvbuf */
  char *final;               /* where the owned block ends (scratch or recvbuf) */
  char *inter;               /* scratch for partial sums: [WINDOW][nsteps][piece] */
  struct ring_at *steps_at;  /* the builder's ([WINDOW][nsteps]) */
};

/* The plan's piece size and count for blocks of at most maxblock
 * elements: hetccl_algo_piece's, at most max_piece (0: no bound), and
 * never so small that a block takes more than about a thousand pieces. */
void hetccl_ring_pieces(ring_plan_t *pl, size_t maxblock, size_t max_piece);
/* At most about this many pieces per block, whatever the pipeline chunk
 * says: a schedule's steps grow with them (four per piece and step). */
#define HETCCL_ALGO_MAX_PIECES 1024
/* The plan's schedule, empty, in the engine's scratch (NULL on OOM), with
 * room for `more` steps after the plan's, inter_bytes of partial-sum
 * pieces (pl->inter, NULL for 0) and extra_bytes for the caller (*extra,
 * where extra is not NULL). */
hetccl_sched_t *hetccl_ring_sched(ring_plan_t *pl, int more, size_t inter_bytes,
                                  size_t extra_bytes, char **extra);
/* Appends the plan's steps; returns the step that finishes the last piece
 * (pl->finish_last), after every earlier finish, or HETCCL_STEP_NONE. */
int hetccl_ring_build(hetccl_sched_t *s, const ring_plan_t *pl);
/* Both, and the run (blocking). */
ncclResult_t hetccl_ring_run(ring_plan_t *pl);

/* --- reads from the peers' buffers (pull_rs.c) -------------------------------
 *
 * Rank r reduces block r of every rank's input into dst, reading each
 * peer's block straight from its buffer where the transport pulls
 * (engine.h: pull_min), in cache-sized sub-blocks, each in rank order. */
typedef struct pull_plan {
  hetccl_engine_t *e;
  const hetccl_coll_t *c;
  size_t blockcount; /* every block this many elements (ReduceScatter), or 0: */
  size_t count;      /* count elements split by hetccl_algo_block (AllReduce) */
  const char *in;    /* every rank's input (its sendbuf) */
  char *dst;         /* where this rank's block of the result goes */
  int share_subs;    /* each finished sub-block also sent to every peer (AllReduce) */
} pull_plan_t;

void hetccl_pull_block(const pull_plan_t *pl, int b, size_t *off, size_t *cnt);
/* The sub-blocks of a block of cnt elements: returns how many, *per
 * elements each (the last one shorter); a function of cnt, the type and
 * the engine's knobs only, so sender and reader cut alike. */
int hetccl_pull_subs(const pull_plan_t *pl, size_t cnt, size_t *per);
/* Bytes of the one sub-block an in-place reduction sets aside. */
size_t hetccl_pull_saved_bytes(const pull_plan_t *pl);
/* Appends to s this rank's reduction of its block, finished (average)
 * sub-block by sub-block, with the sends its peers read; `saved` is
 * hetccl_pull_saved_bytes(pl) bytes (NULL while counting). Returns the
 * step that finishes the reduction (HETCCL_STEP_NONE: an empty block).
 * Not for PreMulSum. */
int hetccl_pull_build_own(hetccl_sched_t *s, const pull_plan_t *pl, char *saved);
/* A builder of a schedule by reads (hetccl_pull_build_own, or one that
 * calls it; returning what it does), and the run of it: counted, built in
 * the engine's scratch, run on the host executor with pulling on. */
typedef int (*pull_build_fn)(hetccl_sched_t *s, const pull_plan_t *pl, char *saved);
ncclResult_t hetccl_pull_run(const pull_plan_t *pl, pull_build_fn build);

#endif
