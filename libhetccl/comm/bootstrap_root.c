/* Bootstrap, the rendezvous half: the unique id and its root.
 *
 * Contract. A root serves one group of ranks [first, last] of a
 * communicator (every rank for ncclCommInitRank; one of several groups for
 * ncclCommInitRankScalable, each id its own root). Every rank of the group
 * connects, presents the id's secret, its rank, the group it believes it is
 * in, and the address of its ring listener; when the rank after `last`
 * belongs to another group, that rank registers too (a hello with
 * `successor` set). Once all have come, the root sends each member the
 * address of the rank after it (reply_t), acknowledges the successor, and
 * exits. It forwards no rank's info: that goes round the ring
 * (bootstrap.c), so the root handles 2 small messages per rank of its
 * group, whatever the communicator's size.
 *
 * A connection that does not present the secret, or sends a frame that
 * does not fit, is dropped and logged; the root keeps waiting for the real
 * ranks. A refused hello that speaks the protocol is told why first
 * (reject_t + reason), so that its init fails with the reason. When ranks
 * are missing, the root gives up at the earliest deadline of the ranks that
 * joined (or its own HETCCL_CONNECT_TIMEOUT, counted from the first rank's
 * arrival) and tells them which ranks never came. Before any rank came it
 * waits without limit, as NCCL's root does: an id is often made long before
 * its ranks start (a slow launcher, a framework that makes it at its first
 * collective), nobody waits on it meanwhile, and a root that had gone
 * would meet its ranks with refused connections instead of an answer.
 *
 * Threads. The root runs on a detached thread of its own (started by
 * ncclGetUniqueId, or by the group's first rank under NCCL_COMM_ID and for
 * recovery ids); it owns its state, talks to nobody in this process, and
 * frees everything when it exits. The id functions are pure. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "comm/bootstrap.h"
#include "comm/bootstrap_wire.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

/* ---- unique id ----------------------------------------------------------- */

void hetccl_bs_id_read(const ncclUniqueId *id, id_layout_t *l) {
  memcpy(l, id->internal, sizeof(*l));
}

void hetccl_bs_id_write(ncclUniqueId *id, uint64_t secret, uint32_t flags,
                        const hetccl_net_wire_addr_t *root) {
  id_layout_t l;
  memset(&l, 0, sizeof(l));
  memcpy(l.magic, BS_ID_MAGIC, 8);
  l.version = BS_ID_VERSION;
  l.flags = flags;
  l.secret = secret;
  l.root = *root;
  memcpy(id->internal, &l, sizeof(l));
}

