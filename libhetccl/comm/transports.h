/* The engine's transports for a communicator: which one serves each pair
 * of its ranks, and connecting them into comm->engine.p2p.
 *
 * The transport of a pair is a pure function of what both ranks published
 * (comm->boot.peers), so both ends choose alike: forced (HETCCL_TRANSPORT=name)
 * that one for every pair; auto: shm on one host, else ib where both have
 * an active port (asked only when ib is wanted), else socket.
 *
 * Thread: where init runs (the engine backend's start). */
#ifndef HETCCL_COMM_TRANSPORTS_H
#define HETCCL_COMM_TRANSPORTS_H

#include <stdint.h>

#include "comm/comm.h"

/* Under HETCCL_TRANSPORT=auto, ib serves a pair on two hosts where both
 * ranks have an active port, unless NCCL_IB_DISABLE=1: is ib wanted, and
 * can this rank serve it (what it publishes)? */
int hetccl_transports_ib_wanted(void);
int hetccl_transports_ib_usable(void);

/* Create every used transport's context, exchange their addresses over
 * comm->boot.links and connect the pairs (now, or on first use where the
 * transport can: HETCCL_RUNTIME_CONNECT), then the engine over them
 * (comm->engine.p2p) and comm->engine.stage_piece. Collective, blocking,
 * bounded by the connect timeout and the abort flag. */
ncclResult_t hetccl_transports_connect(ncclComm_t comm, uint64_t secret);

#endif
