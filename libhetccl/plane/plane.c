/* The data plane's life and its failures (plane.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "plane/plane_impl.h"
#include "util/check.h"
#include "util/log.h"
#include "util/proc.h"

#define PEER_CHECK_NS 100000000LL /* how often a waiting rank asks whether its peers live */
#define DESTROY_WAIT_MS 10000

int64_t plane_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* --- set-up ----------------------------------------------------------------- */

/* Every rank passes both barriers whatever happened before them, so that a
 * rank that fails never leaves the others waiting; the caller compares
 * everyone's result afterwards. */
ncclResult_t hetccl_plane_create(const hetccl_plane_args_t *args, hetccl_plane_t **out) {
  *out = NULL;
  int n = args->nranks, me = args->rank;
  hetccl_plane_t *p = calloc(1, sizeof(*p));
  if (!p) {
    WARN("plane: out of memory");
    return ncclSystemError;
  }
  p->a = *args;
  pthread_mutex_init(&p->bridge_lock, NULL);
  pthread_mutex_init(&p->guard_lock, NULL);
  pthread_cond_init(&p->guard_cond, NULL);
  p->nlanes = 1 + 2 * n;
  p->lane_streams = args->lane_streams > 0 ? args->lane_streams : 1;
  while (args->slots % p->lane_streams) p->lane_streams--;
  int multi_host = 0;
  for (int q = 0; args->hosts && q < n; q++) multi_host |= args->hosts[q] != args->hosts[0];
  p->wide_min = args->slots >= 4 && !multi_host ? args->wide_min : 0;
  p->seg_bytes = PLANE_HDR_BYTES + (size_t)(args->slots + (p->wide_min ? 1 : 0)) * args->piece;
  p->gpu = args->rt != NULL;
  size_t stage = args->reduce_copy && args->device_reduce ? args->stage_bytes / args->piece : 0;
  p->stage_pieces = stage > PLANE_MAX_STAGE_PIECES ? PLANE_MAX_STAGE_PIECES : (int)stage;
  if (p->wide_min && p->stage_pieces < 2) p->stage_pieces = 0; /* a wide piece needs two */
  p->out = calloc((size_t)n, sizeof(*p->out));
  p->in = calloc((size_t)n, sizeof(*p->in));
  p->scratch = malloc(4 * args->piece); /* two operands of a wide piece (exec_host.c) */
  ncclResult_t res = p->out && p->in && p->scratch ? ncclSuccess : ncclSystemError;
  if (res != ncclSuccess) WARN("plane: out of memory for %d ranks", n);
  for (int q = 0; q < n && res == ncclSuccess; q++) {
    if (q == me) continue;
    if (!plane_remote(p, q)) {
      res = plane_chan_create(p, q, &p->out[q]);
      continue;
    }
    res = plane_bridge_open(p, q, 1, &p->out[q]);
    if (res == ncclSuccess) res = plane_bridge_open(p, q, 0, &p->in[q]);
    p->bridges++;
  }
  ncclResult_t b = args->barrier(args->barrier_ctx);
  for (int q = 0; q < n && res == ncclSuccess; q++)
    if (q != me && !plane_remote(p, q)) res = plane_chan_open(p, q, &p->in[q]);
  ncclResult_t b2 = args->barrier(args->barrier_ctx);
  for (int q = 0; q < n && p->out; q++) { /* everyone has it open: the name may go */
    if (p->out[q].name[0]) shm_unlink(p->out[q].name);
    p->out[q].name[0] = '\0';
  }
  if (res == ncclSuccess) res = b != ncclSuccess ? b : b2;
  for (int q = 0; q < n && res == ncclSuccess && p->gpu; q++) {
    if (q == me) continue;
    res = plane_chan_register(p, &p->out[q]);
    if (res == ncclSuccess) res = plane_chan_register(p, &p->in[q]);
  }
  if (res == ncclSuccess && p->gpu) {
    void *host = NULL;
    res = args->rt->host_alloc_mapped(&host, &p->done_dev, 256);
    p->done = host;
    if (res == ncclSuccess) *p->done = 0;
  }
  if (res == ncclSuccess && p->gpu && p->stage_pieces) {
    size_t bytes = (size_t)n * PLANE_CTR_STRIDE * sizeof(uint64_t);
    void *host = NULL, *dev = NULL;
    res = args->rt->host_alloc_mapped(&host, &dev, bytes);
    if (res == ncclSuccess) {
      memset(host, 0, bytes);
      p->ctr = host;
      p->ctr_dev = dev;
    }
  }
  if (res != ncclSuccess) {
    hetccl_plane_destroy(p);
    return res;
  }
  char across[96] = "";
  if (p->bridges)
    snprintf(across, sizeof(across), " (%d of other hosts, bridged by the communicator's "
             "transports)", p->bridges);
  char wide[96] = "";
  if (p->wide_min)
    snprintf(wide, sizeof(wide), " (two a piece from %zu bytes per channel)", p->wide_min);
  INFO(HETCCL_INIT, "rank %d: data plane to %d ranks%s, %d slots of %zu bytes per channel%s, %s",
       plane_user_rank(p, me), n - 1, across, args->slots, args->piece, wide,
       p->gpu ? "moved by this GPU's copy engines" : "moved by this rank's CPU");
  char reduce[192] = "", resident[64] = "a kernel per piece";
  if (args->resident_blocks)
    snprintf(resident, sizeof(resident), "by a resident kernel per run of %u blocks",
             args->resident_blocks);
  if (p->gpu && args->device_reduce && p->stage_pieces)
    snprintf(reduce, sizeof(reduce), "; reductions into device memory off the copy lane, "
             "through a split stage of %d pieces, %s", p->stage_pieces, resident);
  else if (p->gpu && args->device_reduce)
    snprintf(reduce, sizeof(reduce), "; reductions on the copy lane (HETCCL_PLANE_STAGE=0)");
  if (p->gpu)
    INFO(HETCCL_INIT, "rank %d: data plane streams: %d per peer and direction%s%s",
         plane_user_rank(p, me), p->lane_streams,
         p->lane_streams != args->lane_streams ? " (HETCCL_PLANE_LANE_STREAMS lowered to divide "
                                                 "HETCCL_PLANE_SLOTS)" : "",
         reduce);
  *out = p;
  return ncclSuccess;
}

