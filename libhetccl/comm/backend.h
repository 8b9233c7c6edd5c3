/* The backend table: what serves a communicator.
 *
 * A communicator is served either by the vendor's library (one island:
 * every call forwarded, backend/forward.c) or by hetccl's engine (several
 * islands, host ranks: transports, data plane, hierarchy; backend/engine.c).
 * Everything that differs between the two goes through this table, chosen
 * at init as the transports of its pairs are (comm/init.c): the entry
 * points (entry/) check the communicator, then call the slot, and never
 * ask which backend they hold.
 *
 * A communicator starts on the engine's table (hetccl_comm_create): until
 * init has decided, it answers as the engine does (its queries, an abort).
 * The forwarded table is published once the vendor's communicator exists,
 * with release ordering after the vendor fields (vendor, vcomm): a reader
 * loads the table (hetccl_backend_of), then reads what its slots use.
 *
 * Every slot is required: a backend that cannot serve a call fills its
 * slot with a function that says so (ncclInvalidUsage and a WARN naming the
 * call, hetccl_unsupported), never NULL. hetccl_backend_get checks the
 * tables once, as the transport registry checks its own.
 *
 * Contracts common to every slot: comm is live (hetccl_comm_check passed);
 * the caller is the API thread that owns comm at the moment (NCCL's rule:
 * one thread at a time per communicator), unless a slot says otherwise; a
 * failure is logged once where it is born (the slot, or what it calls) and
 * the slot returns its code; outputs are written on success only. The
 * slots never touch the entry points' frame (hetccl_call_begin / _end).
 *
 * This header names its implementations (HETCCL_BACKENDS) without including
 * them: they live above this folder and reach back only through here. */
#ifndef HETCCL_COMM_BACKEND_H
#define HETCCL_COMM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/op.h"
#include "nccl.h"
#include "nccl_device_host.h"

/* --- life ------------------------------------------------------------------ */

/* Make what this backend serves comm with, after the bootstrap and the
 * islands (comm->boot.peers filled, every rank choosing the same backend):
 * forward: the vendor's communicator (its unique id over comm->boot.links,
 * which it then closes); engine: the transports of every pair, the data plane, the
 * hierarchy. Collective over comm, blocking, bounded by the connect
 * timeout and the abort flag; runs where init runs (the API thread, or a
 * proxy for grouped and nonblocking inits). On failure, what it made so far
 * is freed by release. */
typedef ncclResult_t (*hetccl_backend_start_fn)(ncclComm_t comm, const ncclUniqueId *id);

/* ncclCommFinalize: finish what was issued; blocking by the communicator's
 * config. */
typedef ncclResult_t (*hetccl_backend_finalize_fn)(ncclComm_t comm);

/* The first half of ncclCommDestroy (abort 0) or ncclCommAbort (abort 1),
 * before comm leaves the live set: stop what the backend runs for it;
 * with abort, calls blocked inside comm return promptly (the abort flag is
 * set already). Never waits on a peer. */
typedef ncclResult_t (*hetccl_backend_shutdown_fn)(ncclComm_t comm, int abort);

/* The second half: free what start made (also after a failed start, and on
 * a communicator whose start never ran). No call is inside comm any more.
 * Never fails, never waits on a peer. */
typedef void (*hetccl_backend_release_fn)(ncclComm_t comm, int abort);

/* ncclCommRevoke. */
typedef ncclResult_t (*hetccl_backend_revoke_fn)(ncclComm_t comm, int flags);

/* --- operations ------------------------------------------------------------ */

/* Run a user's op (checked by the API as far as it can without comm; the
 * entry points' slot, hetccl_comm_dispatch): forward: the vendor's
 * function, which checks it; engine: comm's state and op checked against
 * comm (exec/enqueue.h: hetccl_comm_usable, hetccl_op_validate), then
 * placed as submit places it. Enqueued on op->stream where that is the
 * contract; may return ncclInProgress (a nonblocking communicator); a
 * failure inside a group is also the group's (exec/group.h). */
