/* TCP socket helpers (see net.h). Any thread; every wait is a poll in
 * slices of at most NET_POLL_SLICE_MS so that an abort flag is seen
 * promptly, and never past the caller's deadline. */
#include "util/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

#define NET_POLL_SLICE_MS 100
#define NET_MAX_PENDING 1024

int64_t hetccl_net_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t hetccl_net_deadline(int timeout_ms) {
  return hetccl_net_now_ms() + (timeout_ms > 0 ? timeout_ms : 1000);
}

/* ---- addresses ----------------------------------------------------------- */

socklen_t hetccl_net_addr_len(const hetccl_sockaddr_t *a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int hetccl_net_addr_port(const hetccl_sockaddr_t *a) {
  return ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port);
}

void hetccl_net_addr_set_port(hetccl_sockaddr_t *a, int port) {
  if (a->sa.sa_family == AF_INET6)
    a->sin6.sin6_port = htons((uint16_t)port);
  else
    a->sin.sin_port = htons((uint16_t)port);
}

const char *hetccl_net_addr_str(const hetccl_sockaddr_t *a, char *buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->sin.sin_addr, ip, sizeof(ip));
    snprintf(buf, len, "%s:%d", ip, hetccl_net_addr_port(a));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->sin6.sin6_addr, ip, sizeof(ip));
    if (a->sin6.sin6_scope_id)
      snprintf(buf, len, "[%s%%%u]:%d", ip, a->sin6.sin6_scope_id, hetccl_net_addr_port(a));
    else
      snprintf(buf, len, "[%s]:%d", ip, hetccl_net_addr_port(a));
  } else {
    snprintf(buf, len, "<family %d>", a->sa.sa_family);
  }
  return buf;
}

void hetccl_net_addr_to_wire(const hetccl_sockaddr_t *a, hetccl_net_wire_addr_t *w) {
  memset(w, 0, sizeof(*w));
  if (a->sa.sa_family == AF_INET) {
    w->family = 4;
    w->port = a->sin.sin_port;
    memcpy(w->ip, &a->sin.sin_addr, 4);
  } else if (a->sa.sa_family == AF_INET6) {
    w->family = 6;
    w->port = a->sin6.sin6_port;
    w->scope_id = a->sin6.sin6_scope_id;
    memcpy(w->ip, &a->sin6.sin6_addr, 16);
  }
}

ncclResult_t hetccl_net_addr_from_wire(const hetccl_net_wire_addr_t *w, hetccl_sockaddr_t *a) {
  memset(a, 0, sizeof(*a));
  if (w->port == 0) return ncclInvalidArgument;
  if (w->family == 4) {
    a->sin.sin_family = AF_INET;
    a->sin.sin_port = w->port;
    memcpy(&a->sin.sin_addr, w->ip, 4);
  } else if (w->family == 6) {
    a->sin6.sin6_family = AF_INET6;
    a->sin6.sin6_port = w->port;
    a->sin6.sin6_scope_id = w->scope_id;
    memcpy(&a->sin6.sin6_addr, w->ip, 16);
  } else {
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_net_parse_addr(const char *text, hetccl_sockaddr_t *out) {
  char host[256];
  const char *port_str;
  if (text == NULL || *text == '\0') {
    WARN("net: empty address (expected host:port or [v6]:port)");
    return ncclInvalidArgument;
  }
  if (text[0] == '[') {
    const char *end = strchr(text, ']');
    if (end == NULL || end[1] != ':' || (size_t)(end - text - 1) >= sizeof(host)) {
      WARN("net: malformed address '%s' (expected [v6]:port)", text);
      return ncclInvalidArgument;
    }
    memcpy(host, text + 1, end - text - 1);
    host[end - text - 1] = '\0';
    port_str = end + 2;
  } else {
    const char *colon = strrchr(text, ':');
    if (colon == NULL || colon == text || memchr(text, ':', colon - text) != NULL ||
        (size_t)(colon - text) >= sizeof(host)) {
      WARN("net: malformed address '%s' (expected host:port, or [v6]:port for IPv6)", text);
      return ncclInvalidArgument;
    }
    memcpy(host, text, colon - text);
    host[colon - text] = '\0';
    port_str = colon + 1;
  }
  char *endp = NULL;
  errno = 0;
  long port = strtol(port_str, &endp, 10);
  if (*port_str == '\0' || *endp != '\0' || errno != 0 || port < 1 || port > 65535) {
    WARN("net: bad port in address '%s' (1..65535 expected)", text);
    return ncclInvalidArgument;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || res == NULL) {
    WARN("net: cannot resolve '%s' in address '%s': %s", host, text, gai_strerror(rc));
    if (res) freeaddrinfo(res);
    return ncclInvalidArgument;
  }
  hetccl_sockaddr_t a;
  memset(&a, 0, sizeof(a));
  struct addrinfo *ai;
  for (ai = res; ai; ai = ai->ai_next)
    if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) && ai->ai_addrlen <= sizeof(a))
      break;
  if (ai == NULL) {
    freeaddrinfo(res);
    WARN("net: '%s' resolves to no IPv4/IPv6 address", host);
    return ncclInvalidArgument;
  }
  memcpy(&a, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(res);
  hetccl_net_addr_set_port(&a, (int)port);
  *out = a;
  return ncclSuccess;
}

/* ---- interface choice ---------------------------------------------------- */

/* Does interface `name` match a NCCL_SOCKET_IFNAME list (no ^ / = left)? */
static int ifname_in_list(const char *name, const char *list, int exact) {
  const char *p = list;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len > 0) {
      if (exact ? (strlen(name) == len && strncmp(name, p, len) == 0)
                : strncmp(name, p, len) == 0)
        return 1;
    }
    if (comma == NULL) break;
    p = comma + 1;
  }
  return 0;
}

