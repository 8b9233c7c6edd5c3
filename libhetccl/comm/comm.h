/* comm/: the communicator and its life. It owns the communicator object
 * (this file, comm.c: the live set, errors, reduction operators,
 * signatures), who a rank is and which ranks form islands (identity.h,
 * islands.h), the bootstrap, the choice of backend (backend.h) and of the
 * transports of each pair (transports.h), the proxy thread that runs a
 * communicator's background jobs (proxy.h), init, split/shrink/grow and
 * teardown (init.h), windows (window.h). It runs on the API thread, and on
 * a proxy for grouped and nonblocking inits. It never runs an operation and
 * never includes a folder above it (exec/, hier/, backend/, entry/): what
 * differs between a forwarded and an engine communicator it reaches only
 * through the backend table the communicator holds.
 *
 * The communicator: what one rank knows about its communicator.
 *
 * A communicator is either forwarded (one island, a vendor library serves
 * it: `forward.vendor` and `forward.vcomm` set, every call goes straight
 * there) or run by hetccl's engine (`engine.p2p` set). `backend` says
 * which (comm/backend.h): the entry points call its slots and never test
 * the fields below.
 *
 * Ownership: created and destroyed by the API thread. Once initialised,
 * the identity and configuration at the top are read-only. Its other
 * fields are grouped by backend and mechanism (boot, forward, engine, hier,
 * dataplane, state), each group saying who writes it and who reads it. The
 * engine is driven by one thread at a time: the API thread for blocking
 * calls, else the proxy thread (proxy.c), which owns the work queue.
 * `state.error` and `state.abort_flag` are written by any thread
 * (atomics). */
#ifndef HETCCL_COMM_COMM_H
#define HETCCL_COMM_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "algo/algo.h"
#include "comm/bootstrap.h"
#include "p2p/engine.h"
#include "nccl.h"
#include "runtime/reduce.h"
#include "runtime/runtime.h"
#include "vendor_ccl/vendor.h"

#define HETCCL_MAX_USER_REDOPS 64
#define HETCCL_ERRMSG_BYTES 1024
#define HETCCL_HOSTNAME_BYTES 64

/* What each rank publishes at init (fixed size, exchanged by the bootstrap). */
typedef struct hetccl_peer_info {
  int32_t rank;
  int32_t pid;
  uint64_t host_hash;
  char hostname[HETCCL_HOSTNAME_BYTES];
  int32_t dev_kind;        /* hetccl_dev_kind_t */
  int32_t dev;             /* device ordinal, -1 for host ranks */
  char bus_id[32];
  int32_t vendor_version;  /* NCCL/RCCL version this rank can load, 0 = none */
  int32_t island;          /* forced island id (HETCCL_ISLANDS) or -1 */
  int32_t user_rank;       /* how the user numbers this rank (internal communicators:
                              its rank in the communicator they serve) */
  int32_t blocking;        /* config.blocking, to detect disagreement */
  int32_t stages;          /* may pass device buffers to an engine communicator */
  int32_t ib_usable;       /* has an active verbs port that ib may use (asked only under
                              HETCCL_TRANSPORT=auto without NCCL_IB_DISABLE=1) */
  char vendor_err[160];    /* why a GPU rank could not load its vendor library */
} hetccl_peer_info_t;

typedef struct hetccl_user_redop {
  int in_use;
  hetccl_redop_t op; /* resolved; premul scalar captured at creation */
} hetccl_user_redop_t;

/* comm->engine.copied: one entry per transport, then the data plane's. */
#define HETCCL_COPIED_PLANE HETCCL_TRANSPORT_COUNT
#define HETCCL_COPIED_PATHS (HETCCL_TRANSPORT_COUNT + 1)

/* The groups of struct ncclComm below, one per backend or mechanism. Each
 * says who writes it, when, and which threads read it; the communicator's
 * own identity and configuration are the plain fields at its top. */

