#!/usr/bin/env python3
"""What the cross-rank mismatch check costs (docs/errors.md): hetccl-perf
with HETCCL_CHECK_MISMATCH=1 (the default) and =0, alternately, in one run.

    python tools/bench_check.py                 # n = 2 and 3, the cases below
    python tools/bench_check.py --reps 7 --n 2

The check is a signature compare per message header, plus, for rooted
collectives (broadcast, reduce, gather, scatter), one empty message from
each rank to the next. So the cases are latency-bound sizes, where that
message could show, and one large size. Prints the median time (us) of
each side and on/off: 1.00 means free, 1.10 means 10 % slower with the
check on.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from bench_cpu import find_perf, launcher_env, parse_table  # noqa: E402

CASES = [("all_reduce", 8), ("all_reduce", 1 << 20), ("broadcast", 8), ("broadcast", 1 << 10),
         ("reduce", 8), ("gather", 1 << 10), ("broadcast", 16 << 20)]


def run_once(perf: Path, env: dict, coll: str, size: int, n: int, check: str) -> float:
    iters, warmup = (2000, 200) if size <= 64 << 10 else (20, 5)
    cmd = [sys.executable, "-m", "hetccl", "run", "-n", str(n), "--", str(perf), coll,
           "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(warmup), "-c", "0",
           "-a", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(env, HETCCL_CHECK_MISMATCH=check))
    rows = parse_table(proc.stdout.replace("\0", ""))
    if proc.returncode != 0 or not rows:
        raise RuntimeError(f"{' '.join(cmd)}: rc {proc.returncode}: {proc.stderr[-400:]}")
    return rows[-1]["oop"]["time_us"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", help="hetccl-perf binary (default: newest build*/tools/perf)")
    ap.add_argument("--n", default="2,3", help="rank counts, comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="runs of each side per case")
    args = ap.parse_args()
    perf = find_perf(args.perf)
    if perf is None:
        print("hetccl-perf not found: build it (meson setup build && ninja -C build)")
        return 2
    env = launcher_env(perf)
    print(f"# HETCCL_CHECK_MISMATCH on vs off, hetccl-perf {perf}, median of {args.reps} "
          "alternating runs, out-of-place time (us, max over ranks)")
    print(f"# {'op':<12} {'n':>2} {'bytes':>10} {'on_us':>9} {'off_us':>9} {'on/off':>7}")
    for n in [int(x) for x in args.n.split(",")]:
        for coll, size in CASES:
            on, off = [], []
            for _ in range(args.reps):
                on.append(run_once(perf, env, coll, size, n, "1"))
                off.append(run_once(perf, env, coll, size, n, "0"))
            m_on, m_off = statistics.median(on), statistics.median(off)
            print(f"  {coll:<12} {n:>2} {size:>10} {m_on:>9.2f} {m_off:>9.2f} "
                  f"{m_on / m_off:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