ncclResult_t hetccl_bootstrap_id_check(const ncclUniqueId *id) {
  id_layout_t l;
  if (id == NULL) {
    WARN("bootstrap: unique id is NULL");
    return ncclInvalidArgument;
  }
  hetccl_bs_id_read(id, &l);
  if (memcmp(l.magic, BS_ID_MAGIC, 8) != 0) {
    WARN("bootstrap: unique id is not a hetccl id (zeroed, from another library, or corrupted)");
    return ncclInvalidArgument;
  }
  if (l.version != BS_ID_VERSION || (l.flags & ~BS_ID_FLAG_RANK0_ROOT) != 0) {
    WARN("bootstrap: unique id has format version %u flags 0x%x; this library reads version %u",
         l.version, l.flags, BS_ID_VERSION);
    return ncclInvalidArgument;
  }
  hetccl_sockaddr_t a;
  int reserved_zero = 1;
  for (size_t i = 0; i < sizeof(l.reserved); i++) reserved_zero &= l.reserved[i] == 0;
  if (hetccl_net_addr_from_wire(&l.root, &a) != ncclSuccess || !reserved_zero) {
    WARN("bootstrap: unique id is corrupted (bad root address or reserved bytes)");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

uint64_t hetccl_bootstrap_id_secret(const ncclUniqueId *id) {
  id_layout_t l;
  hetccl_bs_id_read(id, &l);
  return l.secret;
}

uint64_t hetccl_bootstrap_id_comm_id(const ncclUniqueId *id) {
  /* Two different bijections xor-ed: the id names the communicator without
   * being the secret. Never 0, so 0 can mean "none" elsewhere. */
  uint64_t s = hetccl_bootstrap_id_secret(id);
  uint64_t c = hetccl_bs_mix64(s ^ 0x6865746363636964ull) ^
               hetccl_bs_mix64(s + 0x9e3779b97f4a7c15ull);
  return c ? c : 1;
}

void hetccl_bs_group_range(int nranks, int nids, int g, int *first, int *last) {
  int per = nranks / nids, extra = nranks % nids;
  *first = g < extra ? g * (per + 1) : extra * (per + 1) + (g - extra) * per;
  *last = *first + (g < extra ? per + 1 : per) - 1;
}

int hetccl_bs_group_of(int nranks, int nids, int rank) {
  int per = nranks / nids, extra = nranks % nids, big = extra * (per + 1);
  return rank < big ? rank / (per + 1) : extra + (rank - big) / per;
}

/* The root notices a deadline within a poll slice (100 ms) and its reply
 * is one small send, so a second is plenty; short timeouts get less. */
int hetccl_bs_reply_grace_ms(int timeout_ms) {
  int g = timeout_ms / 4;
  return g < 500 ? 500 : g > 2000 ? 2000 : g;
}

int hetccl_bs_connect_timeout_ms(void) {
  return (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000;
}

/* ---- the root ------------------------------------------------------------ */

typedef struct root {
  int lfd;
  uint64_t secret;
  int timeout_ms;
  int nranks, first, last; /* fixed by the first complete hello */
  int members;             /* last - first + 1 */
  int successor;           /* the rank after `last`, -1 if it is a member */
  int slots, arrived;      /* members (+ 1 for the successor) / joined so far */
  uint64_t info_bytes;
  int *fds;                /* per slot: member rank - first, then the successor */
  hetccl_sockaddr_t *from; /* per slot, for messages */
  hetccl_net_wire_addr_t *listen; /* per slot: where the rank takes its ring link */
  int in_rank0;            /* started by a rank's own init (NCCL_COMM_ID, recovery) */
  int64_t expires;         /* the earliest deadline of a rank that joined */
  int expires_rank, expires_timeout_ms;
  int64_t own_expires;     /* the first arrival + timeout_ms; INT64_MAX until then */
  uint64_t msgs, bytes;    /* handled, for the INFO line (docs/scale.md) */
  char name[HETCCL_NET_ADDR_STRLEN + 32];
} root_t;

static void root_free(root_t *r) {
  if (r->fds)
    for (int i = 0; i < r->slots; i++) hetccl_net_close(&r->fds[i]);
  hetccl_net_close(&r->lfd);
  free(r->fds);
  free(r->from);
  free(r->listen);
  free(r);
}

/* A reject with a reason into buf (at most HETCCL_NET_REPLY_MAX bytes). */
static size_t reject_fill(unsigned char *buf, ncclResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static size_t reject_fill(unsigned char *buf, ncclResult_t code, const char *fmt, ...) {
  char text[REJECT_MAX_REASON + 1];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  size_t len = k < 0 ? 0 : (size_t)k < REJECT_MAX_REASON ? (size_t)k : REJECT_MAX_REASON;
  reject_t rj = {.magic = BS_REJECT_MAGIC, .code = (int32_t)code, .bytes = (uint32_t)len};
  memcpy(buf, &rj, sizeof(rj));
  memcpy(buf + sizeof(rj), text, len);
  return sizeof(rj) + len;
}

static int slot_of(const root_t *r, const hello_t *h) {
  return h->successor ? r->members : h->rank - r->first;
}

/* Does a hello with the right secret agree with the ranks so far? If not,
 * log it and fill the reply that tells the rank why. */
static int root_shape_ok(root_t *r, const hello_t *h, const hetccl_sockaddr_t *peer,
                         hetccl_net_reply_t *reply) {
  char s[HETCCL_NET_ADDR_STRLEN], s2[HETCCL_NET_ADDR_STRLEN];
  hetccl_net_addr_str(peer, s, sizeof(s));
  if (h->nranks != r->nranks) {
    /* Right secret, wrong shape: a real rank disagrees. Worth a WARN. */
    WARN("%s: rank %d from %s says nranks=%d, the ranks before it said nranks=%d; dropped",
         r->name, h->rank, s, h->nranks, r->nranks);
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: this rank says nranks=%d, the ranks that joined first "
                             "say nranks=%d (ranks of two jobs share a unique id, or nranks "
                             "differs between ranks)", h->nranks, r->nranks);
    return 0;
  }
  if (h->info_bytes != r->info_bytes) {
    WARN("%s: rank %d from %s publishes %" PRIu64 " bytes of info, the ranks before it %" PRIu64
         "; dropped", r->name, h->rank, s, h->info_bytes, r->info_bytes);
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: this rank publishes %" PRIu64 " bytes of bootstrap info, "
                             "the ranks that joined first %" PRIu64 " (ranks of this unique id "
                             "run different hetccl versions)", h->info_bytes, r->info_bytes);
    return 0;
  }
  if (h->first != r->first || h->last != r->last) {
    WARN("%s: rank %d from %s expects this root to serve ranks %d-%d, the ranks before it "
         "%d-%d; dropped", r->name, h->rank, s, h->first, h->last, r->first, r->last);
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: this rank expects the root of its unique id to serve "
                             "ranks %d-%d, the ranks that joined first %d-%d (the ranks pass "
                             "different numbers of unique ids to ncclCommInitRankScalable)",
                             h->first, h->last, r->first, r->last);
    return 0;
  }
  int in_group = h->successor ? h->rank == r->successor
                              : h->rank >= r->first && h->rank <= r->last;
  if (!in_group) {
    WARN("%s: rank %d from %s is not one this root serves (ranks %d-%d%s); dropped", r->name,
         h->rank, s, r->first, r->last, r->successor >= 0 ? " and the next group's first" : "");
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: the root of this unique id serves ranks %d-%d, not rank "
                             "%d (the ranks pass their unique ids in different orders)",
                             r->first, r->last, h->rank);
    return 0;
  }
  int slot = slot_of(r, h);
  if (r->fds[slot] >= 0) {
    hetccl_net_addr_str(&r->from[slot], s2, sizeof(s2));
    WARN("%s: rank %d joined twice (from %s, again from %s); the second one is dropped", r->name,
         h->rank, s2, s);
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: rank %d already joined from %s (two processes claim one "
                             "rank: ranks of two jobs share a unique id, or a rank number is "
                             "repeated)", h->rank, s2);
    return 0;
  }
  return 1;
}