/* The bootstrap: how this communicator's ranks met (comm/init.c), both
 * backends. Written before and during init, by the thread that runs init
 * (the API thread, or a proxy for a grouped or nonblocking init), and not
 * again until teardown; read by this communicator's init steps
 * (comm/transports.c, comm/islands.c, hier/hier.c, exec/dataplane.c) and
 * by the splits made of it (comm/reshape.c). */
typedef struct hetccl_comm_boot {
  /* ncclCommInitRankScalable's ids past the first (the first is the one
   * init is handed), nids - 1 of them, owned; NULL for one id. */
  ncclUniqueId *ids;
  int nids;
  /* An internal communicator presents this island id at init instead of
   * HETCCL_ISLANDS's (island_forced set): the whole island one id, each
   * leader its own. Set by the split that makes it (comm/reshape.c). */
  int island_forced;
  int32_t island_force_id;
  int island_inherited;          /* a user's split: island_force_id is its island in the parent */
  /* The bootstrap's links to the other ranks (comm/bootstrap.h): kept by
   * an engine communicator for its splits and its data plane's barrier,
   * closed by a forwarded one once the vendor's communicator exists (the
   * vendor has its own bootstrap). Used by one thread at a time. */
  hetccl_bootstrap_t *links;
  hetccl_peer_info_t *peers;     /* nranks entries: what every rank published */
} hetccl_comm_boot_t;

/* A forwarded (homogeneous) communicator: one island, a vendor library
 * serves it and every call goes straight there (backend/forward.c).
 * Written where init runs, before the forwarding table is published
 * (hetccl_backend_publish orders them); a split's or shrink's child gets
 * vendor and vparent when it is made and vcomm from the vendor (see
 * vcomm). Read by the forwarding table's slots, on the API thread. Zero on
 * an engine communicator. */
typedef struct hetccl_comm_forward {
  const hetccl_vendor_t *vendor;
  ncclComm_t vcomm;              /* a split's / shrink's child: written by the vendor's job */
  ncclComm_t vparent;            /* such a child: its parent's vcomm, whose state it has
                                    until vcomm arrives */
  ncclComm_t vnone;              /* where a NOCOLOR split's vendor writes its NULL child */
} hetccl_comm_forward_t;

/* hetccl's engine (backend/engine.c, exec/): the point-to-point engine
 * over the transports of every pair, and what its operations keep. p2p
 * and stage_piece are made where init runs (comm/transports.c); then the
 * engine is driven by one thread at a time: the API thread for blocking
 * calls, else the proxy thread, which owns the work queue (comm/proxy.h).
 * The fields marked otherwise say who writes them. Zero on a forwarded
 * communicator. */
typedef struct hetccl_comm_engine {
  hetccl_engine_t *p2p;          /* the point-to-point engine (p2p/engine.h) */
  uint64_t op_seq;               /* operations issued on this comm */
  /* Elementwise collectives larger than this run as pieces of this many
   * bytes, so that staging device buffers overlaps the engine (api/coll.c,
   * exec/devpath.h); 0: never. The same on every rank: it depends on
   * whether any rank stages (hetccl_peer_info_t.stages). */
  size_t stage_piece;
  struct hetccl_devpath *devpath; /* staging of device buffers, made on first use */
  /* The user's reduction operators: made and destroyed by the API thread
   * under state.lock (comm.c), read when an operation is resolved. */
  hetccl_user_redop_t redops[HETCCL_MAX_USER_REDOPS];
  int finalized;                 /* ncclCommFinalize ran (API thread) */
  /* Payload bytes the CPU copied, per transport (hetccl_transport_args_t
   * .copied; added by whichever thread drives the engine, relaxed atomics),
   * and at HETCCL_COPIED_PLANE by the data plane's host executor (into and
   * out of its slots); hetcclCommCopiedBytes adds an island's, leaders' and rail's
   * communicators. */
  uint64_t copied[HETCCL_COPIED_PATHS];
  hetccl_fail_note_t peer_note;  /* why a peer gave up, first note (engine, transports) */
  hetccl_tag_mismatch_t mismatch; /* first signature mismatch seen (engine, transports) */
} hetccl_comm_engine_t;

