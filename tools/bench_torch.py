#!/usr/bin/env python3
"""torch.distributed on CPU tensors: the hetccl backend against gloo in one run.

Each repetition launches the same job twice, once per backend, in
alternating order: N rank processes on this host (env:// rendezvous, no
HETCCL_* variable set), each timing every collective at every size, then
a DDP training step. It prints, per (collective, size), both backends'
median times, `ratio` (gloo's median over hetccl's: > 1 means hetccl is
faster) and `paired` (the median over repetitions of each hetccl launch
against the gloo launch beside it), and the same for the DDP step, with
the loss of both after the last step:

    python tools/bench_torch.py -n 4 --reps 5
    python tools/bench_torch.py -n 8 --sizes 1K,1M,16M --json out.json --plot out.png
    python tools/bench_torch.py -n 8 --variant spin0:HETCCL_SPIN=0   # one more hetccl job

With `--direct`, each hetccl rank also times every collective through the
library alone: the same buffers on the backend's own communicator, called
through hetccl's Python API (`hetccl.nccl`), with no torch.distributed
between. The table adds that column (`library`), so a point where hetccl
loses to gloo says whether the time goes to the library or to the way
torch reaches it.

A variant (`--variant LABEL:VAR=VALUE[,VAR=VALUE]`, repeatable) launches the
hetccl job once more per repetition with those variables, in the same
alternation; the table adds its time and its paired ratio against gloo.

Timing: per size, warmup iterations, then a barrier and `iters` calls
each waited on; a rank's time is the mean per call, the point's time the
slowest rank's. Every rank uses cores // N intra-op threads (torch's
default would oversubscribe the host N times over; `--threads` sets
another count, to see how a backend fares when compute wants more cores
than there are). With `--bind`, each
rank of both backends is held to a block of cores // N CPUs of its own
(what `hetccl run` does: hetccl.launcher.core_binding), so where the
scheduler puts a launch's compute threads no longer moves the figures.

The DDP step (a 4-layer MLP of `--ddp-params`, batch 64, SGD) is also
taken apart on every rank (`--profile`): compute alone (DDP's no_sync:
the same forward and backward with no communication), DDP without
communication (a comm hook that only divides each bucket by n, as DDP's
default path does before its all-reduce: DDP's own copies into and out of
its buckets, with nothing sent), DDP in step with no data (the hook
all-reduces one element of each bucket: every bucket waits for the
slowest rank), the step with
communication, and the CPU time of each named thread of the process
during the steps (torch's autograd and OpenMP threads, the backend's
worker `hetccl-pg-*`, the library's proxy threads).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
KIB, MIB = 1 << 10, 1 << 20
COLLS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
         "all_to_all_single", "send_recv")
BACKENDS = ("gloo", "hetccl")


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": KIB, "M": MIB, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def size_text(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


# -- one rank ---------------------------------------------------------------------
def thread_cpu() -> Dict[str, float]:
    """CPU seconds of each thread of this process, summed by thread name."""
    out: Dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # name groups: a thread pool's threads differ by a number only
        key = name.rstrip("0123456789-_") or name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def minor_faults() -> int:
    """This process's minor page faults so far (memory touched for the first time)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // n))
    if args.backend == "hetccl":
        import hetccl.torch_backend  # noqa: F401 (registers the backend)
    dist.init_process_group(args.backend)
    result: Dict[str, Any] = {"rank": rank, "points": {}, "ddp": {}, "direct": {}}
    comm = None
    if args.direct and args.backend == "hetccl":
        dist.all_reduce(torch.ones(1))  # the backend makes its communicator on first use
        comm = dist.distributed_c10d._get_default_group()._get_backend(
            torch.device("cpu"))._comm

    def timed(fn, iters: int) -> float:
        for _ in range(args.warmup):
            fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    for size in args.sizes:
        count = max(1, size // 4)
        iters = max(3, min(200, int(args.budget / max(size / 2e9, 2e-5))))
        for coll in args.colls:
            op = make_op(coll, count, rank, n)
            if op is None:
                continue
            result["points"][f"{coll}/{size}"] = timed(op, iters)
            if comm is not None:
                result["direct"][f"{coll}/{size}"] = timed(
                    make_op(coll, count, rank, n, comm), iters)
    if args.ddp_steps:
        result["ddp"] = ddp(args, rank, n)
    dist.barrier()
    if args.backend == "hetccl":  # the library this process ran (a variant may name another)
        from hetccl import _lib
        result["library"] = str(_lib._path or "")
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)


