/* Shared-memory transport for ranks on one host: segments, connection
 * set-up, liveness, and the table. The data path is in shm_ring.c; the
 * segment layout in shm.h.
 *
 * Threads: ctx_create/connect/ctx_destroy run on the thread that creates
 * the communicator; the endpoint slots on the one thread that drives it
 * (transport.h). No locks. Only connect waits on peers, bounded by
 * timeout_ms and the abort flag.
 *
 * Life of a segment. ctx_create makes one POSIX shm object per rank, sized
 * for a receive ring from every other rank but backed only where touched:
 * ftruncate leaves it sparse, and connect reserves (fallocate) only the
 * rings of peers it will talk to, so a full /dev/shm is an error at connect
 * and not a SIGBUS in the middle of a copy. connect maps, per peer, our
 * ring for it and its ring for us (each endpoint holds its own two
 * mappings, so the context can go right after connect). Every producer
 * marks `attached` in the ring it mapped; when all our producers have, no
 * one will open our name again and we unlink it, still inside connect. From
 * then on nothing is left in /dev/shm whatever happens to the processes; a
 * crash between ctx_create and the end of connect may leave a segment. Its
 * name says comm id, rank, pid and pid namespace, so that the next
 * ctx_create on the host removes the segments whose creator, in our pid
 * namespace, no longer runs (seg_sweep_stale).
 *
 * Connections on first use (transport.h; the default). ep_open does what
 * connect does for one peer (reserve and map our ring for it, map its ring
 * for us, mark it attached, probe CMA) and never waits: ep_ready says the
 * pair is ready once the peer did the same on its side. The segment keeps
 * its name until the context is destroyed (a peer may come at any time),
 * and its descriptor stays open to reserve rings. A rank that fails
 * (ctx_fail) writes its note into the control page of every ring of its
 * segment, so that a peer that maps one later, never connected before,
 * reads why.
 *
 * Single copy (CMA). In connect every receiver tries process_vm_readv on a
 * known word of each sender (the probe); the outcome, ANDed with its
 * HETCCL_SHM_CMA (unset: cma_default), goes into the ring's cma_ok, and a
 * sender with single copy on then sends messages above HETCCL_SHM_CMA_MIN
 * whose receiver copies as a rendezvous. A kernel that forbids it (Yama
 * ptrace_scope, seccomp, no capability across users) costs one INFO line
 * and the ring path.
 *
 * Liveness. A peer can die without a word; when an endpoint with pending
 * work has been idle for SHM_LIVENESS_NS, progress asks the kernel whether
 * the peer still runs (kill(pid, 0), then /proc/pid/stat for a zombie or a
 * reused pid) and whether it closed its end. A peer in another pid
 * namespace (its pid means nothing here) is not watched: its death shows as
 * the engine's timeout.
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

#define SHM_ADDR_MAGIC 0x53484d4144445231ull /* "SHMADDR1" */

typedef struct addr_blob {
  uint64_t magic;
  char name[SHM_NAME_MAX];
} addr_blob_t;
_Static_assert(sizeof(addr_blob_t) <= HETCCL_TRANSPORT_ADDR_BYTES, "address blob");

/* The word a receiver reads across processes to learn whether CMA works. */
static const volatile uint64_t shm_cma_probe = SHM_CMA_PROBE;

struct hetccl_tctx {
  hetccl_transport_args_t args;
  int rank_user; /* args.rank as the user numbers it, for messages */
  int fd;           /* our segment, -1 once closed */
  int unlinked;
  char name[SHM_NAME_MAX];
  uint32_t slots;
  size_t chunk, stride, ring_bytes, hdr_bytes, seg_bytes;
  int cma_knob;     /* HETCCL_SHM_CMA resolved (shm_connect) */
  size_t cma_min;   /* HETCCL_SHM_CMA_MIN */
  int cma_stream;   /* HETCCL_SHM_CMA_STREAM */
  int help_on;      /* HETCCL_SHM_HELPER resolved (shm_helper.h) */
};

