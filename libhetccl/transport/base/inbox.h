/* The inbox: what a transport's listener receives while its communicator
 * runs (connections on first use, transport.h), taken without blocking.
 *
 * Contract. hetccl_inbox_poll accepts what is pending on the listener and
 * reads a fixed-size header from each connection, many at once, never
 * waiting: a connection whose header is complete goes to take(); one that
 * closes, errs, or has not sent its header within INBOX_EXPIRE_MS is
 * closed; when INBOX_MAX_PENDING are pending the oldest makes room (a real
 * peer sends its header at once). take() returns 1 to keep the fd (it owns
 * it from then on) or 0 to have it closed. Exactly the header's bytes are
 * read: what follows stays in the socket for its new owner.
 *
 * Threads: the one that drives the transport's context; no locks. */
#ifndef HETCCL_TRANSPORT_BASE_INBOX_H
#define HETCCL_TRANSPORT_BASE_INBOX_H

#include <stddef.h>

#include "nccl.h"
#include "util/net.h"

typedef struct hetccl_inbox hetccl_inbox_t;

typedef int (*hetccl_inbox_take_fn)(void *ctx, int fd, const void *hdr,
                                    const hetccl_sockaddr_t *from);

/* An inbox on listener lfd (not owned) for headers of hdr_bytes (at most
 * 256). NULL, with a WARN, when out of memory. */
hetccl_inbox_t *hetccl_inbox_create(int lfd, size_t hdr_bytes);
/* One round; ncclSystemError only if the listener itself fails. */
ncclResult_t hetccl_inbox_poll(hetccl_inbox_t *in, hetccl_inbox_take_fn take, void *ctx);
/* Closes the pending connections (not the listener). NULL is fine. */
void hetccl_inbox_destroy(hetccl_inbox_t *in);

#endif
