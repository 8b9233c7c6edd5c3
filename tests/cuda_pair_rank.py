"""One process of tests/test_cuda_engine.py's one-thread case: T_ROLE=pair
drives ranks 0 and 1 (GPUs 0 and 1) from one thread, as ncclCommInitAll's
callers do, each call of the two inside a group; T_ROLE=host is rank 2, a
host rank in the other island (HETCCL_ISLANDS=0,0,1). The two GPUs form an
island that NCCL serves inside a hierarchical communicator, so every
hierarchical form runs its phases for both ranks in step (hier/hier_ops.c).
T_BUF: "device" (torch tensors on each GPU's side stream) or "host" (numpy
arrays on the GPU ranks too: staged, hier/hier_host.c). Every result is
checked against numpy; prints "RESULT {json}".

Environment: T_LIB, T_ROLE, T_BUF, T_ID_FILE (the pair writes the unique id).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from nccl_ctypes import P, UniqueId, async_error, checker, load, report, run_main
from rank_procs import publish, wait_for

LIB = load(os.environ["T_LIB"])
ROLE = os.environ["T_ROLE"]
BUF = os.environ.get("T_BUF", "device")
N = 3
MINE = [0, 1] if ROLE == "pair" else [2]
FLOAT32, SUM, MAX = 7, 0, 2
check = checker(LIB)


if ROLE == "pair":
    import torch
    STREAMS = [torch.cuda.Stream(device=d) for d in (0, 1)]
else:
    STREAMS = []


class Buf:
    """count float32 on rank r: device memory on a GPU rank (T_BUF=device),
    else host memory."""

    def __init__(self, r: int, count: int, fill: np.ndarray | None = None):
        self.r, self.count = r, count
        self.dev = ROLE == "pair" and BUF == "device"
        if self.dev:
            with torch.cuda.stream(STREAMS[r]):
                self.t = torch.full((max(count, 1),), -7.0, device=f"cuda:{r}")
                if fill is not None:
                    self.t[:count].copy_(torch.from_numpy(fill).to(f"cuda:{r}"))
        else:
            self.a = np.full(max(count, 1), -7, dtype=np.float32)
            if fill is not None:
                self.a[:count] = fill

    def ptr(self, elem_off: int = 0) -> int:
        return (self.t.data_ptr() if self.dev else self.a.ctypes.data) + 4 * elem_off

    def read(self) -> np.ndarray:
        if self.dev:
            STREAMS[self.r].synchronize()
            return self.t[: self.count].cpu().numpy()
        return self.a[: self.count].copy()


def stream(r: int) -> int | None:
    return STREAMS[r].cuda_stream if ROLE == "pair" else None


def each(calls) -> None:
    """calls(r) for each of this process's ranks: one group for the pair."""
    if ROLE == "pair":
        check(LIB.ncclGroupStart(), "GroupStart")
    for r in MINE:
        calls(r)
    if ROLE == "pair":
        check(LIB.ncclGroupEnd(), "GroupEnd")


def pattern(r: int, count: int) -> np.ndarray:
    return ((r + 1) * (np.arange(count) % 89 + 1)).astype(np.float32)


def run(comms, count: int) -> dict:
    out: dict = {}
    x = {r: pattern(r, count) for r in range(N)}
    xn = {r: pattern(r, count * N) for r in range(N)}
    tri = N * (N + 1) // 2

    def agree(name, r, got, want):
        ok = bool(np.array_equal(got, want))
        out[f"{name}/{count}/rank{r}"] = ok
        if not ok:
            bad = np.nonzero(got != want)[0]
            out[f"{name}/{count}/rank{r}.first_bad"] = [int(bad[0]), float(got[bad[0]]),
                                                         float(want[bad[0]])]

    # AllReduce and AllGather of each rank in one group: two forms in step,
    # then Broadcast from the host rank, Reduce to rank 1, ReduceScatter.
    s = {r: Buf(r, count, x[r]) for r in MINE}
    ar = {r: Buf(r, count) for r in MINE}
    ag = {r: Buf(r, count * N) for r in MINE}

    def two(r):
        check(LIB.ncclAllReduce(s[r].ptr(), ar[r].ptr(), count, FLOAT32, SUM, comms[r],
                                stream(r)), "AllReduce")
        check(LIB.ncclAllGather(s[r].ptr(), ag[r].ptr(), count, FLOAT32, comms[r], stream(r)),
              "AllGather")
    each(two)
    for r in MINE:
        agree("allreduce", r, ar[r].read(), x[0] * tri)
        agree("allgather", r, ag[r].read(), np.concatenate([x[q] for q in range(N)]))

    b = {r: Buf(r, count, x[r]) for r in MINE}
    each(lambda r: check(LIB.ncclBroadcast(b[r].ptr(), b[r].ptr(), count, FLOAT32, 2, comms[r],
                                           stream(r)), "Broadcast"))
    for r in MINE:
        agree("broadcast", r, b[r].read(), x[2])

    rd = {r: Buf(r, count) for r in MINE}
    each(lambda r: check(LIB.ncclReduce(s[r].ptr(), rd[r].ptr(), count, FLOAT32, MAX, 1,
                                        comms[r], stream(r)), "Reduce"))
    if 1 in MINE:
        agree("reduce", 1, rd[1].read(), x[2])

    sn = {r: Buf(r, count * N, xn[r]) for r in MINE}
    rs = {r: Buf(r, count) for r in MINE}
    each(lambda r: check(LIB.ncclReduceScatter(sn[r].ptr(), rs[r].ptr(), count, FLOAT32, SUM,
                                               comms[r], stream(r)), "ReduceScatter"))
    for r in MINE:
        agree("reducescatter", r, rs[r].read(), (xn[0] * tri)[r * count:(r + 1) * count])
    return out


def main() -> None:
    path = os.environ["T_ID_FILE"]
    uid = UniqueId()
    if ROLE == "pair":
        check(LIB.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        publish(path, bytes(uid))
    else:
        ctypes.memmove(ctypes.byref(uid), wait_for(path), 128)
    comms = {r: P() for r in MINE}
    if ROLE == "pair":
        check(LIB.ncclGroupStart(), "GroupStart")
    for r in MINE:
        if ROLE == "pair":
            torch.cuda.set_device(r)
        check(LIB.ncclCommInitRank(ctypes.byref(comms[r]), N, uid, r), "ncclCommInitRank")
    if ROLE == "pair":
        check(LIB.ncclGroupEnd(), "GroupEnd")
    results = {"backend": [LIB.hetcclCommBackend(comms[r]).decode() for r in MINE]}
    for count in (1031, 1 << 20):
        results.update(run(comms, count))
    for r in MINE:
        results[f"async_error/rank{r}"] = async_error(LIB, comms[r])
    for r in MINE:
        check(LIB.ncclCommDestroy(comms[r]), "ncclCommDestroy")
    report(results)


if __name__ == "__main__":
    run_main(main, ROLE)
