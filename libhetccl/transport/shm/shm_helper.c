/* The receive helper thread (shm_helper.h says what it is for and its
 * contract).
 *
 * Thread: the helper runs helper_main; post, retire and wanted run on the
 * driver threads of endpoints. `lock` guards the queue, every post's
 * state and the thread's existence. */
#include "transport/shm/shm_helper.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/shm/shm_coop.h"
#include "util/knobs.h"
#include "util/log.h"
#include "util/proc.h"

/* CPUs per rank of the communicator on this host from which the helper is
 * on by default: a driver thread and a helper per rank, each with a core.
 * On the 16-core machine (docs/host-engine.md) that is up to 8 ranks. */
#define SHM_HELP_CPUS_PER_RANK 2

enum { SHM_HELP_IDLE = 0, SHM_HELP_QUEUED, SHM_HELP_RUNNING };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cond = PTHREAD_COND_INITIALIZER; /* a post queued */
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER; /* a post finished */
static shm_help_t *head, *tail;
static int started; /* the helper thread exists (0 again in a forked child) */
static int stopping; /* the last endpoint that may post is gone: the thread ends */
static int users;   /* endpoints that may post (hetccl_shm_help_attach) */
static pthread_t thread;
static int at_fork_set;

/* A forked child has no helper thread and may have copied the lock held:
 * it starts from nothing (its endpoints, if any, are its parent's). */
static void after_fork_child(void) {
  pthread_mutex_init(&lock, NULL);
  pthread_cond_init(&work_cond, NULL);
  pthread_cond_init(&done_cond, NULL);
  head = tail = NULL;
  started = stopping = users = 0;
}

/* Read [off, off + n) of the message into our destination; 0 and the post
 * marked failed if the kernel refuses. */
static int read_piece(shm_help_t *h, uint64_t dst, size_t off, size_t n) {
  for (size_t at = 0; at < n;) {
    struct iovec local = {(void *)(uintptr_t)(dst + off + at), n - at};
    struct iovec remote = {(void *)(uintptr_t)(h->src + off + at), n - at};
    ssize_t got = process_vm_readv(h->pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got < 0 && errno == ESRCH) {
        h->res = ncclRemoteError;
        snprintf(h->message, sizeof(h->message),
                 "shm: peer rank %d (pid %d) exited while its send buffer was being read",
                 h->peer_user, h->pid);
      } else {
        h->res = ncclSystemError;
        snprintf(h->message, sizeof(h->message),
                 "shm: the receive helper's process_vm_readv of %zu bytes at offset %zu of "
                 "rank %d's send buffer (pid %d): %s", n - at, off + at, h->peer_user, h->pid,
                 got < 0 ? strerror(errno) : "read nothing");
      }
      atomic_store_explicit(&h->failed, 1, memory_order_release);
      return 0;
    }
    at += (size_t)got;
    hetccl_copied_add(h->args, (size_t)got);
  }
  return 1;
}

/* Pieces from the back until none is left or a read fails. */
static void run(shm_help_t *h) {
  shm_coop_t *co = h->co;
  uint32_t i;
  while (!atomic_load_explicit(&h->cancel, memory_order_relaxed) && shm_coop_claim(co, 1, &i)) {
    size_t off = (size_t)i * co->piece;
    size_t n = co->piece < h->bytes - off ? co->piece : h->bytes - off;
    if (!read_piece(h, co->dst, off, n)) return; /* that piece is never done: the driver sees failed */
    h->helped += n;
    atomic_fetch_add_explicit(&co->done, n, memory_order_release);
  }
}

static void *helper_main(void *unused) {
  (void)unused;
  hetccl_thread_name("hetccl-shmhelp");
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!head && !stopping) pthread_cond_wait(&work_cond, &lock);
    if (!head) break; /* stopping, and nothing left to read */
    shm_help_t *h = head;
    head = h->next;
    if (!head) tail = NULL;
    h->state = SHM_HELP_RUNNING;
    pthread_mutex_unlock(&lock);
    run(h);
    pthread_mutex_lock(&lock);
    h->state = SHM_HELP_IDLE;
    pthread_cond_broadcast(&done_cond);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* Under lock: start the thread if it is not running; 0 if it cannot. */
