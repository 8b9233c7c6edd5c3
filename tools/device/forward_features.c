/* The forwarded features that the PyTorch and CuPy drop-ins do not reach,
 * as a program built against the real NCCL's own header and linked to the
 * real libnccl.so.2, on one GPU (one-rank communicators):
 *
 *   nonblocking init (config.blocking = 0) polled with ncclCommGetAsyncError,
 *   allreduce, group of send/recv to self, PreMulSum with a device scalar,
 *   CUDA graph capture and replay, ncclMemAlloc + ncclCommRegister +
 *   ncclCommWindowRegister, split, shrink, finalize, destroy, abort.
 *
 * Each step prints one line "step: result-codes values verdict"; the line
 * holds no pointer or time, so the run against NCCL and the run under
 * LD_PRELOAD=libhetccl.so must print the same text (forward_features.sh
 * compares them). Exit status 1 if any step's values are wrong.
 *
 *   nvcc -o ff tools/device/forward_features.c -I$NCCL/include -L$NCCL/lib -l:libnccl.so.2
 */
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define COUNT (1 << 20)

static int failures;

/* A wrong step: NCCL's own explanation goes to stderr (not compared: the
 * text may name addresses). */
static void explain(const char *step) {
  fprintf(stderr, "%s: ncclGetLastError: %s\n", step, ncclGetLastError(NULL));
}

static void verdict(const char *step, int ok, const char *fmt, double a, double b) {
  printf("%s: ", step);
  printf(fmt, a, b);
  printf(" %s\n", ok ? "ok" : "WRONG");
  fflush(stdout);
  if (!ok) {
    failures++;
    explain(step);
  }
}

/* Count a step's verdict, explaining a wrong one. */
static void tally(const char *step, int ok) {
  if (!ok) {
    failures++;
    explain(step);
  }
}

#define CUDA(call)                                                                     \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Poll a nonblocking communicator until it leaves ncclInProgress (30 s cap). */
static ncclResult_t wait_comm(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  double t0 = now();
  while (st == ncclInProgress && now() - t0 < 30) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
  }
  return st;
}