int64_t hetccl_shm_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Ring index of sender `src` in the segment of `owner`. */
static size_t ring_index(int owner, int src) { return (size_t)(src < owner ? src : src - 1); }

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* --- liveness ------------------------------------------------------------- */

/* Pids compare only within one pid namespace (containers may share IPC and
 * /dev/shm but not pids). */
static uint64_t pidns_self(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

ncclResult_t hetccl_shm_ep_check_peer(hetccl_ep_t *ep) {
  /* Read each close flag once: a peer that fails while we look must not
   * be seen as failed by one test and as merely closed by the next. */
  uint32_t peer_rx = atomic_load_explicit(&ep->tx.ctrl->rx_closed, memory_order_acquire);
  uint32_t peer_tx = atomic_load_explicit(&ep->rx.ctrl->tx_closed, memory_order_acquire);
  /* A peer that failed says why before it exits: read that first. */
  const hetccl_fail_note_t *why = peer_rx == SHM_FAILED ? &ep->tx.ctrl->rx_note
                                  : peer_tx == SHM_FAILED ? &ep->rx.ctrl->tx_note
                                                          : NULL;
  if (why && (ep->sq.first || ep->rq.first))
    return hetccl_fail_note_received(why, "shm", ep->peer, &ep->args);
  if (ep->peer_watch && !hetccl_proc_alive(ep->peer_pid, ep->peer_start)) {
    WARN("shm: peer rank %d (pid %d) exited", ep->peer_user, ep->peer_pid);
    return ncclRemoteError;
  }
  /* Idle with work pending: our sends wait for a consumer, our receives for
   * a producer. If that side closed, they wait forever. */
  if (ep->sq.first && peer_rx) {
    WARN("shm: peer rank %d (pid %d) closed its connection while a send of %zu bytes was "
         "pending", ep->peer_user, ep->peer_pid, ep->sq.first->bytes);
    return ncclRemoteError;
  }
  if (ep->rq.first && peer_tx &&
      atomic_load_explicit(&ep->rx.ctrl->tail, memory_order_acquire) == ep->rx_head) {
    WARN("shm: peer rank %d (pid %d) closed its connection while a receive of %zu bytes was "
         "pending", ep->peer_user, ep->peer_pid, ep->rq.first->bytes);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

/* --- context -------------------------------------------------------------- */

static int shm_can_connect(const hetccl_peer_locality_t *me, const hetccl_peer_locality_t *peer) {
  return me->host_hash == peer->host_hash;
}

/* Remove the segments that crashed runs left behind: those made in our pid
 * namespace by a process that is gone. Best effort, silent but for INFO. */
static void seg_sweep_stale(uint64_t pidns) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    unsigned long long id, ns;
    int rank, pid, n = 0;
    if (sscanf(e->d_name, "hetccl-%16llx-r%d-p%d-n%llx-%*u%n", &id, &rank, &pid, &ns, &n) != 4 ||
        n == 0 || e->d_name[n] != '\0' || ns != pidns || pid <= 0 || hetccl_proc_alive(pid, 0))
      continue;
    char name[sizeof(e->d_name) + 1];
    snprintf(name, sizeof(name), "/%s", e->d_name);
    if (shm_unlink(name) == 0)
      INFO(HETCCL_SHM | HETCCL_INIT, "shm: removed %s, left by pid %d which no longer runs", name,
           pid);
  }
  closedir(d);
}

/* Reserve [off, off+len) of the segment so that later stores cannot SIGBUS.
 * Filesystems without fallocate keep the lazy behaviour. */
static ncclResult_t seg_reserve(int fd, const char *name, size_t off, size_t len) {
  int rc;
  do rc = fallocate(fd, 0, (off_t)off, (off_t)len); while (rc == -1 && errno == EINTR);
  if (rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS) return ncclSuccess;
  WARN("shm: cannot reserve %zu bytes of %s in /dev/shm (is it full? see df /dev/shm): %s", len,
       name, strerror(errno));
  return ncclSystemError;
}

/* Single copy (CMA) when HETCCL_SHM_CMA is unset (docs/host-engine.md).
 *
 * With more ranks than CPUs, the copies are what the ranks wait on, and
 * one copy beats two. Otherwise it is a matter of what bounds a copy. On a
 * host of many cores one core's copy is a small share of what the memory
 * moves, so the CPU is the bound and one copy per byte (the receiver's)
 * beats the ring's two (16-core machine, MPICH 5.0.2 beside it: sendrecv of
 * 16 MiB at n = 2 went from 0.36-0.55 x MPICH through the ring to
 * 1.11-1.36 x by process_vm_readv, allgather from 0.65-0.96 to 1.03-1.19).
 * On a host of few cores (the 2-core development VM) two cores' copies
 * already fill the memory, and the ring moves bytes in two passes over
 * memory (the slot stays in cache, the receiver stores past the cache)
 * where the kernel's copy makes three (it reads each destination line for
 * ownership): the ring ran 10-30 % ahead there. Hence SHM_CMA_MIN_CPUS.
 * The host's copy profile (shm_host.c, measured once per boot) keeps the
 * ring where process_vm_readv is far slower than a copy (SHM_CMA_RATIO:
 * a kernel or sandbox that makes it costly). Every rank of a host reads
 * the same CPU count and profile, so both sides of a pair agree. The
 * choice itself, with its reason in words: shm_host.c,
 * hetccl_shm_cma_choice. */
static int cma_choice(const hetccl_transport_args_t *args) {
  char why[256];
  int on = hetccl_shm_cma_choice(args->local_ranks, why, sizeof(why));
  INFO(HETCCL_SHM | HETCCL_INIT, "shm: %s", why);
  return on;
}

static void ctx_free(hetccl_tctx_t *c) {
  if (c->fd >= 0) close(c->fd);
  if (c->name[0] && !c->unlinked) shm_unlink(c->name);
  free(c);
}

static ncclResult_t shm_ctx_create(const hetccl_transport_args_t *args, hetccl_tctx_t **out,
                                   void *addr) {
  static _Atomic unsigned name_counter;
  ncclResult_t res = ncclSuccess;
  hetccl_tctx_t *c = calloc(1, sizeof(*c));
  if (!c) {
    WARN("shm: out of memory for a context");
    return ncclSystemError;
  }
  c->fd = -1;
  c->args = *args;
  c->rank_user = hetccl_user_rank(args->user_ranks, args->rank);
  c->cma_knob = cma_choice(args);
  c->cma_stream = (int)hetccl_knob_int(HETCCL_KNOB_SHM_CMA_STREAM);
  c->help_on = c->cma_knob && hetccl_shm_help_wanted(args);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  c->chunk = (size_t)hetccl_knob_int(HETCCL_KNOB_SHM_CHUNK) & ~(size_t)63;
  if (c->chunk < 64) c->chunk = 64;
  c->cma_min = hetccl_knob_is_set(HETCCL_KNOB_SHM_CMA_MIN)
                   ? (size_t)hetccl_knob_int(HETCCL_KNOB_SHM_CMA_MIN)
                   : c->chunk / 2; /* above one slot's worth, a round trip is cheap */
  c->slots = (uint32_t)hetccl_knob_int(HETCCL_KNOB_SHM_SLOTS);
  c->stride = SHM_SLOT_HDR + c->chunk;
  c->hdr_bytes = round_up(sizeof(shm_seg_hdr_t), page);
  _Static_assert(sizeof(shm_ring_ctrl_t) <= 4096, "ring control fits a page");
  c->ring_bytes = round_up(page + c->slots * c->stride, page);
  size_t nrings = args->nranks > 1 ? (size_t)args->nranks - 1 : 0;
  if (nrings && c->ring_bytes > (SIZE_MAX / 2 - c->hdr_bytes) / nrings) {
    WARN("shm: %zu rings of %zu bytes do not fit in one segment (HETCCL_SHM_SLOTS x "
         "HETCCL_SHM_CHUNK too large for %d ranks)", nrings, c->ring_bytes, args->nranks);
    free(c);
    return ncclInvalidArgument;
  }
  c->seg_bytes = c->hdr_bytes + nrings * c->ring_bytes;

  uint64_t pidns = pidns_self();
  if (pidns) seg_sweep_stale(pidns);
  for (int attempt = 0; c->fd < 0; attempt++) {
    snprintf(c->name, sizeof(c->name), "/hetccl-%016" PRIx64 "-r%d-p%d-n%" PRIx64 "-%u",
             c->args.comm_id, c->args.rank, (int)getpid(), pidns,
             atomic_fetch_add(&name_counter, 1));
    c->fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (c->fd >= 0) break;
    if (errno == EEXIST && attempt < 16) continue; /* a stale one from a reused pid */
    WARN("shm: shm_open %s: %s", c->name, strerror(errno));
    c->name[0] = '\0';
    res = ncclSystemError;
    goto fail;
  }
  char what[SHM_NAME_MAX + 32];
  snprintf(what, sizeof(what), "shm: ftruncate %s", c->name);
  HETCCL_SYSCHECK_GOTO(ftruncate(c->fd, (off_t)c->seg_bytes), what, res, fail);
  /* The pages written before the rings are reserved: header and controls. */
  HETCCL_CHECK_GOTO(seg_reserve(c->fd, c->name, 0, c->hdr_bytes), res, fail);
  for (size_t i = 0; i < nrings; i++)
    HETCCL_CHECK_GOTO(seg_reserve(c->fd, c->name, c->hdr_bytes + i * c->ring_bytes, page), res,
                      fail);
  shm_seg_hdr_t h = {.magic = SHM_SEG_MAGIC, .comm_id = c->args.comm_id, .rank = c->args.rank,
                     .nranks = c->args.nranks, .pid = (int32_t)getpid(),
                     .slots = (int32_t)c->slots,
                     .chunk = c->chunk, .ring_bytes = c->ring_bytes, .hdr_bytes = c->hdr_bytes,
                     .cma_probe_addr = (uint64_t)(uintptr_t)&shm_cma_probe,
                     .pidns = pidns};
  snprintf(what, sizeof(what), "shm: write header of %s", c->name);
  HETCCL_SYSCHECK_GOTO(pwrite(c->fd, &h, sizeof(h), 0), what, res, fail);

  addr_blob_t blob = {.magic = SHM_ADDR_MAGIC};
  memcpy(blob.name, c->name, sizeof(blob.name));
  memset(addr, 0, HETCCL_TRANSPORT_ADDR_BYTES);
  memcpy(addr, &blob, sizeof(blob));
  INFO(HETCCL_SHM | HETCCL_INIT, "shm: rank %d segment %s, %zu rings of %u x %zu bytes",
       c->rank_user, c->name, nrings, c->slots, c->chunk);
  *out = c;
  return ncclSuccess;
fail:
  ctx_free(c);
  return res;
}

static void shm_ctx_destroy(hetccl_tctx_t *c) {
  if (c) ctx_free(c);
}

/* --- endpoints -------------------------------------------------------------- */

static ncclResult_t ring_map(shm_ring_map_t *m, int fd, const char *name, size_t off,
                             size_t bytes, uint32_t nslots, size_t chunk) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
  if (p == MAP_FAILED) {
    WARN("shm: mmap %zu bytes at %zu of %s: %s", bytes, off, name, strerror(errno));
    return ncclSystemError;
  }
  size_t ctrl_bytes = (size_t)sysconf(_SC_PAGESIZE); /* the ring's first page */
  m->base = p;
  m->bytes = bytes;
  m->ctrl = p;
  m->slots = (uint8_t *)p + ctrl_bytes;
  m->nslots = nslots;
  m->chunk = chunk;
  m->stride = SHM_SLOT_HDR + chunk;
  return ncclSuccess;
}

