/* The forms the data plane runs, as schedules of pieces (sched/sched.h).
 *
 *   form                 collectives                          lanes
 *   two-rank exchange    AllReduce, ReduceScatter (n = 2;     a lane per peer and direction
 *                        AllReduce on the plane only)
 *   ring wavefront       AllReduce, ReduceScatter, AllGather  one
 *                        (n >= 3; AllReduce on the host, n >= 2)
 *   chain                Broadcast, Reduce                    one
 *   direct               AlltoAll, Gather, Scatter,           a lane per peer and direction
 *                        AllGather (n = 2), Send/Recv
 *   halving-doubling     AllReduce under HETCCL_ALGO=rhd      one
 *                        (algo/rhd.c, the host engine's
 *                        schedule, in whole messages)
 *
 * Every message is cut into pieces of at most `piece` bytes (the plane's
 * slot, or two for a wide piece), and for the data plane a form lists its
 * steps piece by piece: piece k passes through every step of a ring before
 * piece k + 1 enters it (a wavefront), so one lane in listed order keeps
 * every link busy. For the host executor a ring lists the same steps wave
 * by wave (unit i of piece w - i in wave w, as ring.c): that executor
 * starts a message only after those listed before it on its pair, so piece
 * by piece a ring would carry one piece at a time (pieces.c: ring_units).
 * Both ranks of a pair list their pieces in the same order, which is the
 * order the plane numbers them on its channels.
 *
 * Each reduced element is reduced on one rank, in one order (a ring's
 * chunk on the rank that finishes it, the two-rank exchange with the lower
 * rank's data first), so every rank ends with the same bits. This rank's
 * own data enters a reduction through a transient PREPARE (PreMulSum's
 * scaling, by this rank's own scalar), an intermediate sum goes on through
 * a transient RECV_REDUCE, and a finished chunk gets its FINISH (Avg's
 * division) at once; the data plane's lowering (plane/program.c) fuses each
 * of these into the step beside it, so that no transient result is ever
 * written. The host executor fuses too, where the operator does not scale
 * (sched_host.c: a transient PREPARE is its source), and writes each
 * intermediate sum: a ring AllReduce's to recvbuf at its offset in sendbuf,
 * as the host's own ring keeps them (the all-gather overwrites them
 * later); a ring ReduceScatter's and a chain Reduce's to slots of scratch
 * given by hetccl_wavefront_run, a few pieces deep, piece k's sum waiting
 * for the send that read piece k - SUM_WAVES's (an `after` only that
 * executor sees). Under PreMulSum the host scales this rank's data where a
 * receive reduces with it (sched_host.c fuses the PREPARE into the
 * receive), and where it is sent on unreduced (a ring's first send, a
 * chain's head, the two-rank exchange) into a buffer: an AllReduce's own
 * chunk into recvbuf at its offset, as the host's own ring does, else the
 * slot of step n - 1, which no intermediate sum takes.
 *
 * Memory: the caller's schedule (hetccl_sched_init_ranks, op = &c->op for
 * a reducing collective); a build with a counting schedule says how many
 * steps to size it for.
 *
 * Thread: the caller's. */
#ifndef HETCCL_ALGO_PIECES_H
#define HETCCL_ALGO_PIECES_H

#include <stddef.h>

#include "algo/algo.h"
#include "sched/sched.h"

/* Collective c (count > 0) in pieces of `piece` bytes (a multiple of the
 * element size); sets s->one_lane for its form. *cut: 1 where the
 * schedule's messages are whole and the executor cuts them into pieces
 * (halving-doubling), 0 where its steps are the pieces. ncclInternalError
 * for a function that is not a collective. */
ncclResult_t hetccl_pieces_coll(hetccl_sched_t *s, const hetccl_coll_t *c, size_t piece,
                                int *cut);

/* algo/rhd.c: AllReduce by recursive halving then doubling into s (op
 * &c->op), in whole messages. */
void hetccl_rhd_build(hetccl_sched_t *s, const hetccl_coll_t *c);

/* A message of `bytes` to / from peer, piece by piece. A receive with
 * `guard` (a SEND step's index, else HETCCL_STEP_NONE) lands in place of
 * that send's source: its piece k waits for that send's piece k, cut
 * alike and listed one step after another. */
void hetccl_pieces_send(hetccl_sched_t *s, int peer, const void *src, size_t bytes, size_t piece);
void hetccl_pieces_recv(hetccl_sched_t *s, int peer, void *dst, size_t bytes, size_t piece,
                        int guard);

/* Bytes per piece the form of c moves per message (what the plane sizes
 * its pieces by): a ring AllReduce's chunk, else the whole count. */
size_t hetccl_pieces_message_bytes(const hetccl_coll_t *c, int nranks);

#endif
