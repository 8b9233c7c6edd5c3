/* Hierarchical communicators: the island and leaders communicators of a
 * communicator that spans several islands, and the operations' hierarchical
 * forms (core/hier.h). */
#include "core/hier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dispatch.h"
#include "core/enqueue.h"
#include "core/group.h"
#include "core/init.h"
#include "core/proxy.h"
#include "util/check.h"
#include "util/knobs.h"
#include "util/log.h"

static int same_island(const hetccl_peer_info_t *a, const hetccl_peer_info_t *b) {
  return a->island == b->island && a->dev_kind == b->dev_kind &&
         a->vendor_version == b->vendor_version;
}

/* The lowest rank of r's island. */
static int island_leader(const ncclComm_t comm, int r) {
  for (int q = 0; q < r; q++)
    if (same_island(&comm->peers[q], &comm->peers[r])) return q;
  return r;
}

ncclResult_t hetccl_hier_setup(ncclComm_t comm) {
  int n = comm->nranks;
  if (!hetccl_knob_int(HETCCL_KNOB_HIER) || n < 3) return ncclSuccess;
  int *lead = malloc((size_t)n * sizeof(*lead)), *size = calloc((size_t)n, sizeof(*size));
  if (!lead || !size) {
    free(lead);
    free(size);
    WARN("ncclCommInitRank: out of memory for %d ranks' islands", n);
    return ncclSystemError;
  }
  int islands = 0, biggest = 0;
  for (int r = 0; r < n; r++) {
    lead[r] = island_leader(comm, r);
    islands += lead[r] == r;
    if (++size[lead[r]] > biggest) biggest = size[lead[r]];
  }
  int leader = lead[comm->rank], mine = size[leader];
  free(lead);
  free(size);
  if (islands < 2 || biggest < 2) return ncclSuccess;
  /* Internal communicators block: a host-buffer phase has finished when
   * its call returns, so the next phase may start. */
  ncclConfig_t config = comm->config;
  config.blocking = 1;
  HETCCL_CHECK(hetccl_comm_split_internal(comm, mine > 1 ? leader : NCCL_SPLIT_NOCOLOR,
                                          comm->rank, &config, leader, &comm->island));
  HETCCL_CHECK(hetccl_comm_split_internal(comm, comm->rank == leader ? 0 : NCCL_SPLIT_NOCOLOR,
                                          comm->rank, &config, comm->rank, &comm->leaders));
  comm->hier = 1;
  const char *inside = !comm->island ? "no one else"
                       : comm->island->vendor ? comm->island->vendor->backend : "engine";
  INFO(HETCCL_INIT, "rank %d of %d: hierarchical, %d islands; mine has %d ranks led by rank %d "
       "(inside it: %s)%s", comm->rank, n, islands, mine, leader, inside,
       comm->leaders ? "; this rank joins the leaders" : "");
  return ncclSuccess;
}

int hetccl_hier_allreduce_applies(ncclComm_t comm, size_t count, ncclRedOp_t op) {
  return comm->hier && count > 0 && (int)op >= (int)ncclSum && (int)op < (int)ncclAvg &&
         hetccl_group_depth() == 0;
}

static ncclResult_t child_error(ncclComm_t c) {
  if (!c) return ncclSuccess;
  if (c->vendor && c->vcomm) {
    ncclResult_t err = ncclSuccess;
    if (HETCCL_VENDOR_CALL(c->vendor, CommGetAsyncError, c->vcomm, &err) != ncclSuccess)
      return ncclInternalError;
    return err == ncclInProgress ? ncclSuccess : err;
  }
  ncclResult_t err = (ncclResult_t)__atomic_load_n(&c->error, __ATOMIC_ACQUIRE);
  return err == ncclInProgress ? ncclSuccess : err;
}

ncclResult_t hetccl_hier_error(ncclComm_t comm) {
  ncclResult_t err = child_error(comm->island);
  return err != ncclSuccess ? err : child_error(comm->leaders);
}

void hetccl_hier_finalize(ncclComm_t comm) {
  if (comm->island) (void)hetccl_comm_finalize(comm->island);
  if (comm->leaders) (void)hetccl_comm_finalize(comm->leaders);
}

void hetccl_hier_set_abort(ncclComm_t comm) {
  if (comm->island) __atomic_store_n(&comm->island->abort_flag, 1, __ATOMIC_RELEASE);
  if (comm->leaders) __atomic_store_n(&comm->leaders->abort_flag, 1, __ATOMIC_RELEASE);
}

