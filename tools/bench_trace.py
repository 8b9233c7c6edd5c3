#!/usr/bin/env python3
"""What the per-operation trace costs (docs/trace.md): hetccl-perf latency
with HETCCL_TRACE unset ("off") and set ("on"), and optionally "off" of
another build (--base-perf: the commit before the trace, built in a second
worktree), in rotating order, in one run.

    python tools/bench_trace.py                         # AllReduce of 8 B and 64 KiB, 1 and 2 ranks
    python tools/bench_trace.py --base-perf ../base/build/tools/perf/hetccl-perf --reps 9

Off, every trace point is one branch on a flag read once, so off/base
should be 1.00 within the noise of the machine; on/off is what recording
costs (a clock read per event boundary, one buffer write per event; the
file is written at ncclCommDestroy, outside the timed loop). Prints, per
case, the median and the minimum over --reps rounds of hetccl-perf's
out-of-place time (us, max over ranks), and the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from bench_cpu import find_perf  # noqa: E402

CASES: List[Tuple[str, int]] = [("all_reduce", 8), ("all_reduce", 64 << 10)]


def side_env(perf: Path, trace: Optional[str]) -> Dict[str, str]:
    """The environment of one side: the library of perf's own build tree
    (each side its own), this tree's Python package to launch the ranks,
    and HETCCL_TRACE set only for the "on" side."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HETCCL_LIBRARY", "HETCCL_TRACE", "HETCCL_TRACE_EVENTS")}
    lib = perf.resolve().parent.parent.parent / "libhetccl" / "libhetccl.so"
    if not lib.is_file():
        raise SystemExit(f"{lib} not found: {perf} is not in a build tree")
    env["HETCCL_LIBRARY"] = str(lib)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS.parent / "python"),
                                                      env.get("PYTHONPATH")]))
    if trace:
        env["HETCCL_TRACE"] = trace
    return env


def run_once(perf: Path, env: Dict[str, str], coll: str, size: int, n: int, iters: int,
             tmp: str) -> float:
    """One hetccl-perf run; its out-of-place time from the -J file (to the
    nanosecond; the table prints two decimals)."""
    iters = iters if size <= 4096 else max(iters // 10, 100)
    out = Path(tmp) / "perf.json"
    cmd = [sys.executable, "-m", "hetccl", "run", "-n", str(n), "--", str(perf), coll,
           "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(iters // 10), "-c", "0",
           "-a", "3", "-J", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    rows = json.loads(out.read_text())["rows"] if proc.returncode == 0 and out.exists() else []
    if not rows:
        raise RuntimeError(f"{' '.join(cmd)}: rc {proc.returncode}: {proc.stderr[-400:]}")
    out.unlink()
    return float(rows[-1]["oop"]["time_us"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", help="hetccl-perf of the build under test (default: newest "
                    "build*/tools/perf)")
    ap.add_argument("--base-perf", help="hetccl-perf of the build before the trace, for the "
                    "'base' column")
    ap.add_argument("--n", default="1,2", help="rank counts (processes), comma-separated; "
                    "1 times the call path alone, without a peer's scheduling in it")
    ap.add_argument("--reps", type=int, default=7, help="rounds; each runs every side once")
    ap.add_argument("--iters", type=int, default=20000,
                    help="timed iterations per run of a small size (a tenth above 4 KiB)")
    args = ap.parse_args()
    perf = find_perf(args.perf)
    if perf is None:
        print("hetccl-perf not found: build it (meson setup build && ninja -C build)")
        return 2
    with tempfile.TemporaryDirectory(prefix="hetccl-trace-bench-") as tmp:
        sides: List[Tuple[str, Path, Dict[str, str]]] = []
        if args.base_perf:
            sides.append(("base", Path(args.base_perf), side_env(Path(args.base_perf), None)))
        sides.append(("off", perf, side_env(perf, None)))
        sides.append(("on", perf, side_env(perf, str(Path(tmp) / "t.json"))))
        print(f"# HETCCL_TRACE off vs on{' vs the base build' if args.base_perf else ''}: "
              f"hetccl-perf {perf}, {args.reps} rotating rounds of {args.iters} iterations "
              f"({max(args.iters // 10, 100)} above 4 KiB), "
              "out-of-place time (us, max over ranks): median and minimum over the rounds")
        if args.base_perf:
            print(f"# base: {args.base_perf}")
        heads = [f"{name}_us" for name, _, _ in sides]
        ratios = (["off/base"] if args.base_perf else []) + ["on/off"]
        print(f"# {'op':<12} {'n':>2} {'bytes':>8} {'stat':>6} "
              + " ".join(f"{h:>9}" for h in heads + ratios))
        for n in [int(x) for x in args.n.split(",")]:
            for coll, size in CASES:
                times: Dict[str, List[float]] = {name: [] for name, _, _ in sides}
                for r in range(args.reps):
                    for k in range(len(sides)):  # rotate who goes first
                        name, p, env = sides[(r + k) % len(sides)]
                        times[name].append(run_once(p, env, coll, size, n, args.iters, tmp))
                # The median is the figure; the minimum, what a quiet machine gives.
                for stat, fn in (("median", statistics.median), ("min", min)):
                    v = {name: fn(t) for name, t in times.items()}
                    cells = [v[name] for name, _, _ in sides]
                    if args.base_perf:
                        cells.append(v["off"] / v["base"])
                    cells.append(v["on"] / v["off"])
                    print(f"  {coll:<12} {n:>2} {size:>8} {stat:>6} "
                          + " ".join(f"{c:>9.3f}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
