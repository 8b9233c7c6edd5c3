/* The proxy thread: one per communicator, started on first use.
 *
 * It runs jobs that the API thread must not wait for: operations of a
 * nonblocking communicator, each communicator's share of a group that spans
 * several communicators (so that one thread can drive several ranks), and
 * background init. The proxy owns its queue; the API thread hands jobs over
 * through hetccl_proxy_post only. While the proxy runs a job it is the only
 * thread driving that communicator's engine.
 *
 * Completion is signalled through a hetccl_sync_t that the poster owns and
 * may share between jobs of several communicators. */
#ifndef HETCCL_COMM_PROXY_H
#define HETCCL_COMM_PROXY_H

#include <pthread.h>

#include "nccl.h"

typedef struct hetccl_sync {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int pending;         /* jobs not yet finished */
  ncclResult_t result; /* first error of any job */
  char message[1024];  /* what the failing job's thread logged */
  int refs;            /* poster + jobs; freed by the last release */
} hetccl_sync_t;

hetccl_sync_t *hetccl_sync_new(void);
void hetccl_sync_release(hetccl_sync_t *s);
/* Block until every job posted against s has finished; returns the first
 * error, whose message becomes the calling thread's last error. */
ncclResult_t hetccl_sync_wait(hetccl_sync_t *s);

typedef ncclResult_t (*hetccl_job_fn)(ncclComm_t comm, void *arg);

/* Frees a job's arg and whatever it still owns. */
typedef void (*hetccl_job_release_fn)(void *arg);

/* Queue fn(comm, arg) on comm's proxy thread (started if needed). `arg` is
 * owned by the job: released with release(arg) (free() when NULL) after fn
 * returns, when the job is dropped unrun (hetccl_proxy_stop), or here if
 * posting fails. sync may be NULL (then only the communicator's async
 * error reports the outcome). */
ncclResult_t hetccl_proxy_post(ncclComm_t comm, hetccl_job_fn fn, void *arg,
                               hetccl_job_release_fn release, hetccl_sync_t *sync);

/* Number of queued or running jobs (for ncclCommGetAsyncError). */
int hetccl_proxy_pending(ncclComm_t comm);

/* Wait until the queue is empty (bounded by the abort flag). */
void hetccl_proxy_drain(ncclComm_t comm);

/* Stop and join the thread; queued jobs not yet started are dropped with
 * their syncs signalled. Idempotent. */
void hetccl_proxy_stop(ncclComm_t comm);

#endif