static long root_on_header(void *ctx, const void *hdr, const hetccl_sockaddr_t *peer,
                           hetccl_net_reply_t *reply) {
  root_t *r = ctx;
  hello_t h;
  char s[HETCCL_NET_ADDR_STRLEN];
  memcpy(&h, hdr, sizeof(h));
  if (h.magic != BS_HELLO_MAGIC) { /* not ours: no word back */
    INFO(HETCCL_BOOTSTRAP, "%s: dropping connection from %s: not a hetccl bootstrap hello",
         r->name, hetccl_net_addr_str(peer, s, sizeof(s)));
    return -1;
  }
  const char *why = NULL;
  if (h.secret != r->secret) {
    why = "wrong secret (a different unique id)";
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: the unique id's secret does not match the one this root "
                             "made (a unique id of another job, or a forged or corrupted one)");
  } else if (h.nranks < 1 || h.nranks > BS_MAX_RANKS || h.rank < 0 || h.rank >= h.nranks ||
             h.first < 0 || h.last < h.first || h.last >= h.nranks) {
    why = "rank / nranks out of range";
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: rank %d of nranks %d is out of range (0 <= rank < nranks "
                             "<= %d)",
                             h.rank, h.nranks, BS_MAX_RANKS);
  } else if (h.info_bytes > BS_MAX_INFO || h.info_bytes * (uint64_t)h.nranks > BS_MAX_TABLE) {
    why = "oversized info";
    reply->len = reject_fill(reply->buf, ncclInvalidUsage,
                             "refused: %" PRIu64 " bytes of info per rank for nranks %d exceed "
                             "the bootstrap's limits (%u per rank, %" PRIu64 " in all)",
                             h.info_bytes, h.nranks, BS_MAX_INFO, BS_MAX_TABLE);
  }
  if (why) {
    INFO(HETCCL_BOOTSTRAP, "%s: dropping connection from %s: %s", r->name,
         hetccl_net_addr_str(peer, s, sizeof(s)), why);
    return -1;
  }
  if (r->nranks > 0 && !root_shape_ok(r, &h, peer, reply)) return -1;
  return 0;
}