/* --- failures ---------------------------------------------------------------- */

/* Every counter this rank's streams may wait on, and those its peers wait
 * on for it, set past any value. */
static void release_all(hetccl_plane_t *p) {
  for (int q = 0; q < p->a.nranks; q++) {
    plane_chan_release(&p->out[q]);
    plane_chan_release(&p->in[q]);
    for (int j = 0; p->ctr && j < p->stage_pieces; j++)
      __atomic_store_n(plane_staged(p, q, (uint64_t)j), PLANE_RELEASED, __ATOMIC_RELEASE);
    if (p->ctr) __atomic_store_n(plane_reduced(p, q), PLANE_RELEASED, __ATOMIC_RELEASE);
  }
}

void hetccl_plane_fail(hetccl_plane_t *p, ncclResult_t code) {
  if (!p || !__sync_bool_compare_and_swap(&p->failed, 0, (int)code)) return;
  int me = p->a.rank;
  for (int q = 0; q < p->a.nranks; q++) {
    if (p->out[q].hdr) {
      __atomic_store_n(&p->out[q].hdr->src_code, (int32_t)code, __ATOMIC_RELAXED);
      __atomic_store_n(&p->out[q].hdr->src_failed, me + 1, __ATOMIC_RELEASE);
    }
    if (p->in[q].hdr) {
      __atomic_store_n(&p->in[q].hdr->dst_code, (int32_t)code, __ATOMIC_RELAXED);
      __atomic_store_n(&p->in[q].hdr->dst_failed, me + 1, __ATOMIC_RELEASE);
    }
  }
  release_all(p);
  plane_capture_release(p);
}

/* A peer that marked one of our channels failed. */
static int peer_failed(const hetccl_plane_t *p, int *who, int *code) {
  for (int q = 0; q < p->a.nranks; q++) {
    if (q == p->a.rank) continue;
    const plane_chan_hdr_t *in = p->in[q].hdr, *out = p->out[q].hdr;
    if (in && __atomic_load_n(&in->src_failed, __ATOMIC_ACQUIRE)) {
      *who = q, *code = in->src_code;
      return 1;
    }
    if (out && __atomic_load_n(&out->dst_failed, __ATOMIC_ACQUIRE)) {
      *who = q, *code = out->dst_code;
      return 1;
    }
  }
  return 0;
}

ncclResult_t plane_check(hetccl_plane_t *p, int64_t since_ns, const uint8_t *waited) {
  int me = plane_user_rank(p, p->a.rank);
  if (p->failed) {
    WARN("plane: rank %d: this communicator failed earlier", me);
    return (ncclResult_t)p->failed;
  }
  HETCCL_CHECK(plane_peers_check(p, &p->last_peer_check_ns, waited));
  if (since_ns >= 0 && plane_now_ns() - since_ns > (int64_t)p->a.timeout_ms * 1000000LL) {
    WARN("plane: rank %d: no progress from its peers for %d s (HETCCL_TIMEOUT)", me,
         p->a.timeout_ms / 1000);
    return ncclTimeout;
  }
  return ncclSuccess;
}