/* Tell a peer that may still wait on us, through both rings' control
 * pages; it reads them when idle (hetccl_shm_ep_check_peer). */
static void ep_mark_closed(hetccl_ep_t *ep, const hetccl_fail_note_t *why) {
  uint32_t state = why ? SHM_FAILED : SHM_CLOSED;
  if (ep->tx.ctrl) {
    if (why) ep->tx.ctrl->tx_note = *why;
    atomic_store_explicit(&ep->tx.ctrl->tx_closed, state, memory_order_release);
  }
  if (ep->rx.ctrl) {
    if (why) ep->rx.ctrl->rx_note = *why;
    atomic_store_explicit(&ep->rx.ctrl->rx_closed, state, memory_order_release);
  }
}

static void shm_ep_fail(hetccl_ep_t *ep, const hetccl_fail_note_t *why) {
  if (!ep) return;
  ep_mark_closed(ep, why);
  if (ep->help_on) {
    hetccl_shm_help_retire(&ep->help); /* a receive the helper may still be reading */
    if (ep->help.helped)
      INFO(HETCCL_SHM, "shm: the receive helper thread read %llu bytes of rank %d's messages",
           (unsigned long long)ep->help.helped, ep->peer_user);
    hetccl_shm_help_detach();
  }
  if (ep->tx.base) munmap(ep->tx.base, ep->tx.bytes);
  if (ep->rx.base) munmap(ep->rx.base, ep->rx.bytes);
  free(ep->bounce);
  free(ep);
}

