/* Communicators made from an engine communicator: split (also the internal
 * ones of a hierarchy, hier/hier.c), shrink and grow (comm/init.h). Each
 * new communicator goes through hetccl_comm_init with an id its members
 * agree on over the parent's bootstrap. A forwarded communicator's split
 * and shrink are the vendor's own (backend/forward.c).
 *
 * Thread: the API caller (the parent's calls are collective). */
#include <stdlib.h>
#include <string.h>

#include "comm/init.h"
#include "comm/proxy.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

/* --- split / shrink ------------------------------------------------------- */

typedef struct split_entry {
  int32_t color, key, rank, pad;
} split_entry_t;

/* Ranks [members] (parent ranks, in new-rank order) form a communicator;
 * `leader_id` is the unique id its first member created. */
static ncclResult_t join_new_as(ncclComm_t parent, int newrank, int newn, const ncclUniqueId *id,
                                const ncclConfig_t *config, int forced, int32_t island,
                                ncclComm_t *out) {
  ncclComm_t comm = NULL;
  /* A split's ranks are the parent's: the same kind, whatever the process
   * has loaded since (hetcclCommInitRankAs may have chosen it). */
  HETCCL_CHECK(hetccl_comm_create(newn, newrank, config ? config : &parent->config,
                                  parent->dev_kind, &comm));
  comm->boot.island_forced = forced;
  comm->boot.island_force_id = island;
  if (!forced) { /* a user's split: its ranks keep the islands they have in the parent */
    comm->boot.island_inherited = 1;
    comm->boot.island_force_id = parent->boot.peers ? parent->boot.peers[parent->rank].island : -1;
  }
  comm->self_user_rank = parent->user_ranks ? parent->user_ranks[parent->rank] : parent->rank;
  ncclResult_t res = hetccl_comm_init(comm, id);
  if (res != ncclSuccess) {
    hetccl_comm_unregister(comm);
    hetccl_comm_release(comm);
    return res;
  }
  *out = comm;
  return ncclSuccess;
}

static ncclResult_t join_new(ncclComm_t parent, int newrank, int newn, const ncclUniqueId *id,
                             const ncclConfig_t *config, ncclComm_t *out) {
  return join_new_as(parent, newrank, newn, id, config, 0, 0, out);
}

static ncclResult_t split_engine(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                 const ncclConfig_t *config, int forced, int32_t island);

ncclResult_t hetccl_comm_split_internal(ncclComm_t comm, int color, int key,
                                        const ncclConfig_t *config, int32_t island,
                                        ncclComm_t *newcomm) {
  *newcomm = NULL;
  return split_engine(comm, color, key, newcomm, config, 1, island);
}

ncclResult_t hetccl_comm_split_engine(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                      const ncclConfig_t *config) {
  *newcomm = NULL;
  return split_engine(comm, color, key, newcomm, config, 0, 0);
}

static ncclResult_t split_engine(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                 const ncclConfig_t *config, int forced, int32_t island) {
  if (!comm->boot.links) {
    WARN("ncclCommSplit: communicator has no bootstrap (rank %d)", comm->rank);
    return ncclInternalError;
  }
  int n = comm->nranks;
  split_entry_t mine = {color, key, comm->rank, 0};
  split_entry_t *all = calloc(n, sizeof(*all));
  ncclUniqueId *ids = calloc(n, sizeof(*ids));
  ncclResult_t res = ncclSuccess;
  if (!all || !ids) {
    WARN("ncclCommSplit: out of memory");
    res = ncclSystemError;
    goto out;
  }
  HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(comm->boot.links, &mine, all, sizeof(mine)), res,
                    out);
  /* The lowest parent rank of each colour serves its bootstrap root. */
  int leader = -1, newn = 0, newrank = 0;
  for (int r = 0; r < n && color != NCCL_SPLIT_NOCOLOR; r++) {
    if (all[r].color != color) continue;
    if (leader < 0) leader = r;
    newn++;
    if (all[r].key < key || (all[r].key == key && r < comm->rank)) newrank++;
  }
  ncclUniqueId myid;
  memset(&myid, 0, sizeof(myid));
  if (leader == comm->rank) HETCCL_CHECK_GOTO(hetccl_bootstrap_root_create(&myid), res, out);
  HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(comm->boot.links, &myid, ids, sizeof(myid)), res,
                    out);
  if (color == NCCL_SPLIT_NOCOLOR) goto out;
  res = join_new_as(comm, newrank, newn, &ids[leader], config, forced, island, newcomm);
out:
  free(all);
  free(ids);
  return res;
}

