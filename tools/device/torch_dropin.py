#!/usr/bin/env python3
"""PyTorch (backend nccl) as a drop-in check: the same run with and without
hetccl preloaded must give bitwise-identical results.

    python3 tools/device/torch_dropin.py OUT.json [--world 2] [--quick]

Two processes (torch.multiprocessing spawn), one GPU each: all_reduce (sum,
max; float32, float16), broadcast, all_gather_into_tensor,
reduce_scatter_tensor (sum, avg), all_to_all_single, send/recv both ways,
collectives on new_group()s, and a small DDP training loop with fixed
seeds. Each result is hashed (sha256 of its bytes); rank 0 writes every
digest, the final loss and a digest of the final parameters to OUT.json,
with timings under "timing" (compared by nobody: they vary).

--quick: init and one all_reduce only (for the broken-library check, where
init is expected to fail with a clear error). The child processes inherit
the environment, LD_PRELOAD included. NCCL_NVLS_ENABLE=0 is forced.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def digest(t: torch.Tensor) -> str:
    raw = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()


def collectives(rank: int, world: int, dev: torch.device, res: dict, timing: dict) -> None:
    gen = torch.Generator(device=dev).manual_seed(1234 + rank)
    n = (1 << 20) + 3  # not a multiple of anything convenient
    x = torch.randn(n, device=dev, generator=gen)

    t = x.clone()
    dist.all_reduce(t)
    res["all_reduce_sum_f32"] = digest(t)
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    res["all_reduce_max_f32"] = digest(t)
    h = x.half()
    dist.all_reduce(h)
    res["all_reduce_sum_f16"] = digest(h)
    i = (x * 1000).to(torch.int64)
    dist.all_reduce(i)
    res["all_reduce_sum_i64"] = digest(i)

    t = x.clone()
    dist.broadcast(t, src=world - 1)
    res["broadcast"] = digest(t)

    m = 4096 * 3 + 1
    part = x[:m].clone()
    gathered = torch.empty(world * m, device=dev)
    dist.all_gather_into_tensor(gathered, part)
    res["all_gather_into_tensor"] = digest(gathered)

    full = x[: world * m].clone()
    out = torch.empty(m, device=dev)
    dist.reduce_scatter_tensor(out, full)
    res["reduce_scatter_sum"] = digest(out)
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG)
    res["reduce_scatter_avg"] = digest(out)

    a2a_in = x[: world * 1000].clone()
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)
    res["all_to_all_single"] = digest(a2a_out)

    # send/recv around the ring, both directions (isend/irecv: no ordering deadlock)
    buf = torch.empty(77777, device=dev)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for direction, (to, frm) in (("fwd", (nxt, prv)), ("bwd", (prv, nxt))):
        reqs = [dist.isend(x[:77777].clone(), to), dist.irecv(buf, frm)]
        for r in reqs:
            r.wait()
        res[f"sendrecv_{direction}"] = digest(buf)
    if world >= 2:  # blocking send/recv between 0 and 1
        if rank == 0:
            dist.send(x[:1000].clone(), 1)
        elif rank == 1:
            got = torch.empty(1000, device=dev)
            dist.recv(got, 0)
            res["send_recv_blocking"] = digest(got)

    # groups: everyone in reversed order, and a group of rank 0 alone
    g_all = dist.new_group(list(reversed(range(world))))
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g_all)
    res["group_all_reduce_min"] = digest(t)
    g0 = dist.new_group([0])
    if rank == 0:
        t = x.clone()
        dist.all_reduce(t, group=g0)
        res["group_single_all_reduce"] = digest(t)

    # a timed bandwidth point (256 MiB float32), like the reference figure
    big = torch.ones(64 << 20, device=dev)
    for _ in range(3):
        dist.all_reduce(big)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    iters = 10
    for _ in range(iters):
        dist.all_reduce(big)
    torch.cuda.synchronize(dev)
    timing["all_reduce_256MiB_ms"] = (time.perf_counter() - t0) * 1e3 / iters


def ddp_train(rank: int, dev: torch.device, res: dict, timing: dict) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device=dev).manual_seed(100 + rank)
    losses = []
    t0 = time.perf_counter()
    for _ in range(30):
        inp = torch.randn(32, 64, device=dev, generator=gen)
        target = torch.randint(0, 10, (32,), device=dev, generator=gen)
        loss = torch.nn.functional.cross_entropy(ddp(inp), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    timing["ddp_30_steps_ms"] = (time.perf_counter() - t0) * 1e3
    res["ddp_losses"] = hashlib.sha256(json.dumps(losses).encode()).hexdigest()
    res["ddp_final_loss"] = repr(losses[-1])
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    res["ddp_params"] = digest(flat)


def worker(rank: int, world: int, port: int, out: str, quick: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=timedelta(seconds=120))
    res: dict = {}
    timing: dict = {}
    try:
        if quick:
            t = torch.ones(1000, device=dev)
            dist.all_reduce(t)
            res["quick_all_reduce"] = digest(t)
        else:
            collectives(rank, world, dev, res, timing)
            ddp_train(rank, dev, res, timing)
        torch.cuda.synchronize(dev)
        Path(f"{out}.rank{rank}").write_text(json.dumps({"results": res, "timing": timing}))
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch_dropin: no CUDA device", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    mp.spawn(worker, args=(args.world, port, args.out, args.quick), nprocs=args.world, join=True)
    merged = {"world": args.world, "nccl_version": list(torch.cuda.nccl.version()),
              "preload": os.environ.get("LD_PRELOAD", ""), "ranks": {}, "timing": {}}
    for r in range(args.world):
        part = json.loads(Path(f"{args.out}.rank{r}").read_text())
        merged["ranks"][str(r)] = part["results"]
        merged["timing"][str(r)] = part["timing"]
        Path(f"{args.out}.rank{r}").unlink()
    merged["timing"]["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(merged, indent=1, sort_keys=True))
    print(f"torch_dropin: wrote {args.out} ({args.world} ranks, "
          f"{merged['timing']['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