def make_op(coll: str, count: int, rank: int, n: int, comm: Any = None):
    """One call of `coll` on `count` float32 elements per rank through
    torch.distributed, or, given the hetccl backend's communicator `comm`,
    the same call on the same buffers straight through the library
    (hetccl.nccl, sum)."""
    import torch
    import torch.distributed as dist

    per = max(1, count // n)  # a rank's block (AllGather, ReduceScatter, AlltoAll)
    shapes = {"all_reduce": (count, 0), "broadcast": (count, 0),  # (input, output); 0: in place
              "all_gather_into_tensor": (per, per * n), "reduce_scatter_tensor": (per * n, per),
              "all_to_all_single": (per * n, per * n), "send_recv": (count, count)}
    if coll not in shapes:
        raise ValueError(coll)
    ins, outs = shapes[coll]
    src = torch.ones(ins)
    dst = torch.empty(outs) if outs else src
    if comm is not None:
        from hetccl.nccl import NCCL_FLOAT32 as F32, NCCL_SUM as SUM
        a, b = src.data_ptr, dst.data_ptr  # bound: the lambdas keep the tensors alive
    if coll == "send_recv":  # pairs (0,1), (2,3), ...: each sends then receives, or the reverse
        peer = rank ^ 1
        if peer >= n:
            return lambda: None
        if comm is None:
            send, recv = (lambda: dist.send(src, peer)), (lambda: dist.recv(dst, peer))
        else:
            send, recv = ((lambda: comm.send(a(), count, F32, peer)),
                          (lambda: comm.recv(b(), count, F32, peer)))
        first, second = (send, recv) if rank % 2 == 0 else (recv, send)
        return lambda: (first(), second())
    if comm is None:
        return {"all_reduce": lambda: dist.all_reduce(src),
                "broadcast": lambda: dist.broadcast(src, 0),
                "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(dst, src),
                "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(dst, src),
                "all_to_all_single": lambda: dist.all_to_all_single(dst, src)}[coll]
    return {"all_reduce": lambda: comm.allReduce(a(), a(), count, F32, SUM),
            "broadcast": lambda: comm.bcast(a(), count, F32, 0),
            "all_gather_into_tensor": lambda: comm.allGather(a(), b(), per, F32),
            "reduce_scatter_tensor": lambda: comm.reduceScatter(a(), b(), per, F32, SUM),
            "all_to_all_single": lambda: comm.alltoall(a(), b(), per, F32)}[coll]


def ddp(args: argparse.Namespace, rank: int, n: int) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    width = int((args.ddp_params / 3) ** 0.5)  # three width x width layers, and the ends
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 16))
    params = sum(p.numel() for p in model.parameters())
    net = DDP(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [(torch.randn(64, 256, generator=gen), torch.randn(64, 16, generator=gen))
               for _ in range(4)]

    def step(i: int, sync: bool = True) -> float:
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        if sync:
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
        else:
            with net.no_sync():
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
        opt.step()
        return float(loss)

    for i in range(3):
        step(i)
    out: Dict[str, Any] = {"params": params}
    cpu0, flt0 = thread_cpu(), minor_faults()
    times, loss = [], 0.0
    for i in range(args.ddp_steps):
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
    cpu1 = thread_cpu()
    out["step"] = statistics.median(times)
    out["faults"] = {"step": (minor_faults() - flt0) / max(1, args.ddp_steps)}
    maps = Path("/proc/self/maps").read_text().splitlines()
    out["maps"] = {"mappings": len(maps), "gpu_libraries": sorted({
        Path(ln.split()[-1]).name for ln in maps
        if any(k in ln for k in ("libcuda.so", "libnccl", "libcudart", "libamdhip"))})}
    out["loss"] = loss
    out["threads"] = {k: round(cpu1.get(k, 0) - cpu0.get(k, 0), 3) for k in cpu1
                      if cpu1.get(k, 0) - cpu0.get(k, 0) > 0.005}
    if args.profile:
        # compute alone: the same steps with DDP's communication off; no
        # optimizer step changes the model here, so losses stay comparable
        ctimes = []
        flt0 = minor_faults()
        for i in range(min(args.ddp_steps, 10)):
            t0 = time.perf_counter()
            step(i, sync=False)
            ctimes.append(time.perf_counter() - t0)
        out["compute"] = statistics.median(ctimes)
        out["faults"]["compute"] = (minor_faults() - flt0) / len(ctimes)
        # (hooks without annotations: this file's are strings, which DDP's
        # check refuses)
        def hooked(hook, name: str) -> float:  # type: ignore[no-untyped-def]
            """The median step of the same model under a second DDP with hook."""
            net2 = DDP(model)
            net2.register_comm_hook(None, hook)
            times2 = []
            prof = None
            for i in range(min(args.ddp_steps, 10) + 2):
                if i == 2:
                    flt0, tcpu0 = minor_faults(), thread_cpu()
                    if args.ops_profile and name == "floor" and rank == 0:
                        prof = torch.profiler.profile(
                            activities=[torch.profiler.ProfilerActivity.CPU])
                        prof.__enter__()
                x, y = batches[i % len(batches)]
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.mse_loss(net2(x), y).backward()
                opt.step()
                times2.append(time.perf_counter() - t0)
            if prof is not None:
                prof.__exit__(None, None, None)
                out["ops"] = prof.key_averages().table(sort_by="self_cpu_time_total",
                                                       row_limit=14)
            out["faults"][name] = (minor_faults() - flt0) / len(times2[2:])
            tcpu1 = thread_cpu()
            out.setdefault("row_threads", {})[name] = {
                k: round(v - tcpu0.get(k, 0), 3) for k, v in tcpu1.items()
                if v - tcpu0.get(k, 0) > 0.005}
            return statistics.median(times2[2:])

        # DDP's own work with no communication: the hook only divides each
        # bucket by n, as DDP's default path does before its all-reduce
        def local_hook(_state, bucket):  # type: ignore[no-untyped-def]
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer().div_(n))
            return fut

        # ... and with the ranks kept in step: the hook all-reduces one
        # element of each bucket through the backend under test, so the
        # step waits for the slowest rank at every bucket but moves no data
        def sync_hook(_state, bucket):  # type: ignore[no-untyped-def]
            buf = bucket.buffer().div_(n)
            work = dist.all_reduce(buf[:1], async_op=True)
            return work.get_future().then(lambda _f: buf)

        out["floor"] = hooked(local_hook, "floor")
        out["sync"] = hooked(sync_hook, "sync")
    return out