typedef ncclResult_t (*hetccl_backend_dispatch_fn)(ncclComm_t comm, const hetccl_op_t *op);

/* Run an op hetccl derived itself from one that dispatch has checked and
 * validated already (the hierarchical forms' phases on the internal
 * communicators, their pairs' sends and receives on the communicator
 * itself: hier/), through hetccl_comm_submit. No check of comm's state or
 * of op: the one who derives it answers for both (hier/hier_ops.c checks
 * the internal communicators once per operation). Placed where dispatch
 * places it: forward: the vendor's function (a vendor island's phases
 * still go to the vendor); engine: the hierarchical form where op has one
 * (inside a group: at the group's end), else engine tasks. Stream, "in
 * progress" and group error as for dispatch. */
typedef ncclResult_t (*hetccl_backend_submit_fn)(ncclComm_t comm, const hetccl_op_t *op);

/* ncclRedOpCreatePreMulSum / ncclRedOpDestroy. */
typedef ncclResult_t (*hetccl_backend_redop_create_fn)(ncclComm_t comm, ncclRedOp_t *op,
                                                       void *scalar, ncclDataType_t dtype,
                                                       ncclScalarResidence_t residence);
typedef ncclResult_t (*hetccl_backend_redop_destroy_fn)(ncclComm_t comm, ncclRedOp_t op);

/* --- queries --------------------------------------------------------------- */

/* ncclCommGetAsyncError. Any thread (a watchdog polls it). */
typedef ncclResult_t (*hetccl_backend_async_error_fn)(ncclComm_t comm, ncclResult_t *err);
/* ncclCommCount, ncclCommUserRank, ncclCommCuDevice (-1 on a host rank). */
typedef ncclResult_t (*hetccl_backend_int_query_fn)(ncclComm_t comm, int *out);
/* ncclCommQueryProperties (props checked not NULL). */
typedef ncclResult_t (*hetccl_backend_properties_fn)(ncclComm_t comm,
                                                     ncclCommProperties_t *props);
/* ncclCommMemStats. */
typedef ncclResult_t (*hetccl_backend_mem_stats_fn)(ncclComm_t comm, ncclCommMemStat_t stat,
                                                    uint64_t *value);
/* ncclGetLastError(comm): the message, in buf (len bytes, per thread, the
 * caller's) or in storage the vendor owns. Never NULL. Any thread. */
typedef const char *(*hetccl_backend_last_error_fn)(ncclComm_t comm, char *buf, size_t len);
/* hetcclCommBackend: a static string ("engine", "nccl", ...). Any thread. */
typedef const char *(*hetccl_backend_describe_fn)(ncclComm_t comm);

/* --- memory ------------------------------------------------------------------ */

/* ncclCommRegister / ncclCommDeregister: declare a buffer for
 * communication (a hint: a backend that needs none still returns a handle
 * its deregister takes). */
typedef ncclResult_t (*hetccl_backend_mem_register_fn)(ncclComm_t comm, void *buff, size_t size,
                                                       void **handle);
typedef ncclResult_t (*hetccl_backend_mem_deregister_fn)(ncclComm_t comm, void *handle);
/* ncclCommWindowRegister / ncclCommWindowDeregister / ncclWinGetUserPtr. */
typedef ncclResult_t (*hetccl_backend_window_register_fn)(ncclComm_t comm, void *buff,
                                                          size_t size, ncclWindow_t *win,
                                                          int flags);
typedef ncclResult_t (*hetccl_backend_window_deregister_fn)(ncclComm_t comm, ncclWindow_t win);
typedef ncclResult_t (*hetccl_backend_win_user_ptr_fn)(ncclComm_t comm, ncclWindow_t win,
                                                       void **out);
/* ncclCommSuspend (flags) / ncclCommResume. */
typedef ncclResult_t (*hetccl_backend_suspend_fn)(ncclComm_t comm, int flags);
typedef ncclResult_t (*hetccl_backend_resume_fn)(ncclComm_t comm);

/* --- communicators made from comm --------------------------------------------- */

