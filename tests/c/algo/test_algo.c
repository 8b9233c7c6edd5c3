/* Every engine collective through the public API, against a reference that
 * each rank computes on its own from every rank's (deterministic) input.
 *
 *   test_algo NRANKS [quick|full|big|medium]
 *
 * Forks NRANKS processes, which share a unique id (made by rank 0 after
 * the fork, see common/share_id.h) and join with ncclCommInitRank; each
 * sweeps collective x dtype x op x count x in/out-of-place and checks its
 * own output (integers exactly, floats within a tolerance that allows for a
 * different reduction order). AllReduce results are also compared bitwise
 * across ranks (through a shared map). Knobs from the environment reach
 * every rank: HETCCL_ALGO, HETCCL_PIPELINE_CHUNK and HETCCL_SMALL_BYTES set
 * small make small buffers take the multi-piece ring paths. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/share_id.h"
#include "nccl.h"
#include "runtime/reduce.h" /* conversions only: compiled into this test */

enum { F_ALLREDUCE, F_BROADCAST, F_REDUCE, F_ALLGATHER, F_REDUCESCATTER, F_ALLTOALL,
       F_GATHER, F_SCATTER, F_COUNT };
static const char *const fnames[F_COUNT] = {"AllReduce", "Broadcast", "Reduce", "AllGather",
                                            "ReduceScatter", "AlltoAll", "Gather", "Scatter"};
static int reducing(int f) { return f == F_ALLREDUCE || f == F_REDUCE || f == F_REDUCESCATTER; }

/* ops tested: the built-ins plus PreMulSum */
#define OP_PREMUL 5
static const char *const opnames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};

/* Ranks a run may fork (the host engine's wide rules start above 8). */
#define MAX_RANKS 16

static int nranks, rank_;
static int failures;
static uint64_t *shared_hash; /* [test][rank] */
static int test_index;

#define FAIL(...)                                                              \
  do {                                                                         \
    if (failures++ < 10) {                                                     \
      fprintf(stderr, "rank %d: ", rank_);                                     \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
    }                                                                          \
  } while (0)

#define NCCLCHECK(call)                                                        \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank_, #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                         \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)

/* --- element values --------------------------------------------------------- */

static int is_int(ncclDataType_t t) { return t <= ncclUint64; }
static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static size_t esize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static int mant_bits(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return 10;
    case ncclBfloat16: return 7;
    case ncclFloat8e4m3: return 3;
    case ncclFloat8e5m2: return 2;
    case ncclFloat32: return 23;
    default: return 52;
  }
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Input of rank r, element i, for op `op` (floats: values every format
 * holds exactly; products stay powers of two). */
static double fvalue(int r, size_t i, int op, uint64_t seed) {
  uint64_t h = mix(seed ^ ((uint64_t)r << 40) ^ i);
  if (op == ncclProd) {
    static const double pv[] = {1, 2, 0.5, -1, 1, -2};
    return pv[h % 6];
  }
  return ((double)(int)(h % 9) - 4.0) / 2.0; /* -2 .. 2 step 0.5 */
}

static uint64_t ivalue(int r, size_t i, uint64_t seed) { return mix(seed ^ ((uint64_t)r << 40) ^ i ^ 0x55); }

static void put(ncclDataType_t t, void *buf, size_t i, double f, uint64_t u) {
  switch (t) {
    case ncclInt8: case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)u; break;
    case ncclInt32: case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)u; break;
    case ncclInt64: case ncclUint64: ((uint64_t *)buf)[i] = u; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = hetccl_float_to_half((float)f); break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = hetccl_float_to_bf16((float)f); break;
    case ncclFloat8e4m3: ((uint8_t *)buf)[i] = hetccl_float_to_e4m3((float)f); break;
    case ncclFloat8e5m2: ((uint8_t *)buf)[i] = hetccl_float_to_e5m2((float)f); break;
    case ncclFloat32: ((float *)buf)[i] = (float)f; break;
    default: ((double *)buf)[i] = f; break;
  }
}

static double getf(ncclDataType_t t, const void *buf, size_t i) {
  switch (t) {
    case ncclFloat16: return hetccl_half_to_float(((const uint16_t *)buf)[i]);
    case ncclBfloat16: return hetccl_bf16_to_float(((const uint16_t *)buf)[i]);
    case ncclFloat8e4m3: return hetccl_e4m3_to_float(((const uint8_t *)buf)[i]);
    case ncclFloat8e5m2: return hetccl_e5m2_to_float(((const uint8_t *)buf)[i]);
    case ncclFloat32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
  }
}