static void shm_ep_close(hetccl_ep_t *ep) { shm_ep_fail(ep, NULL); }

/* Map the peer's ring for us, check that the segment is the one the peer
 * described, and mark it attached. */
static ncclResult_t ep_map_tx(hetccl_tctx_t *c, hetccl_ep_t *ep, const uint8_t *addr,
                              const hetccl_peer_locality_t *loc, uint64_t *probe_addr) {
  addr_blob_t blob;
  memcpy(&blob, addr, sizeof(blob));
  blob.name[SHM_NAME_MAX - 1] = '\0';
  if (blob.magic != SHM_ADDR_MAGIC) {
    WARN("shm: rank %d published no shared-memory segment (address magic 0x%016" PRIx64 ")",
         ep->peer_user, blob.magic);
    return ncclInternalError;
  }
  int fd = shm_open(blob.name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    WARN("shm: cannot open rank %d's segment %s: %s (different IPC namespace, or the peer "
         "already gone?)", ep->peer_user, blob.name, strerror(err));
    return err == ENOENT ? ncclRemoteError : ncclSystemError;
  }
  ncclResult_t res = ncclSuccess;
  shm_seg_hdr_t h;
  struct stat st;
  if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || fstat(fd, &st) != 0) {
    WARN("shm: cannot read the header of rank %d's segment %s: %s", ep->peer_user, blob.name,
         strerror(errno));
    res = ncclSystemError;
    goto out;
  }
  if (h.magic != SHM_SEG_MAGIC || h.comm_id != c->args.comm_id || h.rank != ep->peer ||
      h.nranks != c->args.nranks || h.pid != loc->pid) {
    /* h.rank is in range only if the segment is of this communicator's size. */
    int says = h.nranks == c->args.nranks && h.rank >= 0 && h.rank < h.nranks
                   ? hetccl_user_rank(c->args.user_ranks, h.rank) : h.rank;
    WARN("shm: segment %s is not rank %d's for communicator 0x%016" PRIx64 " (it says rank %d "
         "of %d, pid %d, communicator 0x%016" PRIx64 "; expected pid %d)", blob.name,
         ep->peer_user, c->args.comm_id, says, h.nranks, h.pid, h.comm_id, loc->pid);
    res = ncclSystemError;
    goto out;
  }
  size_t off = h.hdr_bytes + ring_index(ep->peer, c->args.rank) * h.ring_bytes;
  if (h.slots < 2 || h.chunk < 64 || h.chunk % 64 || (size_t)st.st_size < off + h.ring_bytes ||
      h.ring_bytes < (uint64_t)h.slots * (SHM_SLOT_HDR + h.chunk) + (size_t)sysconf(_SC_PAGESIZE)) {
    WARN("shm: segment %s of rank %d has an inconsistent geometry (%d slots of %" PRIu64
         " bytes, ring %" PRIu64 ", size %lld)", blob.name, ep->peer_user, h.slots, h.chunk,
         h.ring_bytes, (long long)st.st_size);
    res = ncclSystemError;
    goto out;
  }
  HETCCL_CHECK_GOTO(ring_map(&ep->tx, fd, blob.name, off, h.ring_bytes, (uint32_t)h.slots,
                             h.chunk), res, out);
  uint64_t ns = pidns_self();
  ep->peer_watch = h.pidns == ns || h.pidns == 0 || ns == 0;
  if (!ep->peer_watch)
    INFO(HETCCL_SHM | HETCCL_INIT, "shm: rank %d (pid %d) is in another pid namespace: its exit "
         "shows only as a timeout", ep->peer_user, ep->peer_pid);
  else if (!hetccl_proc_stat(ep->peer_pid, &(char){0}, &ep->peer_start))
    ep->peer_start = 0;
  atomic_store_explicit(&ep->tx.ctrl->attached, 1, memory_order_release);
  *probe_addr = h.cma_probe_addr;
