#!/usr/bin/env python3
"""Training throughput across islands: data-parallel (DDP) and a 2-stage
pipeline, with torch's nccl backend, against one GPU alone and against the
same job on one island, in one run.

    python3 tools/device/train_bench.py OUT.json [--steps 20] [--layers 16]
        [--variant NAME:VAR=VALUE[,VAR=VALUE...]]... [--alternate N]
        [--gpus N] [--kinds ddp,pipe]

--gpus N (default 2): DDP on N GPUs, the hetccl runs with the GPUs in two
islands of N/2 (HETCCL_ISLANDS=0,..,0,1,..,1: NCCL inside each, hetccl's
hierarchical forms across, on the rails by default; a variant
leaders:HETCCL_HIER_RAILS=0 runs them through the leaders). The pipeline
stays on GPUs 0 and 1; --kinds ddp leaves it out.

Every configuration runs in fresh processes (torch.multiprocessing spawn),
so the library each loads follows the environment given to it:

  single       one GPU, no communicator: the model's own speed
  ddp/native   two GPUs, DDP, torch's NCCL (one island)
  ddp/hetccl   the same under LD_PRELOAD=$HETCCL_LIBRARY, HETCCL_ISLANDS=0,1
               (two islands: every gradient byte crosses on hetccl's path)
  pipe/native  two GPUs, two stages of half the layers each, activations
               and their gradients exchanged by send/recv (micro-batches of
               32 MiB activations), torch's NCCL
  pipe/hetccl  the same across two islands
  ddp/copies   DDP whose gradients go through host memory with nothing
               else: a comm hook that copies each bucket's bytes to pinned
               host memory and back in at once (two streams) and adds what
               came in, with no peer to wait for. Each rank of a two-rank
               AllReduce through host memory moves at least this much (its
               whole bucket out and in), so no such path trains faster:
               the bound of the "DDP >= 1.7 x one GPU" goal on this host
  ddp/nocomm   DDP whose hook returns the local gradients at once: the
               step with no communication at all (the compute's ceiling)
  ddp/NAME, pipe/NAME
               each --variant: the hetccl runs again with those variables
               set too (e.g. mapped:HETCCL_PLANE_REDUCE_READ=mapped for the
               previous read path, or maxconn:CUDA_DEVICE_MAX_CONNECTIONS=32,
               or b100:T_BUCKET_MB=100 for DDP buckets of 100 MB instead
               of torch's 25), printed beside the others, not part of
               PASS/FAIL. T_HOSTS=2 in a variant runs the second half of
               the ranks as a host of their own (an IPC namespace each
               of their own, as `unshare --ipc`), so that their pairs with
               the first half cross by hetccl's socket transport
               (hosts:T_HOSTS=2 against
               hostsone:T_HOSTS=2,HETCCL_PLANE_HOSTS=one: the data plane
               across hosts against staging)

The model: `--layers` blocks of Linear(4096, 4096) + GELU in bf16 (16
blocks: 268 M parameters), mean-square loss against a fixed target, SGD;
8192 rows per rank and step for DDP, 4 micro-batches of 4096 rows (32 MiB
activations) for the pipeline.
For the pipeline it also prints the bound that its blocking send / recv
set: each of a step's 2 x MICRO transfers lies on the critical path, so
the step can be no shorter than the native one plus each transfer's extra
time (measured alone, rank 0 to rank 1), nor than the native one plus one
copy of each activation over the GPU's link to host memory (measured in
the same run): pipe_predicted_vs_native and pipe_staged_bound_vs_native.
The two DDP bounds run on torch's NCCL (no LD_PRELOAD) and train on
local gradients only, so their losses are not compared.
Seeds are fixed, so the losses of native and hetccl runs must agree (they
are printed, and compared within 1e-3 relative). Reported: samples per
second over the timed steps (after 3 warm-up steps), DDP's ratio to one GPU
(two GPUs train twice the samples per step), the pipeline's ratio to its
native run. NCCL_NVLS_ENABLE=0 throughout.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WIDTH = 4096
BATCH = 8192          # rows per step per data-parallel rank
MICRO = 4             # pipeline micro-batches per step
MICRO_ROWS = 4096     # rows per micro-batch: 32 MiB of bf16 activations
WARMUP = 3


def model(layers: int, dev: torch.device) -> torch.nn.Sequential:
    torch.manual_seed(1)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks).to(dev, torch.bfloat16)


def batch(step: int, rank: int, rows: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(1000 * step + rank)
    x = torch.randn(rows, WIDTH, device=dev, dtype=torch.bfloat16, generator=g)
    return x, torch.tanh(x)


def timed_steps(steps: int, step_fn, dev) -> tuple[float, list[float]]:
    losses = []
    for s in range(WARMUP):
        step_fn(s)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for s in range(WARMUP, WARMUP + steps):
        losses.append(step_fn(s))
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0, losses


def data_parallel_step(net, rank: int, dev):
    """One SGD step on this rank's batch (net may be DDP-wrapped)."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(s):
        x, y = batch(s, rank, BATCH, dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x).float(), y.float())
        loss.backward()
        opt.step()
        return loss

    return step


