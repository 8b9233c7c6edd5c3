#!/usr/bin/env python3
"""hetccl against the real NCCL on the GPU machine, one process, -g 2.

    python3 tools/device/compare_nccl.py /path/to/libnccl.so.2 [--out $OUT]

For each collective it runs `hetccl-perf COLL --mem_type cuda -g 2 ...` with
HETCCL_PERF_LIB=<that NCCL>, then with hetccl's own library (which forwards
to the same NCCL through HETCCL_NCCL_LIBRARY), alternately, and prints per
size both times and bus bandwidths and the ratio hetccl/NCCL (busbw; > 1:
hetccl better). `--modes nccl,hetccl,islands` adds hetccl with every rank
in its own island (HETCCL_ISLANDS=rank), i.e. the cross-island engine path
with no NCCL between the GPUs. NCCL_NVLS_ENABLE=0 is exported to every run.

libcudart is taken from $HETCCL_PERF_CUDART, else looked for next to the
NCCL library's pip package (site-packages/nvidia/*/lib), else the loader's
path. Raw outputs go to --out (one file per run).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS))
from bench_cpu import find_perf, parse_table  # noqa: E402

COLLS = ["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall",
         "gather", "scatter", "sendrecv"]


def find_cudart(nccl: Path) -> Optional[Path]:
    if os.environ.get("HETCCL_PERF_CUDART"):
        return Path(os.environ["HETCCL_PERF_CUDART"])
    nvidia = nccl.resolve().parent.parent.parent  # .../site-packages/nvidia
    found = sorted(nvidia.glob("*/lib/libcudart.so*"), reverse=True)
    return found[0] if found else None


def mode_env(mode: str, nccl: Path, base: dict[str, str]) -> dict[str, str]:
    env = dict(base, NCCL_NVLS_ENABLE="0")
    if mode == "nccl":
        env["HETCCL_PERF_LIB"] = str(nccl)
    else:
        env.pop("HETCCL_PERF_LIB", None)
        env.setdefault("HETCCL_NCCL_LIBRARY", str(nccl))
        if mode == "islands":
            env["HETCCL_ISLANDS"] = "rank"
    return env


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nccl", type=Path, help="the real libnccl.so.2")
    p.add_argument("--perf", help="hetccl-perf (default: newest build*/tools/perf)")
    p.add_argument("--colls", default=",".join(COLLS))
    p.add_argument("--modes", default="nccl,hetccl", help="nccl,hetccl[,islands]")
    p.add_argument("-g", "--ngpus", type=int, default=2)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="1G")
    p.add_argument("-f", "--stepfactor", default="8")
    p.add_argument("-n", "--iters", default="20")
    p.add_argument("-w", "--warmup", default="5")
    p.add_argument("-c", "--check", default="1")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", type=Path, help="folder for the raw outputs")
    args = p.parse_args(argv)

    perf = find_perf(args.perf)
    if perf is None:
        sys.stderr.write("compare_nccl: hetccl-perf not found (build it or pass --perf)\n")
        return 2
    base = dict(os.environ)
    cudart = find_cudart(args.nccl)
    if cudart:
        base["HETCCL_PERF_CUDART"] = str(cudart)
    modes = args.modes.split(",")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    print(f"# hetccl-perf: {perf}\n# nccl: {args.nccl}\n# cudart: {cudart or '(loader path)'}")
    print("# NCCL_NVLS_ENABLE=0; --mem_type cuda -g %d; ratio = busbw(mode) / busbw(nccl), > 1: "
          "hetccl better; time in us, busbw in GB/s, out-of-place" % args.ngpus)
    failures = 0
    for coll in args.colls.split(","):
        rows: dict[str, list[dict]] = {}
        # alternate which side runs first, collective by collective
        order = modes if COLLS.index(coll) % 2 == 0 else list(reversed(modes))
        for mode in order:
            cmd = [str(perf), coll, "--mem_type", "cuda", "-g", str(args.ngpus),
                   "-b", args.minbytes, "-e", args.maxbytes, "-f", args.stepfactor,
                   "-n", args.iters, "-w", args.warmup, "-c", args.check]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                      env=mode_env(mode, args.nccl, base))
                out, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = (e.stdout or b"").decode(errors="replace") + "\n(timed out)", 124
            if args.out:
                (args.out / f"{coll}.{mode}.txt").write_text(" ".join(cmd) + "\n" + out)
            rows[mode] = parse_table(out)
            if rc != 0:
                failures += 1
                tail = " | ".join(out.strip().splitlines()[-3:])
                print(f"# {coll} {mode}: rc={rc}: {tail}")
        print(f"#\n# {coll}")
        head = f"# {'bytes':>11}" + "".join(
            f" {m + ' us':>12} {m + ' bw':>12} {'wrong':>5}" for m in modes)
        head += "".join(f" {'ratio ' + m:>14}" for m in modes if m != "nccl")
        print(head)
        sizes = sorted({r["size"] for m in modes for r in rows.get(m, [])})
        for size in sizes:
            line = f"  {size:>11}"
            got = {m: next((r for r in rows.get(m, []) if r["size"] == size), None) for m in modes}
            for m in modes:
                r = got[m]
                if r:
                    wrong = r["oop"]["wrong"]
                    line += (f" {r['oop']['time_us']:>12.2f} {r['oop']['busbw']:>12.2f}"
                             f" {'-' if wrong is None else wrong:>5}")
                else:
                    line += f" {'-':>12} {'-':>12} {'-':>5}"
            ref = got.get("nccl")
            for m in modes:
                if m == "nccl":
                    continue
                r = got[m]
                ratio = (r["oop"]["busbw"] / ref["oop"]["busbw"]
                         if r and ref and ref["oop"]["busbw"] > 0 else None)
                line += f" {f'{ratio:.2f}' if ratio is not None else '-':>14}"
            print(line, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
