"""One rank of tests/test_cuda_engine.py: device buffers on a communicator
that runs on hetccl's engine (several islands), driven through ctypes.

Environment: T_LIB (libhetccl.so), T_RANK, T_NRANKS, T_ID_FILE (rank 0
writes the unique id there), T_MODE ("cuda": torch tensors on a side
stream; "cudahost": a CUDA rank (its stream passed) handed numpy arrays,
which the call must have finished with when it returns, as on host ranks;
"host": numpy arrays, no stream), T_CHECKS (comma list, see CHECKS).
Prints one line "RESULT {json}" with what every check found.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

from nccl_ctypes import P, UniqueId, async_error, checker, load, report, run_main
from rank_procs import publish, wait_for

LIB = load(os.environ["T_LIB"])
RANK = int(os.environ["T_RANK"])
N = int(os.environ["T_NRANKS"])
MODE = os.environ.get("T_MODE", "cuda")

FLOAT32, INT32, SUM, MAX = 7, 2, 0, 2  # ncclFloat32, ncclInt32, ncclSum, ncclMax
IN_PROGRESS, INVALID_USAGE = 7, 5
check = checker(LIB)


def exchange_id() -> UniqueId:
    path = os.environ["T_ID_FILE"]
    uid = UniqueId()
    if RANK == 0:
        check(LIB.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        publish(path, bytes(uid))  # the raw 128 bytes (.internal stops at a NUL)
        return uid
    ctypes.memmove(ctypes.byref(uid), wait_for(path), 128)
    return uid


# --- buffers: torch on a side stream, or numpy -----------------------------------

if MODE in ("cuda", "cudahost"):
    import torch
    DEV = torch.device("cuda", int(os.environ.get("T_DEV", "0")))
    torch.cuda.set_device(DEV)
    STREAM = torch.cuda.Stream()
    STREAM_P = STREAM.cuda_stream
    TORCH_T = {FLOAT32: torch.float32, INT32: torch.int32}
else:
    STREAM, STREAM_P = None, None
NP_T = {FLOAT32: np.float32, INT32: np.int32}


class Buf:
    """count elements of dtype in device (cuda mode) or host memory."""

    def __init__(self, count: int, dtype: int, fill: np.ndarray | None = None):
        self.count, self.dtype = count, dtype
        if MODE == "cuda":
            with torch.cuda.stream(STREAM):  # written in stream order, no sync
                self.t = torch.full((max(count, 1),), -7, dtype=TORCH_T[dtype], device=DEV)
                if fill is not None:
                    self.t[:count].copy_(torch.from_numpy(fill).to(DEV, non_blocking=False))
        else:
            self.a = np.full(max(count, 1), -7, dtype=NP_T[dtype])
            if fill is not None:
                self.a[:count] = fill

    def ptr(self, elem_off: int = 0) -> int:
        base = self.t.data_ptr() if MODE == "cuda" else self.a.ctypes.data
        return base + elem_off * 4

    def read(self) -> np.ndarray:
        if MODE == "cuda":  # cudahost reads at once: the call was blocking
            STREAM.synchronize()
            return self.t[: self.count].cpu().numpy()
        return self.a[: self.count].copy()


def pattern(rank: int, count: int, dtype: int) -> np.ndarray:
    return ((rank + 1) * (np.arange(count) % 97 + 1)).astype(NP_T[dtype])


# --- checks ------------------------------------------------------------------------


def run_collectives(comm, count: int, dtype: int) -> dict:
    """Every collective out of place and (where NCCL allows) in place."""
    out, tri = {}, N * (N + 1) // 2
    x = [pattern(r, count, dtype) for r in range(N)]
    xn = [pattern(r, count * N, dtype) for r in range(N)]
    root = N - 1

    def agree(name, got, want):
        out[name] = bool(np.array_equal(got, want))
        print(f"rank {RANK}: {name} count {count}: {out[name]}", file=sys.stderr, flush=True)
        if not out[name]:
            bad = np.nonzero(got != want)[0]
            out[name + ".first_bad"] = [int(bad[0]), str(got[bad[0]]), str(want[bad[0]])]

    s, r = Buf(count, dtype, x[RANK]), Buf(count, dtype)
    check(LIB.ncclAllReduce(s.ptr(), r.ptr(), count, dtype, SUM, comm, STREAM_P), "AllReduce")
    agree("allreduce", r.read(), x[0] * tri)
    b = Buf(count, dtype, x[RANK])
    check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, dtype, MAX, comm, STREAM_P), "AllReduce")
    agree("allreduce_inplace_max", b.read(), x[N - 1])

    s, r = Buf(count, dtype, x[RANK]), Buf(count, dtype)
    check(LIB.ncclBroadcast(s.ptr(), r.ptr(), count, dtype, root, comm, STREAM_P), "Broadcast")
    agree("broadcast", r.read(), x[root])

    s, r = Buf(count, dtype, x[RANK]), Buf(count, dtype)
    check(LIB.ncclReduce(s.ptr(), r.ptr(), count, dtype, SUM, root, comm, STREAM_P), "Reduce")
    if RANK == root:
        agree("reduce", r.read(), x[0] * tri)
    else:
        agree("reduce_untouched", r.read(), np.full(count, -7, dtype=NP_T[dtype]))

    s, r = Buf(count, dtype, x[RANK]), Buf(count * N, dtype)
    check(LIB.ncclAllGather(s.ptr(), r.ptr(), count, dtype, comm, STREAM_P), "AllGather")
    agree("allgather", r.read(), np.concatenate(x))
    r = Buf(count * N, dtype, np.concatenate([x[q] if q == RANK else np.zeros(count, NP_T[dtype])
                                              for q in range(N)]))
    check(LIB.ncclAllGather(r.ptr(RANK * count), r.ptr(), count, dtype, comm, STREAM_P),
          "AllGather")
    agree("allgather_inplace", r.read(), np.concatenate(x))

    s, r = Buf(count * N, dtype, xn[RANK]), Buf(count, dtype)
    check(LIB.ncclReduceScatter(s.ptr(), r.ptr(), count, dtype, SUM, comm, STREAM_P),
          "ReduceScatter")
    agree("reducescatter", r.read(), (xn[0] * tri)[RANK * count:(RANK + 1) * count])
    s = Buf(count * N, dtype, xn[RANK])
    check(LIB.ncclReduceScatter(s.ptr(), s.ptr(RANK * count), count, dtype, SUM, comm,
                                STREAM_P), "ReduceScatter")
    agree("reducescatter_inplace", s.read()[RANK * count:(RANK + 1) * count],
          (xn[0] * tri)[RANK * count:(RANK + 1) * count])

    s, r = Buf(count * N, dtype, xn[RANK]), Buf(count * N, dtype)
    check(LIB.ncclAlltoAll(s.ptr(), r.ptr(), count, dtype, comm, STREAM_P), "AlltoAll")
    agree("alltoall", r.read(),
          np.concatenate([xn[q][RANK * count:(RANK + 1) * count] for q in range(N)]))

    s, r = Buf(count, dtype, x[RANK]), Buf(count * N, dtype)
    check(LIB.ncclGather(s.ptr(), r.ptr(), count, dtype, root, comm, STREAM_P), "Gather")
    if RANK == root:
        agree("gather", r.read(), np.concatenate(x))

    s, r = Buf(count * N, dtype, xn[RANK]), Buf(count, dtype)
    check(LIB.ncclScatter(s.ptr(), r.ptr(), count, dtype, root, comm, STREAM_P), "Scatter")
    agree("scatter", r.read(), xn[root][RANK * count:(RANK + 1) * count])
    return out


def check_sweep(comm) -> dict:
    out = {}
    for count, dtype in ((0, FLOAT32), (1, INT32), (1031, FLOAT32), (1 << 20, FLOAT32),
                         (3_000_001, INT32)):
        for k, v in run_collectives(comm, count, dtype).items():
            out[f"{k}/{count}"] = v
    return out


def check_group_p2p(comm) -> dict:
    """One group: two allreduces and a ring of send/recv, on device buffers."""
    count, dtype = 65537, FLOAT32
    a, b = Buf(count, dtype, pattern(RANK, count, dtype)), Buf(count, dtype, pattern(RANK, count, dtype) * 2)
    s, r = Buf(count, dtype, pattern(RANK, count, dtype)), Buf(count, dtype)
    LIB.ncclGroupStart()
    check(LIB.ncclAllReduce(a.ptr(), a.ptr(), count, dtype, SUM, comm, STREAM_P), "AllReduce")
    check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, dtype, SUM, comm, STREAM_P), "AllReduce")
    check(LIB.ncclSend(s.ptr(), count, dtype, (RANK + 1) % N, comm, STREAM_P), "Send")
    check(LIB.ncclRecv(r.ptr(), count, dtype, (RANK - 1) % N, comm, STREAM_P), "Recv")
    check(LIB.ncclGroupEnd(), "GroupEnd")
    tri = N * (N + 1) // 2
    base = pattern(0, count, dtype)
    return {"group_allreduce_a": bool(np.array_equal(a.read(), base * tri)),
            "group_allreduce_b": bool(np.array_equal(b.read(), base * 2 * tri)),
            "group_recv": bool(np.array_equal(r.read(), pattern((RANK - 1) % N, count, dtype)))}


def check_chain(comm) -> dict:
    """14 dependent in-place allreduces queued without a sync: each reads
    the previous one's output, so staging reuse and order both show."""
    count, dtype, steps = 4096, FLOAT32, 14  # 3**14 is exact in float32
    b = Buf(count, dtype, np.ones(count, np.float32))
    for _ in range(steps):
        check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, dtype, SUM, comm, STREAM_P), "AllReduce")
    return {"chain": bool(np.array_equal(b.read(), np.full(count, float(N) ** steps, np.float32)))}