out:
  close(fd);
  return res;
}

/* Can this process read the peer's memory with process_vm_readv? */
static int cma_probe(const hetccl_ep_t *ep, uint64_t probe_addr) {
  uint64_t v = 0;
  struct iovec local = {&v, sizeof(v)};
  struct iovec remote = {(void *)(uintptr_t)probe_addr, sizeof(v)};
  ssize_t n = process_vm_readv(ep->peer_pid, &local, 1, &remote, 1, 0);
  if (n == (ssize_t)sizeof(v) && v == SHM_CMA_PROBE) return 1;
  INFO(HETCCL_SHM | HETCCL_INIT,
       "shm: process_vm_readv from rank %d (pid %d) unavailable (%s); its large messages go "
       "through the ring", ep->peer_user, ep->peer_pid,
       n < 0 ? strerror(errno) : "probe mismatch");
  return 0;
}

static ncclResult_t ep_create(hetccl_tctx_t *c, int p, const uint8_t *addr,
                              const hetccl_peer_locality_t *loc, int cma_knob,
                              hetccl_ep_t **out) {
  ncclResult_t res = ncclSuccess;
  hetccl_ep_t *ep = calloc(1, sizeof(*ep));
  if (!ep) {
    WARN("shm: out of memory for the endpoint to rank %d",
         hetccl_user_rank(c->args.user_ranks, p));
    return ncclSystemError;
  }
  ep->args = c->args;
  ep->peer = p;
  ep->peer_user = hetccl_user_rank(c->args.user_ranks, p);
  ep->peer_pid = loc->pid;
  ep->cma_min = SIZE_MAX;
  ep->cma_want = cma_knob;
  ep->cma_want_min = c->cma_min;
  ep->cma_stream = c->cma_stream;
  ep->help_on = c->help_on;
  if (ep->help_on) hetccl_shm_help_attach();

  size_t off = c->hdr_bytes + ring_index(c->args.rank, p) * c->ring_bytes;
  HETCCL_CHECK_GOTO(seg_reserve(c->fd, c->name, off, c->ring_bytes), res, fail);
  HETCCL_CHECK_GOTO(ring_map(&ep->rx, c->fd, c->name, off, c->ring_bytes, c->slots, c->chunk),
                    res, fail);
  uint64_t probe_addr = 0;
  HETCCL_CHECK_GOTO(ep_map_tx(c, ep, addr, loc, &probe_addr), res, fail);
  int cma = cma_knob && cma_probe(ep, probe_addr);
  atomic_store_explicit(&ep->rx.ctrl->cma_ok, (uint32_t)cma, memory_order_relaxed);
  atomic_store_explicit(&ep->rx.ctrl->rx_ready, 1, memory_order_release);
  *out = ep;
  return ncclSuccess;
fail:
  shm_ep_close(ep);
  return res;
}

