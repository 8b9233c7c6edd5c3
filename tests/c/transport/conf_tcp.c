/* The socket and ib sections of the conformance test. Both publish a TCP
 * listener (after a 64-bit magic, as hetccl_net_wire_addr_t) on which each
 * pair's connection opens with a hetccl_hello_t: before connecting, rank 0
 * throws foreign connections at the others' listeners, which connect must
 * drop and wait past; once connected, no listener may accept any more. A
 * peer that exits before connect shows as a timeout (its port refuses). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "util/knobs.h"
#include "util/net.h"

/* White-box: the handshake each transport reads first (handshake_t in
 * socket.c, ib_hello_t in ib.c): its magic and size. */
typedef struct tcp_hello_shape {
  uint64_t magic;
  size_t bytes;
} tcp_hello_shape_t;

static const tcp_hello_shape_t socket_hello = {0x534f434b48414e44ull /* "SOCKHAND" */,
                                               sizeof(hetccl_hello_t) + 8};
static const tcp_hello_shape_t ib_hello = {0x494248454c4c4f31ull /* "IBHELLO1" */,
                                           sizeof(hetccl_hello_t) + 24};

static void listener_of(int area, int rank, hetccl_sockaddr_t *a) {
  hetccl_net_wire_addr_t w;
  memcpy(&w, tc_blob(area, rank) + 8, sizeof(w));
  if (hetccl_net_addr_from_wire(&w, a) != ncclSuccess) FAIL("address blob of rank %d", rank);
}

static void hostile_send(const hetccl_sockaddr_t *a, const void *bytes, size_t n) {
  int fd;
  CHK(hetccl_net_connect(a, hetccl_net_deadline(5000), NULL, "hostile", &fd));
  CHK(hetccl_net_send_all(fd, bytes, n, hetccl_net_deadline(5000), NULL, "hostile"));
  close(fd);
}

/* Garbage, and handshakes of the right shape from another communicator:
 * the wrong secret, the wrong communicator id. */
static void hostile(const conf_conn_t *c, const tcp_hello_shape_t *shape) {
  if (tc_rank != 0) return;
  uint8_t garbage[64], secret[64] = {0}, comm[64] = {0};
  memset(garbage, 'g', sizeof(garbage));
  hetccl_hello_t h = hetccl_hello_make(shape->magic, &c->args);
  h.secret ^= 1;
  memcpy(secret, &h, sizeof(h));
  h = hetccl_hello_make(shape->magic, &c->args);
  h.comm_id ^= 1;
  memcpy(comm, &h, sizeof(h));
  for (int p = 1; p < tc_nranks; p++) {
    hetccl_sockaddr_t a;
    listener_of(c->area, p, &a);
    hostile_send(&a, garbage, sizeof(garbage));
    hostile_send(&a, secret, shape->bytes);
    hostile_send(&a, comm, shape->bytes);
  }
}

static void socket_hostile(const conf_conn_t *c) { hostile(c, &socket_hello); }
static void ib_hostile(const conf_conn_t *c) { hostile(c, &ib_hello); }

/* A connection to a published address is refused (hetccl_net_connect
 * retries until its deadline, then says ncclTimeout). */
static void listeners_closed(const conf_conn_t *c, const conf_opts_t *o) {
  (void)o;
  if (tc_rank != 0) return;
  for (int p = 0; p < tc_nranks; p++) {
    hetccl_sockaddr_t a;
    int fd = -1;
    listener_of(c->area, p, &a);
    if (hetccl_net_connect(&a, hetccl_net_deadline(100), NULL, NULL, &fd) == ncclSuccess)
      FAIL("rank %d still accepts connections on its listener after connect", p);
  }
}

static size_t socket_piece(void) {
  size_t chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_SOCKET_CHUNK) & ~(size_t)63;
  return chunk < 512 ? 512 : chunk;
}

static void socket_describe(char *buf, size_t len) {
  snprintf(buf, len, "nstreams=%d chunk=%lld", (int)hetccl_knob_int(HETCCL_KNOB_SOCKET_NSTREAMS),
           (long long)hetccl_knob_int(HETCCL_KNOB_SOCKET_CHUNK));
}

/* What a transport that connects through a TCP listener answers. */
#define TCP_SECTION                                                            \
  .crosses_hosts = 1, .gone_before_connect = ncclTimeout, .gone_timeout_ms = 1000, \
  .after_connect = listeners_closed

const conf_section_t conf_socket = {
    .name = "socket",
    .piece_bytes = socket_piece,
    .describe = socket_describe,
    .before_connect = socket_hostile,
    TCP_SECTION,
};

/* A verbs device with an active port, as the kernel sees it (sysfs): no
 * verbs library is needed to ask. */
static int ib_available(void) {
  DIR *d = opendir("/sys/class/infiniband");
  struct dirent *e;
  int found = 0;
  while (d && !found && (e = readdir(d)) != NULL) {
    for (int port = 1; port <= 4 && !found && e->d_name[0] != '.'; port++) {
      char path[512], state[64] = "";
      snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/state", e->d_name, port);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      found = fgets(state, sizeof(state), f) && strstr(state, "ACTIVE");
      fclose(f);
    }
  }
  if (d) closedir(d);
  if (!found)
    printf("ib: no verbs device with an active port (/sys/class/infiniband): skipped\n");
  return found;
}

static size_t ib_piece(void) {
  return (size_t)hetccl_knob_int(HETCCL_KNOB_IB_CHUNK) & ~(size_t)63;
}

static void ib_describe(char *buf, size_t len) {
  snprintf(buf, len, "chunk=%lld slots=%lld", (long long)hetccl_knob_int(HETCCL_KNOB_IB_CHUNK),
           (long long)hetccl_knob_int(HETCCL_KNOB_IB_SLOTS));
}

const conf_section_t conf_ib = {
    .name = "ib",
    .available = ib_available,
    .piece_bytes = ib_piece,
    .describe = ib_describe,
    .before_connect = ib_hostile,
    TCP_SECTION,
};
