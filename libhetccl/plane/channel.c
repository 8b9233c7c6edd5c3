/* Channels: the shared segments of the data plane (plane_impl.h).
 *
 * The sender of a channel creates its segment under a name made of the
 * communicator id, both ranks and its own pid; the receiver opens it by the
 * same name once the caller's barrier has passed, and the creator unlinks
 * it after a second barrier, so nothing is left in /dev/shm even when a
 * process is killed later. A GPU rank registers each segment it maps with
 * its runtime (pinned and mapped: the copy engines and kernels reach the
 * slots, the stream operations reach the counters).
 *
 * Ranks of one process (ncclCommInitAll) share a segment's mapping and
 * its registration: the process maps each segment once (a list of mapped
 * segments, counted), so the runtime never sees the same pages registered
 * at two addresses.
 *
 * A channel of captured programs (capture.c) is a second segment, "-g" at
 * the end of its name, made when a capture first uses it, by whichever of
 * its two ranks comes first (the header last; its mailboxes start free);
 * the other waits until it is whole (bounded by the plane's timeout and
 * the peers' liveness), maps it and unlinks the name. Neither waits for
 * the other to arrive, so one thread may capture for several ranks.
 *
 * Thread: set-up and teardown (plane.c); the API thread for the channels
 * of captured programs. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plane/plane_impl.h"
#include "util/check.h"
#include "util/log.h"

#define PLANE_MAGIC 0x48455450414e4533ull /* "HETPANE3": a counter pair per slot, wide pieces */

/* --- this process's mappings ---------------------------------------------- */

typedef struct mapping {
  struct mapping *next;
  char name[96];
  void *base, *dev;
  size_t bytes;
  int refs, registered;
} mapping_t;

static mapping_t *mappings;
static pthread_mutex_t mappings_lock = PTHREAD_MUTEX_INITIALIZER;

static mapping_t *mapping_find(void *base) {
  for (mapping_t *m = mappings; m; m = m->next)
    if (m->base == base) return m;
  return NULL;
}

/* Another rank of this process mapped `name` already: share it. */
static int mapping_share(const char *name, plane_chan_t *c) {
  pthread_mutex_lock(&mappings_lock);
  mapping_t *m = mappings;
  while (m && strcmp(m->name, name)) m = m->next;
  if (m) {
    m->refs++;
    c->hdr = m->base;
    c->bytes = m->bytes;
    c->slots_host = (char *)m->base + PLANE_HDR_BYTES;
  }
  pthread_mutex_unlock(&mappings_lock);
  return m != NULL;
}

static void mapping_add(const char *name, plane_chan_t *c) {
  mapping_t *m = calloc(1, sizeof(*m));
  if (!m) return; /* not shared then: a second rank here maps its own */
  snprintf(m->name, sizeof(m->name), "%s", name);
  m->base = c->hdr;
  m->bytes = c->bytes;
  m->refs = 1;
  pthread_mutex_lock(&mappings_lock);
  m->next = mappings;
  mappings = m;
  pthread_mutex_unlock(&mappings_lock);
}

static void chan_name(const hetccl_plane_t *p, int src, int dst, int graph, char *out,
                      size_t len) {
  snprintf(out, len, "/hetccl-plane-%016" PRIx64 "-%d-%d-%d%s", p->a.comm_id, src, dst,
           (int)p->a.pids[src], graph ? "-g" : "");
}

static ncclResult_t chan_map(hetccl_plane_t *p, int fd, const char *name, plane_chan_t *c) {
  void *m = mmap(NULL, p->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    WARN("plane: mmap %zu bytes of %s: %s", p->seg_bytes, name, strerror(errno));
    return ncclSystemError;
  }
  c->hdr = m;
  c->bytes = p->seg_bytes;
  c->slots_host = (char *)m + PLANE_HDR_BYTES;
  return ncclSuccess;
}

/* Make channel src -> dst's segment; with graph, where it exists already
 * (the other rank made it), *exists and nothing else. */
static ncclResult_t chan_make(hetccl_plane_t *p, int src, int dst, int graph, plane_chan_t *c,
                              int *exists) {
  chan_name(p, src, dst, graph, c->name, sizeof(c->name));
  int fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && graph && errno == EEXIST) {
    c->name[0] = '\0';
    *exists = 1;
    return ncclSuccess;
  }
  if (fd < 0) {
    WARN("plane: shm_open %s: %s", c->name, strerror(errno));
    c->name[0] = '\0';
    return ncclSystemError;
  }
  ncclResult_t res = ncclSuccess;
  /* Reserve the pages now: a /dev/shm that cannot hold the slots fails
   * here, with a message, not later with SIGBUS inside a copy. */
  int err = posix_fallocate(fd, 0, (off_t)p->seg_bytes);
  if (err) {
    WARN("plane: cannot reserve %zu bytes for %s in /dev/shm: %s", p->seg_bytes, c->name,
         strerror(err));
    res = ncclSystemError;
  }
  if (res == ncclSuccess) res = chan_map(p, fd, c->name, c);
  close(fd);
  if (res != ncclSuccess) return res;
  mapping_add(c->name, c);
  plane_chan_hdr_t *h = c->hdr;
  h->comm_id = p->a.comm_id;
  h->src = src;
  h->dst = dst;
  h->slots = p->a.slots;
  h->piece = p->a.piece;
  h->wide_min = p->wide_min;
  for (int s = 0; graph && s < p->a.slots; s++) h->consumed[s] = 1; /* mailboxes: every slot free */
  __atomic_store_n(&h->magic, PLANE_MAGIC, __ATOMIC_RELEASE);
  return ncclSuccess;
}