def run_single(args, q) -> None:
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    secs, losses = timed_steps(args.steps, data_parallel_step(model(args.layers, dev), 0, dev),
                               dev)
    q.put({"samples_per_s": BATCH * args.steps / secs, "losses": [float(l) for l in losses]})


def become_another_host() -> None:
    """This process into an IPC namespace of its own: to hetccl, a host of
    its own (its host identity includes the namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x08000000) != 0:  # CLONE_NEWIPC
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWIPC)")


def worker(rank: int, world: int, kind: str, args, port: int, env: dict, q) -> None:
    os.environ.update(env)
    if env.get("T_HOSTS") == "2" and rank >= world // 2:
        become_another_host()
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world, device_id=dev)
    try:
        if kind == "ddp":
            res = ddp(rank, args, dev)
        elif kind.startswith("ddp/"):
            res = ddp(rank, args, dev, hook=kind[4:])
        else:
            res = pipe(rank, args, dev)
        res["backend_lib"] = os.environ.get("LD_PRELOAD", "")
        q.put((rank, res))
    finally:
        dist.destroy_process_group()


class HostCopies:
    """State of the copies-only comm hook: a pinned host buffer per
    direction, grown to the largest bucket, and a stream per direction."""

    def __init__(self, dev):
        self.dev = dev
        self.out_stream = torch.cuda.Stream(dev)
        self.in_stream = torch.cuda.Stream(dev)
        self.host_out = self.host_in = torch.empty(0, dtype=torch.uint8)

    def buffers(self, nbytes: int):
        if self.host_out.numel() < nbytes:
            torch.cuda.synchronize(self.dev)  # the old buffers may be in use
            self.host_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self.host_in = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
        return self.host_out[:nbytes], self.host_in[:nbytes]


def host_copies_hook(state: HostCopies, bucket):
    """The bucket out to host memory and (zeros) back in at once, then
    added in: the copies and the reduction of a two-rank AllReduce through
    host memory, with the peer's half always there already."""
    grads = bucket.buffer()
    raw = grads.view(-1).view(torch.uint8)
    out, into = state.buffers(raw.numel())
    caller = torch.cuda.current_stream(state.dev)
    state.out_stream.wait_stream(caller)
    state.in_stream.wait_stream(caller)
    with torch.cuda.stream(state.out_stream):
        out.copy_(raw, non_blocking=True)
    with torch.cuda.stream(state.in_stream):
        landed = into.to(state.dev, non_blocking=True).view(grads.dtype).view(grads.shape)
        grads.add_(landed)
        state.in_stream.wait_stream(state.out_stream)
        fut = torch.futures.Future(devices=[state.dev])
        fut.set_result(grads)
    return fut


def local_only_hook(_state, bucket):
    fut = torch.futures.Future(devices=[bucket.buffer().device])
    fut.set_result(bucket.buffer())
    return fut


def ddp(rank: int, args, dev, hook: str = "") -> dict:
    # T_BUCKET_MB (a --variant may set it): DDP's bucket_cap_mb, torch's 25 by default
    net = torch.nn.parallel.DistributedDataParallel(
        model(args.layers, dev), device_ids=[dev],
        bucket_cap_mb=float(os.environ.get("T_BUCKET_MB", "25")))
    if hook == "copies":
        net.register_comm_hook(HostCopies(dev), host_copies_hook)
    elif hook == "nocomm":
        net.register_comm_hook(None, local_only_hook)
    secs, losses = timed_steps(args.steps, data_parallel_step(net, rank, dev), dev)
    return {"samples_per_s": dist.get_world_size() * BATCH * args.steps / secs,
            "losses": [float(l) for l in losses]}


