/* How a group's device shares reach their streams.
 *
 * A share is one communicator's operations of a group that go on a stream:
 * the data plane's (exec/dataplane.h: pieces that wait on the peers'
 * pieces) or the engine's through staging (exec/devpath.h: stream waits
 * for the proxy). A stream runs what it was given in order, so two
 * communicators' shares on one stream run one after the other, and if two
 * ranks put them there in opposite orders, each waits on the other for
 * ever. So every rank enqueues a group's shares in one order that all
 * ranks agree on, whatever the order of their calls: by the communicator's
 * id (comm_id, the same on every rank of it and different between
 * communicators), a communicator's plane share before its staged one.
 * NCCL does the same by its communicators' hash.
 *
 *   shares on               enqueued by                      order on the stream
 *   one stream (a job)      this thread; or, when some job   comm_id ascending, plane
 *                           holds a large plane share and    before staged
 *                           the group holds anything else,
 *                           a thread of the job's own
 *   other streams (ranks    their own jobs, the same way     (their own)
 *     of other devices)
 *
 * A stream is a stream pointer on one device of one runtime: the null
 * stream that two GPUs' ranks driven by one thread may both be given is
 * two streams, two jobs.
 *
 * Why threads: every rank's stream waits on its peers' pieces, so a launch
 * that blocks in the runtime (a stream's queue is finite, and a share of
 * hundreds of pieces fills it) before this thread has made the other
 * streams' launches, or run a host share of the same group, would wait for
 * ever. So when any share is large (more than LAUNCH_INLINE_PIECES pieces)
 * and the group holds anything else, every job gets a thread; otherwise the
 * jobs run here, in order, a thread costing more than they take. A job
 * keeps its stream's order because one thread enqueues all of it.
 *
 * Thread: the API thread (start, finish); a job's shares are launched by
 * one thread, the API thread or the job's. */
#ifndef HETCCL_EXEC_GROUP_STREAMS_H
#define HETCCL_EXEC_GROUP_STREAMS_H

#include "exec/task.h"

typedef enum { HETCCL_SHARE_PLANE, HETCCL_SHARE_STAGED } hetccl_share_kind_t;

typedef struct hetccl_device_share {
  ncclComm_t comm;
  hetccl_task_t *tasks; /* call order; every task's stream joins tasks->stream */
  hetccl_share_kind_t kind;
} hetccl_device_share_t;

typedef struct hetccl_group_streams hetccl_group_streams_t;

/* Launch n shares (any order: the array is sorted in place, and the jobs
 * point into it, so it must live until _finish). `others`: the group
 * holds shares this thread runs after (host shares). Ownership of every
 * list passes here; the first error is returned (its message made this thread's
 * last error). Call _finish once this thread has run the group's other
 * shares: it joins the jobs' threads. */
ncclResult_t hetccl_group_streams_start(hetccl_device_share_t *shares, int n, int others,
                                        hetccl_group_streams_t **out);
ncclResult_t hetccl_group_streams_finish(hetccl_group_streams_t *g);

#endif