/* The first complete hello fixes the shape. */
static int root_shape_set(root_t *r, const hello_t *h, hetccl_net_reply_t *reply) {
  int members = h->last - h->first + 1;
  int succ = (h->last + 1) % h->nranks;
  int successor = succ >= h->first && succ <= h->last ? -1 : succ;
  int slots = members + (successor >= 0);
  r->fds = malloc(slots * sizeof(int));
  r->from = calloc(slots, sizeof(*r->from));
  r->listen = calloc(slots, sizeof(*r->listen));
  if (r->fds == NULL || r->from == NULL || r->listen == NULL) {
    WARN("%s: out of memory for %d ranks", r->name, slots);
    free(r->fds);
    free(r->from);
    free(r->listen);
    r->fds = NULL;
    r->from = NULL;
    r->listen = NULL;
    reply->len = reject_fill(reply->buf, ncclSystemError,
                             "refused: the root is out of memory for %d ranks", slots);
    return 0;
  }
  for (int i = 0; i < slots; i++) r->fds[i] = -1;
  r->nranks = h->nranks;
  r->first = h->first;
  r->last = h->last;
  r->members = members;
  r->successor = successor;
  r->slots = slots;
  r->info_bytes = h->info_bytes;
  return 1;
}

static int root_on_frame(void *ctx, int fd, const void *hdr, const void *payload,
                         const hetccl_sockaddr_t *peer, hetccl_net_reply_t *reply) {
  root_t *r = ctx;
  hello_t h;
  char s[HETCCL_NET_ADDR_STRLEN];
  (void)payload;
  memcpy(&h, hdr, sizeof(h));
  if (r->nranks == 0 && !root_shape_set(r, &h, reply)) return 0;
  /* Checked again: others completed meanwhile. */
  if (!root_shape_ok(r, &h, peer, reply)) return 0;
  int slot = slot_of(r, &h);
  r->fds[slot] = fd;
  r->from[slot] = *peer;
  r->listen[slot] = h.listen;
  if (r->arrived++ == 0) r->own_expires = hetccl_net_now_ms() + r->timeout_ms;
  r->msgs++;
  r->bytes += sizeof(h);
  int64_t gives_up = hetccl_net_now_ms() + h.left_ms;
  if (gives_up < r->expires) {
    r->expires = gives_up;
    r->expires_rank = h.rank;
    r->expires_timeout_ms = (int)h.timeout_ms;
  }
  TRACE(HETCCL_BOOTSTRAP, "%s: rank %d/%d%s arrived from %s, waits %u ms more", r->name, h.rank,
        r->nranks, h.successor ? " (next group's first)" : "",
        hetccl_net_addr_str(peer, s, sizeof(s)), h.left_ms);
  return 1;
}

static int root_done(void *ctx) {
  root_t *r = ctx;
  return r->nranks > 0 && r->arrived == r->slots;
}

static int64_t root_expires(void *ctx) {
  const root_t *r = ctx;
  return r->expires < r->own_expires ? r->expires : r->own_expires;
}

static int slot_rank(const root_t *r, int slot) {
  return slot < r->members ? r->first + slot : r->successor;
}