/* Hierarchical collectives (hier/hier.h), on an engine communicator of
 * several islands: set on every rank or on none; then the ranks of this
 * rank's island (NULL where it is alone) and the first rank of every
 * island (NULL on the others); where every island holds as many ranks, the
 * ranks of this rank's index in every island (its rail; NULL on a leader,
 * whose rail is `leaders`). Made at init, after the engine is up, by
 * splitting this communicator (hetccl_hier_setup, the thread that runs
 * init); owned by it, released at teardown. Read by the thread that runs
 * the operation (hier/hier_ops.c). */
typedef struct hetccl_comm_hier {
  int enabled;                   /* the hierarchical forms apply */
  struct ncclComm *island;
  struct ncclComm *leaders;
  struct ncclComm *rail;
  struct hetccl_hier_map *map;   /* where every rank's island lies (hier/hier.h) */
} hetccl_comm_hier_t;

/* The cross-island data plane (exec/dataplane.h), on an engine
 * communicator that exec/dataplane.h gives one. Made where init runs
 * (hetccl_dataplane_setup), freed at teardown after the proxy has stopped;
 * read by the threads that run its operations (the API thread, the proxy
 * that watches a stream, a group's stream jobs: exec/group_streams.h).
 * Zero where there is none. */
typedef struct hetccl_comm_dataplane {
  struct hetccl_plane *plane;    /* the plane (plane/plane.h), or NULL */
  int reduces;                   /* it runs the reducing collectives too */
  int32_t *pids;                 /* each rank's pid, for the plane */
  uint64_t *hosts;               /* each rank's host, for the plane's bridges */
} hetccl_comm_dataplane_t;

/* Health and calls, both backends: written by any thread (the volatile
 * fields with atomics, the messages under `lock`; trace_calls by the API
 * thread), read by the API thread's checks, by blocked waits (abort_flag)
 * and by teardown (inflight). */
typedef struct hetccl_comm_state {
  volatile int abort_flag;
  volatile int error;            /* sticky ncclResult_t; ncclInProgress while init/ops run async */
  volatile int inflight;         /* API calls running on this comm (abort waits) */
  uint32_t trace_calls;          /* calls traced on it (trace/trace.h: an event's seq) */
  pthread_mutex_t lock;          /* guards last_error, fail_error (and engine.redops' slots) */
  char last_error[HETCCL_ERRMSG_BYTES]; /* why the last API call on it failed; "" after a success */
  char fail_error[HETCCL_ERRMSG_BYTES]; /* why it failed (the first message), kept while failed */
} hetccl_comm_state_t;

struct ncclComm {
  /* Identity and configuration: set at creation and init by the thread
   * that runs them, read-only after (backend: published once, see
   * comm/backend.h); any thread reads them. */
  uint64_t magic;
  int rank, nranks;
  int dev;                       /* GPU device, -1 for host ranks */
  char busid[32];                /* its PCI bus id ("0000:1b:00.0"), "" for host ranks */
  hetccl_dev_kind_t dev_kind;
  hetccl_dev_kind_t ptr_kind;    /* runtime that can tell device pointers apart (HOST: none) */
  int blocking;                  /* config.blocking resolved (1 default) */
  ncclConfig_t config;           /* the user's config, UNDEF fields resolved */
  /* The caller's config bytes as given (its size and version may be an
   * older NCCL's): what a vendor library is handed. */
  unsigned char user_config[512];
  int has_user_config;
  uint64_t comm_id;              /* from the unique id; in every frame */
  /* What serves it (comm/backend.h): the engine's table from creation,
   * the forwarding one once a vendor communicator exists. */
  const struct hetccl_backend_ops *backend;
  /* How the user numbers this communicator's ranks, for messages: NULL
   * where it is the user's own; for an internal one (island, leaders, rail), the
   * ranks they have in the communicator it serves. Handed to the
   * transports and the engine; owned here. */
  int32_t self_user_rank;
  int32_t *user_ranks;

