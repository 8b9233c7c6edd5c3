#!/usr/bin/env python3
"""CuPy's NCCL module (cupy.cuda.nccl) as a drop-in check: the same run with
and without hetccl preloaded must give bitwise-identical results.

    python3 tools/device/cupy_dropin.py OUT.json [--ngpus 2]

Part 1, one process, every GPU (NcclCommunicator.initAll, i.e.
ncclCommInitAll: several ranks per process): allReduce, bcast, reduce,
allGather, reduceScatter and a send/recv ring, each group-wrapped
(groupStart/groupEnd) across the communicators.
Part 2, one process per GPU (get_unique_id + NcclCommunicator): allReduce
and send/recv between the two.
Results are hashed (sha256 of their bytes) into OUT.json; timings go under
"timing". NCCL_NVLS_ENABLE=0 is forced.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mproc
import os
import sys
import time
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"

import cupy as cp  # noqa: E402
from cupy.cuda import nccl  # noqa: E402

N = (1 << 20) + 5


def digest(a) -> str:
    return hashlib.sha256(cp.asnumpy(a).tobytes()).hexdigest()


def inputs(rank: int):
    rs = cp.random.RandomState(1234 + rank)
    return rs.standard_normal(N, dtype=cp.float32)


def group(ngpus: int, fn) -> None:
    """fn(i) for every device i inside one NCCL group, then wait for all."""
    nccl.groupStart()
    for i in range(ngpus):
        with cp.cuda.Device(i):
            fn(i)
    nccl.groupEnd()
    for i in range(ngpus):
        cp.cuda.Device(i).synchronize()


def part_init_all(ngpus: int, res: dict, timing: dict) -> None:
    t0 = time.perf_counter()
    comms = nccl.NcclCommunicator.initAll(list(range(ngpus)))
    timing["initAll_ms"] = (time.perf_counter() - t0) * 1e3
    xs, outs = [], []
    for i in range(ngpus):
        with cp.cuda.Device(i):
            xs.append(inputs(i))
            outs.append(cp.empty(N * ngpus, dtype=cp.float32))
    f32 = nccl.NCCL_FLOAT32

    def stream(i: int) -> int:  # group() has made device i current
        return cp.cuda.get_current_stream().ptr

    group(ngpus, lambda i: comms[i].allReduce(xs[i].data.ptr, outs[i].data.ptr, N, f32,
                                              nccl.NCCL_SUM, stream(i)))
    res["initAll_allReduce_sum"] = [digest(outs[i][:N]) for i in range(ngpus)]
    group(ngpus, lambda i: comms[i].allReduce(xs[i].data.ptr, outs[i].data.ptr, N, f32,
                                              nccl.NCCL_MAX, stream(i)))
    res["initAll_allReduce_max"] = [digest(outs[i][:N]) for i in range(ngpus)]

    bufs = [None] * ngpus
    for i in range(ngpus):
        with cp.cuda.Device(i):
            bufs[i] = xs[i].copy()
    group(ngpus, lambda i: comms[i].bcast(bufs[i].data.ptr, N, f32, ngpus - 1, stream(i)))
    res["initAll_bcast"] = [digest(b) for b in bufs]

    group(ngpus, lambda i: comms[i].reduce(xs[i].data.ptr, outs[i].data.ptr, N, f32,
                                           nccl.NCCL_SUM, 0, stream(i)))
    res["initAll_reduce_root0"] = digest(outs[0][:N])

    group(ngpus, lambda i: comms[i].allGather(xs[i].data.ptr, outs[i].data.ptr, N, f32,
                                              stream(i)))
    res["initAll_allGather"] = [digest(o) for o in outs]

    m = N // ngpus
    group(ngpus, lambda i: comms[i].reduceScatter(xs[i].data.ptr, outs[i].data.ptr, m, f32,
                                                  nccl.NCCL_SUM, stream(i)))
    res["initAll_reduceScatter"] = [digest(outs[i][:m]) for i in range(ngpus)]

    def ring(i: int) -> None:
        comms[i].send(xs[i].data.ptr, 4097, f32, (i + 1) % ngpus, stream(i))
        comms[i].recv(bufs[i].data.ptr, 4097, f32, (i - 1) % ngpus, stream(i))
    group(ngpus, ring)
    res["initAll_sendrecv_ring"] = [digest(b[:4097]) for b in bufs]

    res["initAll_rank_device"] = [[c.rank_id(), c.device_id()] for c in comms]
    for c in comms:
        c.destroy()


def proc_worker(rank: int, ngpus: int, uid, q) -> None:
    try:
        cp.cuda.Device(rank).use()
        comm = nccl.NcclCommunicator(ngpus, uid, rank)
        x = inputs(rank)
        out = cp.empty_like(x)
        s = cp.cuda.get_current_stream().ptr
        comm.allReduce(x.data.ptr, out.data.ptr, N, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
        got = cp.empty(1001, dtype=cp.float32)
        nccl.groupStart()
        comm.send(x.data.ptr, 1001, nccl.NCCL_FLOAT32, (rank + 1) % ngpus, s)
        comm.recv(got.data.ptr, 1001, nccl.NCCL_FLOAT32, (rank - 1) % ngpus, s)
        nccl.groupEnd()
        cp.cuda.Device(rank).synchronize()
        q.put((rank, {"procs_allReduce": digest(out), "procs_sendrecv": digest(got)}, None))
        comm.destroy()
    except Exception as e:  # reported by the parent
        q.put((rank, {}, f"{type(e).__name__}: {e}"))


def part_procs(ngpus: int, res: dict) -> None:
    ctx = mproc.get_context("spawn")
    q = ctx.Queue()
    uid = nccl.get_unique_id()
    procs = [ctx.Process(target=proc_worker, args=(r, ngpus, uid, q)) for r in range(ngpus)]
    for p in procs:
        p.start()
    errors = []
    for _ in range(ngpus):
        rank, got, err = q.get(timeout=120)
        if err:
            errors.append(f"rank {rank}: {err}")
        for k, v in got.items():
            res.setdefault(k, [None] * ngpus)[rank] = v
    for p in procs:
        p.join(30)
    if errors:
        raise RuntimeError("; ".join(errors))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--ngpus", type=int, default=2)
    args = p.parse_args(argv)
    ngpus = min(args.ngpus, cp.cuda.runtime.getDeviceCount())
    if ngpus < 2:
        print("cupy_dropin: needs 2 GPUs", file=sys.stderr)
        return 2
    res: dict = {"nccl_version": nccl.get_version(), "ngpus": ngpus}
    timing: dict = {}
    t0 = time.perf_counter()
    part_init_all(ngpus, res, timing)
    part_procs(ngpus, res)
    timing["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps({"results": res, "timing": timing,
                                          "preload": os.environ.get("LD_PRELOAD", "")},
                                         indent=1, sort_keys=True))
    print(f"cupy_dropin: wrote {args.out} ({timing['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
