#!/usr/bin/env python3
"""DDP's own work, before and after a backend's first collectives: is a
DDP step without communication slower in a hetccl process than in a gloo
one, and since when?

    PYTHONPATH=python python3 tools/device/ddp_floor.py -n 8 --reps 2 \\
        [--config LABEL:BACKEND[:VAR=VALUE,...]] ...

Each launch starts n processes of one configuration, in alternating order
per repetition. The default configurations: gloo; hetccl; hetccl with
HETCCL_TRANSPORT=socket (no shared memory); gloo in processes that
initialised CUDA first (DDP_FLOOR_INIT_CUDA=1: torch.cuda.init(), where a
GPU is there); and hetccl with CUDA_VISIBLE_DEVICES empty (the library
finds no GPU, so a host rank never stages or asks CUDA about pointers).
The last two tell whether a gap follows CUDA being initialised. Every rank builds tools/bench_torch.py's
model (18.8 M parameters, batch 64, 16 / n intra-op threads) and times,
as medians of 10 steps after 2 of warm-up:

  plain0   forward and backward of the bare model (no DDP), before anything
  floor0   a DDP step whose comm hook only divides each bucket by n (no
           collective), before any DDP step with communication
  step     20 DDP steps with the backend's all-reduces
  floor1   floor0 again, after them
  plain1   plain0 again

and prints, per launch, the slowest rank and the median rank of each,
rank 0's CPU time by thread name during the two floor rows, and the median
rank's minor page faults per step in each row (glibc returning freed
tensors to the kernel and faulting them in again: its mmap and trim
thresholds move with what the process freed before, see docs/torch.md). A gap between
backends in floor0 is the process (the library loaded and set up); one
that appears only in floor1 is what the collectives left behind.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from bench_torch import free_port, rank_results, thread_cpu  # noqa: E402 (the model's bench: same helpers)

CONFIGS = ["gloo:gloo", "hetccl:hetccl", "socket:hetccl:HETCCL_TRANSPORT=socket",
           "gloo-cuda:gloo:DDP_FLOOR_INIT_CUDA=1", "hetccl-nogpu:hetccl:CUDA_VISIBLE_DEVICES="]


def rank_main(backend: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    if os.environ.get("DDP_FLOOR_INIT_CUDA") == "1" and torch.cuda.is_available():
        torch.cuda.init()
    if backend == "hetccl":
        importlib.import_module("hetccl.torch_backend")  # registers the backend
    dist.init_process_group(backend)
    torch.manual_seed(0)
    width = int((18.8e6 / 3) ** 0.5)
    layers: List[Any] = [torch.nn.Linear(256, width), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 16))
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [(torch.randn(64, 256, generator=gen), torch.randn(64, 16, generator=gen))
               for _ in range(4)]
    out: Dict[str, Any] = {"threads": {}, "faults": {}}

    def timed(step: Any, steps: int, tag: str) -> float:
        times = []
        for i in range(steps + 2):
            if i == 2:
                flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            step(*batches[i % len(batches)])
            times.append(time.perf_counter() - t0)
        flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0
        out["faults"][tag] = round(flt / steps)
        return statistics.median(times[2:]) * 1e3

    def plain(tag: str) -> None:
        def step(x: Any, y: Any) -> None:
            for p in model.parameters():
                p.grad = None
            torch.nn.functional.mse_loss(model(x), y).backward()
        dist.barrier()
        out[tag] = timed(step, 10, tag)

    def ddp_rows(net: Any, steps: int, tag: str) -> float:
        opt = torch.optim.SGD(net.parameters(), lr=0.0)  # the model stays as it is

        def step(x: Any, y: Any) -> None:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        return timed(step, steps, tag)

    # (no annotations: with this file's they are strings, which DDP's check refuses)
    def local_hook(_state, bucket):  # type: ignore[no-untyped-def]
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer().div_(n))
        return fut

    def floor(tag: str) -> None:
        net = DDP(model)
        net.register_comm_hook(None, local_hook)
        dist.barrier()
        cpu0 = thread_cpu()
        out[tag] = ddp_rows(net, 10, tag)
        cpu1 = thread_cpu()
        out["threads"][tag] = {k: round(v - cpu0.get(k, 0.0), 2) for k, v in cpu1.items()
                               if v - cpu0.get(k, 0.0) > 0.005}

    plain("plain0")
    floor("floor0")
    net = DDP(model)
    dist.barrier()
    out["step"] = ddp_rows(net, 20, "step")
    floor("floor1")
    plain("plain1")
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def launch(backend: str, env_extra: Dict[str, str], n: int,
           timeout: float) -> List[Dict[str, Any]]:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETCCL_")}
    if "HETCCL_LIBRARY" in os.environ:
        base["HETCCL_LIBRARY"] = os.environ["HETCCL_LIBRARY"]
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"),
                                                       base.get("PYTHONPATH")]))
    base.update(env_extra)
    procs = []
    for rank in range(n):
        env = dict(base, RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // n)))
        procs.append(subprocess.Popen([sys.executable, __file__, "--as-rank", backend], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return rank_results(procs, backend, timeout)


def parse_config(text: str) -> Tuple[str, str, Dict[str, str]]:
    label, backend, *rest = text.split(":", 2)
    if backend not in ("gloo", "hetccl"):
        raise SystemExit(f"--config {text!r}: the backend is gloo or hetccl")
    env = dict(a.split("=", 1) for a in rest[0].split(",") if a) if rest else {}
    return label, backend, env


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--as-rank":
        rank_main(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--config", action="append", metavar="LABEL:BACKEND[:VAR=VALUE,...]")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    configs = [parse_config(c) for c in (args.config or CONFIGS)]
    print(f"# DDP's own work on {args.n} ranks of {os.cpu_count()} CPUs, ms: slowest rank "
          "(median rank)")
    for rep in range(args.reps):
        for label, backend, env in (configs if rep % 2 == 0 else configs[::-1]):
            t0 = time.monotonic()
            res = launch(backend, env, args.n, args.timeout)
            rows = "  ".join(f"{k} {max(r[k] for r in res):.1f} "
                             f"({statistics.median(r[k] for r in res):.1f})"
                             for k in ("plain0", "floor0", "step", "floor1", "plain1"))
            print(f"{label:12s} {time.monotonic() - t0:5.1f}s  {rows}", flush=True)
            print(f"{'':12s} rank 0's threads, CPU s: {res[0]['threads']}", flush=True)
            print(f"{'':12s} minor page faults per step, median rank: "
                  + "  ".join(f"{k} {statistics.median(r['faults'][k] for r in res)}"
                              for k in res[0]["faults"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
