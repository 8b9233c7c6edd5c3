/* One entry per collective: how a test size maps to buffers and counts,
 * how one rank issues the operation, what its output must hold, and the
 * bus-bandwidth factor. Sizes, in-place layouts and factors follow
 * nccl-tests, so that figures compare with published ones. */
#include <string.h>

#include "perf.h"

#define AT(buf, elems, type) ((char *)(buf) + (size_t)(elems) * (type)->size)
#define CAT(buf, elems, type) ((const char *)(buf) + (size_t)(elems) * (type)->size)

static double factor_one(int n) { (void)n; return 1.0; }
static double factor_allreduce(int n) { return 2.0 * (n - 1) / n; }
static double factor_spread(int n) { return (double)(n - 1) / n; }

static void shape(struct perf_counts *c, size_t send, size_t recv, size_t param,
                  size_t send_inplace, size_t recv_inplace, size_t type_size)
{
  c->send = send;
  c->recv = recv;
  c->param = param;
  c->send_inplace = send_inplace;
  c->recv_inplace = recv_inplace;
  c->bytes = (send > recv ? send : recv) * type_size;
}

/* ---- counts: `elements` is the size column divided by the type size ---- */

static void counts_same(struct perf_counts *c, size_t n, int nranks, int rank, size_t ts)
{
  (void)nranks, (void)rank;
  shape(c, n, n, n, 0, 0, ts);
}

/* each rank contributes n/nranks, everyone (or the root) gets them all */
static void counts_gather(struct perf_counts *c, size_t n, int nranks, int rank, size_t ts)
{
  size_t per = n / (size_t)nranks;
  shape(c, per, per * nranks, per, per * rank, 0, ts);
}

/* the whole input is split, rank r keeps (or gets) part r */
static void counts_scatter(struct perf_counts *c, size_t n, int nranks, int rank, size_t ts)
{
  size_t per = n / (size_t)nranks;
  shape(c, per * nranks, per, per, 0, per * rank, ts);
}

static void counts_alltoall(struct perf_counts *c, size_t n, int nranks, int rank, size_t ts)
{
  size_t per = n / (size_t)nranks;
  (void)rank;
  shape(c, per * nranks, per * nranks, per, 0, 0, ts);
}

/* ---- launches ---- */

static ncclResult_t launch_allreduce(const struct perf_args *a, const struct perf_counts *c,
                                     const void *s, void *r, ncclComm_t comm, int rank,
                                     cudaStream_t st)
{
  (void)rank;
  return a->api->AllReduce(s, r, c->param, a->type->nccl, a->op, comm, st);
}

static ncclResult_t launch_allgather(const struct perf_args *a, const struct perf_counts *c,
                                     const void *s, void *r, ncclComm_t comm, int rank,
                                     cudaStream_t st)
{
  (void)rank;
  return a->api->AllGather(s, r, c->param, a->type->nccl, comm, st);
}

static ncclResult_t launch_reducescatter(const struct perf_args *a,
                                         const struct perf_counts *c, const void *s, void *r,
                                         ncclComm_t comm, int rank, cudaStream_t st)
{
  (void)rank;
  return a->api->ReduceScatter(s, r, c->param, a->type->nccl, a->op, comm, st);
}

static ncclResult_t launch_broadcast(const struct perf_args *a, const struct perf_counts *c,
                                     const void *s, void *r, ncclComm_t comm, int rank,
                                     cudaStream_t st)
{
  (void)rank;
  return a->api->Broadcast(s, r, c->param, a->type->nccl, a->root, comm, st);
}

static ncclResult_t launch_reduce(const struct perf_args *a, const struct perf_counts *c,
                                  const void *s, void *r, ncclComm_t comm, int rank,
                                  cudaStream_t st)
{
  (void)rank;
  return a->api->Reduce(s, r, c->param, a->type->nccl, a->op, a->root, comm, st);
}

/* Several point-to-point calls that must progress together: one group
 * (nested inside the caller's, which NCCL allows). */
#define GROUP(api, body)                                                       \
  do {                                                                         \
    ncclResult_t res_ = (api)->GroupStart();                                   \
    if (res_ != ncclSuccess)                                                   \
      return res_;                                                             \
    body;                                                                      \
    return (api)->GroupEnd();                                                  \
  } while (0)

#define TRY(call)                                                              \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      a->api->GroupEnd();                                                      \
      return r_;                                                               \
    }                                                                          \
  } while (0)

static ncclResult_t launch_alltoall(const struct perf_args *a, const struct perf_counts *c,
                                    const void *s, void *r, ncclComm_t comm, int rank,
                                    cudaStream_t st)
{
  (void)rank;
  if (a->api->AlltoAll)
    return a->api->AlltoAll(s, r, c->param, a->type->nccl, comm, st);
  GROUP(a->api, for (int p = 0; p < a->nranks; p++) {
    TRY(a->api->Send(CAT(s, c->param * p, a->type), c->param, a->type->nccl, p, comm, st));
    TRY(a->api->Recv(AT(r, c->param * p, a->type), c->param, a->type->nccl, p, comm, st));
  });
}

static ncclResult_t launch_gather(const struct perf_args *a, const struct perf_counts *c,
                                  const void *s, void *r, ncclComm_t comm, int rank,
                                  cudaStream_t st)
{
  if (a->api->Gather)
    return a->api->Gather(s, r, c->param, a->type->nccl, a->root, comm, st);
  GROUP(a->api, {
    if (rank == a->root)
      for (int p = 0; p < a->nranks; p++)
        TRY(a->api->Recv(AT(r, c->param * p, a->type), c->param, a->type->nccl, p, comm, st));
    TRY(a->api->Send(s, c->param, a->type->nccl, a->root, comm, st));
  });
}