static int ensure_thread(void) {
  if (started) return 1;
  if (!at_fork_set) {
    pthread_atfork(NULL, NULL, after_fork_child);
    at_fork_set = 1;
  }
  int err = pthread_create(&thread, NULL, helper_main, NULL);
  if (err) {
    INFO(HETCCL_SHM, "shm: no receive helper thread (pthread_create: %s); receives read on "
         "their own thread", strerror(err));
    return 0;
  }
  started = 1;
  return 1;
}

int hetccl_shm_help_post(shm_help_t *h) {
  atomic_store_explicit(&h->failed, 0, memory_order_relaxed);
  atomic_store_explicit(&h->cancel, 0, memory_order_relaxed);
  h->res = ncclSuccess;
  h->message[0] = '\0';
  h->next = NULL;
  pthread_mutex_lock(&lock);
  int ok = ensure_thread();
  if (ok) {
    h->state = SHM_HELP_QUEUED;
    if (tail) tail->next = h;
    else head = h;
    tail = h;
    pthread_cond_signal(&work_cond);
  }
  pthread_mutex_unlock(&lock);
  return ok;
}

void hetccl_shm_help_retire(shm_help_t *h) {
  atomic_store_explicit(&h->cancel, 1, memory_order_relaxed);
  pthread_mutex_lock(&lock);
  if (h->state == SHM_HELP_QUEUED) {
    shm_help_t **at = &head, *prev = NULL;
    while (*at && *at != h) {
      prev = *at;
      at = &(*at)->next;
    }
    if (*at) {
      *at = h->next;
      if (tail == h) tail = prev;
    }
    h->state = SHM_HELP_IDLE;
  }
  while (h->state == SHM_HELP_RUNNING) pthread_cond_wait(&done_cond, &lock);
  pthread_mutex_unlock(&lock);
}

void hetccl_shm_help_attach(void) {
  pthread_mutex_lock(&lock);
  users++;
  pthread_mutex_unlock(&lock);
}

void hetccl_shm_help_detach(void) {
  pthread_mutex_lock(&lock);
  int end = --users == 0 && started;
  if (end) {
    stopping = 1;
    pthread_cond_broadcast(&work_cond);
  }
  pthread_mutex_unlock(&lock);
  if (!end) return;
  pthread_join(thread, NULL);
  pthread_mutex_lock(&lock);
  started = stopping = 0;
  pthread_mutex_unlock(&lock);
}

/* CPUs this process may run on. */
static int affinity_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

int hetccl_shm_help_choice(int local, char *why, size_t len) {
  if (hetccl_knob_is_set(HETCCL_KNOB_SHM_HELPER)) {
    int on = (int)hetccl_knob_int(HETCCL_KNOB_SHM_HELPER);
    snprintf(why, len, "receive helper thread %s (HETCCL_SHM_HELPER=%d)", on ? "on" : "off", on);
    return on;
  }
  long ncpu = hetccl_host_cpus();
  int mine = affinity_cpus();
  if (local < 1) local = 1;
  int on = mine >= 2 && ncpu >= (long)SHM_HELP_CPUS_PER_RANK * local;
  snprintf(why, len, "receive helper thread %s by default: %ld CPUs for %d ranks here (%d wanted "
           "per rank), this process may run on %d", on ? "on" : "off", ncpu, local,
           SHM_HELP_CPUS_PER_RANK, mine);
  return on;
}

int hetccl_shm_help_wanted(const hetccl_transport_args_t *args) {
  static _Atomic int said;
  char why[192];
  int on = hetccl_shm_help_choice(args->local_ranks, why, sizeof(why));
  if (!atomic_exchange(&said, 1)) INFO(HETCCL_SHM | HETCCL_INIT, "shm: %s", why);
  return on;
}