def pipe(rank: int, args, dev) -> dict:
    """Rank 0 holds the first half of the layers, rank 1 the second; GPipe
    order (all forwards, then all backwards) over MICRO micro-batches."""
    full = model(args.layers, dev)
    half = len(full) // 2
    stage = full[:half] if rank == 0 else full[half:]
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
    rows = MICRO_ROWS
    act_shape = (rows, WIDTH)

    def step(s):
        opt.zero_grad(set_to_none=True)
        outs, ins, total = [], [], torch.zeros((), device=dev)
        for m in range(MICRO):
            x, y = batch(s * MICRO + m, 0, rows, dev)
            if rank == 0:
                a = stage(x)
                dist.send(a.detach().contiguous(), 1)
                outs.append(a)
            else:
                a = torch.empty(act_shape, device=dev, dtype=torch.bfloat16)
                dist.recv(a, 0)
                a.requires_grad_(True)
                loss = torch.nn.functional.mse_loss(stage(a).float(), y.float()) / MICRO
                ins.append((a, loss))
        for m in range(MICRO):
            if rank == 1:
                a, loss = ins[m]
                loss.backward()
                total += loss.detach()
                dist.send(a.grad.contiguous(), 0)
            else:
                g = torch.empty(act_shape, device=dev, dtype=torch.bfloat16)
                dist.recv(g, 1)
                outs[m].backward(g)
        opt.step()
        return total

    secs, losses = timed_steps(args.steps, step, dev)
    return {"samples_per_s": MICRO * MICRO_ROWS * args.steps / secs,
            "step_ms": 1000 * secs / args.steps,
            "transfer_ms": transfer_ms(rank, act_shape, dev),
            "activation_mib": rows * WIDTH * 2 / 2**20,
            "losses": [float(l) for l in losses]}


def transfer_ms(rank: int, shape, dev, reps: int = 10) -> float:
    """One activation from rank 0 to rank 1 with nothing else running, as
    the pipeline's send / recv moves it: mean ms from the send's start to
    the receive's end (both ranks aligned by a barrier per transfer)."""
    buf = torch.ones(shape, device=dev, dtype=torch.bfloat16)
    total = 0.0
    for i in range(reps + 2):
        dist.barrier()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
        else:
            dist.recv(buf, 0)
        torch.cuda.synchronize(dev)
        if i >= 2:
            total += time.perf_counter() - t0
    return 1000 * total / reps