/* "rank 3" or "ranks 2-5, 9" (ranks whose slot is empty), cut short with
 * ", ..." where the buffer ends. */
static void missing_ranks(const root_t *r, char *buf, size_t len) {
  int missing = r->slots - r->arrived;
  size_t at = (size_t)snprintf(buf, len, "%s", missing == 1 ? "rank " : "ranks ");
  int first = 1;
  for (int i = 0; i < r->slots && at < len; i++) {
    if (r->fds[i] >= 0) continue;
    int j = i;
    while (j + 1 < r->members && i < r->members && r->fds[j + 1] < 0) j++;
    char item[32];
    if (j == i) snprintf(item, sizeof(item), "%s%d", first ? "" : ", ", slot_rank(r, i));
    else snprintf(item, sizeof(item), "%s%d-%d", first ? "" : ", ", slot_rank(r, i),
                  slot_rank(r, j));
    if (at + strlen(item) + 5 >= len) {
      snprintf(buf + at, len - at, ", ...");
      return;
    }
    at += (size_t)snprintf(buf + at, len - at, "%s", item);
    first = 0;
    i = j;
  }
}

/* Tell every rank that joined why there will be no reply, then close. */
static void root_reject_all(root_t *r, ncclResult_t code, const char *reason) {
  hetccl_net_reply_t reply;
  reply.len = reject_fill(reply.buf, code, "%s", reason);
  int64_t deadline = hetccl_net_deadline(1000); /* a few hundred bytes into idle sockets */
  for (int i = 0; i < r->slots; i++) {
    if (r->fds[i] < 0) continue;
    (void)hetccl_net_send_all(r->fds[i], reply.buf, reply.len, deadline, NULL, NULL);
    hetccl_net_close(&r->fds[i]);
  }
}

/* The ranks that joined wait for a word: say which ranks never came. */
static void root_give_up(root_t *r, ncclResult_t res) {
  char reason[REJECT_MAX_REASON + 1], ranks[256];
  if (r->arrived == 0) {
    INFO(HETCCL_BOOTSTRAP, "%s: gave up, no rank joined", r->name);
    return;
  }
  if (res == ncclTimeout) {
    missing_ranks(r, ranks, sizeof(ranks));
    if (r->expires <= r->own_expires)
      snprintf(reason, sizeof(reason),
               "%s of %d never joined within %.1f s (HETCCL_CONNECT_TIMEOUT of rank %d)", ranks,
               r->nranks, r->expires_timeout_ms / 1000.0, r->expires_rank);
    else
      snprintf(reason, sizeof(reason),
               "%s of %d never joined within %.1f s (HETCCL_CONNECT_TIMEOUT of %s)", ranks,
               r->nranks, r->timeout_ms / 1000.0,
               r->in_rank0 ? "the rank that serves the root (NCCL_COMM_ID, or a recovery)"
                           : "the process that made the unique id, where the bootstrap root runs");
  } else {
    snprintf(reason, sizeof(reason), "the bootstrap root failed with %d of %d ranks: %s",
             r->arrived, r->nranks, hetccl_last_error());
  }
  INFO(HETCCL_BOOTSTRAP, "%s: gave up: %s", r->name, reason);
  root_reject_all(r, res == ncclTimeout ? ncclTimeout : ncclSystemError, reason);
}