ncclResult_t plane_peers_check(hetccl_plane_t *p, int64_t *last_ns, const uint8_t *waited) {
  int me = plane_user_rank(p, p->a.rank);
  if (__atomic_load_n(p->a.abort_flag, __ATOMIC_ACQUIRE)) {
    WARN("plane: rank %d: operation aborted (ncclCommAbort)", me);
    return ncclInvalidUsage;
  }
  int who, code;
  if (peer_failed(p, &who, &code)) {
    WARN("plane: rank %d gave up (%s); rank %d stops too", plane_user_rank(p, who),
         ncclGetErrorString((ncclResult_t)code), me);
    return code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError;
  }
  int64_t now = plane_now_ns();
  if (now - *last_ns > PEER_CHECK_NS) {
    *last_ns = now;
    for (int q = 0; q < p->a.nranks; q++) {
      /* a rank of another host is watched by its connection (bridge.c) */
      /* a zombie counts as gone: its parent may reap it late */
      if (q == p->a.rank || (waited && !waited[q]) || plane_remote(p, q) ||
          hetccl_proc_alive((int)p->a.pids[q], 0))
        continue;
      WARN("plane: peer rank %d (pid %d) exited while rank %d waited on it",
           plane_user_rank(p, q), (int)p->a.pids[q], me);
      return ncclRemoteError;
    }
  }
  return ncclSuccess;
}

/* --- running ---------------------------------------------------------------- */

/* args.inflight: until no more than inflight - 1 of this rank's programs
 * are still on its streams, for at most PACE_MAX_MS. Two processes on one
 * GPU take turns on it, and a process
 * whose queues hold a program that waits (for the other's copies) keeps
 * its turn while it waits: on one H200, back-to-back all_reduce calls of
 * 4 MiB took 2.4 ms each, 0.43 ms each with a synchronisation between
 * them (docs/measurements.md, "Graphs across islands"). Bounded, so that
 * a previous program held back by the caller's own later work (an event
 * recorded after this call) cannot deadlock it. */
#define PACE_MAX_MS 20
static void pace(hetccl_plane_t *p) {
  struct timespec nap = {0, 5000};
  int64_t until = plane_now_ns() + PACE_MAX_MS * 1000000LL;
  uint64_t ended = p->launched - (uint64_t)(p->a.inflight - 1); /* launched >= inflight */
  while (__atomic_load_n(p->done, __ATOMIC_ACQUIRE) < ended && !p->failed &&
         plane_now_ns() < until)
    nanosleep(&nap, NULL);
}

ncclResult_t hetccl_plane_launch(hetccl_plane_t *p, const hetccl_plane_task_t *tasks, int ntasks,
                                 void *stream, hetccl_plane_watch_fn watch, void *watch_ctx) {
  if (p->failed) return plane_check(p, -1, NULL);
  int capturing = 0;
  HETCCL_CHECK(p->a.rt->stream_capturing(stream, &capturing));
  if (capturing) return plane_capture_launch(p, tasks, ntasks, stream);
  if (p->a.inflight > 0 && p->launched >= (uint64_t)p->a.inflight) pace(p);
  HETCCL_CHECK(plane_streams_create(p));
  plane_prog_t prog;
  HETCCL_CHECK(plane_prog_build(p, tasks, ntasks, 0, &prog));
  /* The watch first: enqueueing may block (a stand-in runtime that runs
   * each operation as it is enqueued, a stream whose queue is full) until
   * the bridges have moved pieces of this very program. */
  hetccl_plane_ticket_t ticket = {.prog = ++p->launched, .bridged = prog.bridge_end};
  ncclResult_t res = watch(watch_ctx, ticket);
  if (res == ncclSuccess) res = plane_exec_stream(p, &prog, stream);
  plane_prog_free(&prog);
  if (res == ncclSuccess)
    res = p->a.rt->stream_write_counter(stream, p->done, p->done_dev, ticket.prog);
  /* The peers have numbered these pieces too: what did not make it onto
   * the streams must fail them, not leave them waiting (and the watch,
   * if it started, returns the failure). The stream never writes this
   * ticket, so teardown waits for the one before it. */
  if (res != ncclSuccess) {
    p->launched = ticket.prog - 1;
    hetccl_plane_fail(p, res);
  }
  return res;
}

/* A failure seen on the thread that drives the communicator: fail the
 * plane, and where bridges run, the wire too, so that ranks of other hosts
 * (which see no failure mark and watch no pid of ours) learn it now. */