ncclResult_t plane_chan_create(hetccl_plane_t *p, int dst, plane_chan_t *c) {
  return chan_make(p, p->a.rank, dst, 0, c, NULL);
}

/* A captured programs' channel: its segment, once the rank that made it
 * has made it whole (size reserved, header written). */
static ncclResult_t graph_chan_wait(hetccl_plane_t *p, int peer, const char *name, int *fd) {
  int64_t start = plane_now_ns(), last_check = 0;
  struct timespec nap = {0, 100000};
  for (;;) {
    *fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    struct stat st;
    if (*fd >= 0 && fstat(*fd, &st) == 0 && (size_t)st.st_size >= p->seg_bytes) {
      const plane_chan_hdr_t *h = mmap(NULL, sizeof(*h), PROT_READ, MAP_SHARED, *fd, 0);
      int whole = h != MAP_FAILED && __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == PLANE_MAGIC;
      if (h != MAP_FAILED) munmap((void *)h, sizeof(*h));
      if (whole) return ncclSuccess;
    }
    if (*fd >= 0) close(*fd);
    *fd = -1;
    ncclResult_t res = plane_peers_check(p, &last_check, NULL);
    if (res != ncclSuccess) return res;
    if (plane_now_ns() - start > (int64_t)p->a.timeout_ms * 1000000LL) {
      WARN("plane: rank %d waited %d s for the channel %s of captured programs that rank %d "
           "began (HETCCL_TIMEOUT)", plane_user_rank(p, p->a.rank), p->a.timeout_ms / 1000,
           name, plane_user_rank(p, peer));
      return ncclTimeout;
    }
    nanosleep(&nap, NULL);
  }
}

/* Open channel src -> dst's segment (graph: once whole, then unlink its
 * name). */
static ncclResult_t chan_open(hetccl_plane_t *p, int src, int dst, int graph, plane_chan_t *c) {
  char name[96];
  chan_name(p, src, dst, graph, name, sizeof(name));
  int fd = -1;
  if (graph) HETCCL_CHECK(graph_chan_wait(p, src == p->a.rank ? dst : src, name, &fd));
  else fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    WARN("plane: rank %d cannot open rank %d's channel %s: %s", plane_user_rank(p, p->a.rank),
         plane_user_rank(p, src), name, strerror(errno));
    return ncclSystemError;
  }
  ncclResult_t res = mapping_share(name, c) ? ncclSuccess : chan_map(p, fd, name, c);
  close(fd);
  if (graph) shm_unlink(name); /* mapped by both sides now */
  if (res != ncclSuccess) return res;
  if (!mapping_find(c->hdr)) mapping_add(name, c);
  const plane_chan_hdr_t *h = c->hdr;
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != PLANE_MAGIC || h->comm_id != p->a.comm_id ||
      h->src != src || h->dst != dst || h->slots != p->a.slots ||
      h->piece != p->a.piece || h->wide_min != p->wide_min) {
    WARN("plane: channel %s from rank %d does not fit (slots %d x %" PRIu64 " bytes, wide "
         "from %" PRIu64 "; here %d x %zu, wide from %zu): ranks disagree on "
         "HETCCL_PLANE_SLOTS, HETCCL_PLANE_PIECE or HETCCL_PLANE_WIDE_MIN",
         name, plane_user_rank(p, src), (int)h->slots, h->piece, h->wide_min, p->a.slots,
         p->a.piece, p->wide_min);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

ncclResult_t plane_chan_open(hetccl_plane_t *p, int src, plane_chan_t *c) {
  return chan_open(p, src, p->a.rank, 0, c);
}

ncclResult_t plane_chan_graph(hetccl_plane_t *p, int src, int dst, plane_chan_t *c) {
  int exists = 0;
  HETCCL_CHECK(chan_make(p, src, dst, 1, c, &exists));
  return exists ? chan_open(p, src, dst, 1, c) : ncclSuccess;
}

ncclResult_t plane_chan_register(hetccl_plane_t *p, plane_chan_t *c) {
  pthread_mutex_lock(&mappings_lock);
  mapping_t *m = mapping_find(c->hdr);
  ncclResult_t res = ncclSuccess;
  if (m && m->registered) {
    c->dev = m->dev;
  } else {
    void *dev = NULL;
    res = p->a.rt->host_register(c->hdr, c->bytes, &dev);
    if (res == ncclSuccess) c->dev = dev;
    if (res == ncclSuccess && m) m->dev = dev, m->registered = 1;
  }
  pthread_mutex_unlock(&mappings_lock);
  return res;
}

void plane_chan_close(hetccl_plane_t *p, plane_chan_t *c) {
  plane_bridge_close(p, c); /* a bridged channel's memory is its own: no mapping shares it */
  if (c->hdr) {
    pthread_mutex_lock(&mappings_lock);
    mapping_t **pm = &mappings;
    while (*pm && (*pm)->base != c->hdr) pm = &(*pm)->next;
    mapping_t *m = *pm;
    int last = !m || --m->refs == 0;
    if (m && last) *pm = m->next;
    pthread_mutex_unlock(&mappings_lock);
    if (last) {
      if (c->dev && p->a.rt) (void)p->a.rt->host_unregister(c->hdr);
      munmap(c->hdr, c->bytes);
    }
    free(last ? m : NULL);
  }
  c->dev = NULL;
  c->hdr = NULL;
  if (c->name[0]) shm_unlink(c->name);
  c->name[0] = '\0';
}
