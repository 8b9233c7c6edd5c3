#!/usr/bin/env python3
"""The OpenMPI peer of hetccl-perf: the same collectives, sizes, timing
method, busbw factors and columns, through mpi4py on numpy buffers.

    mpirun --oversubscribe -np 2 python tools/peers/mpi_bench.py all_reduce -b 1M -e 64M -f 4

Method (as hetccl-perf): for each size and each placement (out-of-place,
in-place): `-w` untimed iterations, a barrier, `-n` timed iterations; the
time of one iteration is taken on every rank and rank 0 reports the max
over ranks (`-a 3`, the default here; `-a 1` the mean). Sizes map to counts
as nccl-tests does (all_gather's size is the gathered buffer, ...).

Install the peer: apt-get install -y openmpi-bin libopenmpi-dev && pip install mpi4py
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

try:
    from mpi4py import MPI
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("mpi_bench.py: mpi4py is missing: apt-get install -y openmpi-bin "
                     "libopenmpi-dev && pip install mpi4py\n")
    sys.exit(3)

DTYPES = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64}
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().removesuffix("iB").removesuffix("B")
    if t and t[-1].upper() in units:
        return int(float(t[:-1]) * units[t[-1].upper()])
    return int(t)


@dataclass
class Shape:
    send: int  # elements
    recv: int
    per: int  # count per rank or per peer where the collective splits
    bytes: int


@dataclass
class Coll:
    bus_factor: Callable[[int], float]
    split: str  # "same", "gather" (recv = n * per) or "scatter" (send = n * per)
    has_op: bool = False
    has_root: bool = False


COLLS = {
    "all_reduce": Coll(lambda n: 2 * (n - 1) / n, "same", has_op=True),
    "all_gather": Coll(lambda n: (n - 1) / n, "gather"),
    "broadcast": Coll(lambda n: 1.0, "same", has_root=True),
    "reduce": Coll(lambda n: 1.0, "same", has_op=True, has_root=True),
    "reduce_scatter": Coll(lambda n: (n - 1) / n, "scatter", has_op=True),
    "alltoall": Coll(lambda n: (n - 1) / n, "alltoall"),
    "sendrecv": Coll(lambda n: 1.0, "same"),
}
ALIASES = {k.replace("_", ""): k for k in COLLS}


def shape(coll: Coll, elements: int, n: int, itemsize: int) -> Shape:
    per = elements // n
    if coll.split == "gather":
        send, recv = per, per * n
    elif coll.split == "scatter":
        send, recv = per * n, per
    elif coll.split == "alltoall":
        send = recv = per * n
    else:
        send = recv = per = elements
    return Shape(send, recv, per, max(send, recv) * itemsize)


class Bench:
    def __init__(self, args: argparse.Namespace, comm: "MPI.Comm") -> None:
        self.a = args
        self.comm = comm
        self.rank = comm.Get_rank()
        self.n = comm.Get_size()
        self.dtype = DTYPES[args.datatype]
        self.op = OPS[args.op]
        self.coll = COLLS[args.coll]
        most = shape(self.coll, args.maxbytes // np.dtype(self.dtype).itemsize, self.n,
                     np.dtype(self.dtype).itemsize)
        length = max(most.send, most.recv, 1)
        self.sendbuf = np.zeros(length, dtype=self.dtype)
        self.recvbuf = np.zeros(length, dtype=self.dtype)
        # Write every page before anything is timed, as hetccl-perf does: an
        # untouched np.zeros buffer is the kernel's shared zero page, and a
        # send from it reads no memory at all (with -c 0 it measured
        # sendrecv above this machine's memcpy bandwidth).
        self.fill(most, False)

    # One operation; `inplace` uses MPI.IN_PLACE where MPI has it.
    def run(self, s: Shape, inplace: bool) -> None:
        c, name, root = self.comm, self.a.coll, self.a.root
        send, recv = self.sendbuf[: s.send], self.recvbuf[: s.recv]
        nxt, prv = (self.rank + 1) % self.n, (self.rank - 1) % self.n
        if name == "all_reduce":
            c.Allreduce(MPI.IN_PLACE if inplace else send, recv, op=self.op)
        elif name == "all_gather":
            c.Allgather(MPI.IN_PLACE if inplace else send, recv)
        elif name == "broadcast":  # MPI broadcasts in place either way
            c.Bcast(recv, root=root)
        elif name == "reduce":
            sb = MPI.IN_PLACE if inplace and self.rank == root else send
            c.Reduce(sb, recv, op=self.op, root=root)
        elif name == "reduce_scatter":
            if inplace:
                c.Reduce_scatter_block(MPI.IN_PLACE, self.recvbuf[: s.send], op=self.op)
            else:
                c.Reduce_scatter_block(send, recv, op=self.op)
        elif name == "alltoall":
            c.Alltoall(MPI.IN_PLACE if inplace else send, recv)
        elif name == "sendrecv":
            if inplace:
                c.Sendrecv_replace(recv, dest=nxt, source=prv)
            else:
                c.Sendrecv(send, dest=nxt, recvbuf=recv, source=prv)

    def fill(self, s: Shape, inplace: bool) -> None:
        """Small integers (exact in every type) that depend on rank and index."""
        idx = np.arange(max(s.send, s.recv), dtype=np.int64)
        vals = ((idx * 7 + self.rank * 13) % 17).astype(self.dtype)
        self.sendbuf[: s.send] = vals[: s.send]
        self.recvbuf[:] = -1
        if inplace:
            if self.a.coll == "all_gather":
                self.recvbuf[self.rank * s.per:(self.rank + 1) * s.per] = vals[: s.per]
            elif self.a.coll == "reduce_scatter":
                self.recvbuf[: s.send] = vals[: s.send]
            else:
                self.recvbuf[: s.send] = vals[: s.send]
        if self.a.coll == "broadcast" and self.rank == self.a.root:
            self.recvbuf[: s.recv] = vals[: s.recv]

    def expected(self, s: Shape) -> np.ndarray | None:
        idx = np.arange(max(s.send, s.recv), dtype=np.int64)
        per_rank = [((idx * 7 + r * 13) % 17).astype(np.float64) for r in range(self.n)]
        name = self.a.coll
        if name in ("all_reduce", "reduce", "reduce_scatter"):
            red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[self.a.op]
            total = red(np.stack(per_rank), axis=0)
            if name == "reduce" and self.rank != self.a.root:
                return None
            if name == "reduce_scatter":
                return total[self.rank * s.per:(self.rank + 1) * s.per]
            return total[: s.recv]
        if name == "all_gather":
            return np.concatenate([p[: s.per] for p in per_rank]) if s.per else idx[:0] * 1.0
        if name == "broadcast":
            return per_rank[self.a.root][: s.recv]
        if name == "alltoall":
            parts = [p[self.rank * s.per:(self.rank + 1) * s.per] for p in per_rank]
            return np.concatenate(parts) if s.per else idx[:0] * 1.0
        return per_rank[(self.rank - 1) % self.n][: s.recv]  # sendrecv

    def wrong(self, s: Shape, inplace: bool) -> int:
        self.fill(s, inplace)
        self.comm.Barrier()
        self.run(s, inplace)
        want = self.expected(s)
        if want is None:
            return 0
        got = self.recvbuf[: len(want)].astype(np.float64)
        return int(np.count_nonzero(got != want))

    def timed(self, s: Shape, inplace: bool) -> float:
        for _ in range(self.a.warmup_iters):
            self.run(s, inplace)
        self.comm.Barrier()
        start = MPI.Wtime()
        for _ in range(self.a.iters):
            self.run(s, inplace)
        us = (MPI.Wtime() - start) / self.a.iters * 1e6
        if self.a.average == 0:
            return us
        if self.a.average == 1:
            return self.comm.allreduce(us, op=MPI.SUM) / self.n
        return self.comm.allreduce(us, op=MPI.MIN if self.a.average == 2 else MPI.MAX)


def sizes(a: argparse.Namespace) -> list[int]:
    out, size = [], a.minbytes
    while size <= a.maxbytes:
        out.append(size)
        nxt = int(size * a.stepfactor) if a.stepfactor > 1 else size + a.stepbytes
        size = max(nxt, size + 1)
    return out


def fmt_time(us: float) -> str:
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("coll", help="|".join(COLLS))
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=1.0)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1))
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("-o", "--op", default="sum", choices=sorted(OPS))
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-a", "--average", type=int, default=3, choices=(0, 1, 2, 3))
    a = p.parse_args(argv)
    a.coll = ALIASES.get(a.coll.replace("-", "").replace("_", "").removesuffix("perf"), a.coll)
    if a.coll not in COLLS:
        p.error(f"unknown collective {a.coll}; one of {', '.join(COLLS)}")

    comm = MPI.COMM_WORLD
    bench = Bench(a, comm)
    coll = COLLS[a.coll]
    itemsize = np.dtype(bench.dtype).itemsize
    lead = bench.rank == 0
    if lead:
        lib = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
        print(f"# mpi_bench {a.coll}: nranks {bench.n} minBytes {a.minbytes} maxBytes "
              f"{a.maxbytes} warmup iters: {a.warmup_iters} iters: {a.iters} "
              f"validation: {a.check} average: {a.average}")
        print(f"# library: {lib} (mpi4py {__import__('mpi4py').__version__})")
        print("#")
        print(f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}  {'out-of-place':>31}"
              f"  {'in-place':>31}")
        print(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
              + "  ".join(f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" for _ in "ab"))
        print(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
              + "  ".join(f"{'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" for _ in "ab"))
    bw_sum, bw_count, wrong_total = 0.0, 0, 0
    for size in sizes(a):
        s = shape(coll, size // itemsize, bench.n, itemsize)
        cols = []
        for inplace in (False, True):
            us = bench.timed(s, inplace)
            wrong = comm.allreduce(bench.wrong(s, inplace), op=MPI.SUM) if a.check else None
            wrong_total += wrong or 0
            algbw = s.bytes / us / 1e3 if us > 0 else 0.0
            busbw = algbw * coll.bus_factor(bench.n)
            bw_sum, bw_count = bw_sum + busbw, bw_count + 1
            cols.append(f"{fmt_time(us)}  {algbw:6.2f}  {busbw:6.2f}  "
                        + (f"{wrong:6d}" if wrong is not None else f"{'N/A':>6}"))
        if lead:
            print(f"  {s.bytes:10d}  {s.bytes // itemsize:12d}  {a.datatype:>8}  "
                  f"{a.op if coll.has_op else 'none':>6}  {a.root if coll.has_root else -1:6d}  "
                  + "  ".join(cols), flush=True)
    if lead:
        if a.check:
            print(f"# Wrong elements       : {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        print(f"# Avg bus bandwidth    : {bw_sum / max(bw_count, 1):g} \n#", flush=True)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