static ncclResult_t fail_here(hetccl_plane_t *p, ncclResult_t res) {
  hetccl_plane_fail(p, res);
  if (p->bridges && p->a.wire.fail) p->a.wire.fail(p->a.wire.ctx, res);
  return res;
}

/* Is the last piece numbered on channel c in its slot? */
static int chan_written(const hetccl_plane_t *p, const plane_chan_t *c) {
  return !c->hdr || c->next == 0 ||
         __atomic_load_n(plane_produced(p, c, c->next - 1), __ATOMIC_ACQUIRE) >= c->next;
}

/* The peers the streams may still wait on, by the counters: pieces
 * numbered from q that have not all arrived, or pieces to q not all
 * written (a slot q has yet to free). A peer that has done its part of
 * every program launched and left is not one. */
static const uint8_t *streams_wait_on(const hetccl_plane_t *p, uint8_t *waited) {
  for (int q = 0; q < p->a.nranks; q++)
    waited[q] = q != p->a.rank && (!chan_written(p, &p->in[q]) || !chan_written(p, &p->out[q]));
  return waited;
}

ncclResult_t hetccl_plane_watch(hetccl_plane_t *p, hetccl_plane_ticket_t ticket) {
  struct timespec nap = {0, 20000};
  uint8_t waited[p->a.nranks];
  for (long polls = 0;; polls++) {
    int idle = 1;
    ncclResult_t res = plane_bridge_progress(p, &idle);
    if (res != ncclSuccess) return fail_here(p, res);
    if (__atomic_load_n(p->done, __ATOMIC_ACQUIRE) >= ticket.prog &&
        plane_bridge_passed(p, ticket.bridged))
      return ncclSuccess;
    if (!idle) {
      polls = 0;
      nap.tv_nsec = 20000;
      continue;
    }
    /* No timeout here: the stream may be busy with the program's own
     * earlier work for as long as that takes. */
    res = plane_check(p, -1, streams_wait_on(p, waited));
    if (res != ncclSuccess) return fail_here(p, res);
    if (polls > 100) nanosleep(&nap, NULL);
    /* Longer naps only while nothing but the stream is awaited: a bridge
     * that posts a produced piece late holds its peer back by as much. */
    if (polls > 10000 && plane_bridge_passed(p, ticket.bridged))
      nap.tv_nsec = 200000;
  }
}

ncclResult_t hetccl_plane_run_host(hetccl_plane_t *p, const hetccl_plane_task_t *tasks,
                                   int ntasks) {
  if (p->failed) return plane_check(p, -1, NULL);
  plane_prog_t prog;
  ncclResult_t res = plane_prog_build(p, tasks, ntasks, 0, &prog);
  if (res == ncclSuccess) {
    res = plane_exec_host(p, &prog);
    plane_prog_free(&prog);
  }
  return res == ncclSuccess ? res : fail_here(p, res);
}

/* --- teardown -------------------------------------------------------------------- */

static int streams_idle(hetccl_plane_t *p, int wait_ms) {
  if (!p->gpu || !p->done) return 1;
  struct timespec nap = {0, 1000000};
  for (int i = 0; i < wait_ms; i++) {
    if (__atomic_load_n(p->done, __ATOMIC_ACQUIRE) >= p->launched) return 1;
    nanosleep(&nap, NULL);
  }
  return __atomic_load_n(p->done, __ATOMIC_ACQUIRE) >= p->launched;
}

void hetccl_plane_destroy(hetccl_plane_t *p) {
  if (!p) return;
  if (!streams_idle(p, 100)) {
    /* Programs still queued (the caller did not wait for its stream, or a
     * peer is gone): let them run through, then wait for them. */
    hetccl_plane_fail(p, ncclInvalidUsage);
    if (!streams_idle(p, DESTROY_WAIT_MS)) {
      WARN("plane: rank %d: a stream still had data-plane work pending after %d s; its "
           "pinned segments are left mapped", plane_user_rank(p, p->a.rank),
           DESTROY_WAIT_MS / 1000);
      return; /* never unmap memory a device may still reach */
    }
  }
  if (p->lane_stream) plane_streams_destroy(p);
  if (p->gpu) plane_stages_free(p);
  plane_capture_destroy(p);
  for (int q = 0; q < p->a.nranks && p->out; q++) {
    plane_chan_close(p, &p->out[q]);
    plane_chan_close(p, &p->in[q]);
  }
  if (p->done) p->a.rt->host_free((void *)p->done);
  if (p->ctr) p->a.rt->host_free((void *)p->ctr);
  free(p->out);
  free(p->in);
  free(p->scratch);
  pthread_mutex_destroy(&p->bridge_lock);
  pthread_mutex_destroy(&p->guard_lock);
  pthread_cond_destroy(&p->guard_cond);
  free(p);
}