void hetccl_hier_release(ncclComm_t comm, int abort) {
  ncclComm_t kids[2] = {comm->leaders, comm->island};
  comm->leaders = comm->island = NULL;
  for (int i = 0; i < 2; i++) {
    if (!kids[i]) continue;
    if (abort) (void)hetccl_comm_abort(kids[i]);
    else (void)hetccl_comm_destroy(kids[i]);
  }
}

/* A phase failed here: fail the engines of the sibling communicators too
 * (and the parent's), on their proxies, so that ranks waiting on this one
 * in another phase learn it now, with `why`, instead of at HETCCL_TIMEOUT.
 * A vendor island is left to the vendor, as NCCL leaves its own peers. */
typedef struct hier_fail {
  ncclResult_t res;
  char why[HETCCL_FAIL_TEXT];
} hier_fail_t;

static ncclResult_t fail_job(ncclComm_t c, void *arg) {
  const hier_fail_t *f = arg;
  if (c->engine) (void)hetccl_engine_fail(c->engine, f->res, f->why);
  return ncclSuccess;
}

static void fail_engine_of(ncclComm_t c, ncclResult_t res, const char *why) {
  if (!c || !c->engine) return;
  hier_fail_t *f = malloc(sizeof(*f));
  if (!f) return; /* the peers then wait out HETCCL_TIMEOUT */
  f->res = res;
  snprintf(f->why, sizeof(f->why), "%s", why);
  (void)hetccl_proxy_post(c, fail_job, f, NULL, NULL);
}

void hetccl_hier_fail(ncclComm_t comm, ncclResult_t res, const char *why) {
  fail_engine_of(comm->island, res, why);
  fail_engine_of(comm->leaders, res, why);
  fail_engine_of(comm, res, why);
}

/* --- the hierarchical forms --------------------------------------------------- */

int hetccl_hier_applies(ncclComm_t comm, const hetccl_op_t *op) {
  return op->kind == HETCCL_OP_AllReduce &&
         hetccl_hier_allreduce_applies(comm, op->count, op->redop);
}

/* One phase: op as `kind` on c (forwarded or engine), same buffers' owner. */
static ncclResult_t phase(ncclComm_t c, const hetccl_op_t *op, hetccl_op_kind_t kind,
                          const void *send, void *recv, int root) {
  hetccl_op_t p = *op;
  p.kind = kind;
  p.sendbuf = send;
  p.recvbuf = recv;
  p.root = root;
  if (kind != HETCCL_OP_AllReduce && kind != HETCCL_OP_Reduce) p.redop = HETCCL_NO_REDOP;
  return hetccl_dispatch(c, &p);
}

/* AllReduce: inside the island to its leader (island rank 0), across the
 * leaders, back inside the island. A one-rank island has only the middle
 * phase, out of place as asked (no island communicator). */
ncclResult_t hetccl_hier_run(ncclComm_t comm, const hetccl_op_t *op) {
  ncclComm_t island = comm->island, leaders = comm->leaders;
  int alone = island == NULL;
  const void *across = op->sendbuf;
  TRACE(HETCCL_COLL, "AllReduce rank %d: hierarchical, %zu x %s, island of %d%s", comm->rank,
        op->count, hetccl_dtype_name(op->dtype), alone ? 1 : island->nranks,
        leaders ? ", leader" : "");
  ncclResult_t res = ncclSuccess;
  int in_leaders = 0; /* which communicator the failing phase ran on */
  if (!alone) {
    res = phase(island, op, HETCCL_OP_Reduce, op->sendbuf, op->recvbuf, 0);
    across = op->recvbuf;
  }
  if (res == ncclSuccess && leaders) {
    in_leaders = 1;
    res = phase(leaders, op, HETCCL_OP_AllReduce, across, op->recvbuf, HETCCL_NO_ROOT);
  }
  if (res == ncclSuccess && !alone) {
    in_leaders = 0;
    res = phase(island, op, HETCCL_OP_Broadcast, op->recvbuf, op->recvbuf, 0);
  }
  if (res != ncclSuccess && res != ncclInProgress) {
    /* The phase logged its cause, naming ranks as this communicator does
     * (its engine and transports have the map); the message returned here
     * adds where it ran, and goes to the siblings as why. */
    char msg[HETCCL_ERRMSG_BYTES];
    snprintf(msg, sizeof(msg), "%s: rank %d: hierarchical %s failed %s: %.900s", op->fn,
             comm->rank, hetccl_func_name(hetccl_op_func(op->kind)),
             in_leaders ? "across the islands' leaders" : "inside its island", hetccl_last_error());
    hetccl_last_error_set(msg);
    hetccl_comm_set_error(comm, res);
    if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) /* abort tears them down */
      hetccl_hier_fail(comm, res, msg);
  }
  return res;
}
