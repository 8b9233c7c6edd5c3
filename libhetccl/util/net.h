/* TCP socket helpers shared by the bootstrap and the socket transport.
 *
 * Every fd made here is nonblocking and close-on-exec; every wait is a poll
 * bounded by an absolute deadline (hetccl_net_now_ms() + timeout, monotonic
 * milliseconds) and by an optional abort flag (non-zero: give up with
 * ncclInternalError). EINTR is retried everywhere. IPv4 and IPv6.
 *
 * Errors are logged (WARN) here, where they are born, with the address and
 * strerror, and returned as ncclResult_t: a closed or reset connection is
 * ncclRemoteError, a timeout ncclTimeout, a failed syscall ncclSystemError,
 * an abort ncclInternalError. Functions that take a `what` string put it at the head
 * of their messages ("bootstrap: rank 3 (10.1.2.3:4000)"); a NULL `what`
 * makes them silent, for callers that judge the failure themselves (a
 * foreign connection on a listener is not an error of ours).
 *
 * Any thread; no global state besides the knobs. */
#ifndef HETCCL_UTIL_NET_H
#define HETCCL_UTIL_NET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

typedef union hetccl_sockaddr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
} hetccl_sockaddr_t;

/* Longest text hetccl_net_addr_str writes, NUL included ("[v6%scope]:port"). */
#define HETCCL_NET_ADDR_STRLEN 80

/* Wire form of an address (fixed 32 bytes, network byte order inside), for
 * unique ids and address blobs. */
typedef struct hetccl_net_wire_addr {
  uint16_t family; /* 4 or 6; 0 = none */
  uint16_t port;   /* network order */
  uint32_t scope_id;
  uint8_t ip[16];  /* v4 uses the first 4 bytes */
  uint8_t pad[8];
} hetccl_net_wire_addr_t;

/* Monotonic clock in milliseconds. */
int64_t hetccl_net_now_ms(void);
/* now + timeout_ms (timeout_ms <= 0: one second, never "forever"). */
int64_t hetccl_net_deadline(int timeout_ms);

/* "1.2.3.4:5678" or "[fe80::1%2]:5678" into buf (HETCCL_NET_ADDR_STRLEN). */
const char *hetccl_net_addr_str(const hetccl_sockaddr_t *a, char *buf, size_t len);
socklen_t hetccl_net_addr_len(const hetccl_sockaddr_t *a);
int hetccl_net_addr_port(const hetccl_sockaddr_t *a);
void hetccl_net_addr_set_port(hetccl_sockaddr_t *a, int port);

void hetccl_net_addr_to_wire(const hetccl_sockaddr_t *a, hetccl_net_wire_addr_t *w);
/* ncclInvalidArgument (silent) if the wire form is malformed. */
ncclResult_t hetccl_net_addr_from_wire(const hetccl_net_wire_addr_t *w, hetccl_sockaddr_t *a);

/* A peer's link-local IPv6 address carries the peer's interface index,
 * which means nothing here: give it the index of this host's interface
 * chosen by `ifname` (as hetccl_net_local_addr). Other addresses are left
 * alone. */
ncclResult_t hetccl_net_addr_localize(hetccl_sockaddr_t *a, const char *ifname);

/* "host:port", "[v6]:port", "v4:port"; host may be a name (resolved with
 * getaddrinfo, first TCP result). ncclInvalidArgument + WARN if malformed. */
ncclResult_t hetccl_net_parse_addr(const char *text, hetccl_sockaddr_t *out);

/* Choose this host's address for hetccl traffic. `ifname` is an
 * NCCL_SOCKET_IFNAME-style list ("eth,ib" prefixes, "^docker" exclusion,
 * "=eth0" exact names); NULL or "" reads the NCCL_SOCKET_IFNAME knob, and
 * when that is unset too every interface but lo and docker* qualifies, lo
 * being the fallback. NCCL_SOCKET_FAMILY (AF_INET / AF_INET6) restricts the
 * family; otherwise IPv4 is preferred on an interface that has both. The
 * port of *out is 0; the interface name goes to name_out if non-NULL. */
ncclResult_t hetccl_net_local_addr(const char *ifname, hetccl_sockaddr_t *out, char *name_out,
                                   size_t name_len);

/* Listen on addr (port 0: ephemeral) and write the bound address back.
 * SO_REUSEADDR is set, so a fixed port (NCCL_COMM_ID) can be reused at once. */
ncclResult_t hetccl_net_listen(hetccl_sockaddr_t *addr, int backlog, int *fd);

