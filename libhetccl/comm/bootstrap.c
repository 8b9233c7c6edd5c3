/* Bootstrap, a rank's half (comm/bootstrap.h): join the root of its group,
 * link the ring, and the collectives over the ring.
 *
 * Contract. hetccl_bootstrap_init returns with every rank's info in every
 * rank's table, this rank linked to rank + 1 and rank - 1 (mod nranks) by
 * one TCP connection each, and no bootstrap port of the communicator open.
 * A rank handles O(1) messages at its root and 2 (nranks - 1) frames per
 * allgather on the ring, whatever its number: no rank is a funnel. The
 * price is latency: an allgather takes nranks - 1 steps (docs/scale.md).
 *
 * Steps of init:
 *   1. listen (ring listener) and bind a spare port;
 *   2. hello to the root of this rank's group (bootstrap_root.c); the first
 *      rank of a group, when there are several groups, also registers with
 *      the previous group's root as the rank after that group's last;
 *   3. the reply names the listener of rank + 1: connect there and send a
 *      link_t; accept rank - 1's link (anything else is dropped and
 *      logged); close the listener;
 *   4. ring allgather of (spare port, info).
 *
 * Frames on the ring carry a magic, the communicator id, the sender, a kind
 * and a sequence number; a frame that does not fit is ncclSystemError. A
 * lost link is ncclRemoteError naming the neighbour; every wait is bounded
 * by the connect timeout and the abort flag.
 *
 * Spare ports. Every rank also binds one port at init, without listening
 * (connections to it are refused), and the ranks learn each other's. After
 * a failure the survivors need a meeting point that no excluded (maybe dead)
 * rank serves: the lowest survivor serves the new root on its spare port
 * (hetccl_bootstrap_recovery_id), and every survivor derives the same new
 * id from what they share, without a message.
 *
 * Threads. A handle is used by one thread at a time; several handles (ranks)
 * may live in one process and init concurrently: no global state here. */
#include "comm/bootstrap.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "comm/bootstrap_wire.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

struct hetccl_bootstrap {
  int rank, nranks;
  uint64_t secret, comm_id;
  int timeout_ms;
  volatile int *abort_flag;
  uint64_t seq;                /* collective operations so far */
  int lfd;                     /* ring listener, until rank - 1 linked */
  hetccl_sockaddr_t laddr;
  int next_fd, prev_fd;        /* the ring links */
  hetccl_sockaddr_t next_addr, prev_addr;
  int spare_fd;                /* bound, not listening (see "Spare ports") */
  hetccl_net_wire_addr_t *spares; /* every rank's spare port */
  uint64_t recoveries;         /* recovery ids made so far */
  uint64_t msgs, bytes;        /* handled so far (hetccl_bootstrap_stats) */
};

static int next_of(const hetccl_bootstrap_t *bs) { return (bs->rank + 1) % bs->nranks; }
static int prev_of(const hetccl_bootstrap_t *bs) {
  return (bs->rank + bs->nranks - 1) % bs->nranks;
}

/* ---- joining at a root ----------------------------------------------------- */

/* The root refused this rank: read its reason and make it the error. */
static ncclResult_t root_rejected(int fd, const char *what, int64_t deadline,
                                  volatile int *abort_flag) {
  reject_t rj;
  char reason[REJECT_MAX_REASON + 1];
  rj.magic = BS_REJECT_MAGIC;
  HETCCL_CHECK(hetccl_net_recv_all(fd, (char *)&rj + sizeof(rj.magic),
                                   sizeof(rj) - sizeof(rj.magic), deadline, abort_flag, what));
  if (rj.bytes > REJECT_MAX_REASON) {
    WARN("%s: the root refused this rank with a %u-byte reason (at most %zu expected)", what,
         rj.bytes, (size_t)REJECT_MAX_REASON);
    return ncclSystemError;
  }
  HETCCL_CHECK(hetccl_net_recv_all(fd, reason, rj.bytes, deadline, abort_flag, what));
  reason[rj.bytes] = '\0';
  for (uint32_t i = 0; i < rj.bytes; i++) /* our own text, but it came over a wire */
    if ((unsigned char)reason[i] < 0x20 || (unsigned char)reason[i] > 0x7e) reason[i] = '?';
  ncclResult_t code = (ncclResult_t)rj.code;
  if (code != ncclTimeout && code != ncclInvalidUsage && code != ncclSystemError)
    code = ncclRemoteError;
  WARN("%s: %s", what, reason);
  return code;
}