static int ifname_allowed(const char *name, const char *spec) {
  if (spec == NULL || *spec == '\0')
    return !ifname_in_list(name, "docker,lo", 0);
  int exclude = 0, exact = 0;
  if (*spec == '^') { exclude = 1; spec++; }
  if (*spec == '=') { exact = 1; spec++; }
  int hit = ifname_in_list(name, spec, exact);
  return exclude ? !hit : hit;
}

static int is_v6_link_local(const struct sockaddr_in6 *s) {
  return s->sin6_addr.s6_addr[0] == 0xfe && (s->sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

/* NCCL_SOCKET_FAMILY (a refused word fails comm init there; here it is
 * unset). */
static int family_knob(void) {
  switch (hetccl_knob_enum(HETCCL_KNOB_SOCKET_FAMILY)) {
    case HETCCL_KNOB_SOCKET_FAMILY_AF_INET:
    case HETCCL_KNOB_SOCKET_FAMILY_4: return AF_INET;
    case HETCCL_KNOB_SOCKET_FAMILY_AF_INET6:
    case HETCCL_KNOB_SOCKET_FAMILY_6: return AF_INET6;
    default: return AF_UNSPEC;
  }
}

/* First address of family fam on an up interface allowed by spec. */
static int pick_addr(struct ifaddrs *list, const char *spec, int fam, int allow_ll,
                     hetccl_sockaddr_t *out, char *name_out, size_t name_len) {
  for (struct ifaddrs *i = list; i; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != fam) continue;
    if (!(i->ifa_flags & IFF_UP)) continue;
    if (!ifname_allowed(i->ifa_name, spec)) continue;
    hetccl_sockaddr_t a;
    memset(&a, 0, sizeof(a));
    if (fam == AF_INET) {
      memcpy(&a.sin, i->ifa_addr, sizeof(a.sin));
    } else {
      memcpy(&a.sin6, i->ifa_addr, sizeof(a.sin6));
      if (is_v6_link_local(&a.sin6) && !allow_ll) continue;
      if (!is_v6_link_local(&a.sin6)) a.sin6.sin6_scope_id = 0;
    }
    hetccl_net_addr_set_port(&a, 0);
    *out = a;
    if (name_out) snprintf(name_out, name_len, "%s", i->ifa_name);
    return 1;
  }
  return 0;
}

ncclResult_t hetccl_net_local_addr(const char *ifname, hetccl_sockaddr_t *out, char *name_out,
                                   size_t name_len) {
  const char *spec = (ifname && *ifname) ? ifname : hetccl_knob_str(HETCCL_KNOB_SOCKET_IFNAME);
  char name[IFNAMSIZ + 1] = "";
  int family = family_knob();
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) != 0) {
    WARN("net: getifaddrs: %s", strerror(errno));
    return ncclSystemError;
  }
  int found = 0;
  /* IPv4 first unless restricted; global IPv6 before link-local. */
  for (int pass = 0; pass < 3 && !found; pass++) {
    int fam = pass == 0 ? AF_INET : AF_INET6;
    if (family != AF_UNSPEC && fam != family) continue;
    found = pick_addr(list, spec, fam, pass == 2, out, name, sizeof(name));
  }
  if (!found && *spec == '\0') { /* default: lo is the fallback */
    for (int pass = 0; pass < 2 && !found; pass++) {
      int fam = pass == 0 ? AF_INET : AF_INET6;
      if (family != AF_UNSPEC && fam != family) continue;
      found = pick_addr(list, "lo", fam, 0, out, name, sizeof(name));
    }
  }
  freeifaddrs(list);
  if (!found) {
    WARN("net: no usable interface matches NCCL_SOCKET_IFNAME='%s'%s%s", spec,
         family != AF_UNSPEC ? " with NCCL_SOCKET_FAMILY=" : "",
         family != AF_UNSPEC ? hetccl_knob_str(HETCCL_KNOB_SOCKET_FAMILY) : "");
    return ncclSystemError;
  }
  if (name_out) snprintf(name_out, name_len, "%s", name);
  if (HETCCL_LOG_ENABLED(HETCCL_LOG_TRACE, HETCCL_NET)) {
    char s[HETCCL_NET_ADDR_STRLEN];
    TRACE(HETCCL_NET, "net: using %s (%s)", hetccl_net_addr_str(out, s, sizeof(s)), name);
  }
  return ncclSuccess;
}