static uint64_t geti(ncclDataType_t t, const void *buf, size_t i) {
  switch (esize(t)) {
    case 1: return ((const uint8_t *)buf)[i];
    case 4: return ((const uint32_t *)buf)[i];
    default: return ((const uint64_t *)buf)[i];
  }
}

static uint64_t trunc_bits(ncclDataType_t t, uint64_t v) {
  size_t b = 8 * esize(t);
  return b == 64 ? v : v & ((1ull << b) - 1);
}

static int64_t sext(ncclDataType_t t, uint64_t v) {
  switch (t) {
    case ncclInt8: return (int8_t)v;
    case ncclInt32: return (int32_t)v;
    default: return (int64_t)v;
  }
}

/* Fill element i of a buffer with rank r's input. */
static void fill(ncclDataType_t t, void *buf, size_t i, int r, size_t gi, int op, uint64_t seed) {
  put(t, buf, i, fvalue(r, gi, op, seed), ivalue(r, gi, seed));
}

/* Reduced value over all ranks of global element gi; checks `buf[i]`. */
static void check_reduced(ncclDataType_t t, const void *buf, size_t i, size_t gi, int op,
                          uint64_t seed, double scalar, const char *what) {
  if (is_int(t)) {
    uint64_t acc = 0;
    for (int r = 0; r < nranks; r++) {
      uint64_t x = trunc_bits(t, ivalue(r, gi, seed));
      if (op == OP_PREMUL) x = trunc_bits(t, x * (uint64_t)(int64_t)scalar);
      if (r == 0) { acc = x; continue; }
      switch (op) {
        case ncclProd: acc = trunc_bits(t, acc * x); break;
        case ncclMax: acc = (is_signed(t) ? sext(t, x) > sext(t, acc) : x > acc) ? x : acc; break;
        case ncclMin: acc = (is_signed(t) ? sext(t, x) < sext(t, acc) : x < acc) ? x : acc; break;
        default: acc = trunc_bits(t, acc + x); break;
      }
    }
    if (op == ncclAvg)
      acc = is_signed(t) ? trunc_bits(t, (uint64_t)(sext(t, acc) / nranks)) : acc / (uint64_t)nranks;
    uint64_t got = geti(t, buf, i);
    if (got != acc)
      FAIL("%s: [%zu] = 0x%llx, expected 0x%llx", what, i, (unsigned long long)got,
           (unsigned long long)acc);
    return;
  }
  double acc = 0, mag = 0;
  for (int r = 0; r < nranks; r++) {
    double x = fvalue(r, gi, op, seed);
    if (op == OP_PREMUL) x *= scalar;
    mag += fabs(x);
    if (r == 0) { acc = x; continue; }
    switch (op) {
      case ncclProd: acc *= x; break;
      case ncclMax: acc = x > acc ? x : acc; break;
      case ncclMin: acc = x < acc ? x : acc; break;
      default: acc += x; break;
    }
  }
  if (op == ncclAvg) acc /= nranks, mag /= nranks;
  double got = getf(t, buf, i), tol = ldexp(mag, -mant_bits(t)) * (nranks + 1) + 1e-300;
  if (!(fabs(got - acc) <= tol))
    FAIL("%s: [%zu] = %g, expected %g (tol %g)", what, i, got, acc, tol);
}

static void check_copy(ncclDataType_t t, const void *buf, size_t i, int r, size_t gi,
                       uint64_t seed, const char *what) {
  unsigned char want[8];
  fill(t, want, 0, r, gi, ncclSum, seed);
  if (memcmp((const char *)buf + i * esize(t), want, esize(t)))
    FAIL("%s: [%zu] differs from rank %d element %zu", what, i, r, gi);
}