/* One conversation with a root: connect, hello, then the reply. */
typedef struct join {
  id_layout_t id;
  hetccl_sockaddr_t root;
  int first, last, successor;
  int fd;
  ncclResult_t sent;
  char what[160];
} join_t;

static ncclResult_t join_send(hetccl_bootstrap_t *bs, join_t *j, size_t info_bytes,
                              int64_t deadline) {
  char s[HETCCL_NET_ADDR_STRLEN];
  snprintf(j->what, sizeof(j->what), "bootstrap rank %d: root %s%s", bs->rank,
           hetccl_net_addr_str(&j->root, s, sizeof(s)),
           j->successor ? " (of the previous group)" : "");
  ncclResult_t res = hetccl_net_connect(&j->root, deadline, bs->abort_flag, j->what, &j->fd);
  if (res == ncclTimeout)
    WARN("%s: nothing took the connection within %.1f s. The root runs in the process that "
         "made the unique id (in rank 0 under NCCL_COMM_ID) until its ranks have joined: is "
         "that process still running, and is %s reachable from this host (NCCL_SOCKET_IFNAME "
         "chooses the interface)?", j->what, bs->timeout_ms / 1000.0, s);
  HETCCL_CHECK(res);
  int64_t left = deadline - hetccl_net_now_ms();
  hello_t h = {.magic = BS_HELLO_MAGIC, .secret = j->id.secret, .rank = bs->rank,
               .nranks = bs->nranks, .info_bytes = info_bytes,
               .timeout_ms = (uint32_t)bs->timeout_ms, .left_ms = left > 0 ? (uint32_t)left : 0,
               .first = j->first, .last = j->last, .successor = j->successor};
  hetccl_net_addr_to_wire(&bs->laddr, &h.listen);
  bs->msgs++;
  bs->bytes += sizeof(h);
  /* A root that refused us closes at once, maybe while we still send: its
   * reason is read anyway, and is the error that counts. */
  j->sent = hetccl_net_send_all(j->fd, &h, sizeof(h), deadline, bs->abort_flag, j->what);
  return j->sent == ncclSuccess || j->sent == ncclRemoteError ? ncclSuccess : j->sent;
}

/* The reply (or the reason why not: the root waits up to deadline, and we
 * a grace longer). A member learns where rank + 1 listens. */
static ncclResult_t join_reply(hetccl_bootstrap_t *bs, join_t *j, size_t info_bytes,
                               int64_t deadline, hetccl_sockaddr_t *next) {
  int64_t reply_deadline = deadline + hetccl_bs_reply_grace_ms(bs->timeout_ms);
  reply_t t;
  HETCCL_CHECK(hetccl_net_recv_all(j->fd, &t.magic, sizeof(t.magic), reply_deadline,
                                   bs->abort_flag, j->what));
  if (t.magic == BS_REJECT_MAGIC) return root_rejected(j->fd, j->what, reply_deadline,
                                                       bs->abort_flag);
  if (j->sent != ncclSuccess) return j->sent;
  if (t.magic == BS_REPLY_MAGIC)
    HETCCL_CHECK(hetccl_net_recv_all(j->fd, (char *)&t + sizeof(t.magic),
                                     sizeof(t) - sizeof(t.magic), reply_deadline,
                                     bs->abort_flag, j->what));
  bs->msgs++;
  bs->bytes += sizeof(t);
  int want_next = !j->successor && bs->nranks > 1;
  if (t.magic != BS_REPLY_MAGIC || t.secret != j->id.secret || t.nranks != bs->nranks ||
      t.info_bytes != info_bytes ||
      (want_next && hetccl_net_addr_from_wire(&t.next, next) != ncclSuccess)) {
    WARN("%s: the root's reply does not fit (magic 0x%" PRIx64 ", nranks %d, info_bytes %" PRIu64
         "; expected nranks %d, info_bytes %zu)", j->what, t.magic,
         t.magic == BS_REPLY_MAGIC ? t.nranks : -1, t.magic == BS_REPLY_MAGIC ? t.info_bytes : 0,
         bs->nranks, info_bytes);
    return ncclSystemError;
  }
  if (want_next) HETCCL_CHECK(hetccl_net_addr_localize(next, NULL));
  return ncclSuccess;
}