def check_async(comm) -> dict:
    """The call returns while the stream is still busy with earlier work,
    and the collective still sees what that work wrote."""
    count = 1 << 16
    want = np.full(count, N * (N + 1) / 2, np.float32)
    if MODE != "cuda":  # a host peer takes part; its call is blocking
        warm = Buf(count, FLOAT32, np.ones(count, np.float32))  # the CUDA ranks' warm-up
        check(LIB.ncclAllReduce(warm.ptr(), warm.ptr(), count, FLOAT32, SUM, comm, None),
              "AllReduce")
        b = Buf(count, FLOAT32, np.full(count, float(RANK + 1), np.float32))
        check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, FLOAT32, SUM, comm, None), "AllReduce")
        return {"async_result": bool(np.array_equal(b.read(), want))}
    b = Buf(count, FLOAT32)
    # The first AllReduce of a type and operator on a device may compile its
    # reduction kernel on the calling thread (once per process, or once per
    # machine with the disk cache): not what this check times.
    warm = Buf(count, FLOAT32, np.ones(count, np.float32))
    check(LIB.ncclAllReduce(warm.ptr(), warm.ptr(), count, FLOAT32, SUM, comm, STREAM_P),
          "AllReduce")
    STREAM.synchronize()
    with torch.cuda.stream(STREAM):
        torch.cuda._sleep(1_500_000_000)  # about a second of GPU time
        b.t.fill_(float(RANK + 1))        # written after the sleep, before the call
    t0 = time.perf_counter()
    check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, FLOAT32, SUM, comm, STREAM_P), "AllReduce")
    call_s = time.perf_counter() - t0
    busy = not STREAM.query()
    ok = bool(np.array_equal(b.read(), want))
    return {"async_returned_while_stream_busy": busy, "async_result": ok,
            "async_call_ms": round(call_s * 1e3, 3)}