/* ncclCommSplit, ncclCommShrink, ncclCommGrow (a member's call; rank -1)
 * and ncclCommGetUniqueId (the grow's id): collective over comm as NCCL
 * says; *newcomm is NULL unless a communicator is handed out (a nonblocking
 * vendor may fill it later: forward.c). */
typedef ncclResult_t (*hetccl_backend_split_fn)(ncclComm_t comm, int color, int key,
                                                ncclComm_t *newcomm, const ncclConfig_t *config);
typedef ncclResult_t (*hetccl_backend_shrink_fn)(ncclComm_t comm, const int *exclude,
                                                 int nexclude, ncclComm_t *newcomm,
                                                 const ncclConfig_t *config, int flags);
typedef ncclResult_t (*hetccl_backend_grow_fn)(ncclComm_t comm, int nranks,
                                               const ncclUniqueId *id, int rank,
                                               ncclComm_t *newcomm, const ncclConfig_t *config);
typedef ncclResult_t (*hetccl_backend_grow_id_fn)(ncclComm_t comm, ncclUniqueId *id);

/* --- the device API ------------------------------------------------------------ */

/* ncclDevCommCreate / ncclDevCommDestroy. */
typedef ncclResult_t (*hetccl_backend_dev_comm_create_fn)(ncclComm_t comm,
                                                          const ncclDevCommRequirements_t *reqs,
                                                          ncclDevComm_t *out);
typedef ncclResult_t (*hetccl_backend_dev_comm_destroy_fn)(ncclComm_t comm,
                                                           const ncclDevComm_t *dev);

/* The teams (ncclTeamWorld, ...): *out is the team. A failure (a team the
 * backend has no meaning for) leaves *out as given (the empty team) and
 * becomes the communicator's last error: the entry points return a team,
 * not a code. mode: ncclTeamCft's only. */
typedef enum {
  HETCCL_TEAM_WORLD, HETCCL_TEAM_LSA, HETCCL_TEAM_RAIL, HETCCL_TEAM_CFT, HETCCL_TEAM_CFT_MULTIMEM
} hetccl_team_kind_t;
typedef ncclResult_t (*hetccl_backend_team_fn)(ncclComm_t comm, hetccl_team_kind_t kind,
                                               ncclCftTeamMode_t mode, ncclTeam_t *out);
/* ncclTeamRankToWorld (lsa 0) / ncclTeamRankToLsa (lsa 1): *out, or -1
 * with the failure as the communicator's last error, as for teams. */
typedef ncclResult_t (*hetccl_backend_team_rank_fn)(ncclComm_t comm, ncclTeam_t team, int rank,
                                                    int lsa, int *out);
/* ncclGinBarrierCreateRequirement. */
typedef ncclResult_t (*hetccl_backend_gin_barrier_fn)(ncclComm_t comm, ncclTeam_t team,
                                                      int nbarriers,
                                                      ncclGinBarrierHandle_t *handle,
                                                      ncclDevResourceRequirements_t *req);
/* One-sided signals: ncclPutSignal, ncclSignal, ncclWaitSignal; on `stream`. */
typedef ncclResult_t (*hetccl_backend_put_signal_fn)(ncclComm_t comm, const void *localbuff,
                                                     size_t count, ncclDataType_t dtype,
                                                     int peer, ncclWindow_t peer_win,
                                                     size_t peer_win_offset, int sig_idx,
                                                     int ctx, unsigned int flags, void *stream);
typedef ncclResult_t (*hetccl_backend_signal_fn)(ncclComm_t comm, int peer, int sig_idx, int ctx,
                                                 unsigned int flags, void *stream);
typedef ncclResult_t (*hetccl_backend_wait_signal_fn)(ncclComm_t comm, int ndesc,
                                                      ncclWaitSignalDesc_t *descs, void *stream);