/* Hellos to this rank's root and, for the first rank of a group when there
 * are several, to the previous group's; both are sent before either reply
 * is awaited, since the roots answer only once their groups are complete. */
static ncclResult_t join_roots(hetccl_bootstrap_t *bs, const ncclUniqueId *ids, int nids,
                               size_t info_bytes, int64_t deadline, hetccl_sockaddr_t *next) {
  join_t j[2];
  int nj = 0;
  ncclResult_t res = ncclSuccess;
  int g = hetccl_bs_group_of(bs->nranks, nids, bs->rank);
  memset(j, 0, sizeof(j));
  j[0].fd = j[1].fd = -1;
  hetccl_bs_group_range(bs->nranks, nids, g, &j[0].first, &j[0].last);
  hetccl_bs_id_read(&ids[g], &j[0].id);
  nj = 1;
  if (nids > 1 && bs->rank == j[0].first) {
    int pg = (g + nids - 1) % nids;
    hetccl_bs_group_range(bs->nranks, nids, pg, &j[1].first, &j[1].last);
    hetccl_bs_id_read(&ids[pg], &j[1].id);
    j[1].successor = 1;
    nj = 2;
  }
  for (int i = 0; i < nj; i++) {
    HETCCL_CHECK_GOTO(hetccl_net_addr_from_wire(&j[i].id.root, &j[i].root), res, out);
    HETCCL_CHECK_GOTO(hetccl_net_addr_localize(&j[i].root, NULL), res, out);
  }
  for (int i = 0; i < nj; i++)
    HETCCL_CHECK_GOTO(join_send(bs, &j[i], info_bytes, deadline), res, out);
  for (int i = 0; i < nj; i++)
    HETCCL_CHECK_GOTO(join_reply(bs, &j[i], info_bytes, deadline, next), res, out);
out:
  for (int i = 0; i < nj; i++) hetccl_net_close(&j[i].fd);
  return res;
}

/* ---- linking the ring -------------------------------------------------------- */

static long link_on_header(void *ctx, const void *hdr, const hetccl_sockaddr_t *peer,
                           hetccl_net_reply_t *reply) {
  hetccl_bootstrap_t *bs = ctx;
  link_t l;
  char s[HETCCL_NET_ADDR_STRLEN];
  memcpy(&l, hdr, sizeof(l));
  const char *why = NULL;
  /* No word back: the roots admitted every real rank already, so whoever
   * is refused here is not one (a real rank would learn at its first frame). */
  (void)reply;
  if (l.magic != BS_LINK_MAGIC) why = "not a hetccl bootstrap link";
  else if (l.secret != bs->secret || l.comm_id != bs->comm_id) why = "wrong secret";
  else if (l.nranks != bs->nranks || l.rank != prev_of(bs)) why = "not the previous rank";
  else if (bs->prev_fd >= 0) why = "duplicate link";
  if (why) {
    INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d: dropping connection from %s: %s", bs->rank,
         hetccl_net_addr_str(peer, s, sizeof(s)), why);
    return -1;
  }
  return 0;
}

static int link_on_frame(void *ctx, int fd, const void *hdr, const void *payload,
                         const hetccl_sockaddr_t *peer, hetccl_net_reply_t *reply) {
  hetccl_bootstrap_t *bs = ctx;
  (void)hdr;
  (void)payload;
  (void)reply; /* never refused here: link_on_header judged it */
  if (bs->prev_fd >= 0) return 0;
  bs->prev_fd = fd;
  bs->prev_addr = *peer;
  bs->msgs++;
  bs->bytes += sizeof(link_t);
  return 1;
}

static int link_done(void *ctx) { return ((hetccl_bootstrap_t *)ctx)->prev_fd >= 0; }

