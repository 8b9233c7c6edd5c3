#!/usr/bin/env python3
"""Where a DDP step's time goes on one rank: the GPU's compute, its copy
engines (device to host, host to device) and hetccl's reduction kernels,
bin by bin over profiled steps, and the CPU time of the runtime calls
(a call that blocks shows as a long one).

    LD_PRELOAD=libhetccl.so HETCCL_ISLANDS=0,1 \\
        python3 tools/device/ddp_profile.py [--steps 2] [--bin-us 500] [--trace FILE]

The model and batches are train_bench.py's (two processes, one GPU each,
torch's nccl backend; whatever library LD_PRELOAD names serves it). Rank 0
runs torch.profiler over --steps steps after the warm-up and prints:
the step's GPU span; per bin, the share of the bin during which a compute
kernel, a D2H copy, an H2D copy and a hetccl reduction ran; totals and the
overlap of compute with copies; how long hetccl's reductions waited after
their piece arrived, and what each D2H copy that followed an idle engine
waited for; the longest runtime calls by name.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile

os.environ["NCCL_NVLS_ENABLE"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import train_bench as tb  # noqa: E402


def classify(ev: dict) -> str | None:
    cat, name = ev.get("cat", ""), ev.get("name", "")
    if cat == "gpu_memcpy":
        if "DtoH" in name:
            return "d2h"
        if "HtoD" in name:
            return "h2d"
        return "d2d"
    if cat == "kernel":
        return "hetccl" if "hetccl" in name else "compute"
    return None


def union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(iv: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in iv)


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    return sum(covered(y, a, b) for a, b in x)


def summarize(trace_path: str, bin_us: float) -> None:
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    cls: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        c = classify(e)
        if c:
            cls.setdefault(c, []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if not cls:
        print("no GPU activity in the trace")
        return
    lo = min(a for iv in cls.values() for a, _ in iv)
    hi = max(b for iv in cls.values() for _, b in iv)
    u = {k: union(v) for k, v in cls.items()}
    kinds = [k for k in ("compute", "d2h", "h2d", "hetccl", "d2d") if k in u]
    print(f"GPU span {((hi - lo) / 1000):.2f} ms over the profiled steps; busy ms: "
          + ", ".join(f"{k} {covered(u[k], lo, hi) / 1000:.2f}" for k in kinds))
    copies = union(u.get("d2h", []) + u.get("h2d", []))
    print(f"compute while a copy runs: {intersect(u.get('compute', []), copies) / 1000:.2f} ms; "
          f"copies with no compute beside them: "
          f"{(covered(copies, lo, hi) - intersect(u.get('compute', []), copies)) / 1000:.2f} ms")
    for k in ("d2h", "h2d"):
        iv = sorted(cls.get(k, []))
        if len(iv) < 2:
            continue
        size = sorted(b - a for a, b in iv)
        gaps = sorted(max(0.0, iv[i + 1][0] - iv[i][1]) for i in range(len(iv) - 1))
        pick = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
        print(f"{k}: {len(iv)} copies, duration p50 {pick(size, .5):.0f} us; idle gap before "
              f"the next: p10 {pick(gaps, .1):.1f} p50 {pick(gaps, .5):.1f} "
              f"p90 {pick(gaps, .9):.1f} us, {sum(g > 50 for g in gaps)} over 50 us")
    waits(cls)
    print(f"per {bin_us:.0f} us bin, % of the bin busy (t in ms from the first GPU event):")
    print("   t    " + " ".join(f"{k:>7}" for k in kinds))
    t = lo
    while t < hi:
        row = " ".join(f"{100 * covered(u[k], t, t + bin_us) / bin_us:7.0f}" for k in kinds)
        print(f"{(t - lo) / 1000:6.1f}  {row}")
        t += bin_us
    calls: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            calls.setdefault(e["name"], []).append(float(e["dur"]))
    print("runtime calls (count, total ms, longest us):")
    for name, d in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"  {name:40s} {len(d):6d} {sum(d) / 1000:8.2f} {max(d):9.1f}")
    comms = [float(e["dur"]) for e in events
             if e.get("cat") == "cpu_op"
             and any(k in e.get("name", "") for k in ("all_reduce", "allreduce"))]
    if comms:
        print(f"cpu all_reduce calls: {len(comms)}, total {sum(comms) / 1000:.2f} ms, "
              f"longest {max(comms):.0f} us")


def last_end_before(iv: list[tuple[float, float]], t: float) -> float | None:
    """The latest end among intervals that ended at or before t."""
    ends = [b for _, b in iv if b <= t]
    return max(ends) if ends else None


def waits(cls: dict[str, list[tuple[float, float]]], idle_us: float = 50.0,
          near_us: float = 20.0) -> None:
    """What the copies and hetccl's kernels waited for:
    - each hetccl kernel's start minus the end of the last H2D copy before
      it (the piece it reduces is in device memory by then): how long a
      reduction waits for the SMs;
    - each D2H copy that starts after the D2H engine idled over idle_us:
      which of a hetccl kernel, an H2D copy or a compute kernel ended last
      before it, and whether within near_us (a send held back behind the
      previous operation's reductions shows as "hetccl")."""
    pick = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    h2d, het = sorted(cls.get("h2d", [])), sorted(cls.get("hetccl", []))
    delays = sorted(a - e for a, _ in het
                    if (e := last_end_before(h2d, a)) is not None)
    if delays:
        print(f"hetccl kernels: {len(delays)}; start after the last H2D copy's end: "
              f"p50 {pick(delays, .5):.1f} p90 {pick(delays, .9):.1f} "
              f"max {delays[-1]:.1f} us")
    d2h = sorted(cls.get("d2h", []))
    counts: dict[str, int] = {}
    for i in range(1, len(d2h)):
        start = d2h[i][0]
        if start - d2h[i - 1][1] <= idle_us:
            continue
        ends = {k: last_end_before(cls.get(k, []), start) for k in ("hetccl", "h2d", "compute")}
        ends = {k: v for k, v in ends.items() if v is not None}
        if not ends:
            continue
        kind = max(ends, key=lambda k: ends[k])
        key = kind if start - ends[kind] <= near_us else "nothing within %.0f us" % near_us
        counts[key] = counts.get(key, 0) + 1
    if counts:
        print(f"D2H copies after an idle D2H engine (> {idle_us:.0f} us): what ended last before "
              "each: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def worker(rank: int, args, port: int, q) -> None:
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, device_id=dev)
    try:
        net = torch.nn.parallel.DistributedDataParallel(tb.model(args.layers, dev),
                                                        device_ids=[dev])
        step = tb.data_parallel_step(net, rank, dev)
        for s in range(tb.WARMUP + 2):
            step(s)
        torch.cuda.synchronize(dev)
        dist.barrier()
        path = None
        if rank == 0:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for s in range(args.steps):
                    step(100 + s)
                torch.cuda.synchronize(dev)
            path = args.trace or tempfile.mktemp(suffix=".json")
            prof.export_chrome_trace(path)
        else:
            for s in range(args.steps):
                step(100 + s)
            torch.cuda.synchronize(dev)
        q.put((rank, path))
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--bin-us", type=float, default=1000)
    ap.add_argument("--trace", help="keep the Chrome trace here")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=worker, args=(r, args, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(30)
    print(f"library: {os.environ.get('LD_PRELOAD') or 'torch NCCL'}; "
          f"islands {os.environ.get('HETCCL_ISLANDS', '-')}")
    summarize(got[0], args.bin_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