ncclResult_t hetccl_net_addr_localize(hetccl_sockaddr_t *a, const char *ifname) {
  if (a->sa.sa_family != AF_INET6 || !is_v6_link_local(&a->sin6)) return ncclSuccess;
  hetccl_sockaddr_t mine;
  char name[IFNAMSIZ + 1];
  HETCCL_CHECK(hetccl_net_local_addr(ifname, &mine, name, sizeof(name)));
  unsigned idx = if_nametoindex(name);
  if (idx == 0) {
    WARN("net: if_nametoindex(%s): %s", name, strerror(errno));
    return ncclSystemError;
  }
  a->sin6.sin6_scope_id = idx;
  return ncclSuccess;
}

/* ---- socket options ------------------------------------------------------ */

ncclResult_t hetccl_net_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl == -1 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) == -1) {
    WARN("net: fcntl(O_NONBLOCK) on fd %d: %s", fd, strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_net_set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    WARN("net: setsockopt(TCP_NODELAY) on fd %d: %s", fd, strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

void hetccl_net_set_bufsize(int fd, int bytes) {
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void hetccl_net_close(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* ---- waiting ------------------------------------------------------------- */

/* Poll one fd for events until ready, the deadline or an abort.
 * 1: ready; 0: deadline; -1: abort; -2: poll failed (errno). */
static int wait_fd(int fd, short events, int64_t deadline, volatile int *abort_flag) {
  for (;;) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) return -1;
    int64_t left = deadline - hetccl_net_now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int rc = poll(&p, 1, left < NET_POLL_SLICE_MS ? (int)left : NET_POLL_SLICE_MS);
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return -2;
  }
}

static ncclResult_t wait_result(int w, const char *what, const char *action, int64_t deadline) {
  (void)deadline;
  if (w == -1) {
    if (what) WARN("%s: %s aborted", what, action);
    return ncclInternalError;
  }
  if (w == 0) {
    if (what) WARN("%s: timed out during %s", what, action);
    return ncclTimeout;
  }
  if (what) WARN("%s: poll during %s: %s", what, action, strerror(errno));
  return ncclSystemError;
}

/* ---- listen / connect / accept ------------------------------------------ */

ncclResult_t hetccl_net_listen(hetccl_sockaddr_t *addr, int backlog, int *out) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int fd;
  HETCCL_CHECK(hetccl_net_bind(addr, &fd));
  if (listen(fd, backlog > 0 ? backlog : SOMAXCONN) != 0) {
    WARN("net: listen on %s: %s", hetccl_net_addr_str(addr, s, sizeof(s)), strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  *out = fd;
  return ncclSuccess;
}

ncclResult_t hetccl_net_bind(hetccl_sockaddr_t *addr, int *out) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    WARN("net: socket() for %s: %s", hetccl_net_addr_str(addr, s, sizeof(s)), strerror(errno));
    return ncclSystemError;
  }
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, &addr->sa, hetccl_net_addr_len(addr)) != 0) {
    WARN("net: bind to %s: %s", hetccl_net_addr_str(addr, s, sizeof(s)), strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  hetccl_sockaddr_t bound;
  socklen_t len = sizeof(bound);
  if (getsockname(fd, &bound.sa, &len) != 0) {
    WARN("net: getsockname on %s: %s", hetccl_net_addr_str(addr, s, sizeof(s)),
         strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  *addr = bound;
  *out = fd;
  return ncclSuccess;
}

static int connect_retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == ECONNABORTED;
}

/* One nonblocking attempt: 0 connected, else the errno of the failure. */
static int connect_once(const hetccl_sockaddr_t *addr, int64_t deadline, volatile int *abort_flag,
                        int fd) {
  if (connect(fd, &addr->sa, hetccl_net_addr_len(addr)) == 0) return 0;
  if (errno != EINPROGRESS && errno != EINTR) return errno;
  int w = wait_fd(fd, POLLOUT, deadline, abort_flag);
  if (w == -1) return ECANCELED;
  if (w == 0) return ETIMEDOUT;
  if (w < 0) return errno;
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

/* A new socket and one attempt on it: 0 with *out connected (TCP_NODELAY
 * set), else the errno of the failure with the socket closed, or -1 where
 * the socket could not be made or set up (WARNed, a system error). */
static int connect_attempt(const hetccl_sockaddr_t *addr, int64_t deadline,
                           volatile int *abort_flag, const char *what, int *out) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (what) WARN("%s: socket() to connect to %s: %s", what,
                   hetccl_net_addr_str(addr, s, sizeof(s)), strerror(errno));
    return -1;
  }
  int err = connect_once(addr, deadline, abort_flag, fd);
  if (err == 0 && hetccl_net_set_nodelay(fd) != ncclSuccess) err = -1;
  if (err != 0) {
    close(fd);
    return err;
  }
  *out = fd;
  return 0;
}

ncclResult_t hetccl_net_connect(const hetccl_sockaddr_t *addr, int64_t deadline,
                                volatile int *abort_flag, const char *what, int *out) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int backoff_ms = 5, tries = 0;
  for (;;) {
    int err = connect_attempt(addr, deadline, abort_flag, what, out);
    tries++;
    if (err == 0) return ncclSuccess;
    if (err == -1) return ncclSystemError;
    if (err == ECANCELED) {
      if (what) WARN("%s: connect to %s aborted", what, hetccl_net_addr_str(addr, s, sizeof(s)));
      return ncclInternalError;
    }
    int64_t now = hetccl_net_now_ms();
    if (!connect_retryable(err)) {
      if (what) WARN("%s: connect to %s: %s", what, hetccl_net_addr_str(addr, s, sizeof(s)),
                     strerror(err));
      return ncclSystemError;
    }
    if (now >= deadline) {
      if (what) WARN("%s: connect to %s timed out after %d attempts: %s", what,
                     hetccl_net_addr_str(addr, s, sizeof(s)), tries, strerror(err));
      return ncclTimeout;
    }
    int64_t nap = backoff_ms < deadline - now ? backoff_ms : deadline - now;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    if (backoff_ms < 100) backoff_ms *= 2;
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
      if (what) WARN("%s: connect to %s aborted", what, hetccl_net_addr_str(addr, s, sizeof(s)));
      return ncclInternalError;
    }
  }
}

