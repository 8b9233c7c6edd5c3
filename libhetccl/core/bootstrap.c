/* Bootstrap (core/bootstrap.h): the root exchange, then a star through
 * rank 0.
 *
 * Threads. The root runs on a detached thread of its own (started by
 * ncclGetUniqueId, or by rank 0's init under NCCL_COMM_ID); it owns its
 * state, talks to nobody in this process, and frees everything when it
 * exits (table sent, or HETCCL_CONNECT_TIMEOUT elapsed). A bootstrap handle
 * is used by one thread at a time; several handles (ranks) may live in one
 * process and init concurrently: there is no global state here.
 *
 * Wire (all little-endian host order: one host architecture per job).
 *   unique id (128 bytes): id_layout_t below; only the secret is secret.
 *   rank -> root: hello_t + info_bytes of info.
 *   root -> rank: table_t + nranks * info_bytes, or reject_t + a reason
 *     (text, at most REJECT_MAX_REASON bytes) and the connection closes.
 *   rank r>0 -> rank 0 listener: link_t (authenticates the star link).
 *   star frames: frame_t + payload; every field is checked on receipt.
 *
 * Who tells whom why. A hello that speaks the protocol (right magic) but is
 * refused (wrong secret, a shape that disagrees, a rank taken) gets a reject
 * with the reason before the root closes; the reason is our own text plus at
 * most the integers the peer sent, never its bytes, and says nothing about
 * the secret but that it did not match. Anything else is closed without a
 * word. A rank that times out cannot say which ranks are missing, the root
 * can: every hello carries how long its rank will still wait, the root gives
 * up at the first rank's deadline (or its own), tells every rank that joined
 * which ranks never came, and the ranks wait a grace (reply_grace_ms) past
 * their deadline for that word.
 *
 * Ports. Only rank 0 listens (for the star links), and only until every
 * rank has linked; the root listens until the table is out or it gave up.
 * After init no bootstrap port of the communicator is open.
 *
 * Spare ports. Every rank also binds one port at init, without listening
 * (connections to it are refused), and the ranks learn each other's. After
 * a failure the survivors need a meeting point that no excluded (maybe dead)
 * rank serves: the lowest survivor serves the new root on its spare port
 * (hetccl_bootstrap_recovery_id), and every survivor derives the same new
 * id from what they share, without a message.
 */
#include "core/bootstrap.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/net.h"

#define ID_MAGIC "HETCCLID"
#define ID_VERSION 2u /* 2: hellos carry the rank's deadline; the root may reject */
#define ID_FLAG_RANK0_ROOT 0x1u /* NCCL_COMM_ID: rank 0 serves the root */

#define HELLO_MAGIC 0x48455442534845ull /* "HETBSHE" */
#define TABLE_MAGIC 0x48455442535442ull /* "HETBSTB" */
#define LINK_MAGIC 0x484554425354cbull
#define FRAME_MAGIC 0x48455442534652ull /* "HETBSFR" */
#define REJECT_MAGIC 0x4845544253524aull /* "HETBSRJ" */

#define BS_MAX_RANKS (1 << 20)
#define BS_MAX_INFO (1u << 20)            /* bytes of info per rank */
#define BS_MAX_TABLE ((uint64_t)1 << 32)  /* nranks * info_bytes */
#define REJECT_MAX_REASON (HETCCL_NET_REPLY_MAX - sizeof(reject_t))

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
  uint64_t secret;
  int32_t rank, nranks;
  uint64_t info_bytes;
  hetccl_net_wire_addr_t listen; /* rank 0's star listener (others: none) */
  uint32_t timeout_ms;           /* the rank's HETCCL_CONNECT_TIMEOUT */
  uint32_t left_ms;              /* how long the rank waits from this hello on */
} hello_t;

typedef struct reject {
  uint64_t magic;
  int32_t code;    /* the ncclResult_t the rank's init returns */
  uint32_t bytes;  /* of reason text that follows, <= REJECT_MAX_REASON */
} reject_t;

typedef struct table {
  uint64_t magic;
  uint64_t secret;
  int32_t nranks, pad;
  uint64_t info_bytes;
  hetccl_net_wire_addr_t rank0; /* where ranks > 0 keep their link */
} table_t;

typedef struct link {
  uint64_t magic;
  uint64_t secret;
  uint64_t comm_id;
  int32_t rank, nranks;
} link_t;

enum { KIND_GATHER_UP = 1, KIND_GATHER_DOWN, KIND_BCAST_UP, KIND_BCAST_DOWN };