/* --- one collective --------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

static void run_one(ncclComm_t comm, int f, ncclDataType_t t, int op, size_t count, int inplace,
                    int root) {
  int n = nranks, me = rank_;
  size_t es = esize(t);
  uint64_t seed = mix(((uint64_t)f << 32) ^ ((uint64_t)t << 24) ^ ((uint64_t)op << 16) ^ count);
  size_t sendcount = count, recvcount = count; /* elements */
  switch (f) {
    case F_ALLGATHER: recvcount = count * n; break;
    case F_REDUCESCATTER: sendcount = count * n; break;
    case F_ALLTOALL: sendcount = recvcount = count * n; break;
    case F_GATHER: recvcount = count * n; break;
    case F_SCATTER: sendcount = count * n; break;
    default: break;
  }
  size_t big = (sendcount > recvcount ? sendcount : recvcount) + 1;
  char *sbuf = malloc(big * es + 64), *rbuf = malloc(big * es + 64);
  if (!sbuf || !rbuf) { FAIL("out of memory"); exit(2); }
  memset(rbuf, 0xa5, big * es);
  /* Where the input goes: in place, inside recvbuf per NCCL's conventions. */
  char *send = sbuf, *recv = rbuf;
  if (inplace) {
    send = recv = rbuf;
    if (f == F_ALLGATHER) send = rbuf + (size_t)me * count * es;
    if (f == F_REDUCESCATTER) recv = rbuf + (size_t)me * count * es;
    if (f == F_GATHER && me == root) send = rbuf + (size_t)root * count * es;
    if (f == F_SCATTER && me == root) recv = rbuf + (size_t)root * count * es;
  }
  int valued_op = reducing(f) ? op : ncclSum;
  for (size_t i = 0; i < sendcount; i++) {
    size_t gi = i;
    if (f == F_ALLTOALL) gi = i; /* block j of rank r: elements j*count.. */
    fill(t, send, i, me, gi, valued_op, seed);
  }
  ncclRedOp_t rop = op < ncclNumOps ? (ncclRedOp_t)op : ncclSum;
  double scalar = 0;
  if (op == OP_PREMUL) {
    unsigned char sc[8];
    scalar = is_int(t) ? 3 : 0.5;
    put(t, sc, 0, scalar, (uint64_t)3);
    NCCLCHECK(ncclRedOpCreatePreMulSum(&rop, sc, t, ncclScalarHostImmediate, comm));
  }
  void *rootrecv = (f == F_REDUCE && me != root && !inplace) ? NULL : recv;
  ncclResult_t res = ncclSuccess;
  switch (f) {
    case F_ALLREDUCE: res = ncclAllReduce(send, recv, count, t, rop, comm, NULL); break;
    case F_BROADCAST:
      res = ncclBroadcast(me == root ? send : NULL, recv, count, t, root, comm, NULL);
      break;
    case F_REDUCE: res = ncclReduce(send, rootrecv, count, t, rop, root, comm, NULL); break;
    case F_ALLGATHER: res = ncclAllGather(send, recv, count, t, comm, NULL); break;
    case F_REDUCESCATTER: res = ncclReduceScatter(send, recv, count, t, rop, comm, NULL); break;
    case F_ALLTOALL: res = ncclAlltoAll(send, recv, count, t, comm, NULL); break;
    case F_GATHER: res = ncclGather(send, me == root ? recv : NULL, count, t, root, comm, NULL); break;
    case F_SCATTER: res = ncclScatter(me == root ? send : NULL, recv, count, t, root, comm, NULL); break;
  }
  char what[160];
  snprintf(what, sizeof(what), "%s %s %s count %zu %s root %d n %d", fnames[f],
           hetccl_dtype_name(t), reducing(f) ? opnames[op] : "-", count,
           inplace ? "in-place" : "out-of-place", root, n);
  if (res != ncclSuccess) {
    FAIL("%s: returned %s (%s)", what, ncclGetErrorString(res), ncclGetLastError(comm));
    exit(2);
  }
  if (op == OP_PREMUL) NCCLCHECK(ncclRedOpDestroy(rop, comm));
  switch (f) {
    case F_ALLREDUCE:
      for (size_t i = 0; i < count; i++) check_reduced(t, recv, i, i, op, seed, scalar, what);
      shared_hash[(size_t)test_index * MAX_RANKS + me] = hash_bytes(recv, count * es);
      break;
    case F_REDUCE:
      if (me == root)
        for (size_t i = 0; i < count; i++) check_reduced(t, recv, i, i, op, seed, scalar, what);
      break;
    case F_REDUCESCATTER:
      for (size_t i = 0; i < count; i++)
        check_reduced(t, recv, i, (size_t)me * count + i, op, seed, scalar, what);
      break;
    case F_BROADCAST:
      for (size_t i = 0; i < count; i++) check_copy(t, recv, i, root, i, seed, what);
      break;
    case F_ALLGATHER:
      for (size_t i = 0; i < count * n; i++) check_copy(t, recv, i, (int)(i / count), i % count, seed, what);
      break;
    case F_ALLTOALL: /* block j of rank r went to rank j as its block r */
      for (size_t i = 0; i < count * n; i++)
        check_copy(t, recv, i, (int)(i / count), (size_t)me * count + i % count, seed, what);
      break;
    case F_GATHER:
      if (me == root)
        for (size_t i = 0; i < count * n; i++) check_copy(t, recv, i, (int)(i / count), i % count, seed, what);
      break;
    case F_SCATTER:
      for (size_t i = 0; i < count; i++) check_copy(t, recv, i, root, (size_t)me * count + i, seed, what);
      break;
  }
  /* Nothing past the output may change. */
  if (!inplace) {
    size_t outbytes = count * es;
    if (f == F_ALLGATHER || f == F_ALLTOALL || f == F_GATHER) outbytes = recvcount * es;
    int has_out = !((f == F_REDUCE || f == F_GATHER) && me != root);
    if (has_out && (unsigned char)rbuf[outbytes] != 0xa5) FAIL("%s: wrote past the end of recvbuf", what);
  }
  free(sbuf);
  free(rbuf);
  test_index++;
}

