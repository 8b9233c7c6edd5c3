/* Captured programs: the data plane inside a CUDA (or HIP) graph.
 *
 * A stream being captured records what a call enqueues instead of running
 * it, and the graph replays that any number of times. An eager program
 * (plane_impl.h) cannot be replayed: its stream operations compare the
 * counters with piece numbers that grow over the channel's life, and a
 * graph keeps the numbers of the capture. A captured program therefore
 * runs on channels of its own (p->gout, p->gin: one segment per ordered
 * pair, made when a capture first uses it) whose counters mean the same
 * at every replay:
 *
 *   counter          eager program                     captured program
 *   produced[slot]   1 + the last piece written        1 while the slot holds a piece
 *   consumed[slot]   1 + the last piece read           1 while the slot is free
 *
 *   writer   wait consumed >= 1, set consumed = 0, copy into the slot, set produced = 1
 *   reader   wait produced >= 1, set produced = 0, copy or reduce out of it, set consumed = 1
 *
 * Each slot is a mailbox of depth one. Whoever waited for a state clears
 * it, and the other side sets that state again only after the clearing
 * (it first waits for the state the clearer sets next, on the clearer's
 * same stream). So the graph's memory operations carry constant values,
 * a replay leaves every slot as it found it, free, and the slots need no
 * count of replays. Pieces are still numbered per channel across every
 * captured program in the order the ranks capture them (piece q in slot
 * q % slots): ranks that replay their graphs in the same order see each
 * slot filled and drained in the same order.
 *
 * A step that waits for this rank's own earlier piece (an in-place
 * exchange must not overwrite what its send has not copied out yet:
 * plane_impl.h, dep_out) waits on a local counter of that piece's slot,
 * set to the piece's number counted from the program's start and reset to
 * 0 on the caller's stream as the program starts (plane_gdep).
 *
 * What a graph holds: copies, stream memory operations on the counters,
 * reduction kernels, and the events that fork the lanes onto the plane's
 * streams and join them back, which capture turns into edges. No host
 * function and no watch: nothing runs on a CPU at a replay. Not the split
 * or resident reduction paths and no wide pieces (their counters count).
 *
 * Set-up during a capture: channels, local counters, streams, stages and
 * kernels are made on first use, with the calling thread's capture mode
 * relaxed around them (runtime.h: the runtime refuses allocation and
 * registration during a capture in its global mode otherwise). The first
 * of a channel's two ranks to need it makes it, and the other maps it
 * (channel.c): neither waits for the other to arrive, so one thread may
 * capture for several ranks of its process.
 *
 * What cannot be captured (hetccl_plane_capturable, refused with the
 * reason and nothing numbered): a communicator with a host rank (its CPU
 * moves its pieces) or with ranks of other hosts (their bridges move
 * pieces on the proxy thread).
 *
 * Failures. No watch follows a replay, so from the first capture a guard
 * thread ("hetccl-graphs", one per plane) looks every 10 ms at the abort
 * flag, the peers' failure marks and their processes. On a failure it
 * fails the plane (every counter released: streams move on, outputs
 * undefined) and tells the communicator (args.on_failure: its async error).
 * A replay after that clears mailboxes as it passes them, so the guard
 * releases them again every millisecond: a replay on a failed
 * communicator still ends, with undefined outputs.
 *
 * The user's part, as with NCCL: the replays and eager calls of one
 * communicator run in the same order on every rank (one stream, or
 * streams ordered by events), and the graphs go before the communicator
 * (a replay after ncclCommDestroy would reach unmapped memory).
 *
 * Threads: launch on the API thread; the guard on its own; destroy on the
 * destroying thread once the proxy has stopped. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plane/plane_impl.h"
#include "util/check.h"
#include "util/log.h"
#include "util/proc.h"

#define GUARD_LOOK_MS 10     /* how often the guard looks at the peers */
#define GUARD_RELEASE_MS 1   /* how often it releases mailboxes once failed */

int hetccl_plane_capturable(const hetccl_plane_t *p, char *why, size_t len) {
  if (p->a.host_rank >= 0) {
    snprintf(why, len, "rank %d of this communicator is a host rank: its CPU moves its data, "
             "which a graph cannot replay", plane_user_rank(p, p->a.host_rank));
    return 0;
  }
  for (int q = 0; q < p->a.nranks; q++)
    if (plane_remote(p, q)) {
      snprintf(why, len, "rank %d of this communicator is on another host: its data crosses by "
               "the proxy thread, which a graph cannot replay", plane_user_rank(p, q));
      return 0;
    }
  return 1;
}