def check_capture(comm) -> dict:
    """Graph capture where a host rank is in the communicator is refused,
    with the reason, not half-recorded (the host rank makes no call)."""
    if MODE != "cuda":
        return {}
    b = Buf(1024, FLOAT32, np.ones(1024, np.float32))
    STREAM.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, stream=STREAM):
            rc = LIB.ncclAllReduce(b.ptr(), b.ptr(), 1024, FLOAT32, SUM, comm, STREAM_P)
    except RuntimeError:  # an empty capture may be reported; the return code is the point
        pass
    err = (LIB.ncclGetLastError(comm) or b"").decode()
    return {"capture_refused": rc == INVALID_USAGE and "graph" in err and "host rank" in err}


def bench(comm) -> dict:
    """busbw of a staged allreduce (2 (n-1)/n bytes per byte), for the note."""
    out = {}
    for mib in (1, 16, 64):
        count = mib * (1 << 20) // 4
        b = Buf(count, FLOAT32, np.ones(count, np.float32))
        for _ in range(2):
            check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, FLOAT32, SUM, comm, STREAM_P), "w")
        b.read()
        iters = 10
        t0 = time.perf_counter()
        for _ in range(iters):
            check(LIB.ncclAllReduce(b.ptr(), b.ptr(), count, FLOAT32, SUM, comm, STREAM_P), "b")
        if MODE == "cuda":
            STREAM.synchronize()
        dt = (time.perf_counter() - t0) / iters
        out[f"busbw_GBps/{mib}MiB"] = round(count * 4 * 2 * (N - 1) / N / dt / 1e9, 3)
    return out


CHECKS = {"sweep": check_sweep, "group": check_group_p2p, "chain": check_chain,
          "async": check_async, "capture": check_capture, "bench": bench}


def main() -> None:
    if os.environ.get("T_HANG_DUMP"):  # Python stacks of a rank that hangs, then exit
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["T_HANG_DUMP"]), exit=True)
    comm = P()
    check(LIB.ncclCommInitRank(ctypes.byref(comm), N, exchange_id(), RANK), "ncclCommInitRank")
    results = {"backend": LIB.hetcclCommBackend(comm).decode()}
    for name in os.environ.get("T_CHECKS", "sweep").split(","):
        results.update(CHECKS[name](comm))
    if MODE == "cuda":
        STREAM.synchronize()
    results["async_error"] = async_error(LIB, comm)
    check(LIB.ncclCommDestroy(comm), "ncclCommDestroy")
    report(results)


if __name__ == "__main__":
    run_main(main, f"rank {RANK}")