ncclResult_t hetccl_comm_shrink_engine(ncclComm_t comm, const int *exclude, int nexclude,
                                       ncclComm_t *newcomm, const ncclConfig_t *config,
                                       int flags) {
  *newcomm = NULL;
  int n = comm->nranks;
  uint8_t *gone = calloc(n, 1);
  if (!gone) {
    WARN("ncclCommShrink: out of memory");
    return ncclSystemError;
  }
  for (int i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= n) {
      free(gone);
      WARN("ncclCommShrink: excluded rank %d out of range [0, %d)", exclude[i], n);
      return ncclInvalidArgument;
    }
    gone[exclude[i]] = 1;
  }
  if (gone[comm->rank]) {
    free(gone);
    WARN("ncclCommShrink: rank %d is in its own exclude list", comm->rank);
    return ncclInvalidArgument;
  }
  int leader = -1, newn = 0, newrank = 0;
  for (int r = 0; r < n; r++) {
    if (gone[r]) continue;
    if (leader < 0) leader = r;
    if (r < comm->rank) newrank++;
    newn++;
  }
  /* The excluded ranks take no part (they may be dead). On a healthy
   * communicator the new id goes from the leader to each survivor over the
   * engine's own connections. After a failure (or with NCCL_SHRINK_ABORT,
   * which every rank passes alike, whether or not it has seen the failure
   * yet) those are closed: every survivor derives the same id from the
   * bootstrap, and the leader serves its root on its spare port. */
  ncclUniqueId id;
  ncclResult_t res = ncclSuccess;
  ncclResult_t failed = (ncclResult_t)__atomic_load_n(&comm->state.error, __ATOMIC_ACQUIRE);
  if (failed != ncclSuccess || (flags & NCCL_SHRINK_ABORT)) {
    if (flags & NCCL_SHRINK_ABORT) { /* stop what is in flight on the parent first */
      __atomic_store_n(&comm->state.abort_flag, 1, __ATOMIC_RELEASE);
      hetccl_proxy_drain(comm);
    }
    INFO(HETCCL_INIT, "ncclCommShrink: rank %d: %s; the survivors meet at rank %d's spare port",
         comm->rank, failed != ncclSuccess ? "the communicator failed" : "NCCL_SHRINK_ABORT",
         leader);
    HETCCL_CHECK_GOTO(hetccl_bootstrap_recovery_id(comm->boot.links, gone, &id), res, out);
    res = join_new(comm, newrank, newn, &id, config, newcomm);
    goto out;
  }
  /* the new communicator's id, signed "SHRK" and its size */
  hetccl_msg_t m = {0x5348524b00000000ull | (uint64_t)newn, 0};
  if (comm->rank == leader) {
    HETCCL_CHECK_GOTO(hetccl_bootstrap_root_create(&id), res, out);
    for (int r = 0; r < n; r++) {
      if (gone[r] || r == leader) continue;
      HETCCL_CHECK_GOTO(hetccl_engine_sendrecv(comm->engine.p2p, m, r, &id, sizeof(id), -1, NULL,
                                               0, NULL, NULL), res, out);
    }
  } else {
    HETCCL_CHECK_GOTO(hetccl_engine_sendrecv(comm->engine.p2p, m, -1, NULL, 0, leader, &id,
                                             sizeof(id), NULL, NULL), res, out);
  }
  res = join_new(comm, newrank, newn, &id, config, newcomm);
out:
  free(gone);
  return res;
}

/* --- growing ------------------------------------------------------------ */

/* What each member of the parent brings to a grow; the same table on every
 * member, so every member reaches the same verdict. */
typedef struct grow_entry {
  int32_t nranks, rank, has_id, pad;
  ncclUniqueId id;
} grow_entry_t;

ncclResult_t hetccl_comm_grow_engine(ncclComm_t parent, int nranks, const ncclUniqueId *id,
                                     int rank, ncclComm_t *newcomm, const ncclConfig_t *config) {
  *newcomm = NULL;
  if (!parent->boot.links) {
    WARN("ncclCommGrow: communicator has no bootstrap (rank %d)", parent->rank);
    return ncclInternalError;
  }
  int n = parent->nranks;
  grow_entry_t mine = {.nranks = nranks, .rank = rank, .has_id = id != NULL};
  if (id) mine.id = *id;
  grow_entry_t *all = calloc(n, sizeof(*all));
  if (!all) {
    WARN("ncclCommGrow: out of memory");
    return ncclSystemError;
  }
  ncclResult_t res = ncclSuccess;
  HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(parent->boot.links, &mine, all, sizeof(mine)), res,
                    out);
  int from = -1;
  for (int r = 0; r < n; r++) {
    if (all[r].rank != -1) {
      WARN("ncclCommGrow: rank %d of the communicator passed rank %d; members pass -1 (they "
           "keep their ranks) and only joining ranks, with no communicator, name theirs",
           r, all[r].rank);
      res = ncclInvalidArgument;
      goto out;
    }
    if (all[r].nranks <= n) {
      WARN("ncclCommGrow: rank %d asked to grow to %d ranks, not more than the %d there are", r,
           all[r].nranks, n);
      res = ncclInvalidArgument;
      goto out;
    }
    if (all[r].nranks != all[0].nranks) {
      WARN("ncclCommGrow: rank 0 asked to grow to %d ranks and rank %d to %d", all[0].nranks, r,
           all[r].nranks);
      res = ncclInvalidArgument;
      goto out;
    }
    if (!all[r].has_id) continue;
    if (from >= 0 && memcmp(&all[r].id, &all[from].id, sizeof(ncclUniqueId)) != 0) {
      WARN("ncclCommGrow: ranks %d and %d passed different unique ids; pass the one "
           "ncclCommGetUniqueId made, or NULL", from, r);
      res = ncclInvalidArgument;
      goto out;
    }
    if (from < 0) from = r;
  }
  if (from < 0) {
    WARN("ncclCommGrow: no member passed the unique id; the one that called "
         "ncclCommGetUniqueId must pass it");
    res = ncclInvalidArgument;
    goto out;
  }
  HETCCL_CHECK_GOTO(hetccl_bootstrap_id_check(&all[from].id), res, out);
  INFO(HETCCL_INIT, "ncclCommGrow: rank %d of %d joins a communicator of %d (id from rank %d)",
       parent->rank, n, nranks, from);
  res = join_new(parent, parent->rank, nranks, &all[from].id, config, newcomm);
out:
  free(all);
  return res;
}