/* Wait until every peer has mapped our ring (so we may unlink) and decided
 * about CMA in its own (so we know how to send). */
static ncclResult_t connect_wait(hetccl_tctx_t *c, const uint8_t *use, hetccl_ep_t **mine) {
  int64_t start = hetccl_shm_now_ns(), last_check = start;
  for (unsigned spin = 0;; spin++) {
    int pending = -1;
    for (int p = 0; p < c->args.nranks && pending < 0; p++) {
      if (p == c->args.rank || !use[p]) continue;
      if (!atomic_load_explicit(&mine[p]->rx.ctrl->attached, memory_order_acquire) ||
          !atomic_load_explicit(&mine[p]->tx.ctrl->rx_ready, memory_order_acquire))
        pending = p;
    }
    if (pending < 0) return ncclSuccess;
    if (c->args.abort_flag && __atomic_load_n(c->args.abort_flag, __ATOMIC_ACQUIRE)) {
      WARN("shm: connect of rank %d aborted while waiting for rank %d", c->rank_user,
           mine[pending]->peer_user);
      return ncclInternalError;
    }
    if (spin < 1000) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
    int64_t now = hetccl_shm_now_ns();
    if (now - start > (int64_t)c->args.timeout_ms * 1000000LL) {
      WARN("shm: rank %d waited %d ms for rank %d (pid %d) to map its shared-memory ring",
           c->rank_user, c->args.timeout_ms, mine[pending]->peer_user, mine[pending]->peer_pid);
      return ncclTimeout;
    }
    if (now - last_check > SHM_LIVENESS_NS) {
      last_check = now;
      hetccl_ep_t *ep = mine[pending];
      if (ep->peer_watch && !hetccl_proc_alive(ep->peer_pid, ep->peer_start)) {
        WARN("shm: peer rank %d (pid %d) exited during connect", ep->peer_user, ep->peer_pid);
        return ncclRemoteError;
      }
    }
  }
}

