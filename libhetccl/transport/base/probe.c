/* The probe (probe.h): nonblocking connects to a peer's listener, whose
 * outcome is read on later polls. */
#include "transport/base/probe.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/log.h"

void hetccl_probe_init(hetccl_probe_t *p, int64_t now_ms) {
  p->fd = -1;
  p->started_ms = 0;
  p->next_ms = now_ms + HETCCL_PROBE_EVERY_MS;
}

void hetccl_probe_close(hetccl_probe_t *p) {
  if (p->fd < 0) return;
  /* A reset, not a FIN: neither end keeps the connection in TIME_WAIT,
   * however many probes a long wait makes. */
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  (void)setsockopt(p->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(p->fd);
  p->fd = -1;
}

/* What a connect's errno says about the listener. */
static hetccl_probe_result_t verdict(hetccl_probe_t *p, int e, int *err) {
  hetccl_probe_close(p);
  if (e == 0) return HETCCL_PROBE_ALIVE;
  *err = e;
  if (e == ECONNREFUSED || e == ECONNRESET) return HETCCL_PROBE_REFUSED;
  if (e == EHOSTUNREACH || e == ENETUNREACH) return HETCCL_PROBE_UNREACHABLE;
  return HETCCL_PROBE_UNKNOWN; /* ETIMEDOUT, local shortages: no verdict */
}

static hetccl_probe_result_t probe_start(hetccl_probe_t *p, const hetccl_sockaddr_t *addr,
                                         int64_t now_ms, int *err) {
  p->next_ms = now_ms + HETCCL_PROBE_EVERY_MS;
  p->fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (p->fd < 0) return HETCCL_PROBE_UNKNOWN; /* out of descriptors: try on schedule */
  p->started_ms = now_ms;
  int rc;
  do rc = connect(p->fd, &addr->sa, hetccl_net_addr_len(addr));
  while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno == EINPROGRESS) return HETCCL_PROBE_UNKNOWN;
  return verdict(p, rc == 0 ? 0 : errno, err);
}

hetccl_probe_result_t hetccl_probe_poll(hetccl_probe_t *p, const hetccl_sockaddr_t *addr,
                                        int64_t now_ms, int may_start, int *err) {
  if (p->fd < 0)
    return may_start && now_ms >= p->next_ms ? probe_start(p, addr, now_ms, err)
                                             : HETCCL_PROBE_UNKNOWN;
  struct pollfd pf = {.fd = p->fd, .events = POLLOUT, .revents = 0};
  if (poll(&pf, 1, 0) <= 0) {
    if (now_ms - p->started_ms >= HETCCL_PROBE_GIVEUP_MS) hetccl_probe_close(p);
    return HETCCL_PROBE_UNKNOWN;
  }
  int e = 0;
  socklen_t len = sizeof(e);
  if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
  return verdict(p, e, err);
}

hetccl_probe_result_t hetccl_probe_step(hetccl_probe_t *p, const hetccl_sockaddr_t *addr,
                                        int *in_flight, const hetccl_probe_who_t *who, int *err) {
  int64_t now = hetccl_net_now_ms();
  int busy = hetccl_probe_busy(p);
  hetccl_probe_result_t r = hetccl_probe_poll(p, addr, now, *in_flight < HETCCL_PROBES_MAX, err);
  *in_flight += hetccl_probe_busy(p) - busy;
  if (r == HETCCL_PROBE_ALIVE) {
    char a[HETCCL_NET_ADDR_STRLEN];
    TRACE(HETCCL_NET, "%s rank %d: rank %d's listener at %s answers (alive; waited %lld ms %s)",
          who->transport, who->rank, who->peer, hetccl_net_addr_str(addr, a, sizeof(a)),
          (long long)(now - who->since_ms), who->waiting_for);
  }
  return r;
}

void hetccl_probe_gone(const hetccl_probe_who_t *who, const hetccl_sockaddr_t *addr,
                       hetccl_probe_result_t r, int err) {
  char a[HETCCL_NET_ADDR_STRLEN];
  WARN("%s rank %d: rank %d is gone: its listener at %s %s (%s) while rank %d waited %lld ms %s",
       who->transport, who->rank, who->peer, hetccl_net_addr_str(addr, a, sizeof(a)),
       r == HETCCL_PROBE_REFUSED ? "refused a connection" : "is unreachable",
       r == HETCCL_PROBE_REFUSED ? "process gone" : strerror(err), who->rank,
       (long long)(hetccl_net_now_ms() - who->since_ms), who->waiting_for);
}

void hetccl_probe_stop(hetccl_probe_t *p, int *in_flight) {
  if (hetccl_probe_busy(p)) (*in_flight)--;
  hetccl_probe_close(p);
}
