/* Bootstrap wire formats and the helpers its two halves share (private to
 * comm/bootstrap*.c; comm/bootstrap.h is the interface).
 *
 *   bootstrap_root.c  the unique id and the root: the rendezvous that tells
 *                     every rank of its group where the next rank listens
 *   bootstrap.c       a rank's side: join the root, link the ring, and the
 *                     ring collectives (allgather, broadcast, barrier)
 *
 * All little-endian host order: one host architecture per job.
 *
 *   unique id (128 bytes): id_layout_t; only the secret is secret.
 *   rank -> root:  hello_t. No info: that travels the ring.
 *   root -> rank:  reply_t (the next rank's listener), or reject_t + a
 *                  reason (at most REJECT_MAX_REASON bytes of text), and
 *                  the connection closes.
 *   rank -> next rank's listener: link_t (authenticates the ring link).
 *   ring frames:   frame_t + payload; every field is checked on receipt. */
#ifndef HETCCL_COMM_BOOTSTRAP_WIRE_H
#define HETCCL_COMM_BOOTSTRAP_WIRE_H

#include <stdint.h>

#include "nccl.h"
#include "util/net.h"

#define BS_ID_MAGIC "HETCCLID"
#define BS_ID_VERSION 3u /* 3: ring bootstrap, groups of ranks per root */
#define BS_ID_FLAG_RANK0_ROOT 0x1u /* NCCL_COMM_ID / recovery: the group's first rank serves it */

#define BS_HELLO_MAGIC 0x48455442534845ull /* "HETBSHE" */
#define BS_REPLY_MAGIC 0x48455442535442ull /* "HETBSTB" */
#define BS_LINK_MAGIC 0x484554425354cbull
#define BS_FRAME_MAGIC 0x48455442534652ull /* "HETBSFR" */
#define BS_REJECT_MAGIC 0x4845544253524aull /* "HETBSRJ" */

#define BS_MAX_RANKS (1 << 20)
#define BS_MAX_INFO (1u << 20)           /* bytes of info per rank */
#define BS_MAX_TABLE ((uint64_t)1 << 32) /* nranks * info_bytes */

typedef struct id_layout {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  uint64_t secret;
  hetccl_net_wire_addr_t root;
  uint8_t reserved[NCCL_UNIQUE_ID_BYTES - 24 - sizeof(hetccl_net_wire_addr_t)];
} id_layout_t;
_Static_assert(sizeof(id_layout_t) == NCCL_UNIQUE_ID_BYTES, "unique id layout");

typedef struct hello {
  uint64_t magic;
  uint64_t secret;               /* of the id whose root this is */
  int32_t rank, nranks;
  uint64_t info_bytes;           /* checked for agreement; the info goes round the ring */
  hetccl_net_wire_addr_t listen; /* where this rank takes its ring link */
  uint32_t timeout_ms;           /* the rank's HETCCL_CONNECT_TIMEOUT */
  uint32_t left_ms;              /* how long the rank waits from this hello on */
  int32_t first, last;           /* the group of ranks this root serves, as the rank sees it */
  int32_t successor;             /* 1: `rank` registers as the rank after `last` (it is
                                  * in the next group), so that `last` can link to it */
  int32_t pad;
} hello_t;

typedef struct reject {
  uint64_t magic;
  int32_t code;    /* the ncclResult_t the rank's init returns */
  uint32_t bytes;  /* of reason text that follows, <= REJECT_MAX_REASON */
} reject_t;
#define REJECT_MAX_REASON (HETCCL_NET_REPLY_MAX - sizeof(reject_t))

typedef struct reply {
  uint64_t magic;
  uint64_t secret;
  int32_t nranks, pad;
  uint64_t info_bytes;
  hetccl_net_wire_addr_t next; /* the listener of rank + 1 (mod nranks); none for a
                                * successor's registration */
} reply_t;

typedef struct link {
  uint64_t magic;
  uint64_t secret;
  uint64_t comm_id;
  int32_t rank, nranks;
} link_t;

enum { BS_KIND_GATHER = 1, BS_KIND_BCAST };

typedef struct frame {
  uint64_t magic;
  uint64_t comm_id;
  int32_t rank;
  uint32_t kind;
  uint64_t seq;
  uint64_t bytes;
} frame_t;

static inline uint64_t hetccl_bs_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

void hetccl_bs_id_read(const ncclUniqueId *id, id_layout_t *l);
void hetccl_bs_id_write(ncclUniqueId *id, uint64_t secret, uint32_t flags,
                        const hetccl_net_wire_addr_t *root);

/* How long a rank waits past its own deadline for the root's word. */
int hetccl_bs_reply_grace_ms(int timeout_ms);
int hetccl_bs_connect_timeout_ms(void);

/* Listen on addr and start a root thread; it owns everything after. */
ncclResult_t hetccl_bs_root_start(hetccl_sockaddr_t *addr, uint64_t secret, int timeout_ms,
                                  int in_rank0);

/* The group of ranks that id number g of nids serves: [*first, *last]. The
 * first nranks % nids groups hold one rank more than the others, so that
 * the rank that starts a group is the one NCCL's documentation has make
 * that group's id. */
void hetccl_bs_group_range(int nranks, int nids, int g, int *first, int *last);
/* The group of `rank`. */
int hetccl_bs_group_of(int nranks, int nids, int rank);

#endif
