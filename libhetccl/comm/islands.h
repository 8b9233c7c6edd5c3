/* Islands: which ranks one vendor library can serve together.
 *
 * Ranks of one GPU kind, served by one version of that kind's vendor
 * library and presenting the same island id (HETCCL_ISLANDS, or the one
 * an internal communicator or a split inherits) are one island; ranks that
 * share a GPU never are (the vendor refuses two ranks on one device). Every
 * rank reaches the same answer from the same published table
 * (comm->boot.peers), so every rank chooses the same backend.
 *
 * Thread: where init runs. */
#ifndef HETCCL_COMM_ISLANDS_H
#define HETCCL_COMM_ISLANDS_H

#include "comm/comm.h"

/* The island HETCCL_ISLANDS gives this rank of comm (-1: none given). A
 * list of another length than comm's size gives the island this process
 * had in its first communicator (a subset's, as PyTorch's new_group
 * makes), else fails naming both lengths. */
ncclResult_t hetccl_islands_forced(ncclComm_t comm, int32_t *island);

/* One island covering everyone (and vendor forwarding allowed)? */
int hetccl_islands_one(const hetccl_peer_info_t *peers, int n);

/* Give each rank that shares its GPU with another rank an island of its
 * own in comm->boot.peers (one INFO line on rank 0 says which). */
ncclResult_t hetccl_islands_separate_shared_gpus(ncclComm_t comm);

#endif