static ncclResult_t shm_connect(hetccl_tctx_t *c, const uint8_t *use, const uint8_t *addrs,
                                const hetccl_peer_locality_t *localities, hetccl_ep_t **eps) {
  ncclResult_t res = ncclSuccess;
  int cma_knob = c->cma_knob;
  hetccl_ep_t **mine = calloc((size_t)c->args.nranks, sizeof(*mine));
  if (!mine) {
    WARN("shm: out of memory connecting %d ranks", c->args.nranks);
    return ncclSystemError;
  }
  for (int p = 0; p < c->args.nranks; p++) {
    if (p == c->args.rank || !use[p]) continue;
    HETCCL_CHECK_GOTO(ep_create(c, p, addrs + (size_t)p * HETCCL_TRANSPORT_ADDR_BYTES,
                                &localities[p], cma_knob, &mine[p]),
                      res, fail);
  }
  HETCCL_CHECK_GOTO(connect_wait(c, use, mine), res, fail);
  /* Every producer of ours has mapped its ring: the name is no longer needed. */
  if (shm_unlink(c->name) == 0) c->unlinked = 1;
  close(c->fd);
  c->fd = -1;
  for (int p = 0; p < c->args.nranks; p++) {
    hetccl_ep_t *ep = mine[p];
    if (!ep) continue;
    if (cma_knob && atomic_load_explicit(&ep->tx.ctrl->cma_ok, memory_order_relaxed))
      ep->cma_min = c->cma_min;
    INFO(HETCCL_SHM | HETCCL_INIT, "shm: rank %d -> %d connected (%u x %zu byte slots, CMA %s)",
         c->rank_user, ep->peer_user, ep->tx.nslots, ep->tx.chunk,
         ep->cma_min == SIZE_MAX ? "off" : "on");
    eps[p] = ep;
  }
  free(mine);
  return ncclSuccess;
fail:
  for (int p = 0; p < c->args.nranks; p++) shm_ep_close(mine[p]);
  free(mine);
  return res;
}

static size_t shm_pull_min(const hetccl_ep_t *ep) { return ep->cma_min; }

/* --- connections on first use --------------------------------------------- */

