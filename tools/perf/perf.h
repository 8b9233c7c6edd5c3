/* hetccl-perf: collective benchmarks in the nccl-tests style.
 *
 * The program never links an NCCL library: it resolves the API with dlopen
 * (nccl_api.c) so that one binary measures hetccl or a real libnccl.so.2,
 * and it reaches CUDA the same way (memory.c), so that it builds and runs
 * on machines with no CUDA at all.
 *
 * Files: main.c (options, ranks, threads, the sweep and the table),
 * nccl_api.c (the API table), memory.c (host or CUDA buffers and streams),
 * dtype.c (element types, test values, expected results), colls.c (one
 * entry per collective: buffer sizes, launch, expected output, busbw),
 * report.c (the -J JSON file and the progress line on stderr). */
#ifndef HETCCL_PERF_H_
#define HETCCL_PERF_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* ---- the NCCL API, resolved at run time (nccl_api.c) ---- */

struct perf_nccl {
  void *handle;
  char path[4096];  /* the file dlopen'ed, as the loader resolved it */
  int version;      /* ncclGetVersion */
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                         ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  /* NCCL 2.28 and later; NULL when absent (colls.c then composes them from
   * grouped Send/Recv, as older nccl-tests did). */
  ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                           cudaStream_t);
  ncclResult_t (*Gather)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                         cudaStream_t);
  ncclResult_t (*Scatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                          cudaStream_t);
  /* For -R 1; NULL when absent (the option is then refused). */
  ncclResult_t (*CommRegister)(const ncclComm_t, void *, size_t, void **);
  ncclResult_t (*CommDeregister)(const ncclComm_t, void *);
};

/* Loads the library named by $HETCCL_PERF_LIB, else libhetccl.so found
 * beside the executable (installed package) or in ../libhetccl/ (build
 * tree). Returns 0, or -1 after printing why. */
int perf_nccl_load(struct perf_nccl *api, const char *exe_dir);

/* ---- memory and streams (memory.c) ---- */

enum perf_mem_kind { PERF_MEM_HOST, PERF_MEM_CUDA };

/* Loads libcudart for PERF_MEM_CUDA (0, or -1 after printing why); a no-op
 * for host memory. */
int perf_mem_init(enum perf_mem_kind kind);
int perf_mem_device_count(void);
void perf_mem_set_device(int dev);
void *perf_mem_alloc(size_t bytes);
void perf_mem_free(void *ptr);
void perf_mem_to_device(void *dst, const void *src, size_t bytes);
void perf_mem_to_host(void *dst, const void *src, size_t bytes);
/* A stream for NCCL calls: NULL with host memory. */
cudaStream_t perf_mem_stream_create(void);
void perf_mem_stream_destroy(cudaStream_t stream);
void perf_mem_stream_sync(cudaStream_t stream);
/* "host" or the device's PCI bus id. */
void perf_mem_device_name(int dev, char *buf, size_t len);

/* ---- element types and test values (dtype.c) ---- */

struct perf_dtype {
  const char *name;
  ncclDataType_t nccl;
  size_t size;
  int is_float;
  double exact_max;   /* largest integer every value up to which is exact */
  int max_pow2;       /* largest k with 2^k finite and exact */
  double epsilon;     /* relative spacing at 1 (floating types), else 0 */
  void (*store)(void *dst, double value);
  double (*load)(const void *src);
};

const struct perf_dtype *perf_dtype_find(const char *name);
const struct perf_dtype *perf_dtype_at(int index); /* NULL past the end */

struct perf_redop {
  const char *name;
  ncclRedOp_t nccl;
};

const struct perf_redop *perf_redop_find(const char *name);
const struct perf_redop *perf_redop_at(int index);

/* The value rank `rank` puts at element `index` of its input, chosen so
 * that the reduction `op` over `nranks` ranks, in any order, is exact in
 * `type`. */
double perf_value(const struct perf_dtype *type, ncclRedOp_t op, int nranks, int rank,
                  size_t index);
/* The reduction `op` of perf_value over all ranks at `index`, rounded as the
 * type stores it. */
double perf_reduced(const struct perf_dtype *type, ncclRedOp_t op, int nranks, size_t index);
/* Whether an output element equals what was expected (a tolerance only
 * where the library may round: ncclAvg on floating types). */
int perf_value_matches(const struct perf_dtype *type, ncclRedOp_t op, int nranks, double got,
                       double expected);

/* ---- collectives (colls.c) ---- */