/* --- the mailboxes on failure ----------------------------------------------------- */

void plane_capture_release(hetccl_plane_t *p) {
  pthread_mutex_lock(&p->guard_lock);
  for (int q = 0; q < p->a.nranks && p->gout; q++) {
    plane_chan_release(&p->gout[q]);
    plane_chan_release(&p->gin[q]);
  }
  for (size_t i = 0; p->gdep && i < (size_t)p->a.nranks * PLANE_MAX_SLOTS; i++)
    __atomic_store_n(&p->gdep[i], PLANE_RELEASED, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&p->guard_lock);
}

/* --- the guard ------------------------------------------------------------------ */

static void guard_nap(hetccl_plane_t *p, int ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += (long)ms * 1000000L;
  until.tv_sec += until.tv_nsec / 1000000000L;
  until.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&p->guard_lock);
  if (!p->guard_stop) pthread_cond_timedwait(&p->guard_cond, &p->guard_lock, &until);
  pthread_mutex_unlock(&p->guard_lock);
}

static int guard_stopping(hetccl_plane_t *p) {
  pthread_mutex_lock(&p->guard_lock);
  int stop = p->guard_stop;
  pthread_mutex_unlock(&p->guard_lock);
  return stop;
}

static void *guard_main(void *arg) {
  hetccl_plane_t *p = arg;
  hetccl_thread_name("hetccl-graphs");
  int64_t last_look = 0;
  while (!guard_stopping(p)) {
    if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) {
      plane_capture_release(p);
      guard_nap(p, GUARD_RELEASE_MS);
      continue;
    }
    ncclResult_t res = plane_peers_check(p, &last_look, NULL);
    if (res != ncclSuccess) {
      hetccl_plane_fail(p, res);
      if (p->a.on_failure) p->a.on_failure(p->a.failure_ctx, res);
      continue;
    }
    guard_nap(p, GUARD_LOOK_MS);
  }
  return NULL;
}

static ncclResult_t guard_start(hetccl_plane_t *p) {
  if (p->guard_started) return ncclSuccess; /* API thread only */
  int err = pthread_create(&p->guard, NULL, guard_main, p);
  if (err) {
    WARN("plane: cannot start the thread that watches the peers while graphs replay: %s",
         strerror(err));
    return ncclSystemError;
  }
  p->guard_started = 1;
  INFO(HETCCL_INIT, "rank %d: a program was captured into a graph; thread hetccl-graphs now "
       "watches the peers every %d ms", plane_user_rank(p, p->a.rank), GUARD_LOOK_MS);
  return ncclSuccess;
}

/* --- set-up ----------------------------------------------------------------------- */

/* The arrays of the captured programs' channels and the local counters. */
static ncclResult_t capture_setup(hetccl_plane_t *p) {
  if (p->gdep) return ncclSuccess;
  size_t n = (size_t)p->a.nranks;
  plane_chan_t *out = calloc(n, sizeof(*out)), *in = calloc(n, sizeof(*in));
  if (!out || !in) {
    free(out);
    free(in);
    WARN("plane: out of memory for the channels of captured programs");
    return ncclSystemError;
  }
  void *host = NULL, *dev = NULL;
  size_t bytes = n * PLANE_MAX_SLOTS * sizeof(uint64_t);
  ncclResult_t res = p->a.rt->host_alloc_mapped(&host, &dev, bytes);
  if (res != ncclSuccess) {
    free(out);
    free(in);
    return res;
  }
  memset(host, 0, bytes);
  pthread_mutex_lock(&p->guard_lock);
  p->gout = out;
  p->gin = in;
  p->gdep = host;
  p->gdep_dev = dev;
  pthread_mutex_unlock(&p->guard_lock);
  return ncclSuccess;
}

/* Every channel prog uses, mapped and registered (channel.c: whichever
 * rank comes first makes it, so nobody waits for a peer to arrive). */