static int ok_rc(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

/* Sum of a device float buffer, on the host in double. */
static double dsum(const float *d, float *h) {
  CUDA(cudaMemcpy(h, d, COUNT * sizeof(float), cudaMemcpyDeviceToHost));
  double s = 0;
  for (int i = 0; i < COUNT; i++) s += h[i];
  return s;
}

/* cudaMemcpy from pageable memory may return before the device has the
 * data; the device sync orders it before work on non-blocking streams. */
static void fill(float *d, float *h, float v) {
  for (int i = 0; i < COUNT; i++) h[i] = v;
  CUDA(cudaMemcpy(d, h, COUNT * sizeof(float), cudaMemcpyHostToDevice));
  CUDA(cudaDeviceSynchronize());
}

int main(void) {
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  printf("version: rc %d %d\n", r, version);
  CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float *x, *y, *z, *host = malloc(COUNT * sizeof(float));
  CUDA(cudaMalloc((void **)&x, COUNT * sizeof(float)));
  CUDA(cudaMalloc((void **)&y, COUNT * sizeof(float)));
  CUDA(cudaMalloc((void **)&z, COUNT * sizeof(float)));
  for (int i = 0; i < COUNT; i++) host[i] = (float)(i % 1000);
  CUDA(cudaMemcpy(x, host, COUNT * sizeof(float), cudaMemcpyHostToDevice));
  CUDA(cudaDeviceSynchronize());
  const double xsum = (double)(COUNT / 1000) * 499500.0 + (COUNT % 1000) * (COUNT % 1000 - 1) / 2.0;

  /* Nonblocking init. */
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r1 = ncclGetUniqueId(&id);
  ncclResult_t r2 = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
  ncclResult_t st = ok_rc(r2) ? wait_comm(comm) : r2;
  printf("nonblocking_init: rc %d %d in-progress-or-success %d state %d %s\n", r1, r2, ok_rc(r2),
         st, st == ncclSuccess ? "ok" : "WRONG");
  if (st != ncclSuccess) return 1;

  /* Allreduce on a nonblocking communicator. */
  r = ncclAllReduce(x, y, COUNT, ncclFloat, ncclSum, comm, stream);
  st = wait_comm(comm);
  CUDA(cudaStreamSynchronize(stream));
  double s = dsum(y, host);
  printf("allreduce: rc-ok %d state %d ", ok_rc(r), st);
  verdict("sum", s == xsum, "%.1f expected %.1f", s, xsum);

  /* Group: send to self and receive from self. */
  ncclResult_t g0 = ncclGroupStart();
  ncclResult_t g1 = ncclSend(x, COUNT, ncclFloat, 0, comm, stream);
  ncclResult_t g2 = ncclRecv(z, COUNT, ncclFloat, 0, comm, stream);
  ncclResult_t g3 = ncclGroupEnd();
  st = wait_comm(comm);
  CUDA(cudaStreamSynchronize(stream));
  s = dsum(z, host);
  printf("group_sendrecv: rc %d %d %d ok %d state %d ", g0, ok_rc(g1), ok_rc(g2), ok_rc(g3), st);
  verdict("sum", s == xsum, "%.1f expected %.1f", s, xsum);

  /* PreMulSum with the scalar in device memory. */
  float *scalar, two_and_half = 2.5f;
  CUDA(cudaMalloc((void **)&scalar, sizeof(float)));
  CUDA(cudaMemcpy(scalar, &two_and_half, sizeof(float), cudaMemcpyHostToDevice));
  ncclRedOp_t op;
  r1 = ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat, ncclScalarDevice, comm);
  r2 = ok_rc(r1) ? ncclAllReduce(x, y, COUNT, ncclFloat, op, comm, stream) : r1;
  st = wait_comm(comm);
  CUDA(cudaStreamSynchronize(stream));
  ncclResult_t r3 = ok_rc(r1) ? ncclRedOpDestroy(op, comm) : r1;
  s = dsum(y, host);
  printf("premulsum_device_scalar: rc %d %d %d state %d op-is-custom %d ", r1, ok_rc(r2), r3, st,
         (int)op >= (int)ncclNumOps);
  verdict("sum", s == 2.5 * xsum, "%.1f expected %.1f", s, 2.5 * xsum);

  /* CUDA graph capture of an allreduce, replayed three times on new input. */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  r = ncclAllReduce(x, z, COUNT, ncclFloat, ncclSum, comm, stream);
  CUDA(cudaStreamEndCapture(stream, &graph));
  st = wait_comm(comm);
  CUDA(cudaGraphInstantiate(&exec, graph, 0));
  int graph_ok = 1;
  printf("graph_capture: rc-ok %d state %d sums", ok_rc(r), st);
  for (int k = 1; k <= 3; k++) {
    fill(x, host, (float)k);
    CUDA(cudaGraphLaunch(exec, stream));
    CUDA(cudaStreamSynchronize(stream));
    s = dsum(z, host);
    printf(" %.1f", s);
    graph_ok &= s == (double)k * COUNT;
  }
  printf(" %s\n", graph_ok ? "ok" : "WRONG");
  tally("graph_capture", graph_ok);
  CUDA(cudaGraphExecDestroy(exec));
  CUDA(cudaGraphDestroy(graph));

  /* ncclMemAlloc, buffer registration, window registration. */
  void *buf = NULL, *handle = NULL;
  size_t bytes = 2u << 20;
  r1 = ncclMemAlloc(&buf, bytes);
  r2 = ncclCommRegister(comm, buf, bytes, &handle);
  st = wait_comm(comm);
  r3 = ncclCommDeregister(comm, handle);
  printf("register: rc %d %d %d state %d %s\n", r1, r2, r3, st,
         r1 == ncclSuccess && ok_rc(r2) && ok_rc(r3) ? "ok" : "WRONG");
  tally("register", r1 == ncclSuccess && ok_rc(r2) && ok_rc(r3));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  ncclWindow_t win = NULL;
  r1 = ncclCommWindowRegister(comm, buf, bytes, &win, NCCL_WIN_DEFAULT);
  st = wait_comm(comm);
  r2 = win ? ncclCommWindowDeregister(comm, win) : r1;
  st = st == ncclSuccess ? wait_comm(comm) : st;
  printf("window: rc %d %d state %d %s\n", r1, r2, st, ok_rc(r1) && ok_rc(r2) ? "ok" : "WRONG");
  tally("window", ok_rc(r1) && ok_rc(r2));
#endif
  r = ncclMemFree(buf);
  printf("mem_free: rc %d %s\n", r, r == ncclSuccess ? "ok" : "WRONG");
  tally("mem_free", r == ncclSuccess);

  /* Split (inherits the nonblocking config: the parent is polled until the
   * split is done), then a collective on the child. */
  fill(x, host, 3.0f);
  ncclComm_t child = NULL;
  r1 = ncclCommSplit(comm, 0, 0, &child, NULL);
  ncclResult_t pst = wait_comm(comm);
  st = child ? wait_comm(child) : pst;
  int n = -1;
  r2 = child ? ncclCommCount(child, &n) : r1;
  r3 = child ? ncclAllReduce(x, y, COUNT, ncclFloat, ncclSum, child, stream) : r1;
  if (child) wait_comm(child);
  CUDA(cudaStreamSynchronize(stream));
  s = dsum(y, host);
  ncclResult_t r4 = child ? ncclCommDestroy(child) : r1;
  printf("split: rc-ok %d parent %d state %d child %d count-rc %d n %d allreduce-ok %d destroy %d ",
         ok_rc(r1), pst, st, child != NULL, r2, n, ok_rc(r3), r4);
  verdict("sum", child && s == 3.0 * COUNT && n == 1, "%.1f expected %.1f", s, 3.0 * COUNT);

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  ncclComm_t shrunk = NULL;
  int exclude_none[1] = {-1}; /* NCCL wants a list even when it is empty */
  r1 = ncclCommShrink(comm, exclude_none, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT);
  pst = wait_comm(comm);
  st = shrunk ? wait_comm(shrunk) : pst;
  n = -1;
  r2 = shrunk ? ncclCommCount(shrunk, &n) : r1;
  r3 = shrunk ? ncclCommAbort(shrunk) : r1;
  /* NCCL 2.28 refuses to shrink a one-rank communicator by nobody
   * (ncclInvalidArgument); what matters here is that hetccl forwards the
   * call and its answer unchanged, which the comparison of outputs shows. */
  int shrink_ok = (shrunk && st == ncclSuccess && n == 1 && r3 == ncclSuccess) ||
                  (!shrunk && r1 == ncclInvalidArgument);
  printf("shrink: rc %d parent %d state %d child %d count-rc %d n %d abort %d %s\n", r1,
         pst, st, shrunk != NULL, r2, n, r3,
         !shrink_ok ? "WRONG" : shrunk ? "ok" : "ok (refused by this NCCL)");
  tally("shrink", shrink_ok);
#endif

  /* Finalize (nonblocking: in progress, then success), destroy. */
  r1 = ncclCommFinalize(comm);
  st = wait_comm(comm);
  r2 = ncclCommDestroy(comm);
  printf("finalize: rc-ok %d state %d destroy %d %s\n", ok_rc(r1), st, r2,
         ok_rc(r1) && st == ncclSuccess && r2 == ncclSuccess ? "ok" : "WRONG");
  tally("finalize", ok_rc(r1) && st == ncclSuccess && r2 == ncclSuccess);

  /* Blocking init, then abort with work done. */
  ncclComm_t comm2 = NULL;
  ncclGetUniqueId(&id);
  r1 = ncclCommInitRank(&comm2, 1, id, 0);
  r2 = ncclAllReduce(x, y, COUNT, ncclFloat, ncclSum, comm2, stream);
  CUDA(cudaStreamSynchronize(stream));
  r3 = ncclCommAbort(comm2);
  printf("blocking_init_abort: rc %d %d %d %s\n", r1, r2, r3,
         r1 == ncclSuccess && r2 == ncclSuccess && r3 == ncclSuccess ? "ok" : "WRONG");
  tally("blocking_init_abort", r1 == ncclSuccess && r2 == ncclSuccess && r3 == ncclSuccess);

  printf("failures: %d\n", failures);
  return failures ? 1 : 0;
}