  hetccl_comm_boot_t boot;           /* both backends: how the ranks met */
  struct hetccl_proxy *proxy;        /* both backends: started lazily for nonblocking work
                                        (comm/proxy.h) */
  hetccl_comm_forward_t forward;     /* a forwarded communicator's vendor */
  hetccl_comm_engine_t engine;       /* an engine communicator's engine */
  hetccl_comm_hier_t hier;           /* the engine's: islands, leaders, rails */
  hetccl_comm_dataplane_t dataplane; /* the engine's: the cross-island data plane */
  hetccl_comm_state_t state;         /* both backends: errors, abort, calls in flight */
};

#define HETCCL_COMM_MAGIC 0x6865746363636f6dull /* "hetcccom" */

/* Is comm a live hetccl communicator? ncclInvalidArgument + WARN naming the
 * calling function if NULL, destroyed or foreign. */
ncclResult_t hetccl_comm_check(ncclComm_t comm, const char *func);

/* For functions hetccl cannot serve in the current situation: a WARN naming
 * the function (which becomes the last error) and ncclInvalidUsage. */
ncclResult_t hetccl_unsupported(const char *func, const char *why);

/* The name of copied-bytes entry i (comm->engine.copied): a transport's, or
 * "plane". Static. */
static inline const char *hetccl_copied_path_name(int i) {
  return i == HETCCL_COPIED_PLANE ? "plane" : hetccl_transport_get((hetccl_transport_id_t)i)->name;
}

/* Register / forget a communicator in the live set. */
ncclResult_t hetccl_comm_register(ncclComm_t comm);
void hetccl_comm_unregister(ncclComm_t comm);

/* The end of an API call on comm (entry/dispatch.c): a failure's message
 * (the calling thread's last error) becomes the communicator's last
 * error; a success clears it. Ignores a comm that is not live. */
void hetccl_comm_note_call(ncclComm_t comm, ncclResult_t res);

/* Mark the communicator failed (sticky); the first error wins, and the
 * calling thread's last error becomes why it failed unless a message is
 * kept already (the engine may have set the code first). Any thread. */
void hetccl_comm_set_error(ncclComm_t comm, ncclResult_t res);

/* Why the communicator failed ("" when it has not), copied under its lock. */
void hetccl_comm_fail_message(ncclComm_t comm, char *buf, size_t len);

/* ncclGetLastError(comm) for an engine communicator: its last call's
 * error, else why it failed, else the thread's. Copied into buf. */
void hetccl_comm_last_error(ncclComm_t comm, char *buf, size_t len);

/* Resolve an ncclRedOp_t (built-in or user-created) for dtype on comm. */
ncclResult_t hetccl_comm_resolve_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dtype,
                                    hetccl_redop_t *out);

/* User reduction operators (ncclRedOpCreatePreMulSum with a host scalar). */
ncclResult_t hetccl_comm_redop_create(ncclComm_t comm, ncclRedOp_t *op, const void *scalar,
                                      ncclDataType_t dtype);
ncclResult_t hetccl_comm_redop_destroy(ncclComm_t comm, ncclRedOp_t op);

/* Message signatures (transport tags): a collective's depends on its
 * arguments and the communicator's collective sequence number (advanced by
 * this call); a point-to-point message's on its size only. */
uint64_t hetccl_comm_coll_tag(ncclComm_t comm, const hetccl_coll_t *c);
uint64_t hetccl_comm_p2p_tag(size_t bytes);
/* What a signature says, for messages (comm/signature.c): "AllReduce(float,
 * sum, count 4096, op #3)". The count is the low 24 bits the signature
 * keeps. */
void hetccl_comm_tag_describe(uint64_t tag, char *buf, size_t len);

#endif
