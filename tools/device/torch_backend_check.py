#!/usr/bin/env python3
"""The torch backend "hetccl" on the GPU machine: a job of GPU and CPU ranks
(by default two GPU ranks and one CPU rank) runs every collective of
tests/torch_ranks.py on a hetccl group against gloo on the same inputs,
then 100 DDP steps on each; prints PASS/FAIL per collective.

    python3 tools/device/torch_backend_check.py [--devices cuda:0,cuda:1,cpu]
        [--steps 100] [--ddp-rtol 1e-6] [--json OUT.json] [--timeout 300]
        [--parts collectives,ddp] [--sanitize RANK]

--devices: one entry per rank, "cpu" or "cuda:N" (default: cuda:0,cuda:1,cpu
with two GPUs, cuda:0,cuda:0,cpu with one: two processes then share the
GPU). No HETCCL_* variable reaches the ranks but HETCCL_LIBRARY (and those
--env names): a rank's kind follows its tensors, as a user's job runs.
Library: $HETCCL_LIBRARY,
else what the package finds (a build*/ of this checkout). A collective
passes when it passed on every rank; DDP passes when every rank's loss is
within --ddp-rtol of gloo's at every step (the gloo run uses the same
devices: CUDA tensors on GPU ranks). Exit status 0 only when all pass.
--parts: which of the two to run. --sanitize RANK: run that rank under
compute-sanitizer's memcheck (it names the kernel and address of a fault).
T_TRACE=1 in the environment makes every rank wait for its devices after
each check and name the check and device that fault (tests/torch_ranks.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "python")]

from rank_procs import run_ranks  # noqa: E402


def default_devices() -> str:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        sys.exit("no CUDA device: this check needs at least one GPU")
    return "cuda:0,cuda:1,cpu" if n >= 2 else "cuda:0,cuda:0,cpu"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default=None)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ddp-rtol", type=float, default=1e-6)
    ap.add_argument("--json", default=None, help="write every rank's raw results here")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--parts", default="collectives,ddp")
    ap.add_argument("--sanitize", type=int, default=None, metavar="RANK")
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                    help="a variable every rank gets (repeatable), HETCCL_* ones included")
    args = ap.parse_args()
    devices = (args.devices or default_devices()).split(",")
    n = len(devices)
    if "HETCCL_LIBRARY" not in os.environ:
        from hetccl import _lib

        os.environ["HETCCL_LIBRARY"] = str(_lib.library_path())
    print(f"library: {os.environ['HETCCL_LIBRARY']}")
    print(f"ranks: {', '.join(f'{r}={d}' for r, d in enumerate(devices))}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        envs = []
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("HETCCL_") or k == "HETCCL_LIBRARY"}
        base.update(v.split("=", 1) for v in args.env)
        for rank in range(n):
            env = dict(base, T_RANK=str(rank), T_NRANKS=str(n),
                       T_STORE=os.path.join(tmp, "store"), T_DEVICES=",".join(devices),
                       T_PARTS=args.parts, T_STEPS=str(args.steps),
                       NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                       NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(ROOT / "python"), str(ROOT / "tests"),
                              os.environ.get("PYTHONPATH")]))
            envs.append(env)
        try:
            results = run_ranks(ROOT / "tests" / "torch_ranks.py", envs, args.timeout,
                                prefixes=[sanitizer() if r == args.sanitize else []
                                          for r in range(n)])
        except AssertionError as e:  # a rank died: its output is in the message
            print(f"FAIL job: {e}")
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("communicator: " + ", ".join(f"rank {r['rank']} ({r['device']}) {r['comm_backend']}"
                                       for r in results))
    return report(results, args.ddp_rtol)


def sanitizer() -> List[str]:
    """compute-sanitizer's memcheck, from PATH or the CUDA toolkit."""
    exe = shutil.which("compute-sanitizer") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")
    if not os.path.exists(exe):
        sys.exit(f"--sanitize: no compute-sanitizer on PATH nor at {exe}")
    return [exe, "--tool", "memcheck", "--print-limit", "10", "--show-backtrace", "device"]


def report(results: List[dict], rtol: float) -> int:
    passed = failed = 0
    for name in results[0].get("checks", {}):
        bad: Dict[int, str] = {r["rank"]: f"[{r['checks'][name]['ref']}] "
                                          f"{r['checks'][name]['detail']}"
                               for r in results if not r["checks"][name]["ok"]}
        if bad:
            failed += 1
            print(f"FAIL {name}")
            for rank, why in bad.items():
                print(f"     rank {rank}: {why.strip()[-400:]}")
        else:
            passed += 1
            print(f"PASS {name}  ({results[0]['checks'][name]['ref'][:40]})")
    if "ddp" not in results[0]:
        print(f"{passed} passed, {failed} failed (no DDP run)")
        return 0 if failed == 0 else 1
    worst = max(r["ddp"]["max_rel"] for r in results)
    ok = worst <= rtol and all(r["ddp"]["finite"] for r in results)
    first, last = results[0]["ddp"]["hetccl"][0], results[0]["ddp"]["hetccl"][-1]
    print(f"{'PASS' if ok else 'FAIL'} ddp: {results[0]['ddp']['steps']} steps, loss of rank 0 "
          f"{first:.6f} -> {last:.6f}, largest relative difference from gloo {worst:.3g} "
          f"(limit {rtol:g})")
    passed, failed = passed + ok, failed + (not ok)
    secs = ", ".join(f"rank {r['rank']}: {r['seconds']}" for r in results)
    print(f"seconds: {secs}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