static ncclResult_t ring_link(hetccl_bootstrap_t *bs, const hetccl_sockaddr_t *next,
                              int64_t deadline) {
  char s[HETCCL_NET_ADDR_STRLEN], what[160];
  snprintf(what, sizeof(what), "bootstrap rank %d: connection to rank %d (%s)", bs->rank,
           next_of(bs), hetccl_net_addr_str(next, s, sizeof(s)));
  bs->next_addr = *next;
  HETCCL_CHECK(hetccl_net_connect(next, deadline, bs->abort_flag, what, &bs->next_fd));
  link_t l = {.magic = BS_LINK_MAGIC, .secret = bs->secret, .comm_id = bs->comm_id,
              .rank = bs->rank, .nranks = bs->nranks};
  bs->msgs++;
  bs->bytes += sizeof(l);
  HETCCL_CHECK(hetccl_net_send_all(bs->next_fd, &l, sizeof(l), deadline, bs->abort_flag, what));
  hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(link_t), .max_payload = 0,
                                .on_header = link_on_header, .on_frame = link_on_frame,
                                .done = link_done};
  snprintf(what, sizeof(what), "bootstrap rank %d (%s): waiting for rank %d to link", bs->rank,
           hetccl_net_addr_str(&bs->laddr, s, sizeof(s)), prev_of(bs));
  return hetccl_net_accept_hellos(bs->lfd, &ops, bs, deadline, bs->abort_flag, what);
}

/* ---- frames on the ring -------------------------------------------------------- */

static void link_what(const hetccl_bootstrap_t *bs, int next, char *buf, size_t len) {
  char s[HETCCL_NET_ADDR_STRLEN];
  snprintf(buf, len, "bootstrap rank %d: connection to rank %d (%s)", bs->rank,
           next ? next_of(bs) : prev_of(bs),
           hetccl_net_addr_str(next ? &bs->next_addr : &bs->prev_addr, s, sizeof(s)));
}

/* One step: send a frame with sbytes of sbuf to rank + 1 while receiving
 * one of rbytes into rbuf from rank - 1 (either may be skipped with a NULL
 * buffer, 0 bytes and do_send / do_recv 0). Both sides move at once, so no
 * block size can deadlock the ring on full socket buffers. */