/* Bind a TCP socket to addr (port 0: ephemeral) without listening, and
 * write the bound address back: the port is held (a connection to it is
 * refused) until a later hetccl_net_listen on the same address, which
 * SO_REUSEADDR on both allows while this socket is still bound. */
ncclResult_t hetccl_net_bind(hetccl_sockaddr_t *addr, int *fd);

/* Connect to addr, retrying refused / unreachable attempts until the
 * deadline. *fd is nonblocking with TCP_NODELAY. */
ncclResult_t hetccl_net_connect(const hetccl_sockaddr_t *addr, int64_t deadline_ms,
                                volatile int *abort_flag, const char *what, int *fd);
/* Like hetccl_net_connect, for a listener known to be up (published
 * before): one attempt, and a refusal is the peer's end, ncclRemoteError
 * ("nothing listens there any more"), not a reason to retry. */
ncclResult_t hetccl_net_connect_live(const hetccl_sockaddr_t *addr, int64_t deadline_ms,
                                     volatile int *abort_flag, const char *what, int *fd);

/* Accept one connection on the listener lfd (nonblocking, TCP_NODELAY). */
ncclResult_t hetccl_net_accept(int lfd, int64_t deadline_ms, volatile int *abort_flag,
                               const char *what, int *fd, hetccl_sockaddr_t *peer);

/* Move exactly n bytes. A peer that closes mid-way is ncclRemoteError. */
ncclResult_t hetccl_net_send_all(int fd, const void *buf, size_t n, int64_t deadline_ms,
                                 volatile int *abort_flag, const char *what);
ncclResult_t hetccl_net_recv_all(int fd, void *buf, size_t n, int64_t deadline_ms,
                                 volatile int *abort_flag, const char *what);

/* Socket options; they log what failed (what may be NULL). */
ncclResult_t hetccl_net_set_nonblock(int fd);
ncclResult_t hetccl_net_set_nodelay(int fd);
void hetccl_net_set_bufsize(int fd, int bytes); /* best effort, silent */

/* Close if >= 0 and set to -1. */
void hetccl_net_close(int *fd);

/* What a hello callback may send back before its connection is dropped:
 * a short reason for a peer that spoke the protocol but was refused. */
#define HETCCL_NET_REPLY_MAX 512
typedef struct hetccl_net_reply {
  size_t len; /* 0: close without a word */
  unsigned char buf[HETCCL_NET_REPLY_MAX];
} hetccl_net_reply_t;

/* Accept connections on a listener and read one hello frame from each, many
 * at once (a slow or hostile client cannot hold the others up), until the
 * caller says it has what it needs.
 *
 * on_header(ctx, hdr, peer, reply): the fixed-size header (hdr_bytes) has
 *   arrived; return the number of payload bytes that follow
 *   (0..max_payload), or -1 to drop the connection (the callback logs why,
 *   and may fill `reply`).
 * on_frame(ctx, fd, hdr, payload, peer, reply): the whole frame arrived;
 *   return 1 to keep fd (the callback owns it from then on), 0 to drop it
 *   (after sending `reply`, if the callback filled it).
 * done(ctx): true once everything expected has arrived.
 * expires(ctx): optional (NULL: none); an earlier deadline than deadline_ms
 *   that the caller learned meanwhile (from the peers), read every round.
 * A dropped connection gets the reply (best effort, never waited for) and
 * is closed; what it sent is never echoed. A connection that closes or
 * sends nothing before the deadline is dropped; when NET_MAX_PENDING
 * connections are pending, or the process runs out of descriptors, the
 * oldest pending one makes room (a real peer sends its hello at once).
 * Returns ncclSuccess when done; ncclTimeout with a WARN naming `what` on
 * the deadline; ncclInternalError on abort. Pending connections are
 * closed on return. */
typedef struct hetccl_net_hello_ops {
  size_t hdr_bytes;
  size_t max_payload;
  long (*on_header)(void *ctx, const void *hdr, const hetccl_sockaddr_t *peer,
                    hetccl_net_reply_t *reply);
  int (*on_frame)(void *ctx, int fd, const void *hdr, const void *payload,
                  const hetccl_sockaddr_t *peer, hetccl_net_reply_t *reply);
  int (*done)(void *ctx);
  int64_t (*expires)(void *ctx);
} hetccl_net_hello_ops_t;

ncclResult_t hetccl_net_accept_hellos(int lfd, const hetccl_net_hello_ops_t *ops, void *ctx,
                                      int64_t deadline_ms, volatile int *abort_flag,
                                      const char *what);

#endif
