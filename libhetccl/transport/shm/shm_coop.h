/* The claims record of one single-copy message that several threads read
 * (shm_ring.c, "two cores on one message"; shm_helper.h). It lives in the
 * payload of the message's RNDV slot, in the ring both processes map.
 *
 * Thread: the receiver's driving thread opens it; pieces are claimed with
 * atomics by whoever helps (the receiver, its helper thread, the sender). */
#ifndef HETCCL_TRANSPORT_SHM_COOP_H
#define HETCCL_TRANSPORT_SHM_COOP_H

#include <stdatomic.h>
#include <stdint.h>

/* Two cores on one single-copy message (shm_ring.c: the receiver reads
 * pieces from the front, the sender writes pieces from the back). Lives in
 * the payload of the message's RNDV slot, which the receiver owns until it
 * releases it; the sender clears `open` when it places the slot. */
typedef struct shm_coop {
  _Atomic uint64_t claims; /* pieces taken: from the front (low 32 bits), from the back (high) */
  _Atomic uint64_t done;   /* bytes landed, by any reader */
  uint64_t dst;            /* the receiver's destination address */
  uint64_t piece;          /* bytes per piece, the last one shorter */
  uint32_t npieces;
  _Atomic uint32_t open;   /* receiver: 1 once the fields above are set (the sender may
                            * help), 2 when the receiver's helper thread reads from the
                            * back instead (shm_helper.h) */
  uint8_t pad[24];
} shm_coop_t;
_Static_assert(sizeof(shm_coop_t) == 64, "the smallest slot payload (HETCCL_SHM_CHUNK) holds it");

/* Take the next free piece of co, from the front (the receiver) or the back
 * (the sender, or the receiver's helper thread); 0 when every piece is
 * taken. */
static inline int shm_coop_claim(shm_coop_t *co, int back, uint32_t *piece) {
  uint64_t c = atomic_load_explicit(&co->claims, memory_order_relaxed);
  for (;;) {
    uint32_t front = (uint32_t)c, from_back = (uint32_t)(c >> 32);
    if ((uint64_t)front + from_back >= co->npieces) return 0;
    uint64_t next = back ? c + ((uint64_t)1 << 32) : c + 1;
    if (atomic_compare_exchange_weak_explicit(&co->claims, &c, next, memory_order_relaxed,
                                              memory_order_relaxed)) {
      *piece = back ? co->npieces - 1 - from_back : front;
      return 1;
    }
  }
}

#endif