ncclResult_t hetccl_net_connect_live(const hetccl_sockaddr_t *addr, int64_t deadline,
                                     volatile int *abort_flag, const char *what, int *out) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int err = connect_attempt(addr, deadline, abort_flag, what, out);
  if (err == 0) return ncclSuccess;
  if (err == -1) return ncclSystemError;
  if (err == ECANCELED) {
    if (what) WARN("%s: connect to %s aborted", what, hetccl_net_addr_str(addr, s, sizeof(s)));
    return ncclInternalError;
  }
  if (what) WARN("%s: connect to %s: %s%s", what, hetccl_net_addr_str(addr, s, sizeof(s)),
                 strerror(err), err == ECONNREFUSED ? " (nothing listens there any more: the "
                 "process is gone)" : "");
  return err == ECONNREFUSED || err == ECONNRESET ? ncclRemoteError
         : err == ETIMEDOUT ? ncclTimeout : ncclSystemError;
}

/* Errors accept(2) reports for one pending connection that went bad before
 * we took it (accept(2), Linux notes): that connection is gone, the listener
 * is fine, so the next one is tried. A peer must not be able to break a
 * listener by resetting its connection early. */
static int accept_error_is_peers(int err) {
  return err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN ||
         err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
         err == EOPNOTSUPP || err == ENETUNREACH || err == EPERM;
}