static ncclResult_t ring_step(hetccl_bootstrap_t *bs, uint32_t kind, int do_send,
                              const void *sbuf, size_t sbytes, int do_recv, void *rbuf,
                              size_t rbytes,
                              int64_t deadline) {
  char swhat[160], rwhat[160];
  frame_t sf = {.magic = BS_FRAME_MAGIC, .comm_id = bs->comm_id, .rank = bs->rank, .kind = kind,
                .seq = bs->seq, .bytes = sbytes};
  frame_t rf;
  size_t soff = 0, send_total = do_send ? sizeof(sf) + sbytes : 0;
  size_t roff = 0, recv_total = do_recv ? sizeof(rf) + rbytes : 0;
  if (do_send) {
    bs->msgs++;
    bs->bytes += send_total;
  }
  if (do_recv) {
    bs->msgs++;
    bs->bytes += recv_total;
  }
  while (soff < send_total || roff < recv_total) {
    struct pollfd p[2];
    int np = 0, si = -1, ri = -1;
    if (soff < send_total) {
      si = np;
      p[np++] = (struct pollfd){.fd = bs->next_fd, .events = POLLOUT};
    }
    if (roff < recv_total) {
      ri = np;
      p[np++] = (struct pollfd){.fd = bs->prev_fd, .events = POLLIN};
    }
    if (bs->abort_flag && __atomic_load_n(bs->abort_flag, __ATOMIC_ACQUIRE)) {
      link_what(bs, si >= 0, swhat, sizeof(swhat));
      WARN("%s: aborted", swhat);
      return ncclInternalError;
    }
    int64_t left = deadline - hetccl_net_now_ms();
    if (left <= 0) {
      link_what(bs, si >= 0, swhat, sizeof(swhat));
      WARN("%s: timed out during a bootstrap exchange (HETCCL_CONNECT_TIMEOUT)", swhat);
      return ncclTimeout;
    }
    int rc = poll(p, np, left < 100 ? (int)left : 100);
    if (rc < 0 && errno != EINTR) {
      WARN("bootstrap rank %d: poll: %s", bs->rank, strerror(errno));
      return ncclSystemError;
    }
    if (rc <= 0) continue;
    if (si >= 0 && p[si].revents) {
      const char *src = soff < sizeof(sf) ? (const char *)&sf + soff
                                          : (const char *)sbuf + (soff - sizeof(sf));
      size_t len = soff < sizeof(sf) ? sizeof(sf) - soff : send_total - soff;
      ssize_t k = send(bs->next_fd, src, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) soff += (size_t)k;
      else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        link_what(bs, 1, swhat, sizeof(swhat));
        WARN("%s: send: %s", swhat, strerror(errno));
        return errno == EPIPE || errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
      }
    }
    if (ri >= 0 && p[ri].revents) {
      char *dst = roff < sizeof(rf) ? (char *)&rf + roff : (char *)rbuf + (roff - sizeof(rf));
      size_t len = roff < sizeof(rf) ? sizeof(rf) - roff : recv_total - roff;
      ssize_t k = recv(bs->prev_fd, dst, len, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        link_what(bs, 0, rwhat, sizeof(rwhat));
        if (k == 0) WARN("%s: connection closed by peer", rwhat);
        else WARN("%s: recv: %s", rwhat, strerror(errno));
        return k == 0 || errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
      }
      if (k > 0) {
        size_t was = roff;
        roff += (size_t)k;
        if (was < sizeof(rf) && roff >= sizeof(rf) &&
            (rf.magic != BS_FRAME_MAGIC || rf.comm_id != bs->comm_id || rf.rank != prev_of(bs) ||
             rf.kind != kind || rf.seq != bs->seq || rf.bytes != rbytes)) {
          link_what(bs, 0, rwhat, sizeof(rwhat));
          WARN("%s: frame does not fit: magic 0x%" PRIx64 " comm 0x%" PRIx64 " rank %d kind %u "
               "seq %" PRIu64 " bytes %" PRIu64 "; expected comm 0x%" PRIx64 " rank %d kind %u "
               "seq %" PRIu64 " bytes %zu (ranks out of step, or a foreign peer)",
               rwhat, rf.magic, rf.comm_id, rf.rank, rf.kind, rf.seq, rf.bytes, bs->comm_id,
               prev_of(bs), kind, bs->seq, rbytes);
          return ncclSystemError;
        }
      }
    }
  }
  return ncclSuccess;
}

/* ---- init ------------------------------------------------------------------------ */