# -- the driver -------------------------------------------------------------------
def launch(backend: str, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """One job on `backend` ("gloo", "hetccl" or a variant's "hetccl:LABEL")."""
    if str(REPO / "python") not in sys.path:  # the package, for the driver alone
        sys.path.insert(0, str(REPO / "python"))
    from hetccl.ports import free_ports  # where the ranks' MASTER_PORT comes from
    port = free_ports(1)[0]
    procs = []
    blocks: List[Optional[List[int]]] = [None] * args.n
    if args.bind:
        from hetccl.launcher import core_binding
        blocks = core_binding(args.n)
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETCCL_")}
    if "HETCCL_LIBRARY" in os.environ:
        base["HETCCL_LIBRARY"] = os.environ["HETCCL_LIBRARY"]
    base.update(args.variant_env.get(backend, {}))  # a variant's HETCCL_LIBRARY wins
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"),
                                                       base.get("PYTHONPATH")]))
    for rank in range(args.n):
        env = dict(base, RANK=str(rank), WORLD_SIZE=str(args.n), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(
                       max(1, (os.cpu_count() or 1) // args.n)))
        cmd = [sys.executable, __file__, "--as-rank", "--backend", backend.split(":")[0],
               "--sizes", ",".join(map(str, args.sizes)), "--colls", ",".join(args.colls),
               "--ddp-steps", str(args.ddp_steps), "--ddp-params", str(args.ddp_params),
               "--warmup", str(args.warmup), "--budget", str(args.budget),
               "--threads", str(args.threads)]
        if args.profile:
            cmd.append("--profile")
        if args.direct:
            cmd.append("--direct")
        if args.ops_profile:
            cmd.append("--ops-profile")
        pin = (lambda c=blocks[rank]: os.sched_setaffinity(0, c)) if blocks[rank] else None
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, preexec_fn=pin))
    results = rank_results(procs, f"{backend} job", args.timeout, args.rank_logs and
                           Path(args.rank_logs) / backend.replace(":", "-"))
    want, ran = base.get("HETCCL_LIBRARY"), results[0].get("library")
    if backend != "gloo" and want and ran and Path(ran).resolve() != Path(want).resolve():
        raise SystemExit(f"{backend} job: the ranks ran {ran}, not HETCCL_LIBRARY={want}")
    return results


def rank_results(procs: List[subprocess.Popen], what: str, timeout: float,
                 logs: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Each rank's last `RESULT <json>` line; a rank that fails or outlives
    timeout stops them all, saying which. With `logs`, each rank's stderr
    is appended to logs/rank<N>.err (the library's HETCCL_DEBUG lines)."""
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{what}: rank {rank} still running after {timeout} s")
        if logs:
            logs.mkdir(parents=True, exist_ok=True)
            with open(logs / f"rank{rank}.err", "a") as f:
                f.write(err)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            for q in procs:
                q.kill()
            raise SystemExit(f"{what}: rank {rank} failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def job_summary(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The slowest rank's time per point and DDP step; rank 0's profile."""
    points = {k: max(r["points"][k] for r in results) for k in results[0]["points"]}
    direct = {k: max(r["direct"][k] for r in results) for k in results[0].get("direct", {})}
    ddp = {}
    if results[0]["ddp"]:
        ddp = dict(results[0]["ddp"])
        ddp["step"] = max(r["ddp"]["step"] for r in results)
        for key in ("compute", "floor", "sync"):
            if key in ddp:
                ddp[key] = max(r["ddp"][key] for r in results)
        ddp["losses"] = [r["ddp"]["loss"] for r in results]
    return {"points": points, "ddp": ddp, "direct": direct,
            "library": results[0].get("library", "")}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=4, help="ranks (processes) on this host")
    ap.add_argument("--reps", type=int, default=5, help="alternating launches of each backend")
    ap.add_argument("--sizes", default="1K,1M,16M,64M",
                    help="bytes per rank's buffer (K, M, G suffixes)")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--ddp-steps", type=int, default=20, help="timed DDP steps (0: none)")
    ap.add_argument("--ddp-params", type=float, default=18.8e6)
    ap.add_argument("--profile", action="store_true",
                    help="also time the DDP step's compute alone (no_sync)")
    ap.add_argument("--ops-profile", action="store_true",
                    help="with --profile: torch.profiler's operator table of rank 0's DDP "
                         "steps without communication (which operators take the time)")
    ap.add_argument("--direct", action="store_true",
                    help="also time each collective through the library alone, on the hetccl "
                         "backend's own communicator (the column `library`)")
    ap.add_argument("--bind", action="store_true",
                    help="hold each rank to a block of CPUs of its own, as `hetccl run` does")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads per rank (0: cores // N, so the ranks fill the host)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.05,
                    help="about this many seconds of calls per point")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:VAR=VALUE,...",
                    help="one more hetccl job per repetition with these variables")
    ap.add_argument("--json", help="write every launch's summary here")
    ap.add_argument("--rank-logs", help="append each rank's stderr to DIR/<backend>/rank<N>.err "
                    "(with a variant's HETCCL_DEBUG=INFO: which algorithm and transport "
                    "settings the ranks took)")
    ap.add_argument("--plot", help="a PNG of the ratios (needs matplotlib)")
    ap.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.as_rank:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        args.colls = args.colls.split(",")
        rank_main(args)
        return 0
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.colls = [c for c in args.colls.split(",") if c]
    bad = [c for c in args.colls if c not in COLLS]
    if bad:
        ap.error(f"unknown collectives {bad}: choose from {', '.join(COLLS)}")
    args.variant_env = {}
    for v in args.variant:
        label, _, assigns = v.partition(":")
        pairs = [a.split("=", 1) for a in assigns.split(",") if a]
        if not label or not pairs or any(len(p) != 2 for p in pairs):
            ap.error(f"--variant {v!r}: LABEL:VAR=VALUE[,VAR=VALUE]")
        args.variant_env[f"hetccl:{label}"] = dict(pairs)
    backends = list(BACKENDS) + list(args.variant_env)
    runs: Dict[str, List[Dict[str, Any]]] = {b: [] for b in backends}
    for rep in range(args.reps):
        order = backends if rep % 2 == 0 else backends[::-1]
        for backend in order:
            t0 = time.monotonic()
            runs[backend].append(job_summary(launch(backend, args)))
            print(f"# rep {rep + 1}/{args.reps}: {backend} job {time.monotonic() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    rows = table(args, runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.n, "cpus": os.cpu_count(),
                                               "rows": rows, "runs": runs}, indent=1))
    if args.plot:
        plot(rows, args, args.plot)
    return 0