/* Out of descriptors or memory: ours to wait out, not the listener's fault. */
static int accept_error_is_starved(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/* accept4 once: 1 got one, 0 nothing pending, -1 error (errno). */
static int accept_once(int lfd, int *fd, hetccl_sockaddr_t *peer) {
  for (;;) {
    socklen_t len = sizeof(*peer);
    int c = accept4(lfd, &peer->sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c >= 0) {
      int one = 1;
      (void)setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      *fd = c;
      return 1;
    }
    if (accept_error_is_peers(errno)) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

ncclResult_t hetccl_net_accept(int lfd, int64_t deadline, volatile int *abort_flag,
                               const char *what, int *fd, hetccl_sockaddr_t *peer) {
  for (;;) {
    hetccl_sockaddr_t p;
    memset(&p, 0, sizeof(p));
    int rc = accept_once(lfd, fd, &p);
    if (rc == 1) {
      if (peer) *peer = p;
      return ncclSuccess;
    }
    if (rc < 0) {
      if (what) WARN("%s: accept: %s", what, strerror(errno));
      return ncclSystemError;
    }
    int w = wait_fd(lfd, POLLIN, deadline, abort_flag);
    if (w != 1) return wait_result(w, what, "accept", deadline);
  }
}

/* ---- whole transfers ----------------------------------------------------- */

ncclResult_t hetccl_net_send_all(int fd, const void *buf, size_t n, int64_t deadline,
                                 volatile int *abort_flag, const char *what) {
  const char *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t k = send(fd, p + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) { done += (size_t)k; continue; }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = wait_fd(fd, POLLOUT, deadline, abort_flag);
      if (w != 1) return wait_result(w, what, "send", deadline);
      continue;
    }
    if (errno == EPIPE || errno == ECONNRESET) {
      if (what) WARN("%s: connection closed by peer during send (%zu of %zu bytes sent): %s",
                     what, done, n, strerror(errno));
      return ncclRemoteError;
    }
    if (what) WARN("%s: send: %s", what, strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t hetccl_net_recv_all(int fd, void *buf, size_t n, int64_t deadline,
                                 volatile int *abort_flag, const char *what) {
  char *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t k = recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (k > 0) { done += (size_t)k; continue; }
    if (k == 0) {
      if (what) WARN("%s: connection closed by peer (%zu of %zu bytes received)", what, done, n);
      return ncclRemoteError;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLIN, deadline, abort_flag);
      if (w != 1) return wait_result(w, what, "receive", deadline);
      continue;
    }
    if (errno == ECONNRESET) {
      if (what) WARN("%s: connection reset by peer (%zu of %zu bytes received)", what, done, n);
      return ncclRemoteError;
    }
    if (what) WARN("%s: recv: %s", what, strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

/* ---- many hellos at once ------------------------------------------------- */

/* At most this many accepts per round, so that a flood of new connections
 * cannot starve the reads of those already pending. */
#define NET_ACCEPT_BURST 64

typedef struct pending {
  int fd;
  hetccl_sockaddr_t peer;
  char *buf;
  size_t got, need;
  int have_hdr;
  uint64_t serial; /* accept order: the smallest is the oldest */
} pending_t;

typedef struct pending_set {
  pending_t *pd;
  struct pollfd *pfd; /* cap + 1: the listener, then one per pending */
  int n, cap;
  uint64_t serial;
} pending_set_t;

/* Tell a refused peer why (best effort: one nonblocking send of a short
 * reply into an idle socket), then close. Its unread bytes are drained
 * first, bounded, so that the close is a FIN rather than a reset while it
 * may still be sending; nothing here waits on the peer. */
static void reply_and_close(int *fd, const hetccl_net_reply_t *reply) {
  char sink[4096];
  if (*fd < 0) return;
  for (int i = 0; i < 16; i++) {
    ssize_t k = recv(*fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
  }
  if (reply && reply->len) {
    size_t len = reply->len < HETCCL_NET_REPLY_MAX ? reply->len : HETCCL_NET_REPLY_MAX;
    ssize_t k;
    do k = send(*fd, reply->buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    (void)shutdown(*fd, SHUT_WR);
  }
  hetccl_net_close(fd);
}

static void pending_drop(pending_set_t *ps, int i, const hetccl_net_reply_t *reply) {
  pending_t *pd = ps->pd;
  reply_and_close(&pd[i].fd, reply);
  free(pd[i].buf);
  pd[i] = pd[--ps->n];
}

static void pending_drop_oldest(pending_set_t *ps, const char *what, const char *why) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int old = 0;
  for (int i = 1; i < ps->n; i++)
    if (ps->pd[i].serial < ps->pd[old].serial) old = i;
  INFO(HETCCL_NET, "%s: dropping the longest-waiting connection, from %s (%zu of %zu bytes "
       "received), to make room: %s", what, hetccl_net_addr_str(&ps->pd[old].peer, s, sizeof(s)),
       ps->pd[old].got, ps->pd[old].need, why);
  pending_drop(ps, old, NULL);
}

/* Read what is there; 1 frame complete, 0 more to come, -1 dropped. */
static int pending_read(pending_t *c, const hetccl_net_hello_ops_t *ops, void *ctx,
                        const char *what, hetccl_net_reply_t *reply) {
  char s[HETCCL_NET_ADDR_STRLEN];
  for (;;) {
    ssize_t k = recv(c->fd, c->buf + c->got, c->need - c->got, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      INFO(HETCCL_NET, "%s: dropping connection from %s: %s after %zu of %zu bytes", what,
           hetccl_net_addr_str(&c->peer, s, sizeof(s)),
           k == 0 ? "closed" : strerror(errno), c->got, c->need);
      return -1;
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    c->got += (size_t)k;
    if (c->got < c->need) continue;
    if (!c->have_hdr) {
      long extra = ops->on_header(ctx, c->buf, &c->peer, reply);
      if (extra < 0) return -1;
      if ((size_t)extra > ops->max_payload) {
        INFO(HETCCL_NET, "%s: dropping connection from %s: payload of %ld bytes exceeds %zu",
             what, hetccl_net_addr_str(&c->peer, s, sizeof(s)), extra, ops->max_payload);
        return -1;
      }
      c->have_hdr = 1;
      if (extra > 0) {
        char *nb = realloc(c->buf, ops->hdr_bytes + (size_t)extra);
        if (nb == NULL) {
          WARN("%s: out of memory for a %ld-byte hello", what, extra);
          return -1;
        }
        c->buf = nb;
        c->need = ops->hdr_bytes + (size_t)extra;
        continue;
      }
    }
    return 1;
  }
}

/* Room for one more pending connection (the arrays grow up to
 * NET_MAX_PENDING; past that the oldest makes room). */
static ncclResult_t pending_room(pending_set_t *ps, const char *what) {
  if (ps->n == NET_MAX_PENDING) {
    pending_drop_oldest(ps, what, "too many pending connections");
    return ncclSuccess;
  }
  if (ps->n < ps->cap) return ncclSuccess;
  int cap = 2 * ps->cap;
  pending_t *npd = realloc(ps->pd, cap * sizeof(*npd));
  if (npd) ps->pd = npd;
  struct pollfd *npf = realloc(ps->pfd, (cap + 1) * sizeof(*npf));
  if (npf) ps->pfd = npf;
  if (npd == NULL || npf == NULL) {
    WARN("%s: out of memory for %d pending connections", what, cap);
    return ncclSystemError;
  }
  ps->cap = cap;
  return ncclSuccess;
}

/* Accept what the listener has (a burst at most). *starved: the process is
 * out of descriptors; the caller leaves the listener alone for a round. */
static ncclResult_t accept_some(int lfd, pending_set_t *ps, const hetccl_net_hello_ops_t *ops,
                                const char *what, int *starved) {
  for (int burst = 0; burst < NET_ACCEPT_BURST; burst++) {
    int fd;
    hetccl_sockaddr_t peer;
    memset(&peer, 0, sizeof(peer));
    int a = accept_once(lfd, &fd, &peer);
    if (a == 0) return ncclSuccess;
    if (a < 0 && accept_error_is_starved(errno)) {
      INFO(HETCCL_NET, "%s: accept: %s; %d connections pending", what, strerror(errno), ps->n);
      if (ps->n > 0) pending_drop_oldest(ps, what, "out of descriptors");
      *starved = 1;
      return ncclSuccess;
    }
    if (a < 0) {
      WARN("%s: accept: %s", what, strerror(errno));
      return ncclSystemError;
    }
    ncclResult_t res = pending_room(ps, what);
    char *buf = res == ncclSuccess ? malloc(ops->hdr_bytes ? ops->hdr_bytes : 1) : NULL;
    if (buf == NULL) {
      close(fd);
      if (res == ncclSuccess) WARN("%s: out of memory", what);
      return ncclSystemError;
    }
    ps->pd[ps->n++] = (pending_t){.fd = fd, .peer = peer, .buf = buf, .got = 0,
                                  .need = ops->hdr_bytes, .have_hdr = 0,
                                  .serial = ps->serial++};
  }
  return ncclSuccess;
}

/* One round over the pending connections that poll found readable. */
static void pending_serve(pending_set_t *ps, int base, const hetccl_net_hello_ops_t *ops,
                          void *ctx, const char *what) {
  /* Backwards: a dropped entry is replaced by the last one. */
  for (int i = ps->n - 1; i >= 0; i--) {
    if (!ps->pfd[base + i].revents) continue;
    hetccl_net_reply_t reply;
    reply.len = 0;
    pending_t *c = &ps->pd[i];
    int r = pending_read(c, ops, ctx, what, &reply);
    if (r == 0) continue;
    if (r == 1 && ops->on_frame(ctx, c->fd, c->buf, c->buf + ops->hdr_bytes, &c->peer, &reply))
      c->fd = -1; /* the callback owns it now */
    pending_drop(ps, i, &reply);
  }
}

ncclResult_t hetccl_net_accept_hellos(int lfd, const hetccl_net_hello_ops_t *ops, void *ctx,
                                      int64_t deadline, volatile int *abort_flag,
                                      const char *what) {
  ncclResult_t res = ncclSuccess;
  pending_set_t ps = {.n = 0, .cap = 16, .serial = 0};
  ps.pd = malloc(ps.cap * sizeof(*ps.pd));
  ps.pfd = malloc((ps.cap + 1) * sizeof(*ps.pfd));
  int starved = 0;
  if (ps.pd == NULL || ps.pfd == NULL) {
    WARN("%s: out of memory", what);
    res = ncclSystemError;
    goto out;
  }
  while (!ops->done(ctx)) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
      WARN("%s: aborted", what);
      res = ncclInternalError;
      goto out;
    }
    int64_t end = deadline;
    if (ops->expires) {
      int64_t e = ops->expires(ctx);
      if (e < end) end = e;
    }
    int64_t left = end - hetccl_net_now_ms();
    if (left <= 0) {
      WARN("%s: timed out", what);
      res = ncclTimeout;
      goto out;
    }
    int np = 0, listening = !starved;
    starved = 0;
    if (listening) ps.pfd[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    for (int i = 0; i < ps.n; i++)
      ps.pfd[np++] = (struct pollfd){.fd = ps.pd[i].fd, .events = POLLIN};
    int rc = poll(ps.pfd, np, left < NET_POLL_SLICE_MS ? (int)left : NET_POLL_SLICE_MS);
    if (rc < 0 && errno != EINTR) {
      WARN("%s: poll: %s", what, strerror(errno));
      res = ncclSystemError;
      goto out;
    }
    if (rc <= 0) continue;
    pending_serve(&ps, listening ? 1 : 0, ops, ctx, what);
    if (listening && ps.pfd[0].revents) {
      res = accept_some(lfd, &ps, ops, what, &starved);
      if (res != ncclSuccess) goto out;
    }
  }
out:
  while (ps.n > 0) pending_drop(&ps, ps.n - 1, NULL);
  free(ps.pd);
  free(ps.pfd);
  return res;
}
