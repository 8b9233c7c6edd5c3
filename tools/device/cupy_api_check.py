#!/usr/bin/env python3
"""The same collectives through three Python APIs, compared: CuPy's own
cupy.cuda.nccl (the real NCCL), hetccl's cupy-style module with the same
raw-pointer arguments (hetccl.nccl), and hetccl's array API
(hetccl.Communicator) handed the CuPy arrays themselves.

    python3 tools/device/cupy_api_check.py [--ranks 2] [--islands 0,1]

One process per GPU (ranks beyond the GPUs share them round-robin, which
only hetccl accepts: the cupy.cuda.nccl part is then skipped, unless the
script runs with libhetccl in LD_PRELOAD, where cupy.cuda.nccl's calls reach
hetccl as an unmodified program's do: then it runs, labelled "via
LD_PRELOAD", and compares CuPy's bindings to hetccl's on the same
communicator layout). hetccl's
communicators run with HETCCL_ISLANDS (default one island per rank), so
their bytes cross on hetccl's own path while CuPy's go through NCCL. The
inputs are small integers in float32, so every reduction order gives the
same bits: the three results must be equal, and equal to numpy's.
Prints one line per collective and API; exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import multiprocessing as mproc
import os
import sys

N = (1 << 20) + 3  # elements per rank: several plane pieces, not a multiple of any


def inputs(rank: int, n: int):
    import numpy as np
    return (np.arange(n, dtype=np.int64) * (rank + 3) % 97 - 40).astype(np.float32)


def expected(world: int, n: int):
    import numpy as np
    xs = [inputs(r, n) for r in range(world)]
    return {
        "allReduce": sum(xs),
        "reduce": sum(xs),
        "broadcast": xs[0],
        "allGather": np.concatenate(xs),
        "reduceScatter": None,  # per rank below
        "sendrecv": None,
    }, xs


def run_pointer_api(mod, comm, rank: int, world: int, stream) -> dict:
    """Every collective through a cupy.cuda.nccl-style module (pointers)."""
    import cupy as cp
    n = N
    out = {}
    f32, s = mod.NCCL_FLOAT32, stream.ptr
    with stream:  # every allocation and fill ordered before the collectives on `stream`
        return _pointer_calls(mod, comm, rank, world, stream, n, f32, s, out)


def _pointer_calls(mod, comm, rank, world, stream, n, f32, s, out) -> dict:
    import cupy as cp
    x = cp.asarray(inputs(rank, n))
    r = cp.zeros(n, cp.float32)
    comm.allReduce(x.data.ptr, r.data.ptr, n, f32, mod.NCCL_SUM, s)
    out["allReduce"] = r
    r = cp.zeros(n, cp.float32)
    comm.reduce(x.data.ptr, r.data.ptr, n, f32, mod.NCCL_SUM, 0, s)
    out["reduce"] = r
    r = cp.zeros(n, cp.float32)
    comm.broadcast(x.data.ptr, r.data.ptr, n, f32, 0, s)
    out["broadcast"] = r
    r = cp.zeros(n * world, cp.float32)
    comm.allGather(x.data.ptr, r.data.ptr, n, f32, s)
    out["allGather"] = r
    big = cp.asarray(inputs(rank, n * world))
    r = cp.zeros(n, cp.float32)
    comm.reduceScatter(big.data.ptr, r.data.ptr, n, f32, mod.NCCL_SUM, s)
    out["reduceScatter"] = r
    r = cp.zeros(n, cp.float32)
    mod.groupStart()
    comm.send(x.data.ptr, n, f32, (rank + 1) % world, s)
    comm.recv(r.data.ptr, n, f32, (rank - 1) % world, s)
    mod.groupEnd()
    out["sendrecv"] = r
    stream.synchronize()
    return {k: cp.asnumpy(v) for k, v in out.items()}


def run_array_api(comm, rank: int, world: int, stream) -> dict:
    """The same through hetccl.Communicator, handed CuPy arrays."""
    import cupy as cp
    import hetccl
    n = N
    out = {}
    with stream:
        x = cp.asarray(inputs(rank, n))
        out["allReduce"] = comm.all_reduce(x, cp.zeros(n, cp.float32), op="sum")
        out["reduce"] = comm.reduce(x, cp.zeros(n, cp.float32), op="sum", root=0)
        out["broadcast"] = comm.broadcast(x, cp.zeros(n, cp.float32), root=0)
        out["allGather"] = comm.all_gather(x, cp.zeros(n * world, cp.float32))
        big = cp.asarray(inputs(rank, n * world))
        out["reduceScatter"] = comm.reduce_scatter(big, cp.zeros(n, cp.float32), op="sum")
        r = cp.zeros(n, cp.float32)
        hetccl.groupStart()
        comm.send(x, (rank + 1) % world)
        comm.recv(r, (rank - 1) % world)
        hetccl.groupEnd()
        out["sendrecv"] = r
    stream.synchronize()
    return {k: cp.asnumpy(v) for k, v in out.items()}


def worker(rank: int, world: int, ngpus: int, uids: dict, islands: str, q) -> None:
    os.environ["HETCCL_ISLANDS"] = islands
    import cupy as cp
    cp.cuda.Device(rank % ngpus).use()
    stream = cp.cuda.Stream(non_blocking=True)
    results = {}
    try:
        if "cupy" in uids:
            from cupy.cuda import nccl
            comm = nccl.NcclCommunicator(world, uids["cupy"], rank)
            label = "cupy.cuda.nccl" + (" via LD_PRELOAD" if "libhetccl" in
                                        os.environ.get("LD_PRELOAD", "") else "")
            results[label] = run_pointer_api(nccl, comm, rank, world, stream)
            comm.destroy()
        import hetccl
        from hetccl import nccl as hnccl
        hcomm = hnccl.NcclCommunicator(world, uids["hetccl"], rank)
        backend = hcomm.backend()
        results["hetccl.nccl"] = run_pointer_api(hnccl, hcomm, rank, world, stream)
        results["hetccl.Communicator"] = run_array_api(hetccl.Communicator.wrap(hcomm), rank,
                                                       world, stream)
        hcomm.destroy()
        q.put((rank, backend, results, None))
    except Exception as e:  # reported by the parent, with the rank
        q.put((rank, "", {}, f"{type(e).__name__}: {e}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--islands", default="rank")
    args = ap.parse_args()
    import cupy as cp
    import numpy as np
    ngpus = cp.cuda.runtime.getDeviceCount()
    world = args.ranks
    from hetccl import nccl as hnccl
    uids = {"hetccl": hnccl.get_unique_id()}
    preloaded = "libhetccl" in os.environ.get("LD_PRELOAD", "")
    if world <= ngpus or preloaded:
        from cupy.cuda import nccl
        uids["cupy"] = nccl.get_unique_id()
        if preloaded:
            print("cupy_api_check: libhetccl is in LD_PRELOAD: cupy.cuda.nccl's calls reach hetccl")
    else:
        print(f"cupy_api_check: {world} ranks on {ngpus} GPU(s): NCCL takes one rank per GPU, "
              "so the cupy.cuda.nccl part is skipped")
    ctx = mproc.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, ngpus, uids, args.islands, q))
             for r in range(world)]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in range(world)]
    for p in procs:
        p.join(60)
    want, xs = expected(world, N)
    bad = 0
    for rank, backend, results, err in sorted(got, key=lambda g: g[0]):
        if err:
            print(f"rank {rank}: FAIL: {err}")
            bad += 1
            continue
        want["reduceScatter"] = sum(inputs(r, N * world) for r in range(world))[rank * N:(rank + 1) * N]
        want["sendrecv"] = xs[(rank - 1) % world]
        for coll in want:
            if coll == "reduce" and rank != 0:
                continue
            line = []
            for api, res in results.items():
                same = np.array_equal(res[coll], want[coll])
                bad += not same
                if same:
                    line.append(f"{api} ok")
                    continue
                wrong = np.flatnonzero(res[coll] != want[coll])
                line.append(f"{api} DIFFERS at {wrong.size} elements, first [{wrong[0]}] "
                            f"{res[coll][wrong[0]]} (want {want[coll][wrong[0]]})")
            print(f"rank {rank} ({backend}) {coll:14s} " + ", ".join(line))
        apis = list(results)
        for coll in want:
            if coll == "reduce" and rank != 0:
                continue
            for a in apis[1:]:
                if not np.array_equal(results[a][coll], results[apis[0]][coll]):
                    print(f"rank {rank} {coll}: {a} differs from {apis[0]}")
                    bad += 1
    print(f"cupy_api_check: {world} ranks, islands {args.islands}: "
          f"{'PASS' if bad == 0 else f'FAIL ({bad} differences)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