static ncclResult_t shm_ep_open(hetccl_tctx_t *c, int peer, const uint8_t *addr,
                                const hetccl_peer_locality_t *loc, hetccl_ep_t **out) {
  if (c->fd < 0) {
    WARN("shm: rank %d: the segment was closed; cannot connect rank %d", c->rank_user,
         hetccl_user_rank(c->args.user_ranks, peer));
    return ncclInternalError;
  }
  return ep_create(c, peer, addr, loc, c->cma_knob, out);
}

/* The peer closed or failed before the pair was ready: say so. */
static ncclResult_t ep_gone_early(hetccl_ep_t *ep) {
  uint32_t peer_rx = atomic_load_explicit(&ep->tx.ctrl->rx_closed, memory_order_acquire);
  uint32_t peer_tx = atomic_load_explicit(&ep->rx.ctrl->tx_closed, memory_order_acquire);
  if (peer_rx == SHM_FAILED)
    return hetccl_fail_note_received(&ep->tx.ctrl->rx_note, "shm", ep->peer, &ep->args);
  if (peer_tx == SHM_FAILED)
    return hetccl_fail_note_received(&ep->rx.ctrl->tx_note, "shm", ep->peer, &ep->args);
  if (peer_rx || peer_tx) {
    WARN("shm: rank %d (pid %d) closed its end before connecting to rank %d", ep->peer_user,
         ep->peer_pid, hetccl_user_rank(ep->args.user_ranks, ep->args.rank));
    return ncclRemoteError;
  }
  return ncclSuccess;
}

static ncclResult_t shm_ep_ready(hetccl_ep_t *ep, int *ready) {
  *ready = 0;
  if (ep->failed) return ep->failed;
  if (atomic_load_explicit(&ep->rx.ctrl->attached, memory_order_acquire) &&
      atomic_load_explicit(&ep->tx.ctrl->rx_ready, memory_order_acquire)) {
    if (ep->cma_want && atomic_load_explicit(&ep->tx.ctrl->cma_ok, memory_order_relaxed))
      ep->cma_min = ep->cma_want_min;
    *ready = 1;
    return ncclSuccess;
  }
  ncclResult_t res = ep_gone_early(ep);
  if (res != ncclSuccess) ep->failed = res;
  return res;
}

static ncclResult_t shm_ctx_poll(hetccl_tctx_t *c) {
  (void)c; /* peers come by mapping our segment: nothing to take */
  return ncclSuccess;
}

static void shm_ctx_fail(hetccl_tctx_t *c, const hetccl_fail_note_t *why) {
  if (c == NULL || why == NULL || c->fd < 0) return;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (int p = 0; p < c->args.nranks; p++) {
    if (p == c->args.rank) continue;
    size_t off = c->hdr_bytes + ring_index(c->args.rank, p) * c->ring_bytes;
    void *m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, (off_t)off);
    if (m == MAP_FAILED) continue; /* best effort */
    shm_ring_ctrl_t *ctrl = m;
    if (atomic_load_explicit(&ctrl->rx_closed, memory_order_acquire) == SHM_OPEN) {
      ctrl->rx_note = *why;
      atomic_store_explicit(&ctrl->rx_closed, SHM_FAILED, memory_order_release);
    }
    munmap(m, page);
  }
}

static size_t shm_ctx_pull_min(const hetccl_tctx_t *c) {
  return c->cma_knob ? c->cma_min : SIZE_MAX;
}

const hetccl_transport_t hetccl_transport_shm = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .ctx_create = shm_ctx_create,
    .connect = shm_connect,
    .isend = hetccl_shm_isend,
    .irecv = hetccl_shm_irecv,
    .progress = hetccl_shm_progress,
    .ep_close = shm_ep_close,
    .ep_fail = shm_ep_fail,
    .pull_min = shm_pull_min,
    .ctx_destroy = shm_ctx_destroy,
    .ep_open = shm_ep_open,
    .ep_ready = shm_ep_ready,
    .ctx_poll = shm_ctx_poll,
    .ctx_fail = shm_ctx_fail,
    .ctx_pull_min = shm_ctx_pull_min,
    .host_info = hetccl_shm_host_info,
};
