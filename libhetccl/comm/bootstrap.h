/* Bootstrap: how ranks find each other and exchange small metadata over TCP.
 *
 * ncclGetUniqueId starts a root (a thread of the calling process) listening
 * on an address of this host (NCCL_SOCKET_IFNAME honoured) and writes into the
 * id: a magic, the root address and port, and a random 64-bit secret. With
 * NCCL_COMM_ID=host:port set, the id encodes that address instead and
 * hetccl_bootstrap_init on rank 0 serves the root itself.
 *
 * A root is a rendezvous, not a funnel (bootstrap_root.c): every rank of
 * its group connects, presents the secret, its rank and the address of its
 * ring listener; the root checks that they agree (nranks, every rank once)
 * and answers each with where the next rank listens, then exits. With
 * several ids (ncclCommInitRankScalable) the ranks are split into as many
 * groups, each joining its own id's root. A connection that does not
 * present the secret, or sends a frame that does not fit, is dropped and
 * logged; the root keeps waiting for the real ranks. A refused hello that
 * speaks the protocol is told why first, so that its init fails with the
 * reason (ncclInvalidUsage: "the unique id's secret does not match",
 * "nranks=3 ... nranks=2", "rank 1 already joined").
 *
 * When ranks are missing, the root gives up at the earliest deadline of the
 * ranks that joined (or its own HETCCL_CONNECT_TIMEOUT) and tells them which
 * ranks never came; their init returns ncclTimeout with that text ("rank 3
 * of 4 never joined within 5.0 s (HETCCL_CONNECT_TIMEOUT of rank 0)").
 *
 * After that, each rank keeps one TCP link to rank + 1 and one from
 * rank - 1 (bootstrap.c): the ranks' info, and later allgather, broadcast
 * and barrier, go round that ring. They are collective over all ranks of
 * the communicator, blocking, and bounded by the connect timeout and the
 * abort flag. A lost link is ncclRemoteError naming the rank. Every rank
 * listens only until rank - 1 has linked: after init no bootstrap port is
 * open.
 *
 * Threads: a bootstrap handle is used by one thread at a time. */
#ifndef HETCCL_COMM_BOOTSTRAP_H
#define HETCCL_COMM_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

typedef struct hetccl_bootstrap hetccl_bootstrap_t;

/* Fill *id and start a root thread (unless NCCL_COMM_ID is set). */
ncclResult_t hetccl_bootstrap_root_create(ncclUniqueId *id);

/* Is this a well-formed hetccl unique id? (ncclInvalidArgument + WARN if not,
 * e.g. zeroed, from another library, or corrupted.) */
ncclResult_t hetccl_bootstrap_id_check(const ncclUniqueId *id);

/* The id's secret and a communicator id derived from it; equal on all ranks. */
uint64_t hetccl_bootstrap_id_secret(const ncclUniqueId *id);
uint64_t hetccl_bootstrap_id_comm_id(const ncclUniqueId *id);

typedef struct hetccl_bootstrap_opts {
  int timeout_ms;            /* connect and exchange bound; init waits up to 2 s
                              * (a quarter of it, at least 0.5 s) longer for the
                              * root's word on why it failed */
  volatile int *abort_flag;  /* non-zero: give up promptly with ncclInternalError */
} hetccl_bootstrap_opts_t;

/* Join the communicator described by ids (nids of them, the same list on
 * every rank: ncclCommInitRankScalable's; else one) as `rank` of `nranks`;
 * publish info (info_bytes, the same size on every rank) and receive every
 * rank's info into all_infos (nranks * info_bytes, indexed by rank). The
 * communicator id and secret are ids[0]'s. */
ncclResult_t hetccl_bootstrap_init(const ncclUniqueId *ids, int nids, int rank, int nranks,
                                   const void *info, size_t info_bytes, void *all_infos,
                                   const hetccl_bootstrap_opts_t *opts,
                                   hetccl_bootstrap_t **out);

/* Collective over all ranks; `bytes` equal everywhere. all: nranks * bytes. */
ncclResult_t hetccl_bootstrap_allgather(hetccl_bootstrap_t *bs, const void *mine, void *all,
                                        size_t bytes);
ncclResult_t hetccl_bootstrap_bcast(hetccl_bootstrap_t *bs, void *buf, size_t bytes, int root);
ncclResult_t hetccl_bootstrap_barrier(hetccl_bootstrap_t *bs);
/* A unique id for a new communicator of the ranks r with excluded[r] == 0,
 * made without a message (the excluded may be dead: shrink after a
 * failure). Every member calls it with the same set, the same number of
 * times; each gets the same id. Its root is served by the lowest member,
 * which must be rank 0 of the new communicator, on that rank's spare port
 * (bootstrap.c, "Spare ports"). */
ncclResult_t hetccl_bootstrap_recovery_id(hetccl_bootstrap_t *bs, const uint8_t *excluded,
                                          ncclUniqueId *id);

/* Messages and bytes this handle sent and received so far (hellos, links,
 * ring frames), for the INFO line that tools/scale_measure.py reads. */
void hetccl_bootstrap_stats(const hetccl_bootstrap_t *bs, uint64_t *msgs, uint64_t *bytes);

/* Close connections and the listener; never blocks on peers. NULL is fine. */
void hetccl_bootstrap_destroy(hetccl_bootstrap_t *bs);

#endif