static ncclResult_t chans_ready(hetccl_plane_t *p, const plane_prog_t *prog) {
  int n = p->a.nranks;
  char out[n], in[n];
  memset(out, 0, sizeof(out));
  memset(in, 0, sizeof(in));
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    for (int l = 0; l < ph->nlanes; l++)
      for (int i = 0; i < ph->lanes[l].n; i++) {
        const plane_step_t *s = &ph->lanes[l].steps[i];
        if (s->out >= 0) out[s->out] = 1;
        if (s->in >= 0) in[s->in] = 1;
      }
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; q < n; q++) {
      plane_chan_t *c = pass ? &p->gin[q] : &p->gout[q];
      if (!(pass ? in[q] : out[q]) || c->hdr) continue;
      plane_chan_t made = {0};
      HETCCL_CHECK(pass ? plane_chan_graph(p, q, p->a.rank, &made)
                        : plane_chan_graph(p, p->a.rank, q, &made));
      ncclResult_t res = plane_chan_register(p, &made);
      pthread_mutex_lock(&p->guard_lock); /* the guard reads the headers */
      *c = made;
      pthread_mutex_unlock(&p->guard_lock);
      if (res != ncclSuccess) return res;
    }
  return ncclSuccess;
}

/* The local counters of the channels whose pieces a step of prog waits
 * for, marked and set to 0 on stream as the program starts. */
static ncclResult_t deps_reset(hetccl_plane_t *p, const plane_prog_t *prog, void *stream) {
  for (const plane_phase_t *ph = prog->head; ph; ph = ph->next)
    for (int l = 0; l < ph->nlanes; l++)
      for (int i = 0; i < ph->lanes[l].n; i++)
        if (ph->lanes[l].steps[i].dep_out >= 0) p->gout[ph->lanes[l].steps[i].dep_out].dep_used = 1;
  for (int q = 0; q < p->a.nranks; q++)
    for (int s = 0; p->gout[q].dep_used && s < p->a.slots; s++) {
      volatile uint64_t *c = plane_gdep(p, q, (uint64_t)s);
      HETCCL_CHECK(p->a.rt->stream_write_counter(stream, c, plane_gdep_dev(p, c), 0));
    }
  return ncclSuccess;
}

/* --- launch -------------------------------------------------------------------------- */

ncclResult_t plane_capture_launch(hetccl_plane_t *p, const hetccl_plane_task_t *tasks,
                                  int ntasks, void *stream) {
  char why[256];
  if (!hetccl_plane_capturable(p, why, sizeof(why))) {
    WARN("plane: rank %d: stream %p is being captured into a graph, and %s",
         plane_user_rank(p, p->a.rank), stream, why);
    return ncclInvalidUsage;
  }
  const hetccl_runtime_t *rt = p->a.rt;
  int mode = HETCCL_RT_CAPTURE_RELAXED;
  HETCCL_CHECK(rt->capture_mode_exchange(&mode));
  ncclResult_t res = plane_streams_create(p);
  if (res == ncclSuccess) res = capture_setup(p);
  plane_prog_t prog;
  int built = 0, numbered = 0;
  if (res == ncclSuccess) {
    numbered = 1; /* from here on the peers' numbering and ours may part */
    res = plane_prog_build(p, tasks, ntasks, 1, &prog);
    built = res == ncclSuccess;
  }
  if (res == ncclSuccess) res = chans_ready(p, &prog);
  if (res == ncclSuccess) res = deps_reset(p, &prog, stream);
  if (res == ncclSuccess) res = plane_exec_stream(p, &prog, stream);
  if (built) plane_prog_free(&prog);
  ncclResult_t back = rt->capture_mode_exchange(&mode);
  if (res == ncclSuccess) res = back;
  if (res == ncclSuccess) res = guard_start(p);
  if (res != ncclSuccess && numbered) hetccl_plane_fail(p, res);
  return res;
}

/* --- teardown ----------------------------------------------------------------------- */

void plane_capture_destroy(hetccl_plane_t *p) {
  if (p->guard_started) {
    pthread_mutex_lock(&p->guard_lock);
    p->guard_stop = 1;
    pthread_cond_broadcast(&p->guard_cond);
    pthread_mutex_unlock(&p->guard_lock);
    pthread_join(p->guard, NULL);
    p->guard_started = 0;
  }
  for (int q = 0; q < p->a.nranks && p->gout; q++) {
    plane_chan_close(p, &p->gout[q]);
    plane_chan_close(p, &p->gin[q]);
  }
  free(p->gout);
  free(p->gin);
  p->gout = p->gin = NULL;
  if (p->gdep) p->a.rt->host_free((void *)p->gdep);
  p->gdep = NULL;
}