def d2h_gbps(nbytes: int, dev: torch.device) -> float:
    """Device to pinned host memory on this GPU, best of 5: the link every
    byte of a staged transfer crosses once."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, hetccl: bool, args, extra: dict | None = None) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    env = {}
    world = args.gpus if kind.startswith("ddp") else 2
    if hetccl:
        islands = ",".join(str(2 * r // world) for r in range(world))
        env = {"LD_PRELOAD": os.environ["HETCCL_LIBRARY"], "HETCCL_ISLANDS": islands,
               **(extra or {})}
    # The children read LD_PRELOAD at exec: set it around the spawn.
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, world, kind, args, port, env, q))
                 for r in range(world)]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    got = dict(q.get(timeout=args.timeout) for _ in procs)
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError(f"{kind} (hetccl={hetccl}): a rank exited with {p.exitcode}")
    last = got[1] if kind == "pipe" else got[0]
    return {k: last[k] for k in ("samples_per_s", "losses", "activation_mib", "step_ms",
                                 "transfer_ms") if k in last}


def close(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--alternate", type=int, default=0,
                    help="then N more runs each of ddp/hetccl and ddp/copies, in turns: "
                         "how far both move between runs on one host")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:VAR=VALUE[,VAR=VALUE]: the hetccl runs again with these set")
    ap.add_argument("--gpus", type=int, default=2,
                    help="GPUs of the DDP runs (even; two islands of half each for hetccl)")
    ap.add_argument("--kinds", default="ddp,pipe", help="which of ddp, pipe to run")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if args.gpus < 2 or args.gpus % 2 or any(k not in ("ddp", "pipe") for k in kinds):
        ap.error("--gpus: an even count of 2 or more; --kinds: ddp, pipe or both")
    variants = {}
    for v in args.variant:
        name, _, assigns = v.partition(":")
        if not name or not assigns or any("=" not in a for a in assigns.split(",")):
            ap.error(f"--variant {v!r}: NAME:VAR=VALUE[,VAR=VALUE...]")
        variants[name] = dict(a.split("=", 1) for a in assigns.split(","))
    if torch.cuda.device_count() < args.gpus:
        print(f"needs {args.gpus} GPUs", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=run_single, args=(args, q))
    p.start()
    res = {"single": q.get(timeout=args.timeout)}
    p.join()
    for kind in kinds:
        for hetccl in (False, True):
            name = f"{kind}/{'hetccl' if hetccl else 'native'}"
            res[name] = launch(kind, hetccl, args)
            print(f"{name}: {res[name]['samples_per_s']:.0f} samples/s", flush=True)
        for vname, venv in variants.items():
            name = f"{kind}/{vname}"
            res[name] = launch(kind, True, args, venv)
            print(f"{name} ({','.join(f'{k}={v}' for k, v in venv.items())}): "
                  f"{res[name]['samples_per_s']:.0f} samples/s", flush=True)
        if kind == "ddp":
            # copies: a two-rank AllReduce's traffic per rank; on more GPUs
            # the rails move less per rank, so only the compute's ceiling
            for bound in ("copies", "nocomm") if args.gpus == 2 else ("nocomm",):
                name = f"ddp/{bound}"
                try:
                    res[name] = launch(name, False, args)
                except Exception as e:  # a bound is a reading beside the goals, not one of them
                    print(f"{name}: failed: {e}", flush=True)
                    continue
                print(f"{name}: {res[name]['samples_per_s']:.0f} samples/s", flush=True)
    for i in range(2, 2 + args.alternate):
        for name, hetccl_run in ((f"ddp/hetccl#{i}", True), (f"ddp/copies#{i}", False)):
            res[name] = launch("ddp" if hetccl_run else "ddp/copies", hetccl_run, args)
            print(f"{name}: {res[name]['samples_per_s']:.0f} samples/s", flush=True)
    one = res["single"]["samples_per_s"]
    summary = {
        "params_M": args.layers * (WIDTH * WIDTH + WIDTH) / 1e6,
        "gpus": args.gpus,
        "single_samples_per_s": round(one),
    }
    if "ddp" in kinds:
        summary["ddp_native_vs_one_gpu"] = res["ddp/native"]["samples_per_s"] / one
        summary["ddp_hetccl_vs_one_gpu"] = res["ddp/hetccl"]["samples_per_s"] / one
        summary["ddp_loss_rel_diff"] = close(res["ddp/hetccl"]["losses"],
                                             res["ddp/native"]["losses"])
    if "pipe" in kinds:
        summary["pipe_hetccl_vs_native"] = (res["pipe/hetccl"]["samples_per_s"]
                                            / res["pipe/native"]["samples_per_s"])
        summary["pipe_loss_rel_diff"] = close(res["pipe/hetccl"]["losses"],
                                              res["pipe/native"]["losses"])
    for bound in ("copies", "nocomm"):
        if f"ddp/{bound}" in res:
            summary[f"ddp_{bound}_vs_one_gpu"] = res[f"ddp/{bound}"]["samples_per_s"] / one
    if "ddp/copies" in res:
        summary["ddp_hetccl_vs_copies_bound"] = (res["ddp/hetccl"]["samples_per_s"]
                                                 / res["ddp/copies"]["samples_per_s"])
    if args.alternate:
        for what in ("hetccl", "copies"):
            runs = [res[f"ddp/{what}"]] if f"ddp/{what}" in res else []
            runs += [res[f"ddp/{what}#{i}"] for i in range(2, 2 + args.alternate)]
            summary[f"ddp_{what}_runs_vs_one_gpu"] = " ".join(
                f"{r['samples_per_s'] / one:.3f}" for r in runs)
    # The pipeline's bound: every transfer of a step (MICRO activations
    # forward, MICRO gradients back) lies on its critical path, since a
    # blocking send / recv orders the next compute after it. Predicted:
    # the native step plus each transfer's extra time measured alone; the
    # staged bound: each transfer no faster than one copy over this GPU's
    # link to host memory.
    if "pipe" in kinds:
        nat, het = res["pipe/native"], res["pipe/hetccl"]
        moved = 2 * MICRO
        nbytes = MICRO_ROWS * WIDTH * 2
        link = d2h_gbps(nbytes, torch.device("cuda", 0))
        summary["pipe_transfer_ms_native"] = nat["transfer_ms"]
        summary["pipe_transfer_ms_hetccl"] = het["transfer_ms"]
        summary["pipe_predicted_vs_native"] = nat["step_ms"] / (
            nat["step_ms"] + moved * (het["transfer_ms"] - nat["transfer_ms"]))
        summary["d2h_gbps"] = link
        summary["pipe_staged_bound_vs_native"] = nat["step_ms"] / (
            nat["step_ms"] + moved * (nbytes / link / 1e6 - nat["transfer_ms"]))
    for vname in variants:
        if "ddp" in kinds:
            summary[f"ddp_{vname}_vs_one_gpu"] = res[f"ddp/{vname}"]["samples_per_s"] / one
        if "pipe" in kinds:
            summary[f"pipe_{vname}_vs_native"] = (res[f"pipe/{vname}"]["samples_per_s"]
                                                  / res["pipe/native"]["samples_per_s"])
    res["summary"] = summary
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in summary.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if args.gpus != 2:  # issue D's goals are for two GPUs; here, the losses only
        ok = summary.get("ddp_loss_rel_diff", 0) <= 1e-3
        print("PASS" if ok else "FAIL: DDP's losses differ from NCCL's by more than 1e-3")
        return 0 if ok else 1
    ok = (summary.get("ddp_hetccl_vs_one_gpu", 2) >= 1.7
          and summary.get("pipe_hetccl_vs_native", 1) >= 0.97
          and summary.get("ddp_loss_rel_diff", 0) <= 1e-3
          and summary.get("pipe_loss_rel_diff", 0) <= 1e-3)
    print("PASS" if ok else "FAIL: below the goals (DDP >= 1.7 x one GPU, pipeline >= 0.97 x "
          "native, losses within 1e-3)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