ncclResult_t hetccl_bootstrap_init(const ncclUniqueId *ids, int nids, int rank, int nranks,
                                   const void *info, size_t info_bytes, void *all_infos,
                                   const hetccl_bootstrap_opts_t *opts,
                                   hetccl_bootstrap_t **out) {
  ncclResult_t res;
  if (nids < 1 || nids > nranks) {
    WARN("bootstrap: %d unique ids for %d ranks (1 to nranks expected)", nids, nranks);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < nids; i++) HETCCL_CHECK(hetccl_bootstrap_id_check(&ids[i]));
  if (nranks < 1 || nranks > BS_MAX_RANKS || rank < 0 || rank >= nranks ||
      info_bytes > BS_MAX_INFO || (info_bytes && (info == NULL || all_infos == NULL))) {
    WARN("bootstrap: bad arguments (rank %d, nranks %d, info_bytes %zu)", rank, nranks,
         info_bytes);
    return ncclInvalidArgument;
  }
  id_layout_t l;
  hetccl_bs_id_read(&ids[0], &l);
  /* Under NCCL_COMM_ID every process makes the same id; like NCCL, one
   * root then serves every rank. */
  if (l.flags & BS_ID_FLAG_RANK0_ROOT) nids = 1;
  char *blocks = NULL;
  hetccl_bootstrap_t *bs = calloc(1, sizeof(*bs));
  if (bs == NULL) {
    WARN("bootstrap: out of memory");
    return ncclSystemError;
  }
  bs->rank = rank;
  bs->nranks = nranks;
  bs->secret = l.secret;
  bs->comm_id = hetccl_bootstrap_id_comm_id(&ids[0]);
  bs->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : hetccl_bs_connect_timeout_ms();
  bs->abort_flag = opts ? opts->abort_flag : NULL;
  bs->lfd = bs->next_fd = bs->prev_fd = bs->spare_fd = -1;
  int64_t deadline = hetccl_net_deadline(bs->timeout_ms);

  if ((l.flags & BS_ID_FLAG_RANK0_ROOT) && rank == 0) {
    hetccl_sockaddr_t where;
    HETCCL_CHECK_GOTO(hetccl_net_addr_from_wire(&l.root, &where), res, fail);
    HETCCL_CHECK_GOTO(hetccl_net_addr_localize(&where, NULL), res, fail);
    res = hetccl_bs_root_start(&where, bs->secret, bs->timeout_ms, 1);
    if (res != ncclSuccess) { /* the root logged why */
      char s[HETCCL_NET_ADDR_STRLEN];
      hetccl_last_error_prefix("bootstrap rank 0: cannot serve the root at %s, which another "
                               "rank 0 of this id or another program may hold (NCCL_COMM_ID)",
                               hetccl_net_addr_str(&where, s, sizeof(s)));
      goto fail;
    }
  }
  /* Every rank checks its interface now: a bad NCCL_SOCKET_IFNAME fails
   * here with its own message on each rank, not later as a root that
   * never completes. */
  hetccl_sockaddr_t mine, next;
  HETCCL_CHECK_GOTO(hetccl_net_local_addr(NULL, &mine, NULL, 0), res, fail);
  hetccl_net_wire_addr_t spare;
  memset(&spare, 0, sizeof(spare));
  if (nranks > 1) {
    bs->laddr = mine;
    HETCCL_CHECK_GOTO(hetccl_net_listen(&bs->laddr, 0, &bs->lfd), res, fail);
    HETCCL_CHECK_GOTO(hetccl_net_bind(&mine, &bs->spare_fd), res, fail);
    hetccl_net_addr_to_wire(&mine, &spare);
    if ((bs->spares = calloc(nranks, sizeof(*bs->spares))) == NULL) {
      WARN("bootstrap: out of memory for %d spare addresses", nranks);
      res = ncclSystemError;
      goto fail;
    }
  }
  HETCCL_CHECK_GOTO(join_roots(bs, ids, nids, info_bytes, deadline, &next), res, fail);
  /* The reply came at most at the deadline; linking gets the same grace. */
  deadline += hetccl_bs_reply_grace_ms(bs->timeout_ms);
  if (nranks > 1) {
    HETCCL_CHECK_GOTO(ring_link(bs, &next, deadline), res, fail);
    hetccl_net_close(&bs->lfd); /* rank - 1 linked: nobody else may come in */
    /* One allgather carries both: each block is the spare port, then info. */
    size_t block = sizeof(spare) + info_bytes;
    if ((blocks = malloc(block * (size_t)nranks)) == NULL) {
      WARN("bootstrap: out of memory for %d x %zu bytes", nranks, block);
      res = ncclSystemError;
      goto fail;
    }
    memcpy(blocks + block * (size_t)rank, &spare, sizeof(spare));
    if (info_bytes) memcpy(blocks + block * (size_t)rank + sizeof(spare), info, info_bytes);
    HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(bs, blocks + block * (size_t)rank, blocks,
                                                 block), res, fail);
    for (int r = 0; r < nranks; r++) {
      memcpy(&bs->spares[r], blocks + block * (size_t)r, sizeof(spare));
      if (info_bytes)
        memcpy((char *)all_infos + info_bytes * (size_t)r, blocks + block * (size_t)r +
               sizeof(spare), info_bytes);
    }
    free(blocks);
  } else if (info_bytes) {
    memcpy(all_infos, info, info_bytes);
  }
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d/%d: joined communicator 0x%016" PRIx64 " (%d root%s)",
       rank, nranks, bs->comm_id, nids, nids > 1 ? "s" : "");
  *out = bs;
  return ncclSuccess;