/* The slots, every one required (REQUIRED_SLOTS in comm/backend.c). */
typedef struct hetccl_backend_ops {
  const char *name;
  /* life */
  hetccl_backend_start_fn start;
  hetccl_backend_finalize_fn finalize;
  hetccl_backend_shutdown_fn shutdown;
  hetccl_backend_release_fn release;
  hetccl_backend_revoke_fn revoke;
  /* operations */
  hetccl_backend_dispatch_fn dispatch;
  hetccl_backend_submit_fn submit;
  hetccl_backend_redop_create_fn redop_create;
  hetccl_backend_redop_destroy_fn redop_destroy;
  /* queries */
  hetccl_backend_async_error_fn async_error;
  hetccl_backend_int_query_fn count;
  hetccl_backend_int_query_fn user_rank;
  hetccl_backend_int_query_fn cu_device;
  hetccl_backend_properties_fn properties;
  hetccl_backend_mem_stats_fn mem_stats;
  hetccl_backend_last_error_fn last_error;
  hetccl_backend_describe_fn describe;
  /* memory */
  hetccl_backend_mem_register_fn mem_register;
  hetccl_backend_mem_deregister_fn mem_deregister;
  hetccl_backend_window_register_fn window_register;
  hetccl_backend_window_deregister_fn window_deregister;
  hetccl_backend_win_user_ptr_fn win_user_ptr;
  hetccl_backend_suspend_fn suspend;
  hetccl_backend_resume_fn resume;
  /* communicators made from this one */
  hetccl_backend_split_fn split;
  hetccl_backend_shrink_fn shrink;
  hetccl_backend_grow_fn grow;
  hetccl_backend_grow_id_fn grow_id;
  /* the device API */
  hetccl_backend_dev_comm_create_fn dev_comm_create;
  hetccl_backend_dev_comm_destroy_fn dev_comm_destroy;
  hetccl_backend_team_fn team;
  hetccl_backend_team_rank_fn team_rank;
  hetccl_backend_gin_barrier_fn gin_barrier;
  hetccl_backend_put_signal_fn put_signal;
  hetccl_backend_signal_fn signal;
  hetccl_backend_wait_signal_fn wait_signal;
} hetccl_backend_ops_t;

/* id, table symbol. */
#define HETCCL_BACKENDS(X)                                                     \
  X(engine, hetccl_backend_engine)                                             \
  X(forward, hetccl_backend_forward)

#define HETCCL_BACKEND_DECL(id, sym) extern const hetccl_backend_ops_t sym;
HETCCL_BACKENDS(HETCCL_BACKEND_DECL)
#undef HETCCL_BACKEND_DECL

typedef enum {
#define HETCCL_BACKEND_ENUM(id, sym) HETCCL_BACKEND_##id,
  HETCCL_BACKENDS(HETCCL_BACKEND_ENUM)
#undef HETCCL_BACKEND_ENUM
  HETCCL_BACKEND_COUNT
} hetccl_backend_id_t;

/* The table for id, its slots checked once (a missing one: a WARN naming
 * it, and NULL). Any thread. */
const hetccl_backend_ops_t *hetccl_backend_get(hetccl_backend_id_t id);

/* comm's table, as published (see above). Any thread. */
static inline const hetccl_backend_ops_t *hetccl_backend_of(ncclComm_t comm) {
  return __atomic_load_n(&comm->backend, __ATOMIC_ACQUIRE);
}

/* Make `ops` comm's table (init, once its backend's vendor fields are set). */
static inline void hetccl_backend_publish(ncclComm_t comm, const hetccl_backend_ops_t *ops) {
  __atomic_store_n(&comm->backend, ops, __ATOMIC_RELEASE);
}

/* A user's operation on comm through its backend (entry/dispatch.c, once
 * the handle is checked): the backend validates it against comm. No trace
 * of a call of its own. */
static inline ncclResult_t hetccl_comm_dispatch(ncclComm_t comm, const hetccl_op_t *op) {
  return hetccl_backend_of(comm)->dispatch(comm, op);
}

/* An operation hetccl derived from one already dispatched (the submit
 * slot's contract): placed as dispatch would place it, not validated
 * again. No trace of a call of its own. */
static inline ncclResult_t hetccl_comm_submit(ncclComm_t comm, const hetccl_op_t *op) {
  return hetccl_backend_of(comm)->submit(comm, op);
}

#endif
