/* Communicator life cycle, the end (init.h): finalize, destroy, abort, and
 * freeing a communicator that never got users. What differs between a
 * forwarded and an engine communicator is its backend's (backend.h: the
 * shutdown and release slots); the order around them is the same for both:
 *
 *   destroy   shutdown(0) -> drain the proxy -> leave the live set -> wait
 *             for calls still inside -> release(0) -> free
 *   abort     abort flag -> shutdown(1) -> leave the live set -> wait for
 *             calls still inside (the flag makes them leave) -> release(1)
 *             -> free
 *
 * Local: never blocks on a peer. Thread: the API caller (a proxy's job may
 * still be running until the proxy is stopped, which release does). */
#include <stdlib.h>
#include <time.h>

#include "comm/backend.h"
#include "comm/init.h"
#include "comm/proxy.h"
#include "comm/window.h"

/* --- in-flight accounting ------------------------------------------------------ */

void hetccl_comm_enter(ncclComm_t comm) {
  __atomic_add_fetch(&comm->state.inflight, 1, __ATOMIC_ACQ_REL);
}
void hetccl_comm_leave(ncclComm_t comm) {
  __atomic_sub_fetch(&comm->state.inflight, 1, __ATOMIC_ACQ_REL);
}

/* Calls on other threads that are still inside the communicator (blocked
 * in the engine, say) must leave before it is freed; the abort flag makes
 * them leave within milliseconds. Bounded in case one never does. */
static void wait_inflight(ncclComm_t comm, int allowed) {
  struct timespec ts = {0, 1000000};
  for (int i = 0; i < 10000 && __atomic_load_n(&comm->state.inflight, __ATOMIC_ACQUIRE) > allowed;
       i++)
    nanosleep(&ts, NULL);
}

/* --- teardown ------------------------------------------------------------------- */

/* Out of the live set: no new call gets in; windows still registered on
 * it go with it. */
static void leave_live_set(ncclComm_t comm) {
  hetccl_window_comm_gone(comm);
  hetccl_comm_unregister(comm);
}

static void release_as(ncclComm_t comm, int abort) {
  hetccl_backend_of(comm)->release(comm, abort);
  hetccl_proxy_stop(comm); /* idempotent: the backend may have stopped it first */
  hetccl_bootstrap_destroy(comm->boot.links);
  free(comm->boot.peers);
  free(comm->user_ranks);
  free(comm->boot.ids);
  pthread_mutex_destroy(&comm->state.lock);
  free(comm);
}

void hetccl_comm_release(ncclComm_t comm) { release_as(comm, 1); }

ncclResult_t hetccl_comm_finalize(ncclComm_t comm) {
  return hetccl_backend_of(comm)->finalize(comm);
}

ncclResult_t hetccl_comm_destroy(ncclComm_t comm) {
  ncclResult_t res = hetccl_backend_of(comm)->shutdown(comm, 0);
  hetccl_proxy_drain(comm);
  leave_live_set(comm);
  wait_inflight(comm, 0);
  release_as(comm, 0);
  return res;
}

ncclResult_t hetccl_comm_abort(ncclComm_t comm) {
  __atomic_store_n(&comm->state.abort_flag, 1, __ATOMIC_RELEASE);
  ncclResult_t res = hetccl_backend_of(comm)->shutdown(comm, 1);
  leave_live_set(comm);
  wait_inflight(comm, 0);
  release_as(comm, 1);
  return res;
}