fail:
  free(blocks);
  hetccl_bootstrap_destroy(bs);
  return res;
}

/* ---- collectives ---------------------------------------------------------------- */

ncclResult_t hetccl_bootstrap_allgather(hetccl_bootstrap_t *bs, const void *mine, void *all,
                                        size_t bytes) {
  char *a = all;
  int n = bs->nranks;
  bs->seq++;
  int64_t deadline = hetccl_net_deadline(bs->timeout_ms);
  if (bytes && a + (size_t)bs->rank * bytes != (const char *)mine)
    memmove(a + (size_t)bs->rank * bytes, mine, bytes);
  /* Step s passes on the block that came in at step s - 1 (at step 0 our
   * own): after n - 1 steps every block went round. */
  for (int s = 0; s < n - 1; s++) {
    int out = ((bs->rank - s) % n + n) % n, in = ((bs->rank - s - 1) % n + n) % n;
    HETCCL_CHECK(ring_step(bs, BS_KIND_GATHER, 1, bytes ? a + (size_t)out * bytes : NULL, bytes,
                           1, bytes ? a + (size_t)in * bytes : NULL, bytes, deadline));
  }
  return ncclSuccess;
}

ncclResult_t hetccl_bootstrap_bcast(hetccl_bootstrap_t *bs, void *buf, size_t bytes, int root) {
  if (root < 0 || root >= bs->nranks) {
    WARN("bootstrap: broadcast root %d out of range (nranks %d)", root, bs->nranks);
    return ncclInvalidArgument;
  }
  bs->seq++;
  int64_t deadline = hetccl_net_deadline(bs->timeout_ms);
  if (bs->nranks == 1) return ncclSuccess;
  /* Down the ring from the root: receive (unless root), pass on (unless
   * the next rank is the root). */
  int from_prev = bs->rank != root, to_next = next_of(bs) != root;
  if (from_prev) HETCCL_CHECK(ring_step(bs, BS_KIND_BCAST, 0, NULL, 0, 1, buf, bytes, deadline));
  if (to_next) HETCCL_CHECK(ring_step(bs, BS_KIND_BCAST, 1, buf, bytes, 0, NULL, 0, deadline));
  return ncclSuccess;
}

ncclResult_t hetccl_bootstrap_barrier(hetccl_bootstrap_t *bs) {
  return hetccl_bootstrap_allgather(bs, NULL, NULL, 0);
}

ncclResult_t hetccl_bootstrap_recovery_id(hetccl_bootstrap_t *bs, const uint8_t *excluded,
                                          ncclUniqueId *id) {
  int leader = -1, members = 0;
  uint64_t h = hetccl_bs_mix64(bs->secret ^ hetccl_bs_mix64(++bs->recoveries));
  for (int r = 0; r < bs->nranks; r++) {
    if (excluded[r]) continue;
    if (leader < 0) leader = r;
    members++;
    h = hetccl_bs_mix64(h ^ (uint64_t)r);
  }
  if (excluded[bs->rank]) {
    WARN("bootstrap rank %d: a recovery id needs this rank among the members", bs->rank);
    return ncclInvalidArgument;
  }
  if (members == 1) return hetccl_bootstrap_root_create(id); /* nobody to meet */
  /* The leader is rank 0 of the new communicator: it serves the root. */
  hetccl_bs_id_write(id, h, BS_ID_FLAG_RANK0_ROOT, &bs->spares[leader]);
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d: recovery %" PRIu64 " meets at rank %d's spare port",
       bs->rank, bs->recoveries, leader);
  return ncclSuccess;
}

void hetccl_bootstrap_stats(const hetccl_bootstrap_t *bs, uint64_t *msgs, uint64_t *bytes) {
  *msgs = bs ? bs->msgs : 0;
  *bytes = bs ? bs->bytes : 0;
}

void hetccl_bootstrap_destroy(hetccl_bootstrap_t *bs) {
  if (bs == NULL) return;
  hetccl_net_close(&bs->next_fd);
  hetccl_net_close(&bs->prev_fd);
  hetccl_net_close(&bs->lfd);
  hetccl_net_close(&bs->spare_fd);
  free(bs->spares);
  free(bs);
}