static void *root_main(void *arg) {
  hetccl_thread_name("hetccl-bootroot");
  root_t *r = arg;
  hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(hello_t), .max_payload = 0,
                                .on_header = root_on_header, .on_frame = root_on_frame,
                                .done = root_done, .expires = root_expires};
  char what[sizeof(r->name) + 64];
  snprintf(what, sizeof(what), "%s: waiting for ranks", r->name);
  /* No deadline of its own: root_expires gives the one there is. */
  ncclResult_t res = hetccl_net_accept_hellos(r->lfd, &ops, r, INT64_MAX, NULL, what);
  hetccl_net_close(&r->lfd);
  if (res != ncclSuccess) {
    root_give_up(r, res);
    root_free(r);
    return NULL;
  }
  int64_t deadline = hetccl_net_deadline(r->timeout_ms);
  for (int i = 0; i < r->slots; i++) {
    reply_t t = {.magic = BS_REPLY_MAGIC, .secret = r->secret, .nranks = r->nranks,
                 .info_bytes = r->info_bytes};
    /* A member's next is the member after it, or for `last` the successor
     * (a member too when this root serves every rank). */
    if (i < r->members) t.next = r->listen[i + 1 < r->slots ? i + 1 : 0];
    char w[sizeof(r->name) + 32];
    snprintf(w, sizeof(w), "%s: reply to rank %d", r->name, slot_rank(r, i));
    r->msgs++;
    r->bytes += sizeof(t);
    /* A failed send is the rank's problem to report; the others go on. */
    (void)hetccl_net_send_all(r->fds[i], &t, sizeof(t), deadline, NULL, w);
  }
  INFO(HETCCL_BOOTSTRAP, "%s: ranks %d-%d of %d joined; root exits", r->name, r->first, r->last,
       r->nranks);
  INFO(HETCCL_BOOTSTRAP, "bootstrap root stats: %" PRIu64 " messages, %" PRIu64 " bytes", r->msgs,
       r->bytes);
  root_free(r);
  return NULL;
}

ncclResult_t hetccl_bs_root_start(hetccl_sockaddr_t *addr, uint64_t secret, int timeout_ms,
                                  int in_rank0) {
  ncclResult_t res;
  root_t *r = calloc(1, sizeof(*r));
  if (r == NULL) {
    WARN("bootstrap: out of memory for the root");
    return ncclSystemError;
  }
  r->lfd = -1;
  r->secret = secret;
  r->timeout_ms = timeout_ms;
  r->in_rank0 = in_rank0;
  r->expires = r->own_expires = INT64_MAX;
  HETCCL_CHECK_GOTO(hetccl_net_listen(addr, 0, &r->lfd), res, fail);
  char s[HETCCL_NET_ADDR_STRLEN];
  snprintf(r->name, sizeof(r->name), "bootstrap root %s", hetccl_net_addr_str(addr, s, sizeof(s)));
  pthread_attr_t attr;
  pthread_t th;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int err = pthread_create(&th, &attr, root_main, r);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    WARN("%s: pthread_create: %s", r->name, strerror(err));
    res = ncclSystemError;
    goto fail;
  }
  INFO(HETCCL_BOOTSTRAP, "%s: listening", r->name);
  return ncclSuccess;
fail:
  root_free(r);
  return res;
}

ncclResult_t hetccl_bootstrap_root_create(ncclUniqueId *id) {
  hetccl_sockaddr_t addr;
  uint64_t secret;
  uint32_t flags = 0;
  const char *fixed = hetccl_knob_str(HETCCL_KNOB_COMM_ID);
  if (*fixed) {
    /* Every process may call ncclGetUniqueId on its own and must get the
     * same id, so the secret is derived from the address: under
     * NCCL_COMM_ID, knowing the address is what admits a rank. */
    HETCCL_CHECK(hetccl_net_parse_addr(fixed, &addr));
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = fixed; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    secret = hetccl_bs_mix64(h);
    flags = BS_ID_FLAG_RANK0_ROOT;
  } else {
    if (getrandom(&secret, sizeof(secret), 0) != (ssize_t)sizeof(secret)) {
      WARN("bootstrap: getrandom for the unique id secret: %s", strerror(errno));
      return ncclSystemError;
    }
    HETCCL_CHECK(hetccl_net_local_addr(NULL, &addr, NULL, 0));
    HETCCL_CHECK(hetccl_bs_root_start(&addr, secret, hetccl_bs_connect_timeout_ms(), 0));
  }
  hetccl_net_wire_addr_t root;
  hetccl_net_addr_to_wire(&addr, &root);
  hetccl_bs_id_write(id, secret, flags, &root);
  return ncclSuccess;
}
