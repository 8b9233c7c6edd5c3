/* The core's side of the cross-island data plane (plane/plane.h): which
 * communicators get one, which of their operations it runs, and how.
 *
 * A communicator run by the engine gets a plane at init when all its ranks
 * are on one host, some of them pass device buffers (hetccl_peer_info_t
 * .stages), it has at most HETCCL_PLANE_MAX_RANKS ranks and HETCCL_PLANE
 * is not off. Every rank decides the same from the published peer table, and
 * if making the plane fails anywhere, everywhere goes on without it.
 *
 * Its operations then go to the plane, except the reducing collectives
 * when some GPU rank cannot reduce on its device (no runtime compiler):
 * those keep the engine, device buffers staged through host memory
 * (exec/devpath.h), as one INFO line at init says. The choice depends on
 * the operation alone, so every rank makes it alike.
 *
 * A share of a group whose plane operations have device buffers is
 * enqueued on the caller's stream (the call returns at once) and watched
 * by the proxy thread; one with host buffers runs where the engine's would
 * (the caller's thread, or the proxy). A share may not mix the two.
 *
 * Thread: setup where init runs; the rest on the API thread, the host run
 * where hetccl_tasks_run runs. */
#ifndef HETCCL_EXEC_DATAPLANE_H
#define HETCCL_EXEC_DATAPLANE_H

#include "exec/task.h"

/* After the engine is up (collective over comm). */
ncclResult_t hetccl_dataplane_setup(ncclComm_t comm);

/* Does the plane take task t (of comm)? The route's condition
 * (backend/route.h), read once per operation: the task keeps the answer
 * (t->form), which hetccl_dataplane_split reads. */
int hetccl_dataplane_takes(ncclComm_t comm, const hetccl_task_t *t);

/* Task t's stream is being captured into a graph (t->captured): fine
 * where the plane takes t and its programs can be captured
 * (plane/capture.c); else a WARN naming why and ncclInvalidUsage. */
ncclResult_t hetccl_dataplane_capture_check(ncclComm_t comm, const char *fn,
                                            const hetccl_task_t *t);

/* Take the plane tasks (t->form) out of *tasks (call order kept; the
 * rest stay). */
hetccl_task_t *hetccl_dataplane_split(ncclComm_t comm, hetccl_task_t **tasks);

/* Plane tasks with device buffers: enqueue on their stream, post the watch
 * to the proxy. Takes ownership of tasks. */
ncclResult_t hetccl_dataplane_launch(ncclComm_t comm, hetccl_task_t *tasks);

/* A group's device shares of several communicators (one thread driving
 * several ranks: ncclCommInitAll, nccl-tests -g N; or one rank in several
 * communicators) are launched by exec/group_streams.h, which calls
 * hetccl_dataplane_launch for each in an order every rank agrees on. */

/* Plane tasks with host buffers: run them here. Takes ownership. */
ncclResult_t hetccl_dataplane_run(ncclComm_t comm, hetccl_task_t *tasks);

/* Do any of tasks have device buffers? */
int hetccl_dataplane_on_device(const hetccl_task_t *tasks);

/* Teardown: fail (abort) / destroy the plane after the proxy stopped. */
void hetccl_dataplane_abort(ncclComm_t comm);
void hetccl_dataplane_destroy(ncclComm_t comm);

#endif
