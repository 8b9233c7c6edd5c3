#!/usr/bin/env python3
"""Staged AllReduce against the same ranks on host buffers, in one run.

For each HETCCL_STAGE_PIECE value, runs tools/device/engine_smoke.sh's
`bench` check on two ranks in forced islands: two CUDA ranks on device
buffers (staged), a CUDA rank with a host rank, and two host ranks on host
buffers (the engine alone, the peer to compare with). Prints rank 0's
in-place AllReduce busbw per size and the ratio of each staged pair to the
host pair measured in the same invocation.

    python3 tools/device/stage_bench.py [--pieces 0,2M,4M,8M] [--reps 2]

Each configuration runs --reps times, the configurations interleaved (rep
1 of every piece and pair, then rep 2, ...) so that a drift of the
machine's memory speed falls on all of them; the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tools" / "device" / "engine_smoke.sh"
PAIRS = ("cuda,cuda", "cuda,host", "host,host")


def run_bench(pair: str, piece: str) -> dict:
    env = dict(os.environ, HETCCL_STAGE_PIECE=piece, LIMIT="150", HETCCL_DEBUG="WARN")
    out = subprocess.run(["bash", str(SMOKE), f"bench:{pair}"], env=env, capture_output=True,
                         text=True, timeout=200)
    for line in out.stdout.splitlines():
        if line.strip().startswith("[0] RESULT "):
            return json.loads(line.split("RESULT ", 1)[1])
    sys.stderr.write(out.stdout[-3000:] + out.stderr[-2000:])
    raise RuntimeError(f"bench {pair} with piece {piece}: no result from rank 0")


def median(runs: list) -> dict:
    keys = [k for k in runs[0] if k.startswith("busbw")]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces", default="0,2M,4M,8M")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    print("| piece | ranks | " + " | ".join(f"{s} GB/s (x host)" for s in ("1MiB", "16MiB", "64MiB"))
          + " |")
    print("| --- | --- | --- | --- | --- |")
    pieces = args.pieces.split(",")
    runs = {(piece, pair): [] for piece in pieces for pair in PAIRS}
    for _ in range(args.reps):
        for piece in pieces:
            for pair in PAIRS:
                runs[(piece, pair)].append(run_bench(pair, piece))
    for piece in pieces:
        res = {pair: median(runs[(piece, pair)]) for pair in PAIRS}
        host = res["host,host"]
        for pair in PAIRS:
            cells = []
            for key, value in res[pair].items():
                ratio = value / host[key] if host[key] else float("nan")
                cells.append(f"{value:.2f}" + ("" if pair == "host,host" else f" ({ratio:.2f})"))
            print(f"| {piece} | {pair} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
