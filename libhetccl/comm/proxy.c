/* The proxy thread (proxy.h).
 *
 * Thread: hetccl_proxy_post/pending/drain/stop run on API threads; the job
 * functions run on the proxy thread. The queue and counters are guarded by
 * proxy->lock; the proxy never holds it while running a job. */
#include "comm/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/runtime.h"
#include "trace/trace.h"
#include "util/check.h"
#include "util/log.h"
#include "util/proc.h"

typedef struct hetccl_job {
  hetccl_job_fn fn;
  void *arg;
  hetccl_job_release_fn release;
  hetccl_sync_t *sync;
  struct hetccl_job *next;
} hetccl_job_t;

struct hetccl_proxy {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;      /* new job or stop */
  pthread_cond_t idle_cond; /* queue drained */
  hetccl_job_t *head, *tail;
  int pending; /* queued + running */
  int stop;
};

hetccl_sync_t *hetccl_sync_new(void) {
  hetccl_sync_t *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  s->refs = 1;
  return s;
}

void hetccl_sync_release(hetccl_sync_t *s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  int last = --s->refs == 0;
  pthread_mutex_unlock(&s->lock);
  if (last) {
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
  }
}

ncclResult_t hetccl_sync_wait(hetccl_sync_t *s) {
  pthread_mutex_lock(&s->lock);
  while (s->pending > 0) pthread_cond_wait(&s->cond, &s->lock);
  ncclResult_t res = s->result;
  if (res != ncclSuccess && s->message[0]) hetccl_last_error_set(s->message);
  pthread_mutex_unlock(&s->lock);
  return res;
}

static void sync_done(hetccl_sync_t *s, ncclResult_t res) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  if (s->result == ncclSuccess && res != ncclSuccess) {
    s->result = res;
    snprintf(s->message, sizeof(s->message), "%s", hetccl_last_error());
  }
  s->pending--;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  hetccl_sync_release(s);
}

static void release_arg(hetccl_job_release_fn release, void *arg) {
  if (release) release(arg);
  else free(arg);
}

static void job_release(hetccl_job_t *job) { release_arg(job->release, job->arg); }

/* Device work issued from here must target the communicator's device. On
 * failure the runtime has WARNed why; the message, with where, goes into
 * *why for every job to fail with (staged copies on another device would
 * be silent corruption). */
static ncclResult_t proxy_select_device(ncclComm_t comm, char *why, size_t len) {
  if (comm->dev < 0) return ncclSuccess;
  const hetccl_runtime_t *rt = hetccl_runtime_get(comm->dev_kind);
  ncclResult_t res = rt ? rt->set_device(comm->dev) : ncclInternalError;
  if (res != ncclSuccess) {
    hetccl_last_error_prefix("rank %d: proxy thread cannot select %s device %d", comm->rank,
                             hetccl_dev_kind_name(comm->dev_kind), comm->dev);
    snprintf(why, len, "%s", hetccl_last_error());
  }
  return res;
}

static void *proxy_main(void *varg) {
  hetccl_thread_name("hetccl-proxy");
  ncclComm_t comm = varg;
  struct hetccl_proxy *p = comm->proxy;
  if (HETCCL_TRACE_ON()) hetccl_trace_thread_name("proxy thread");
  char dev_why[sizeof(((hetccl_sync_t *)0)->message)];
  ncclResult_t dev_res = proxy_select_device(comm, dev_why, sizeof(dev_why));
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (!p->head && !p->stop) pthread_cond_wait(&p->cond, &p->lock);
    if (!p->head && p->stop) break;
    hetccl_job_t *job = p->head;
    p->head = job->next;
    if (!p->head) p->tail = NULL;
    int stopping = p->stop; /* read under the lock: hetccl_proxy_stop writes it */
    pthread_mutex_unlock(&p->lock);

    ncclResult_t res = stopping ? ncclInvalidUsage : dev_res;
    if (res == ncclSuccess) res = job->fn(comm, job->arg);
    else if (dev_res != ncclSuccess) hetccl_last_error_set(dev_why);
    if (res != ncclSuccess) hetccl_comm_set_error(comm, res); /* keeps this thread's message */
    job_release(job);
    sync_done(job->sync, res);
    free(job);

    pthread_mutex_lock(&p->lock);
    if (--p->pending == 0) pthread_cond_broadcast(&p->idle_cond);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

static ncclResult_t proxy_start(ncclComm_t comm) {
  struct hetccl_proxy *p = calloc(1, sizeof(*p));
  if (!p) {
    WARN("proxy: out of memory");
    return ncclSystemError;
  }
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_cond_init(&p->idle_cond, NULL);
  comm->proxy = p;
  int err = pthread_create(&p->thread, NULL, proxy_main, comm);
  if (err) {
    WARN("proxy: pthread_create: %s", strerror(err));
    comm->proxy = NULL;
    free(p);
    return ncclSystemError;
  }
  INFO(HETCCL_PROXY, "rank %d: proxy thread started", comm->rank);
  return ncclSuccess;
}

ncclResult_t hetccl_proxy_post(ncclComm_t comm, hetccl_job_fn fn, void *arg,
                               hetccl_job_release_fn release, hetccl_sync_t *sync) {
  /* Only API threads post, and a communicator is used by one API thread at
   * a time (NCCL's rule), so the lazy start needs no lock of its own. */
  if (!comm->proxy) {
    ncclResult_t res = proxy_start(comm);
    if (res != ncclSuccess) {
      release_arg(release, arg);
      return res;
    }
  }
  hetccl_job_t *job = calloc(1, sizeof(*job));
  if (!job) {
    release_arg(release, arg);
    WARN("proxy: out of memory");
    return ncclSystemError;
  }
  job->fn = fn;
  job->arg = arg;
  job->release = release;
  job->sync = sync;
  if (sync) {
    pthread_mutex_lock(&sync->lock);
    sync->pending++;
    sync->refs++;
    pthread_mutex_unlock(&sync->lock);
  }
  struct hetccl_proxy *p = comm->proxy;
  pthread_mutex_lock(&p->lock);
  if (p->tail) p->tail->next = job;
  else p->head = job;
  p->tail = job;
  p->pending++;
  pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->lock);
  return ncclSuccess;
}

int hetccl_proxy_pending(ncclComm_t comm) {
  struct hetccl_proxy *p = comm->proxy;
  if (!p) return 0;
  pthread_mutex_lock(&p->lock);
  int n = p->pending;
  pthread_mutex_unlock(&p->lock);
  return n;
}

void hetccl_proxy_drain(ncclComm_t comm) {
  struct hetccl_proxy *p = comm->proxy;
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  while (p->pending > 0) pthread_cond_wait(&p->idle_cond, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

void hetccl_proxy_stop(ncclComm_t comm) {
  struct hetccl_proxy *p = comm->proxy;
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  /* Jobs not started yet are dropped; their posters learn it. */
  hetccl_job_t *job = p->head;
  p->head = p->tail = NULL;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  while (job) {
    hetccl_job_t *next = job->next;
    job_release(job);
    sync_done(job->sync, ncclInvalidUsage);
    free(job);
    pthread_mutex_lock(&p->lock);
    p->pending--;
    pthread_mutex_unlock(&p->lock);
    job = next;
  }
  pthread_join(p->thread, NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->cond);
  pthread_cond_destroy(&p->idle_cond);
  free(p);
  comm->proxy = NULL;
}
