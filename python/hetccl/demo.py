"""A small real multi-rank job: `hetccl demo -n 4` (or
`hetccl run -n 4 -- python -m hetccl.demo`).

Every rank runs allreduce, allgather and broadcast on numpy float32 buffers,
checks the result against what it can compute alone, and prints one line
per collective with its time. Exit status 1 if any check fails. The ranks
are the job the process belongs to (hetccl.init_from_env: `hetccl run`,
mpirun, srun, torchrun); run without a launcher it is a one-rank job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, List

import numpy as np

from .buffers import as_buffer
from .discovery import init_from_env
from .nccl import NCCL_SUM, NcclCommunicator


def _timed(fn: Callable[[], None], iters: int) -> float:
    """Best time of `iters` runs, in seconds (one warm-up run first)."""
    fn()
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _report(rank: int, n: int, name: str, nbytes: int, seconds: float, ok: bool,
            what: str) -> None:
    rate = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    status = "ok" if ok else "WRONG"
    line = (f"rank {rank}/{n} {name:<10} {nbytes / 2**20:8.2f} MiB {seconds * 1e3:9.3f} ms "
            f"{rate:6.2f} GB/s  {status}: {what}\n")
    # One write() per line: ranks share the pipe, and a write this short is atomic.
    os.write(sys.stdout.fileno(), line.encode())


def run(comm: NcclCommunicator, count: int, iters: int) -> List[bool]:
    rank, n = comm.rank_id(), comm.size()
    pattern = (np.arange(count) % 7).astype(np.float32)
    checks = []

    # allreduce: rank r contributes (r + 1) + i % 7; the sum is known everywhere.
    send = pattern + np.float32(rank + 1)
    recv = np.empty_like(send)
    s, r = as_buffer(send), as_buffer(recv)
    t = _timed(lambda: comm.allReduce(s.ptr, r.ptr, s.count, s.dtype, NCCL_SUM), iters)
    want = pattern * n + np.float32(n * (n + 1) // 2)
    checks.append(bool(np.array_equal(recv, want)))
    _report(rank, n, "allreduce", send.nbytes, t, checks[-1],
            f"sum over ranks of (rank+1) = {n * (n + 1) // 2} at element 0")

    # allgather: block b of the result is rank b's buffer.
    mine = pattern + np.float32(100 * rank)
    gathered = np.empty(count * n, dtype=np.float32)
    s, r = as_buffer(mine), as_buffer(gathered)
    t = _timed(lambda: comm.allGather(s.ptr, r.ptr, s.count, s.dtype), iters)
    want = np.concatenate([pattern + np.float32(100 * b) for b in range(n)])
    checks.append(bool(np.array_equal(gathered, want)))
    _report(rank, n, "allgather", gathered.nbytes, t, checks[-1],
            f"{n} blocks, block b starts with 100*b")

    # broadcast from the last rank.
    root = n - 1
    data = pattern * np.float32(3) if rank == root else np.zeros(count, dtype=np.float32)
    b = as_buffer(data)
    t = _timed(lambda: comm.bcast(b.ptr, b.count, b.dtype, root), iters)
    checks.append(bool(np.array_equal(data, pattern * np.float32(3))))
    _report(rank, n, "broadcast", data.nbytes, t, checks[-1], f"root {root}'s 3 * (i % 7)")
    return checks


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m hetccl.demo")
    p.add_argument("--count", type=int, default=1 << 20, help="float32 elements per buffer")
    p.add_argument("--iters", type=int, default=5, help="timed runs (best is shown)")
    args = p.parse_args(argv)
    comm = init_from_env()[0].nccl
    try:
        checks = run(comm, args.count, args.iters)
    finally:
        comm.destroy()
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