typedef struct frame {
  uint64_t magic;
  uint64_t comm_id;
  int32_t rank;
  uint32_t kind;
  uint64_t seq;
  uint64_t bytes;
} frame_t;

struct hetccl_bootstrap {
  int rank, nranks;
  uint64_t secret, comm_id;
  int timeout_ms;
  volatile int *abort_flag;
  uint64_t seq;                /* collective operations so far */
  int lfd;                     /* rank 0: the star listener, until every rank linked */
  hetccl_sockaddr_t laddr;
  int *fds;                    /* rank 0: per peer; others: fds[0] */
  hetccl_sockaddr_t *addrs;    /* peer address per fd, for messages */
  int links_accepted;          /* rank 0 while linking */
  int spare_fd;                /* bound, not listening (see "Spare ports") */
  hetccl_net_wire_addr_t *spares; /* every rank's spare port */
  uint64_t recoveries;         /* recovery ids made so far */
};

/* ---- unique id ----------------------------------------------------------- */

static void id_read(const ncclUniqueId *id, id_layout_t *l) { memcpy(l, id->internal, sizeof(*l)); }

static void id_write(ncclUniqueId *id, uint64_t secret, uint32_t flags,
                     const hetccl_net_wire_addr_t *root) {
  id_layout_t l;
  memset(&l, 0, sizeof(l));
  memcpy(l.magic, ID_MAGIC, 8);
  l.version = ID_VERSION;
  l.flags = flags;
  l.secret = secret;
  l.root = *root;
  memcpy(id->internal, &l, sizeof(l));
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

ncclResult_t hetccl_bootstrap_id_check(const ncclUniqueId *id) {
  id_layout_t l;
  if (id == NULL) {
    WARN("bootstrap: unique id is NULL");
    return ncclInvalidArgument;
  }
  id_read(id, &l);
  if (memcmp(l.magic, ID_MAGIC, 8) != 0) {
    WARN("bootstrap: unique id is not a hetccl id (zeroed, from another library, or corrupted)");
    return ncclInvalidArgument;
  }
  if (l.version != ID_VERSION || (l.flags & ~ID_FLAG_RANK0_ROOT) != 0) {
    WARN("bootstrap: unique id has format version %u flags 0x%x; this library reads version %u",
         l.version, l.flags, ID_VERSION);
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
  id_read(id, &l);
  return l.secret;
}

uint64_t hetccl_bootstrap_id_comm_id(const ncclUniqueId *id) {
  /* Two different bijections xor-ed: the id names the communicator without
   * being the secret. Never 0, so 0 can mean "none" elsewhere. */
  uint64_t s = hetccl_bootstrap_id_secret(id);
  uint64_t c = mix64(s ^ 0x6865746363636964ull) ^ mix64(s + 0x9e3779b97f4a7c15ull);
  return c ? c : 1;
}

/* ---- the root ------------------------------------------------------------ */

/* How long a rank waits past its own deadline for the root's word. The root
 * notices a deadline within a poll slice (100 ms) and its reply is one
 * small send, so a second is plenty; short timeouts get a shorter grace. */
static int reply_grace_ms(int timeout_ms) {
  int g = timeout_ms / 4;
  return g < 500 ? 500 : g > 2000 ? 2000 : g;
}

typedef struct root {
  int lfd;
  hetccl_sockaddr_t addr;
  uint64_t secret;
  int timeout_ms;
  int nranks, arrived;
  uint64_t info_bytes;
  int *fds;
  hetccl_sockaddr_t *from; /* per rank, for messages */
  char *table;
  hetccl_net_wire_addr_t rank0;
  int in_rank0;           /* NCCL_COMM_ID: rank 0's init started this root */
  int64_t expires;        /* the earliest deadline of a rank that joined */
  int expires_rank, expires_timeout_ms;
  char name[HETCCL_NET_ADDR_STRLEN + 32];
} root_t;

static void root_free(root_t *r) {
  if (r->fds)
    for (int i = 0; i < r->nranks; i++) hetccl_net_close(&r->fds[i]);
  hetccl_net_close(&r->lfd);
  free(r->fds);
  free(r->from);
  free(r->table);
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
  reject_t rj = {.magic = REJECT_MAGIC, .code = (int32_t)code, .bytes = (uint32_t)len};
  memcpy(buf, &rj, sizeof(rj));
  memcpy(buf + sizeof(rj), text, len);
  return sizeof(rj) + len;
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
  if (r->fds[h->rank] >= 0) {
    hetccl_net_addr_str(&r->from[h->rank], s2, sizeof(s2));
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
  if (h.magic != HELLO_MAGIC) { /* not ours: no word back */
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
  } else if (h.nranks < 1 || h.nranks > BS_MAX_RANKS || h.rank < 0 || h.rank >= h.nranks) {
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
  return (long)h.info_bytes;
}

static int root_on_frame(void *ctx, int fd, const void *hdr, const void *payload,
                         const hetccl_sockaddr_t *peer, hetccl_net_reply_t *reply) {
  root_t *r = ctx;
  hello_t h;
  char s[HETCCL_NET_ADDR_STRLEN];
  memcpy(&h, hdr, sizeof(h));
  if (r->nranks == 0) { /* the first complete hello fixes the shape */
    r->fds = malloc(h.nranks * sizeof(int));
    r->from = calloc(h.nranks, sizeof(*r->from));
    r->table = malloc(h.info_bytes * h.nranks + 1);
    if (r->fds == NULL || r->from == NULL || r->table == NULL) {
      WARN("%s: out of memory for %d ranks x %" PRIu64 " bytes", r->name, h.nranks, h.info_bytes);
      free(r->fds);
      free(r->from);
      free(r->table);
      r->fds = NULL;
      r->from = NULL;
      r->table = NULL;
      reply->len = reject_fill(reply->buf, ncclSystemError,
                               "refused: the root is out of memory for %d ranks x %" PRIu64
                               " bytes of info", h.nranks, h.info_bytes);
      return 0;
    }
    for (int i = 0; i < h.nranks; i++) r->fds[i] = -1;
    r->nranks = h.nranks;
    r->info_bytes = h.info_bytes;
  }
  /* Checked again: others completed meanwhile. */
  if (!root_shape_ok(r, &h, peer, reply)) return 0;
  r->fds[h.rank] = fd;
  r->from[h.rank] = *peer;
  if (h.info_bytes) memcpy(r->table + (size_t)h.rank * h.info_bytes, payload, h.info_bytes);
  if (h.rank == 0) r->rank0 = h.listen;
  r->arrived++;
  int64_t gives_up = hetccl_net_now_ms() + h.left_ms;
  if (gives_up < r->expires) {
    r->expires = gives_up;
    r->expires_rank = h.rank;
    r->expires_timeout_ms = (int)h.timeout_ms;
  }
  TRACE(HETCCL_BOOTSTRAP, "%s: rank %d/%d arrived from %s, waits %u ms more", r->name, h.rank,
        r->nranks, hetccl_net_addr_str(peer, s, sizeof(s)), h.left_ms);
  return 1;
}

static int root_done(void *ctx) {
  root_t *r = ctx;
  return r->nranks > 0 && r->arrived == r->nranks;
}

static int64_t root_expires(void *ctx) { return ((root_t *)ctx)->expires; }

/* "rank 3" or "ranks 2-5, 9" (ranks whose fd is missing), cut short with
 * ", ..." where the buffer ends. */
static void missing_ranks(const root_t *r, char *buf, size_t len) {
  int missing = r->nranks - r->arrived;
  size_t at = (size_t)snprintf(buf, len, "%s", missing == 1 ? "rank " : "ranks ");
  int first = 1;
  for (int i = 0; i < r->nranks && at < len; i++) {
    if (r->fds[i] >= 0) continue;
    int j = i;
    while (j + 1 < r->nranks && r->fds[j + 1] < 0) j++;
    char item[32];
    if (j == i) snprintf(item, sizeof(item), "%s%d", first ? "" : ", ", i);
    else snprintf(item, sizeof(item), "%s%d-%d", first ? "" : ", ", i, j);
    if (at + strlen(item) + 5 >= len) {
      snprintf(buf + at, len - at, ", ...");
      return;
    }
    at += (size_t)snprintf(buf + at, len - at, "%s", item);
    first = 0;
    i = j;
  }
}

/* Tell every rank that joined why there will be no table, then close. */
static void root_reject_all(root_t *r, ncclResult_t code, const char *reason) {
  hetccl_net_reply_t reply;
  reply.len = reject_fill(reply.buf, code, "%s", reason);
  int64_t deadline = hetccl_net_deadline(1000); /* a few hundred bytes into idle sockets */
  for (int i = 0; i < r->nranks; i++) {
    if (r->fds[i] < 0) continue;
    (void)hetccl_net_send_all(r->fds[i], reply.buf, reply.len, deadline, NULL, NULL);
    hetccl_net_close(&r->fds[i]);
  }
}

/* The ranks that joined wait for a word: say which ranks never came. */
static void root_give_up(root_t *r, ncclResult_t res, int64_t own_deadline) {
  char reason[REJECT_MAX_REASON + 1], ranks[256];
  if (r->arrived == 0) {
    INFO(HETCCL_BOOTSTRAP, "%s: gave up, no rank joined", r->name);
    return;
  }
  if (res == ncclTimeout) {
    missing_ranks(r, ranks, sizeof(ranks));
    if (r->expires <= own_deadline)
      snprintf(reason, sizeof(reason),
               "%s of %d never joined within %.1f s (HETCCL_CONNECT_TIMEOUT of rank %d)", ranks,
               r->nranks, r->expires_timeout_ms / 1000.0, r->expires_rank);
    else
      snprintf(reason, sizeof(reason),
               "%s of %d never joined within %.1f s (HETCCL_CONNECT_TIMEOUT of %s)", ranks,
               r->nranks, r->timeout_ms / 1000.0,
               r->in_rank0 ? "rank 0, which serves the root under NCCL_COMM_ID"
                           : "the process that made the unique id, where the bootstrap root runs");
  } else {
    snprintf(reason, sizeof(reason), "the bootstrap root failed with %d of %d ranks: %s",
             r->arrived, r->nranks, hetccl_last_error());
  }
  INFO(HETCCL_BOOTSTRAP, "%s: gave up: %s", r->name, reason);
  root_reject_all(r, res == ncclTimeout ? ncclTimeout : ncclSystemError, reason);
}

static void *root_main(void *arg) {
  root_t *r = arg;
  hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(hello_t), .max_payload = BS_MAX_INFO,
                                .on_header = root_on_header, .on_frame = root_on_frame,
                                .done = root_done, .expires = root_expires};
  int64_t deadline = hetccl_net_deadline(r->timeout_ms);
  char what[sizeof(r->name) + 64];
  snprintf(what, sizeof(what), "%s: waiting for ranks", r->name);
  ncclResult_t res = hetccl_net_accept_hellos(r->lfd, &ops, r, deadline, NULL, what);
  hetccl_net_close(&r->lfd);
  if (res != ncclSuccess) {
    root_give_up(r, res, deadline);
    root_free(r);
    return NULL;
  }
  table_t t = {.magic = TABLE_MAGIC, .secret = r->secret, .nranks = r->nranks,
               .info_bytes = r->info_bytes, .rank0 = r->rank0};
  size_t tbytes = (size_t)r->nranks * r->info_bytes;
  deadline = hetccl_net_deadline(r->timeout_ms);
  for (int i = 0; i < r->nranks; i++) {
    char w[sizeof(r->name) + 32];
    snprintf(w, sizeof(w), "%s: table to rank %d", r->name, i);
    /* A failed send is the rank's problem to report; the others go on. */
    if (hetccl_net_send_all(r->fds[i], &t, sizeof(t), deadline, NULL, w) == ncclSuccess)
      (void)hetccl_net_send_all(r->fds[i], r->table, tbytes, deadline, NULL, w);
  }
  INFO(HETCCL_BOOTSTRAP, "%s: %d ranks joined; root exits", r->name, r->nranks);
  root_free(r);
  return NULL;
}

/* Listen on addr and start the root thread; it owns everything after. */
static ncclResult_t root_start(hetccl_sockaddr_t *addr, uint64_t secret, int timeout_ms,
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
  r->expires = INT64_MAX;
  HETCCL_CHECK_GOTO(hetccl_net_listen(addr, 0, &r->lfd), res, fail);
  r->addr = *addr;
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

static int connect_timeout_ms(void) {
  return (int)hetccl_knob_int(HETCCL_KNOB_CONNECT_TIMEOUT) * 1000;
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
    secret = mix64(h);
    flags = ID_FLAG_RANK0_ROOT;
  } else {
    if (getrandom(&secret, sizeof(secret), 0) != (ssize_t)sizeof(secret)) {
      WARN("bootstrap: getrandom for the unique id secret: %s", strerror(errno));
      return ncclSystemError;
    }
    HETCCL_CHECK(hetccl_net_local_addr(NULL, &addr, NULL, 0));
    HETCCL_CHECK(root_start(&addr, secret, connect_timeout_ms(), 0));
  }
  hetccl_net_wire_addr_t root;
  hetccl_net_addr_to_wire(&addr, &root);
  id_write(id, secret, flags, &root);
  return ncclSuccess;
}

/* ---- star frames --------------------------------------------------------- */

static void peer_what(const hetccl_bootstrap_t *bs, int peer, char *buf, size_t len) {
  char s[HETCCL_NET_ADDR_STRLEN];
  int slot = bs->rank == 0 ? peer : 0;
  snprintf(buf, len, "bootstrap rank %d: connection to rank %d (%s)", bs->rank, peer,
           hetccl_net_addr_str(&bs->addrs[slot], s, sizeof(s)));
}

static int peer_fd(const hetccl_bootstrap_t *bs, int peer) {
  return bs->fds[bs->rank == 0 ? peer : 0];
}

static ncclResult_t frame_send(hetccl_bootstrap_t *bs, int peer, uint32_t kind, const void *buf,
                               size_t bytes, int64_t deadline) {
  char what[160];
  peer_what(bs, peer, what, sizeof(what));
  frame_t f = {.magic = FRAME_MAGIC, .comm_id = bs->comm_id, .rank = bs->rank, .kind = kind,
               .seq = bs->seq, .bytes = bytes};
  int fd = peer_fd(bs, peer);
  HETCCL_CHECK(hetccl_net_send_all(fd, &f, sizeof(f), deadline, bs->abort_flag, what));
  if (bytes) HETCCL_CHECK(hetccl_net_send_all(fd, buf, bytes, deadline, bs->abort_flag, what));
  return ncclSuccess;
}

static ncclResult_t frame_recv(hetccl_bootstrap_t *bs, int peer, uint32_t kind, void *buf,
                               size_t bytes, int64_t deadline) {
  char what[160];
  peer_what(bs, peer, what, sizeof(what));
  frame_t f;
  int fd = peer_fd(bs, peer);
  HETCCL_CHECK(hetccl_net_recv_all(fd, &f, sizeof(f), deadline, bs->abort_flag, what));
  if (f.magic != FRAME_MAGIC || f.comm_id != bs->comm_id || f.rank != peer || f.kind != kind ||
      f.seq != bs->seq || f.bytes != bytes) {
    WARN("%s: frame does not fit: magic 0x%" PRIx64 " comm 0x%" PRIx64 " rank %d kind %u seq %"
         PRIu64 " bytes %" PRIu64 "; expected comm 0x%" PRIx64 " rank %d kind %u seq %" PRIu64
         " bytes %zu (ranks out of step, or a foreign peer)",
         what, f.magic, f.comm_id, f.rank, f.kind, f.seq, f.bytes, bs->comm_id, peer, kind,
         bs->seq, bytes);
    return ncclSystemError;
  }
  if (bytes) HETCCL_CHECK(hetccl_net_recv_all(fd, buf, bytes, deadline, bs->abort_flag, what));
  return ncclSuccess;
}

/* ---- init ---------------------------------------------------------------- */

/* The root refused this rank: read its reason and make it the error. */
static ncclResult_t root_rejected(int fd, const char *what, int64_t deadline,
                                  volatile int *abort_flag) {
  reject_t rj;
  char reason[REJECT_MAX_REASON + 1];
  rj.magic = REJECT_MAGIC;
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

/* Join at the root: send hello + info, receive the table (or the reason
 * why not: the root waits up to deadline, and we a grace longer). */
static ncclResult_t root_exchange(hetccl_bootstrap_t *bs, const hetccl_sockaddr_t *root,
                                  const void *info, size_t info_bytes, void *all_infos,
                                  hetccl_sockaddr_t *rank0, int64_t deadline) {
  ncclResult_t res = ncclSuccess, sent;
  char s[HETCCL_NET_ADDR_STRLEN], what[160];
  snprintf(what, sizeof(what), "bootstrap rank %d: root %s", bs->rank,
           hetccl_net_addr_str(root, s, sizeof(s)));
  int fd = -1;
  HETCCL_CHECK(hetccl_net_connect(root, deadline, bs->abort_flag, what, &fd));
  int64_t left = deadline - hetccl_net_now_ms();
  hello_t h = {.magic = HELLO_MAGIC, .secret = bs->secret, .rank = bs->rank,
               .nranks = bs->nranks, .info_bytes = info_bytes,
               .timeout_ms = (uint32_t)bs->timeout_ms, .left_ms = left > 0 ? (uint32_t)left : 0};
  hetccl_net_addr_to_wire(&bs->laddr, &h.listen);
  sent = hetccl_net_send_all(fd, &h, sizeof(h), deadline, bs->abort_flag, what);
  if (sent == ncclSuccess && info_bytes)
    sent = hetccl_net_send_all(fd, info, info_bytes, deadline, bs->abort_flag, what);
  /* A root that refused us closes at once, maybe while we still send: its
   * reason is read anyway, and is the error that counts. */
  if (sent != ncclSuccess && sent != ncclRemoteError) {
    res = sent;
    goto out;
  }
  int64_t reply_deadline = deadline + reply_grace_ms(bs->timeout_ms);
  table_t t;
  HETCCL_CHECK_GOTO(hetccl_net_recv_all(fd, &t.magic, sizeof(t.magic), reply_deadline,
                                        bs->abort_flag, what), res, out);
  if (t.magic == REJECT_MAGIC) {
    res = root_rejected(fd, what, reply_deadline, bs->abort_flag);
    goto out;
  }
  if (sent != ncclSuccess) {
    res = sent;
    goto out;
  }
  if (t.magic == TABLE_MAGIC)
    HETCCL_CHECK_GOTO(hetccl_net_recv_all(fd, (char *)&t + sizeof(t.magic),
                                          sizeof(t) - sizeof(t.magic), reply_deadline,
                                          bs->abort_flag, what), res, out);
  if (t.magic != TABLE_MAGIC || t.secret != bs->secret || t.nranks != bs->nranks ||
      t.info_bytes != info_bytes ||
      (bs->nranks > 1 && hetccl_net_addr_from_wire(&t.rank0, rank0) != ncclSuccess)) {
    WARN("%s: the root's reply does not fit (magic 0x%" PRIx64 ", nranks %d, info_bytes %" PRIu64
         "; expected nranks %d, info_bytes %zu)", what, t.magic,
         t.magic == TABLE_MAGIC ? t.nranks : -1, t.magic == TABLE_MAGIC ? t.info_bytes : 0,
         bs->nranks, info_bytes);
    res = ncclSystemError;
    goto out;
  }
  if (bs->nranks > 1) HETCCL_CHECK_GOTO(hetccl_net_addr_localize(rank0, NULL), res, out);
  if (info_bytes)
    HETCCL_CHECK_GOTO(hetccl_net_recv_all(fd, all_infos, info_bytes * bs->nranks, reply_deadline,
                                          bs->abort_flag, what), res, out);
out:
  hetccl_net_close(&fd);
  return res;
}

static long link_on_header(void *ctx, const void *hdr, const hetccl_sockaddr_t *peer,
                           hetccl_net_reply_t *reply) {
  hetccl_bootstrap_t *bs = ctx;
  link_t l;
  char s[HETCCL_NET_ADDR_STRLEN];
  memcpy(&l, hdr, sizeof(l));
  const char *why = NULL;
  /* No word back: the root admitted every real rank already, so whoever is
   * refused here is not one (a real rank would learn at its first frame). */
  (void)reply;
  if (l.magic != LINK_MAGIC) why = "not a hetccl bootstrap link";
  else if (l.secret != bs->secret || l.comm_id != bs->comm_id) why = "wrong secret";
  else if (l.nranks != bs->nranks || l.rank <= 0 || l.rank >= bs->nranks) why = "bad rank";
  else if (bs->fds[l.rank] >= 0) why = "duplicate rank";
  if (why) {
    INFO(HETCCL_BOOTSTRAP, "bootstrap rank 0: dropping connection from %s: %s",
         hetccl_net_addr_str(peer, s, sizeof(s)), why);
    return -1;
  }
  return 0;
}

static int link_on_frame(void *ctx, int fd, const void *hdr, const void *payload,
                         const hetccl_sockaddr_t *peer, hetccl_net_reply_t *reply) {
  hetccl_bootstrap_t *bs = ctx;
  link_t l;
  (void)payload;
  (void)reply; /* never refused here: link_on_header judged it */
  memcpy(&l, hdr, sizeof(l));
  if (bs->fds[l.rank] >= 0) return 0;
  bs->fds[l.rank] = fd;
  bs->addrs[l.rank] = *peer;
  bs->links_accepted++;
  return 1;
}

static int link_done(void *ctx) {
  hetccl_bootstrap_t *bs = ctx;
  return bs->links_accepted == bs->nranks - 1;
}

static ncclResult_t star_link(hetccl_bootstrap_t *bs, const hetccl_sockaddr_t *rank0,
                              int64_t deadline) {
  char s[HETCCL_NET_ADDR_STRLEN], what[160];
  if (bs->rank == 0) {
    hetccl_net_hello_ops_t ops = {.hdr_bytes = sizeof(link_t), .max_payload = 0,
                                  .on_header = link_on_header, .on_frame = link_on_frame,
                                  .done = link_done};
    snprintf(what, sizeof(what), "bootstrap rank 0 (%s): waiting for %d ranks to link",
             hetccl_net_addr_str(&bs->laddr, s, sizeof(s)), bs->nranks - 1);
    return hetccl_net_accept_hellos(bs->lfd, &ops, bs, deadline, bs->abort_flag, what);
  }
  snprintf(what, sizeof(what), "bootstrap rank %d: connection to rank 0 (%s)", bs->rank,
           hetccl_net_addr_str(rank0, s, sizeof(s)));
  bs->addrs[0] = *rank0;
  HETCCL_CHECK(hetccl_net_connect(rank0, deadline, bs->abort_flag, what, &bs->fds[0]));
  link_t l = {.magic = LINK_MAGIC, .secret = bs->secret, .comm_id = bs->comm_id,
              .rank = bs->rank, .nranks = bs->nranks};
  return hetccl_net_send_all(bs->fds[0], &l, sizeof(l), deadline, bs->abort_flag, what);
}

ncclResult_t hetccl_bootstrap_init(const ncclUniqueId *id, int rank, int nranks,
                                   const void *info, size_t info_bytes, void *all_infos,
                                   const hetccl_bootstrap_opts_t *opts,
                                   hetccl_bootstrap_t **out) {
  ncclResult_t res;
  HETCCL_CHECK(hetccl_bootstrap_id_check(id));
  if (nranks < 1 || nranks > BS_MAX_RANKS || rank < 0 || rank >= nranks ||
      info_bytes > BS_MAX_INFO || (info_bytes && (info == NULL || all_infos == NULL))) {
    WARN("bootstrap: bad arguments (rank %d, nranks %d, info_bytes %zu)", rank, nranks,
         info_bytes);
    return ncclInvalidArgument;
  }
  id_layout_t l;
  id_read(id, &l);
  hetccl_sockaddr_t root, rank0;
  HETCCL_CHECK(hetccl_net_addr_from_wire(&l.root, &root));
  HETCCL_CHECK(hetccl_net_addr_localize(&root, NULL));

  hetccl_bootstrap_t *bs = calloc(1, sizeof(*bs));
  if (bs == NULL) {
    WARN("bootstrap: out of memory");
    return ncclSystemError;
  }
  bs->rank = rank;
  bs->nranks = nranks;
  bs->secret = l.secret;
  bs->comm_id = hetccl_bootstrap_id_comm_id(id);
  bs->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : connect_timeout_ms();
  bs->abort_flag = opts ? opts->abort_flag : NULL;
  bs->lfd = -1;
  bs->spare_fd = -1;
  int nslots = rank == 0 ? nranks : 1;
  bs->fds = malloc(nslots * sizeof(int));
  bs->addrs = calloc(nslots, sizeof(hetccl_sockaddr_t));
  if (bs->fds == NULL || bs->addrs == NULL) {
    WARN("bootstrap: out of memory for %d connections", nslots);
    res = ncclSystemError;
    goto fail;
  }
  for (int i = 0; i < nslots; i++) bs->fds[i] = -1;
  int64_t deadline = hetccl_net_deadline(bs->timeout_ms);

  if ((l.flags & ID_FLAG_RANK0_ROOT) && rank == 0) {
    hetccl_sockaddr_t where = root;
    res = root_start(&where, bs->secret, bs->timeout_ms, 1);
    if (res != ncclSuccess) {
      char s[HETCCL_NET_ADDR_STRLEN];
      WARN("bootstrap rank 0: cannot serve the root at %s (NCCL_COMM_ID): %s (another rank 0 "
           "of this id, or another program, holds the port)",
           hetccl_net_addr_str(&root, s, sizeof(s)), hetccl_last_error());
      goto fail;
    }
  }
  /* Every rank checks its interface now, also where it needs no port yet:
   * a bad NCCL_SOCKET_IFNAME fails here with its own message on each rank,
   * not later as a root that never completes. */
  hetccl_sockaddr_t mine;
  HETCCL_CHECK_GOTO(hetccl_net_local_addr(NULL, &mine, NULL, 0), res, fail);
  if (rank == 0 && nranks > 1) { /* the star's centre; the others need no port */
    bs->laddr = mine;
    HETCCL_CHECK_GOTO(hetccl_net_listen(&bs->laddr, 0, &bs->lfd), res, fail);
  }
  hetccl_net_wire_addr_t spare;
  if (nranks > 1) {
    HETCCL_CHECK_GOTO(hetccl_net_bind(&mine, &bs->spare_fd), res, fail);
    hetccl_net_addr_to_wire(&mine, &spare);
    if ((bs->spares = calloc(nranks, sizeof(*bs->spares))) == NULL) {
      WARN("bootstrap: out of memory for %d spare addresses", nranks);
      res = ncclSystemError;
      goto fail;
    }
  }
  HETCCL_CHECK_GOTO(root_exchange(bs, &root, info, info_bytes, all_infos, &rank0, deadline), res,
                    fail);
  /* The table came at most at the deadline; linking gets the same grace. */
  deadline += reply_grace_ms(bs->timeout_ms);
  if (nranks > 1) HETCCL_CHECK_GOTO(star_link(bs, &rank0, deadline), res, fail);
  hetccl_net_close(&bs->lfd); /* every rank linked: nobody else may come in */
  if (nranks > 1)
    HETCCL_CHECK_GOTO(hetccl_bootstrap_allgather(bs, &spare, bs->spares, sizeof(spare)), res, fail);
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d/%d: joined communicator 0x%016" PRIx64, rank, nranks,
       bs->comm_id);
  *out = bs;
  return ncclSuccess;
fail:
  hetccl_bootstrap_destroy(bs);
  return res;
}

/* ---- collectives --------------------------------------------------------- */

ncclResult_t hetccl_bootstrap_allgather(hetccl_bootstrap_t *bs, const void *mine, void *all,
                                        size_t bytes) {
  char *a = all;
  bs->seq++;
  int64_t deadline = hetccl_net_deadline(bs->timeout_ms);
  if (bytes && a + (size_t)bs->rank * bytes != (const char *)mine)
    memmove(a + (size_t)bs->rank * bytes, mine, bytes);
  if (bs->nranks == 1) return ncclSuccess;
  if (bs->rank != 0) {
    HETCCL_CHECK(frame_send(bs, 0, KIND_GATHER_UP, a + (size_t)bs->rank * bytes, bytes, deadline));
    return frame_recv(bs, 0, KIND_GATHER_DOWN, a, bytes * bs->nranks, deadline);
  }
  for (int r = 1; r < bs->nranks; r++)
    HETCCL_CHECK(frame_recv(bs, r, KIND_GATHER_UP, a + (size_t)r * bytes, bytes, deadline));
  for (int r = 1; r < bs->nranks; r++)
    HETCCL_CHECK(frame_send(bs, r, KIND_GATHER_DOWN, a, bytes * bs->nranks, deadline));
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
  if (bs->rank == 0) {
    if (root != 0) HETCCL_CHECK(frame_recv(bs, root, KIND_BCAST_UP, buf, bytes, deadline));
    for (int r = 1; r < bs->nranks; r++)
      if (r != root) HETCCL_CHECK(frame_send(bs, r, KIND_BCAST_DOWN, buf, bytes, deadline));
    return ncclSuccess;
  }
  if (bs->rank == root) return frame_send(bs, 0, KIND_BCAST_UP, buf, bytes, deadline);
  return frame_recv(bs, 0, KIND_BCAST_DOWN, buf, bytes, deadline);
}

ncclResult_t hetccl_bootstrap_recovery_id(hetccl_bootstrap_t *bs, const uint8_t *excluded,
                                          ncclUniqueId *id) {
  int leader = -1, members = 0;
  uint64_t h = mix64(bs->secret ^ mix64(++bs->recoveries));
  for (int r = 0; r < bs->nranks; r++) {
    if (excluded[r]) continue;
    if (leader < 0) leader = r;
    members++;
    h = mix64(h ^ (uint64_t)r);
  }
  if (excluded[bs->rank]) {
    WARN("bootstrap rank %d: a recovery id needs this rank among the members", bs->rank);
    return ncclInvalidArgument;
  }
  if (members == 1) return hetccl_bootstrap_root_create(id); /* nobody to meet */
  /* The leader is rank 0 of the new communicator: it serves the root. */
  id_write(id, h, ID_FLAG_RANK0_ROOT, &bs->spares[leader]);
  INFO(HETCCL_BOOTSTRAP, "bootstrap rank %d: recovery %" PRIu64 " meets at rank %d's spare port",
       bs->rank, bs->recoveries, leader);
  return ncclSuccess;
}

ncclResult_t hetccl_bootstrap_barrier(hetccl_bootstrap_t *bs) {
  return hetccl_bootstrap_allgather(bs, NULL, NULL, 0);
}

void hetccl_bootstrap_destroy(hetccl_bootstrap_t *bs) {
  if (bs == NULL) return;
  if (bs->fds) {
    int nslots = bs->rank == 0 ? bs->nranks : 1;
    for (int i = 0; i < nslots; i++) hetccl_net_close(&bs->fds[i]);
  }
  hetccl_net_close(&bs->lfd);
  hetccl_net_close(&bs->spare_fd);
  free(bs->spares);
  free(bs->fds);
  free(bs->addrs);
  free(bs);
}