static const ncclDataType_t all_types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                           ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16,
                                           ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES (sizeof(all_types) / sizeof(all_types[0]))

static void sweep(ncclComm_t comm, const char *mode) {
  /* medium: the sizes the selector gives halving-doubling by default on
   * more than 4 ranks (algo/select.c: 8 KiB < bytes <= 256 KiB), on the
   * types and operators of big */
  int medium = !strcmp(mode, "medium");
  int big = !strcmp(mode, "big") || medium, full = !strcmp(mode, "full") || big;
  size_t counts[] = {0, 1, 7, 1000, 10000, 60000, 1000003};
  int ncounts = (int)(sizeof(counts) / sizeof(counts[0]));
  for (int ci = 0; ci < ncounts; ci++) {
    size_t count = counts[ci];
    if (medium ? count != 10000 && count != 60000 : big ? count < 1000003 : count > 1000) continue;
    for (int f = 0; f < F_COUNT; f++) {
      for (size_t ti = 0; ti < NTYPES; ti++) {
        ncclDataType_t t = all_types[ti];
        if (big && t != ncclFloat32 && t != ncclInt8 && t != ncclBfloat16) continue;
        if (!full && !big && t != ncclFloat32 && t != ncclInt32 && t != ncclFloat16 &&
            t != ncclFloat8e4m3 && t != ncclUint64)
          continue;
        int nops = reducing(f) ? 6 : 1;
        for (int op = 0; op < nops; op++) {
          if (big && op != ncclSum && op != ncclAvg && op != OP_PREMUL && op != ncclMax) continue;
          for (int inplace = 0; inplace < 2; inplace++) {
            int root = (f == F_BROADCAST || f == F_REDUCE || f == F_GATHER || f == F_SCATTER)
                           ? (int)((ci + ti + op + inplace) % nranks) : 0;
            run_one(comm, f, t, op, count, inplace, root);
          }
        }
      }
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NRANKS [quick|full|big|medium]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  const char *mode = argc > 2 ? argv[2] : "quick";
  if (n < 1 || n > MAX_RANKS) return 2;
  size_t maxtests = 200000;
  shared_hash = mmap(NULL, maxtests * MAX_RANKS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared_hash == MAP_FAILED) return 2;
  nranks = n;
  int idpipe[2];
  if (pipe(idpipe) != 0) return 2;
  pid_t pids[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      rank_ = r;
      alarm(1200);
      ncclUniqueId id;
      if (share_id(&id, idpipe, r, n, ncclGetUniqueId) != 0) {
        fprintf(stderr, "rank %d: no unique id (%s)\n", r, ncclGetLastError(NULL));
        exit(2);
      }
      ncclComm_t comm;
      NCCLCHECK(ncclCommInitRank(&comm, n, id, r));
      sweep(comm, mode);
      NCCLCHECK(ncclCommDestroy(comm));
      if (r == 0) shared_hash[(maxtests - 1) * MAX_RANKS] = (uint64_t)test_index;
      exit(failures ? 1 : 0); /* exit, not _exit: a leak checker looks at each rank */
    }
  }
  close(idpipe[0]);
  close(idpipe[1]);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d: %s %d\n", r, WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      bad = 1;
    }
  }
  /* AllReduce: bitwise equal on every rank (unused slots are zero). */
  for (size_t k = 0; k < maxtests - 1 && !bad; k++)
    for (int r = 1; r < n; r++)
      if (shared_hash[k * MAX_RANKS + r] != shared_hash[k * MAX_RANKS]) {
        fprintf(stderr, "test %zu: AllReduce result differs between rank 0 and rank %d\n", k, r);
        bad = 1;
        break;
      }
  if (!bad)
    printf("algo: %d ranks, %s sweep: %llu collectives match the reference\n", n, mode,
           (unsigned long long)shared_hash[(maxtests - 1) * MAX_RANKS]);
  return bad;
}
