#!/usr/bin/env python3
"""Send/recv on one communicator of four GPUs in two islands (0,0,1,1),
between ranks of one island and between islands, with hetccl's routing of
a send inside a vendor island to the island's NCCL (hier/hier_ops.c) and
without it (HETCCL_HIER=0: every pair on hetccl's engine and data plane).

    python3 tools/device/p2p_islands.py [--mib 256] [--iters 10]

One process per GPU, hetccl's cupy-style API on CuPy buffers. Pattern
"inside": 0 -> 1 and 2 -> 3 at once; "across": 1 -> 2 and 3 -> 0 at
once. Each pattern moves --mib MiB per pair, --iters times after two
warm-up rounds; prints each pair's GB/s (the receiver's time over the
timed rounds) and checks every byte that arrived. Exits 1 on a wrong
byte.
"""
from __future__ import annotations

import argparse
import multiprocessing as mproc
import os
import sys
import time

PATTERNS = {"inside": {0: 1, 2: 3}, "across": {1: 2, 3: 0}}


def worker(rank: int, world: int, uid, env: dict, nbytes: int, iters: int, q) -> None:
    os.environ.update(env)
    import cupy as cp
    from hetccl import nccl
    try:
        cp.cuda.Device(rank).use()
        comm = nccl.NcclCommunicator(world, uid, rank)
        stream = cp.cuda.Stream(non_blocking=True)
        n = nbytes // 4
        with stream:
            src = cp.arange(n, dtype=cp.float32) * 0 + (rank + 1)
            dst = cp.zeros(n, dtype=cp.float32)
        stream.synchronize()
        out = {}
        for name, pairs in PATTERNS.items():
            to = pairs.get(rank)
            frm = next((s for s, d in pairs.items() if d == rank), None)
            comm_barrier(comm, cp, stream)
            for it in range(2 + iters):
                if it == 2:
                    stream.synchronize()
                    t0 = time.perf_counter()
                nccl.groupStart()
                if to is not None:
                    comm.send(src.data.ptr, n, nccl.NCCL_FLOAT32, to, stream.ptr)
                if frm is not None:
                    comm.recv(dst.data.ptr, n, nccl.NCCL_FLOAT32, frm, stream.ptr)
                nccl.groupEnd()
            stream.synchronize()
            secs = time.perf_counter() - t0
            if frm is not None:
                wrong = int(cp.count_nonzero(dst != float(frm + 1)).get())
                out[name] = {"from": frm, "gbps": nbytes * iters / secs / 1e9, "wrong": wrong}
                dst.fill(0)
        comm.destroy()
        q.put((rank, out, None))
    except Exception as e:  # reported, not raised: the parent waits for every rank
        q.put((rank, {}, repr(e)))


def comm_barrier(comm, cp, stream) -> None:
    """An allreduce of one float: every rank is at the same pattern."""
    from hetccl import nccl
    x = cp.ones(1, dtype=cp.float32)
    comm.allReduce(x.data.ptr, x.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()


def run(config: str, env: dict, args) -> int:
    from hetccl import nccl
    world = 4
    uid = nccl.get_unique_id()
    ctx = mproc.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, uid, env, args.mib << 20, args.iters, q))
             for r in range(world)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    bad = 0
    for rank, out, err in got:
        if err:
            print(f"{config}: rank {rank}: FAIL: {err}")
            bad += 1
        for name, r in out.items():
            wrong = f", {r['wrong']} wrong" if r["wrong"] else ""
            print(f"{config}: {name} {r['from']} -> {rank}: {r['gbps']:.1f} GB/s{wrong}")
            bad += r["wrong"] != 0
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    base = {"HETCCL_ISLANDS": "0,0,1,1", "NCCL_NVLS_ENABLE": "0"}
    bad = 0
    for config, env in (("routed", base), ("engine", {**base, "HETCCL_HIER": "0"}),
                        ("routed again", base), ("engine again", {**base, "HETCCL_HIER": "0"})):
        bad += run(config, env, args)
    print("p2p_islands:", "PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
