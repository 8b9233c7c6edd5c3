/* The receive helper: a second core on a single-copy receive.
 *
 * A receive that lands by plain process_vm_readv (shm_ring.c, "two cores
 * on one message") is read in pieces from the front by the thread that
 * drives the communicator. Where the host has cores to spare, that
 * thread also hands the message to this process's helper thread, which
 * reads pieces from the back (the same claims as a sender's help, shm.h's
 * shm_coop_t), so that one message moves on two cores even when both ranks
 * of a pair have receives of their own (a sendrecv, an exchange).
 *
 *   who            does                                     when
 *   driver thread  posts its endpoint's open message         rx_coop_open, if
 *                  (hetccl_shm_help_post), reads the front,  hetccl_shm_help_wanted
 *                  retires the post once every byte landed
 *                  (hetccl_shm_help_retire) or at close
 *   helper thread  claims pieces from the back, reads each   one per process,
 *                  with process_vm_readv, adds it to done;   started at the first
 *                  on a failed read it stops and says why    post, sleeps when idle,
 *                  in the post (failed, res, message)        joined when the last
 *                                                            endpoint that may post
 *                                                            closes
 *
 * Contract: a post stays valid (its endpoint, the ring slot of its
 * shm_coop_t, the destination) until hetccl_shm_help_retire returns; retire
 * takes it off the queue if the helper has not started it, else waits for
 * the piece the helper is reading. A message the helper works on is
 * marked open = 2 in its shm_coop_t, so that the sender does not write
 * into it too. The driver never waits on the helper for progress: every
 * piece the helper has not claimed is the driver's to claim.
 *
 * Default (HETCCL_SHM_HELPER unset): on when this host has at least
 * SHM_HELP_CPUS_PER_RANK CPUs per rank of the communicator on it and this
 * process may run on two CPUs or more (hetccl_shm_help_wanted).
 *
 * Thread: post and retire on the driver thread of the endpoint; the
 * helper's queue and each post's state under one process-wide lock. */
#ifndef HETCCL_TRANSPORT_SHM_HELPER_H
#define HETCCL_TRANSPORT_SHM_HELPER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "transport/transport.h"

struct shm_coop;

typedef struct shm_help {
  struct shm_help *next; /* the helper's queue (under its lock) */
  int state;             /* SHM_HELP_* (under the helper's lock) */
  struct shm_coop *co;   /* the message's claims, in its RNDV slot */
  int pid;               /* the sender */
  uint64_t src;          /* the message's address in the sender */
  uint64_t bytes;
  const hetccl_transport_args_t *args; /* copied-bytes counter, names */
  int peer_user;         /* the sender, as the user numbers it */
  uint64_t helped;       /* bytes the helper has read for this endpoint, all posts
                          * (written by the helper while it runs the post) */
  _Atomic int failed;    /* 1: a read failed; res and message say how */
  _Atomic int cancel;    /* retire: claim no more pieces */
  ncclResult_t res;
  char message[192];
} shm_help_t;

/* An endpoint that may post (help_on) attaches when made and detaches when
 * closed; the thread ends (joined) when the last one detaches, so that a
 * process holding no communicator holds no helper thread. */
void hetccl_shm_help_attach(void);
void hetccl_shm_help_detach(void);

/* Whether endpoints made with args use the helper (logged once). */
int hetccl_shm_help_wanted(const hetccl_transport_args_t *args);
/* The same choice for `local` ranks of a communicator on this host: the
 * knob where set, else the default above; `why` says which, in words. */
int hetccl_shm_help_choice(int local, char *why, size_t len);

/* Hand h (its co, pid, src, bytes, args, peer_user set; the coop record
 * open to claims) to the helper thread; 0 if it cannot run (no thread). */
int hetccl_shm_help_post(shm_help_t *h);

/* Take h back: off the queue, or once the helper has finished the piece
 * it is reading (it claims no more: a message given up, at close, is not
 * read on into a buffer its owner may free). A no-op on a post never made
 * or already retired. */
void hetccl_shm_help_retire(shm_help_t *h);

#endif
