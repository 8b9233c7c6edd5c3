#!/usr/bin/env python3
"""hetccl against OpenMPI on CPU ranks of one host, measured in one run.

For each case (collective, ranks, size) it runs hetccl-perf under the
launcher (`python -m hetccl run -n N -- hetccl-perf ...`) and the OpenMPI
peer (`mpirun -np N python tools/peers/mpi_bench.py ...`) alternately,
--reps times each, with the same timing method (warmup, barrier, the max
over ranks of the mean iteration time), and prints the medians:

    python tools/bench_cpu.py                 # the cases of reference/baselines.md
    python tools/bench_cpu.py --json out.json # also write every run as JSON
    python tools/bench_cpu.py --json -        # JSON on stdout instead of the table

The metric is the time (us) for the 1 KiB case and the bus bandwidth (GB/s,
nccl-tests factors) otherwise; `ratio` > 1 means hetccl is better (faster,
or more bandwidth). `ratio` compares the two medians; `paired` is the median
of the per-repetition ratios (each hetccl run against the peer run next to
it, seconds apart), which cancels drift of the machine's memory bandwidth
between minutes, and `wins` counts the repetitions hetccl won.

The peer needs OpenMPI and mpi4py:
    apt-get install -y openmpi-bin libopenmpi-dev && pip install mpi4py
Without them the table still shows hetccl and says why the peer is missing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("hetccl") is None:  # the source tree's package
    sys.path.insert(0, str(REPO / "python"))
from hetccl.plot import parse_table  # noqa: E402 (the one reader of the tables)
MPI_BENCH = REPO / "tools" / "peers" / "mpi_bench.py"
INSTALL_HINT = "apt-get install -y openmpi-bin libopenmpi-dev && pip install mpi4py"

KIB, MIB = 1 << 10, 1 << 20
# (collective, size): the cases of reference/baselines.md, each at every n.
DEFAULT_CASES = [("all_reduce", 1 * KIB), ("all_reduce", 1 * MIB), ("all_reduce", 64 * MIB),
                 ("sendrecv", 16 * MIB), ("all_gather", 16 * MIB)]
TIME_METRIC_MAX_BYTES = 4 * KIB  # below this, compare times, not bandwidth


@dataclass
class Case:
    coll: str
    n: int
    size: int
    hetccl: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    pairs: list[float] = field(default_factory=list)  # per-repetition ratios
    errors: list[str] = field(default_factory=list)

    @property
    def metric(self) -> str:
        return "time_us" if self.size <= TIME_METRIC_MAX_BYTES else "busbw_GBps"

    def better(self, h: float, p: float) -> Optional[float]:
        """hetccl's advantage: > 1 when h beats p in this case's metric."""
        if self.metric == "time_us":
            return p / h if h > 0 else None
        return h / p if p > 0 else None

    def ratio(self) -> Optional[float]:
        if not self.hetccl or not self.peer:
            return None
        return self.better(statistics.median(self.hetccl), statistics.median(self.peer))

    def paired(self) -> Optional[float]:
        return statistics.median(self.pairs) if self.pairs else None

    def wins(self) -> int:
        return sum(1 for r in self.pairs if r > 1)


def iterations(size: int) -> tuple[int, int]:
    """(iters, warmup): enough to average small sizes, few for large ones."""
    if size <= 64 * KIB:
        return 500, 50
    if size <= 4 * MIB:
        return 50, 10
    return 10, 3


def header_value(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return ""


def find_perf(explicit: Optional[str]) -> Optional[Path]:
    if explicit:
        return Path(explicit)
    built = [p for p in REPO.glob("build*/tools/perf/hetccl-perf") if p.is_file()]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    spec = importlib.util.find_spec("hetccl")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "hetccl-perf").is_file():
            return Path(loc) / "hetccl-perf"
    found = shutil.which("hetccl-perf")
    return Path(found) if found else None


def launcher_env(perf: Path) -> dict[str, str]:
    env = dict(os.environ)
    if importlib.util.find_spec("hetccl") is None:  # run from the source tree
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"),
                                                          env.get("PYTHONPATH")]))
    lib = perf.parent.parent.parent / "libhetccl" / "libhetccl.so"  # build tree
    if "HETCCL_LIBRARY" not in env and lib.is_file():
        env["HETCCL_LIBRARY"] = str(lib)
    return env


def peer_problem() -> Optional[str]:
    """Why the OpenMPI peer cannot run, or None."""
    if shutil.which("mpirun") is None:
        return "mpirun not found"
    probe = subprocess.run([sys.executable, "-c", "import mpi4py, numpy"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return "mpi4py or numpy cannot be imported: " + probe.stderr.strip().splitlines()[-1]
    return None


class Runner:
    def __init__(self, args: argparse.Namespace, perf: Optional[Path]) -> None:
        self.args = args
        self.perf = perf
        self.env = launcher_env(perf) if perf else dict(os.environ)
        self.info: dict[str, str] = {}

    def common(self, case: Case) -> list[str]:
        iters, warmup = iterations(case.size)
        return [case.coll, "-b", str(case.size), "-e", str(case.size), "-n", str(iters),
                "-w", str(warmup), "-c", "1" if self.args.check else "0", "-a", "3"]

    def hetccl_cmd(self, case: Case) -> list[str]:
        return [sys.executable, "-m", "hetccl", "run", "-n", str(case.n),
                "--timeout", str(self.args.timeout), "--", str(self.perf)] + self.common(case)

    def peer_cmd(self, case: Case) -> list[str]:
        cmd = ["mpirun", "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd + ["-np", str(case.n), sys.executable, str(MPI_BENCH)] + self.common(case)

    def measure(self, case: Case, who: str) -> Optional[float]:
        cmd = self.hetccl_cmd(case) if who == "hetccl" else self.peer_cmd(case)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env,
                                  timeout=self.args.timeout + 30)
            out, err, rc = proc.stdout.replace("\0", ""), proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            out, err, rc = "", f"timed out after {self.args.timeout} s", 124
        rows = parse_table(out)
        if rc != 0 or not rows:
            tail = (err.strip() or out.strip()).splitlines()[-3:]
            case.errors.append(f"{who} rc={rc}: " + " | ".join(tail))
            return None
        self.info.setdefault(f"{who}_library", header_value(out, "library"))
        r = rows[-1]["oop"]
        value = r["time_us"] if case.metric == "time_us" else r["busbw"]
        (case.hetccl if who == "hetccl" else case.peer).append(value)
        return value


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def print_table(cases: list[Case], info: dict[str, str], reps: int) -> None:
    print("# hetccl vs OpenMPI, CPU ranks on one host, float32, out-of-place; "
          f"median of {reps} alternating runs each")
    for key, value in info.items():
        print(f"# {key}: {value}")
    print("# metric: time_us (lower is better) or busbw_GBps (higher is better); "
          "ratio > 1: hetccl better")
    print(f"# {'op':<12} {'n':>3} {'bytes':>10}  {'metric':<10} {'hetccl':>10} "
          f"{'openmpi':>10} {'ratio':>7} {'paired':>7} {'wins':>6}")
    for c in cases:
        ratio, paired = c.ratio(), c.paired()
        wins = f"{c.wins()}/{len(c.pairs)}" if c.pairs else "-"
        print(f"  {c.coll:<12} {c.n:>3} {c.size:>10}  {c.metric:<10} {fmt(c.hetccl):>10} "
              f"{fmt(c.peer):>10} {f'{ratio:.2f}' if ratio else '-':>7} "
              f"{f'{paired:.2f}' if paired else '-':>7} {wins:>6}")
    for c in cases:
        for e in c.errors:
            print(f"# error: {c.coll} n={c.n} {c.size}: {e}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--perf", help="hetccl-perf binary (default: newest build*/tools/perf)")
    p.add_argument("--n", default="2,4", help="rank counts, comma-separated (default 2,4)")
    p.add_argument("--reps", type=int, default=3, help="runs of each side per case (default 3)")
    p.add_argument("--only", help="collectives to keep, comma-separated (e.g. all_reduce)")
    p.add_argument("--check", action="store_true", help="also check results (-c 1)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    args = p.parse_args(argv)

    perf = find_perf(args.perf)
    if perf is None or not perf.is_file():
        sys.stderr.write("bench_cpu: hetccl-perf not found; build it (meson setup build && "
                         "ninja -C build) or pass --perf\n")
        return 2
    only = set(args.only.split(",")) if args.only else None
    cases = [Case(coll, int(n), size) for n in args.n.split(",")
             for coll, size in DEFAULT_CASES if not only or coll in only]
    runner = Runner(args, perf)
    problem = peer_problem()
    runner.info["hetccl_perf"] = str(perf)
    runner.info["openmpi_peer"] = f"unavailable ({problem}); install: {INSTALL_HINT}" \
        if problem else "mpirun + mpi4py"
    if problem:
        sys.stderr.write(f"bench_cpu: OpenMPI peer unavailable: {problem}\n"
                         f"  install it with: {INSTALL_HINT}\n")
    started = time.time()
    for rep in range(args.reps):
        for case in cases:
            order = ["hetccl", "peer"] if rep % 2 == 0 else ["peer", "hetccl"]
            got = {}
            for who in order:
                if who == "peer" and problem:
                    continue
                got[who] = runner.measure(case, who)
            if got.get("hetccl") and got.get("peer"):
                pair = case.better(got["hetccl"], got["peer"])
                if pair:
                    case.pairs.append(pair)
    runner.info["wall_seconds"] = f"{time.time() - started:.0f}"

    results = {"info": runner.info, "reps": args.reps, "cases": [
        {"op": c.coll, "n": c.n, "bytes": c.size, "metric": c.metric, "hetccl": c.hetccl,
         "openmpi": c.peer,
         "hetccl_median": statistics.median(c.hetccl) if c.hetccl else None,
         "openmpi_median": statistics.median(c.peer) if c.peer else None,
         "ratio": c.ratio(), "paired_ratios": c.pairs, "paired_median": c.paired(),
         "wins": c.wins(), "errors": c.errors} for c in cases]}
    if args.json == "-":
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(cases, runner.info, args.reps)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(c.hetccl for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