/* One rank of one test: its communicator, stream and buffers. */
struct perf_rank {
  ncclComm_t comm;
  cudaStream_t stream;
  int rank;       /* in the communicator */
  int device;     /* CUDA device, or -1 with host memory */
  void *send;     /* device (or host) buffers, sized for the largest test */
  void *recv;
  void *stage;    /* host staging for fills and checks (CUDA memory only) */
  void *stats;    /* small device buffer for the cross-rank statistics */
  void *send_base, *recv_base; /* as allocated; send and recv sit -u elements past them */
  void *send_reg, *recv_reg;   /* -R 1: ncclCommRegister handles */
};

/* The shapes of one test size, in elements. */
struct perf_counts {
  size_t send, recv;   /* elements in each buffer */
  size_t param;        /* the count passed to the NCCL call */
  size_t send_inplace; /* element offsets into recv for the in-place test */
  size_t recv_inplace;
  size_t bytes;        /* the "size" column: max of the two buffers */
};

struct perf_args {
  const struct perf_nccl *api;
  const struct perf_dtype *type;
  ncclRedOp_t op;
  int root;
  int nranks;
};

struct perf_coll {
  const char *name;
  int has_op, has_root;
  /* 0 where the in-place form overlaps what is sent with what is received
   * (alltoall, sendrecv): NCCL leaves the result undefined, so in-place is
   * timed but not checked ("N/A", as nccl-tests prints). */
  int check_inplace;
  /* busbw = algbw * factor */
  double (*bus_factor)(int nranks);
  void (*counts)(struct perf_counts *out, size_t elements, int nranks, int rank,
                 size_t type_size);
  /* Issues the operation for one rank (inside the caller's group). */
  ncclResult_t (*launch)(const struct perf_args *a, const struct perf_counts *c,
                         const void *send, void *recv, ncclComm_t comm, int rank,
                         cudaStream_t stream);
  /* Expected value of output element `i` at `rank`; returns 0 where the
   * output is not defined (a non-root rank of reduce or gather). */
  int (*expected)(const struct perf_args *a, const struct perf_counts *c, int rank, size_t i,
                  double *value);
};

const struct perf_coll *perf_coll_find(const char *name);
const struct perf_coll *perf_coll_at(int index);

/* ---- command line (options.c) ---- */

#define PERF_MAX_TYPES 16
#define PERF_MAX_OPS 8

struct perf_options {
  const struct perf_coll *coll;
  size_t min_bytes, max_bytes, step_bytes;
  double step_factor;
  int iters, warmup;
  int agg_iters;     /* -m: operations per iteration, in one group */
  int run_cycles;    /* -N: sweeps; 0 for ever */
  int check;         /* -c: checked runs per size; 0 none */
  int blocking;      /* -z: 0 none, 1 wait + barrier, 2 wait, 3 wait + barrier out of the time */
  int parallel_init; /* -p: each thread makes its ranks with ncclCommInitRank */
  int stream_null;   /* -y: the NULL stream for CUDA memory */
  int timeout_s;     /* -T: seconds one size's test may take; 0 none */
  int report_cputime, report_timestamps; /* -C, -S */
  int local_register; /* -R 1: ncclCommRegister on the buffers */
  int unalign;       /* -u: elements past an aligned start */
  double min_bw;     /* NCCL_TESTS_MIN_BW in GB/s; < 0 unset */
  int threads, gpus;
  int root;
  int average; /* time reported: 0 rank 0, 1 mean, 2 min, 3 max over ranks */
  enum perf_mem_kind mem;
  const struct perf_dtype *types[PERF_MAX_TYPES];
  int ntypes;
  const struct perf_redop *ops[PERF_MAX_OPS];
  int nops;
  const char *json_path; /* -J: every row as JSON; NULL: none */
  double progress_after; /* --progress S: a line on stderr once a sweep runs S s; < 0 never */
};

/* Parses argv (the collective as a subcommand, or from the program's name
 * as in all_reduce_perf); returns 0, 1 after --help, -1 after an error. */
int perf_options_parse(struct perf_options *o, int argc, char **argv);

/* ---- JSON rows and progress (report.c), on the printing thread only ---- */

struct perf_report_info {
  const char *collective, *library, *memory;
  int nccl_version, nranks, processes, threads, gpus, iters, warmup, check, average;
  double progress_after; /* seconds; < 0: no progress line */
};

struct perf_report_result {
  double time_us, algbw, busbw, wrong;
  int checked; /* 0: "N/A" in the table, null in JSON */
};

struct perf_report_row {
  const char *collective, *type, *redop;
  size_t size, count;
  int root;
  struct perf_report_result oop, ip;
  int index, total; /* this row's place in the whole sweep */
};

/* Opens the JSON file (path NULL: none) and starts the clock of the
 * progress line; 0, or -1 after printing why. */
int perf_report_open(const char *path, const struct perf_report_info *info);
void perf_report_row(const struct perf_report_row *row);
/* Ends the document with the totals of the table's last lines. */
void perf_report_close(double wrong, double avg_busbw);

#endif
