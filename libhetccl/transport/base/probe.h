/* The probe: is a peer's published listener still there?
 *
 * Why. With connections on first use (transport.h) the lower rank of a pair
 * initiates and the higher one waits for what arrives. A lower rank that is
 * killed before it connected leaves no note, and on another host no pid to
 * look at (p2p/connect.c checks /proc only for ranks of this host). But it
 * published a TCP listener that the transport keeps open while the rank
 * may still have to connect to a higher one (socket.c; an ib handshake
 * listener can promise the same): the kernel answers a connection to it
 * for as long as the process lives, and refuses it (RST) once the process
 * is gone. So the higher rank asks the kernel now and then.
 *
 * Where. In the transport, not the engine: the address is transport-private
 * (the engine holds only opaque blobs), and only the transport can promise
 * how long its listener stays open. This file knows nothing of ranks or
 * endpoints beyond the names its messages print: any transport with a TCP
 * listener calls it with the address it parsed from the peer's blob and
 * judges the answer itself (a refusal means "gone" only where the
 * listener's lifetime says so).
 *
 * Contract. hetccl_probe_poll never blocks. When no probe is in flight and
 * the last one began at least HETCCL_PROBE_EVERY_MS ago (or, for the first,
 * that long after hetccl_probe_init), it starts a nonblocking connect; on
 * later calls it reads the outcome:
 *   HETCCL_PROBE_ALIVE    accepted: the process holds its listener. The
 *                         connection is closed at once with a reset (no
 *                         TIME_WAIT here; the listener's inbox drops a
 *                         connection that closes without a header silently,
 *                         base/inbox.h, and a listener nobody accepts on
 *                         keeps it in its backlog until it closes).
 *   HETCCL_PROBE_REFUSED  reset: nothing listens on that port any more.
 *   HETCCL_PROBE_UNREACHABLE  the host or network is unreachable (an ICMP
 *                         error, or ARP found nobody).
 *   HETCCL_PROBE_UNKNOWN  nothing to say yet: no probe due, one in flight,
 *                         one unanswered for HETCCL_PROBE_GIVEUP_MS (SYNs
 *                         dropped: a lossy link, a full backlog; it is
 *                         closed and the next one starts on schedule), or
 *                         a local failure (out of descriptors). Never a
 *                         verdict: the caller's timeout still bounds the wait.
 * *err gets the errno behind REFUSED / UNREACHABLE. At most one descriptor
 * per probe, held only while a probe is in flight (hetccl_probe_busy).
 *
 * Threads: the one that drives the caller's context; no locks, no global
 * state. */
#ifndef HETCCL_TRANSPORT_BASE_PROBE_H
#define HETCCL_TRANSPORT_BASE_PROBE_H

#include <stdint.h>

#include "util/net.h"

#define HETCCL_PROBE_EVERY_MS 300  /* one probe per peer at most this often */
#define HETCCL_PROBE_GIVEUP_MS 2000 /* an unanswered probe is dropped after this */

typedef enum {
  HETCCL_PROBE_UNKNOWN = 0,
  HETCCL_PROBE_ALIVE,
  HETCCL_PROBE_REFUSED,
  HETCCL_PROBE_UNREACHABLE,
} hetccl_probe_result_t;

typedef struct hetccl_probe {
  int fd;             /* the probe in flight, -1: none */
  int64_t started_ms; /* when it began */
  int64_t next_ms;    /* the next may begin at (or after) this time */
} hetccl_probe_t;

/* A probe whose first connect is due HETCCL_PROBE_EVERY_MS after now_ms. */
void hetccl_probe_init(hetccl_probe_t *p, int64_t now_ms);
/* One step, as the contract above says. may_start = 0: only read the
 * probe in flight (the caller's cap on probes in flight is reached). */
hetccl_probe_result_t hetccl_probe_poll(hetccl_probe_t *p, const hetccl_sockaddr_t *addr,
                                        int64_t now_ms, int may_start, int *err);
/* 1 while a probe holds a descriptor. */
static inline int hetccl_probe_busy(const hetccl_probe_t *p) { return p->fd >= 0; }
/* Drop the probe in flight, if any. Safe on a probe never started. */
void hetccl_probe_close(hetccl_probe_t *p);

/* ---- a higher rank's wait for a lower one, as the transports run it ------
 * (socket: for its connections; ib: for its hello). A context caps its
 * probes in flight at HETCCL_PROBES_MAX (*in_flight counts them); the
 * messages name the waiter and what it waits for. */
#define HETCCL_PROBES_MAX 32 /* probes in flight per context (descriptors) */

typedef struct hetccl_probe_who {
  const char *transport;   /* the messages' first word: "socket", "ib" */
  int rank, peer;          /* the waiter and the lower rank, as the user numbers them */
  int64_t since_ms;        /* when the wait began */
  const char *waiting_for; /* "for it to connect", "for its hello" */
} hetccl_probe_who_t;

/* hetccl_probe_poll under the context's cap, keeping *in_flight right; an
 * ALIVE answer is TRACEd. A REFUSED / UNREACHABLE verdict is the caller's
 * to confirm (the peer may have come just before it closed its listener)
 * before hetccl_probe_gone. */
hetccl_probe_result_t hetccl_probe_step(hetccl_probe_t *p, const hetccl_sockaddr_t *addr,
                                        int *in_flight, const hetccl_probe_who_t *who, int *err);
/* The WARN of a confirmed verdict r (err: what hetccl_probe_step gave):
 * "<transport> rank R: rank P is gone: its listener at A refused a
 * connection (process gone) while rank R waited N ms <waiting_for>". */
void hetccl_probe_gone(const hetccl_probe_who_t *who, const hetccl_sockaddr_t *addr,
                       hetccl_probe_result_t r, int err);
/* hetccl_probe_close, keeping *in_flight right. */
void hetccl_probe_stop(hetccl_probe_t *p, int *in_flight);

#endif