static ncclResult_t launch_scatter(const struct perf_args *a, const struct perf_counts *c,
                                   const void *s, void *r, ncclComm_t comm, int rank,
                                   cudaStream_t st)
{
  if (a->api->Scatter)
    return a->api->Scatter(s, r, c->param, a->type->nccl, a->root, comm, st);
  GROUP(a->api, {
    if (rank == a->root)
      for (int p = 0; p < a->nranks; p++)
        TRY(a->api->Send(CAT(s, c->param * p, a->type), c->param, a->type->nccl, p, comm, st));
    TRY(a->api->Recv(r, c->param, a->type->nccl, a->root, comm, st));
  });
}

/* nccl-tests' sendrecv: every rank sends to the next and receives from the
 * previous one, both at once. */
static ncclResult_t launch_sendrecv(const struct perf_args *a, const struct perf_counts *c,
                                    const void *s, void *r, ncclComm_t comm, int rank,
                                    cudaStream_t st)
{
  int n = a->nranks;
  GROUP(a->api, {
    TRY(a->api->Send(s, c->param, a->type->nccl, (rank + 1) % n, comm, st));
    TRY(a->api->Recv(r, c->param, a->type->nccl, (rank - 1 + n) % n, comm, st));
  });
}

/* ---- expected outputs ---- */

static double input(const struct perf_args *a, int rank, size_t i)
{
  return perf_value(a->type, a->op, a->nranks, rank, i);
}

static int expect_allreduce(const struct perf_args *a, const struct perf_counts *c, int rank,
                            size_t i, double *v)
{
  (void)c, (void)rank;
  *v = perf_reduced(a->type, a->op, a->nranks, i);
  return 1;
}

static int expect_allgather(const struct perf_args *a, const struct perf_counts *c, int rank,
                            size_t i, double *v)
{
  (void)rank;
  *v = input(a, (int)(i / c->param), i % c->param);
  return 1;
}

static int expect_reducescatter(const struct perf_args *a, const struct perf_counts *c,
                                int rank, size_t i, double *v)
{
  *v = perf_reduced(a->type, a->op, a->nranks, (size_t)rank * c->param + i);
  return 1;
}

static int expect_broadcast(const struct perf_args *a, const struct perf_counts *c, int rank,
                            size_t i, double *v)
{
  (void)c, (void)rank;
  *v = input(a, a->root, i);
  return 1;
}

static int expect_reduce(const struct perf_args *a, const struct perf_counts *c, int rank,
                         size_t i, double *v)
{
  return rank == a->root ? expect_allreduce(a, c, rank, i, v) : 0;
}

static int expect_alltoall(const struct perf_args *a, const struct perf_counts *c, int rank,
                           size_t i, double *v)
{
  *v = input(a, (int)(i / c->param), (size_t)rank * c->param + i % c->param);
  return 1;
}

static int expect_gather(const struct perf_args *a, const struct perf_counts *c, int rank,
                         size_t i, double *v)
{
  return rank == a->root ? expect_allgather(a, c, rank, i, v) : 0;
}

static int expect_scatter(const struct perf_args *a, const struct perf_counts *c, int rank,
                          size_t i, double *v)
{
  *v = input(a, a->root, (size_t)rank * c->param + i);
  return 1;
}

static int expect_sendrecv(const struct perf_args *a, const struct perf_counts *c, int rank,
                           size_t i, double *v)
{
  (void)c;
  *v = input(a, (rank - 1 + a->nranks) % a->nranks, i);
  return 1;
}

static const struct perf_coll colls[] = {
  {"all_reduce", 1, 0, 1, factor_allreduce, counts_same, launch_allreduce, expect_allreduce},
  {"all_gather", 0, 0, 1, factor_spread, counts_gather, launch_allgather, expect_allgather},
  {"broadcast", 0, 1, 1, factor_one, counts_same, launch_broadcast, expect_broadcast},
  {"reduce", 1, 1, 1, factor_one, counts_same, launch_reduce, expect_reduce},
  {"reduce_scatter", 1, 0, 1, factor_spread, counts_scatter, launch_reducescatter,
   expect_reducescatter},
  {"alltoall", 0, 0, 0, factor_spread, counts_alltoall, launch_alltoall, expect_alltoall},
  {"gather", 0, 1, 1, factor_spread, counts_gather, launch_gather, expect_gather},
  {"scatter", 0, 1, 1, factor_spread, counts_scatter, launch_scatter, expect_scatter},
  {"sendrecv", 0, 0, 0, factor_one, counts_same, launch_sendrecv, expect_sendrecv},
};

const struct perf_coll *perf_coll_at(int index)
{
  return index >= 0 && (size_t)index < sizeof colls / sizeof colls[0] ? &colls[index] : NULL;
}

/* "all_reduce", "allreduce", "all-reduce" and "all_reduce_perf" name the
 * same test. */
const struct perf_coll *perf_coll_find(const char *name)
{
  char want[64];
  size_t n = 0;
  for (const char *p = name; *p && n + 1 < sizeof want; p++)
    if (*p != '_' && *p != '-')
      want[n++] = *p;
  want[n] = 0;
  if (n > 4 && strcmp(want + n - 4, "perf") == 0)
    want[n - 4] = 0;
  for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
    char have[64];
    size_t m = 0;
    for (const char *p = colls[i].name; *p; p++)
      if (*p != '_')
        have[m++] = *p;
    have[m] = 0;
    if (strcmp(want, have) == 0)
      return &colls[i];
  }
  return NULL;
}