def table(args: argparse.Namespace, runs: Dict[str, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    rows = []
    variants = [b for b in runs if b not in BACKENDS]
    print(f"# torch.distributed on CPU tensors, n={args.n} on {os.cpu_count()} CPUs"
          f"{', each rank bound to its own CPUs' if args.bind else ''}, "
          f"{args.reps} alternating launches each; times are the slowest rank's")
    for b in runs:
        if b != "gloo":
            print(f"# {b}: {runs[b][0].get('library') or 'library not seen'}")
    direct = bool(runs["hetccl"][0].get("direct"))
    extra = "".join(f" {v} | paired |" for v in variants) + (" library |" if direct else "")
    print(f"| op | size | gloo | hetccl | ratio | paired | wins |{extra}")
    print("| --- " * (7 + 2 * len(variants) + direct) + "|")

    def series(backend: str, key: str) -> List[float]:
        return [r["ddp"]["step"] if key == "ddp" else r["points"][key] for r in runs[backend]]

    keys = list(runs["gloo"][0]["points"]) + (["ddp"] if runs["gloo"][0]["ddp"] else [])
    for key in keys:
        g = series("gloo", key)
        op, size = ("ddp_step", 0) if key == "ddp" else (key.split("/")[0], int(key.split("/")[1]))
        r = row(op, size, g, series("hetccl", key))
        r["variants"] = {v: row(op, size, g, series(v, key)) for v in variants}
        if direct and key != "ddp":
            r["library"] = statistics.median(x["direct"][key] for x in runs["hetccl"])
        rows.append(r)
    for r in rows:
        size = size_text(r["size"]) if r["size"] else f"{runs['gloo'][0]['ddp']['params'] / 1e6:.1f} M params"
        cols = "".join(f" {fmt(r['variants'][v]['hetccl'])} | {r['variants'][v]['paired']:.2f} |"
                       for v in variants)
        if direct:
            cols += f" {fmt(r['library'])} |" if "library" in r else " |"
        print(f"| {r['op']} | {size} | {fmt(r['gloo'])} | {fmt(r['hetccl'])} | "
              f"{r['ratio']:.2f} | {r['paired']:.2f} | {r['wins']}/{len(r['pairs'])} |{cols}")
    if runs["gloo"][0]["ddp"]:
        lg = runs["gloo"][-1]["ddp"]["losses"]
        lh = runs["hetccl"][-1]["ddp"]["losses"]
        rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(lh, lg))
        print(f"# DDP loss after the last step, rank 0: gloo {lg[0]:.9g}, hetccl {lh[0]:.9g}; "
              f"largest relative difference over ranks {rel:.2g}")
        for b in runs:
            d = runs[b][-1]["ddp"]
            extra = (f"compute alone (no_sync) {d['compute'] * 1e3:.1f} ms, "
                     if "compute" in d else "")
            extra += (f"DDP without communication {d['floor'] * 1e3:.1f} ms, "
                      if "floor" in d else "")
            extra += (f"DDP in step, no data {d['sync'] * 1e3:.1f} ms, "
                      if "sync" in d else "")
            threads = ", ".join(f"{k} {v:.2f} s" for k, v in
                                sorted(d["threads"].items(), key=lambda kv: -kv[1]))
            if "faults" in d:
                extra += "minor page faults per step: " + ", ".join(
                    f"{k} {v:.0f}" for k, v in d["faults"].items()) + ", "
            for row_name, th in d.get("row_threads", {}).items():
                print(f"# {b}: CPU time by thread in the rows '{row_name}' on rank 0: " + ", ".join(
                    f"{k} {v:.2f} s" for k, v in sorted(th.items(), key=lambda kv: -kv[1])))
            if "maps" in d:
                print(f"# {b}: rank 0's memory mappings after the steps: {d['maps']['mappings']}; "
                      f"GPU libraries mapped: {', '.join(d['maps']['gpu_libraries']) or 'none'}")
            if "ops" in d:
                print(f"# {b}: operators of rank 0's DDP steps without communication:\n"
                      + "\n".join("#   " + ln for ln in d["ops"].splitlines()))
            print(f"# {b}: step {d['step'] * 1e3:.1f} ms, {extra}CPU time by thread over "
                  f"{args.ddp_steps} steps on rank 0: {threads}")
    return rows


def row(op: str, size: int, g: List[float], h: List[float]) -> Dict[str, Any]:
    pairs = [a / b for a, b in zip(g, h)]
    return {"op": op, "size": size, "gloo": statistics.median(g), "hetccl": statistics.median(h),
            "ratio": statistics.median(g) / statistics.median(h),
            "paired": statistics.median(pairs), "wins": sum(p > 1 for p in pairs),
            "pairs": pairs}


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def plot(rows: List[Dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']}\n{size_text(r['size']) if r['size'] else ''}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows)), 4))
    ax.bar(range(len(rows)), [r["paired"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("gloo time / hetccl time (paired median)")
    ax.set_title(f"torch.distributed, CPU tensors, n={args.n}, {os.cpu_count()} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
