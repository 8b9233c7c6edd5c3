#!/usr/bin/env python3
"""hetccl against an MPI (Open MPI or MPICH) on CPU ranks of one host, in one run.

For each case (collective, ranks, size) it runs hetccl-perf under the
launcher (`python -m hetccl run -n N -- hetccl-perf ...`) and the MPI peer
(`tools/peers/mpi_bench.py` under the peer's own launcher) alternately,
--reps times each, with the same timing method (warmup, barrier, the max
over ranks of the mean iteration time), and prints the medians:

    python tools/bench_cpu.py                        # README's table: Open MPI, n = 2,4
    python tools/bench_cpu.py --peer mpich --n 2,4,8,16 --cases all
    python tools/bench_cpu.py --cases sendrecv:64K..4M --variant cma0:HETCCL_SHM_CMA=0 \\
        --variant cma1:HETCCL_SHM_CMA=1             # hetccl settings side by side
    python tools/bench_cpu.py --json out.json        # also write every run as JSON
    python tools/bench_cpu.py --json -               # JSON on stdout instead of the table

Cases: `default` (the five of reference/baselines.md), `all` (those and
reduce_scatter, alltoall and broadcast of 16 MiB), or a comma list of
COLL:SIZE, where SIZE may be a range LO..HI (sizes LO, 4 LO, ... HI; LO..HI*2
for a factor of 2) that one launch of each side measures. Sizes follow
nccl-tests: all_gather's is the gathered buffer, reduce_scatter's and
alltoall's the send buffer.

The metric is the time (us) up to 4 KiB and the bus bandwidth (GB/s,
nccl-tests factors) above; `ratio` > 1 means hetccl is better. `ratio`
compares the two medians; `paired` is the median of the per-repetition
ratios (each hetccl run against the peer run of the same alternation,
seconds apart), which cancels drift of the machine's memory bandwidth
between minutes, and `wins` counts the repetitions hetccl won. Every
alternation runs the peer once and each --variant once, in an order that
rotates from one alternation to the next.

Out-of-place figures are compared, except for broadcast: MPI_Bcast works in
place (the root's buffer is the data), so hetccl's in-place column is the
one that does the same work (out of place, its root also copies the buffer
into its receive buffer). Both columns are in the JSON.

The peers:
  openmpi  `mpirun` (Open MPI) and a Python whose mpi4py loads Open MPI:
           apt-get install -y openmpi-bin libopenmpi-dev && pip install mpi4py
  mpich    MPICH from its PyPI wheel beside mpi4py, in a virtual environment
           of its own: python3 -m venv .peers/mpich && .peers/mpich/bin/pip
           install mpich mpi4py numpy. Run with `mpiexec -bind-to core` from
           that environment, and MPI4PY_LIBMPI pointing at its libmpi, so that
           mpi4py cannot pick up another MPI of the system.
A Python for the peer is looked for in --peer-python, this interpreter, then
.peers/*/bin/python; each is asked which MPI its mpi4py loads, and every run
checks the library the peer printed. Without a peer the table still shows
hetccl and says why the peer is missing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
FROM_TREE = importlib.util.find_spec("hetccl") is None  # use the source tree's package
if FROM_TREE:
    sys.path.insert(0, str(REPO / "python"))
from hetccl.plot import parse_table  # noqa: E402 (the one reader of the tables)
MPI_BENCH = REPO / "tools" / "peers" / "mpi_bench.py"

KIB, MIB = 1 << 10, 1 << 20
# (collective, size): the cases of reference/baselines.md, each at every n.
DEFAULT_CASES = [("all_reduce", 1 * KIB), ("all_reduce", 1 * MIB), ("all_reduce", 64 * MIB),
                 ("sendrecv", 16 * MIB), ("all_gather", 16 * MIB)]
ALL_CASES = DEFAULT_CASES + [("reduce_scatter", 16 * MIB), ("alltoall", 16 * MIB),
                             ("broadcast", 16 * MIB)]
COLLS = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall",
         "sendrecv")
TIME_METRIC_MAX_BYTES = 4 * KIB  # up to this, compare times, not bandwidth
IN_PLACE_COLLS = ("broadcast",)  # MPI's is in place: compare hetccl's in-place column


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": 1 << 30}[m.group(2).upper()])


@dataclass(frozen=True)
class Spec:
    """What one launch of each side measures: a collective over a size range."""
    coll: str
    lo: int
    hi: int
    factor: int = 4

    @property
    def sizes(self) -> List[int]:
        out, s = [], self.lo
        while s <= self.hi:
            out.append(s)
            s *= self.factor
        return out

    @property
    def label(self) -> str:
        return f"{self.coll}:{self.lo}" if self.lo == self.hi else \
            f"{self.coll}:{self.lo}..{self.hi}*{self.factor}"


def parse_cases(text: str) -> List[Spec]:
    if text == "default":
        return [Spec(c, s, s) for c, s in DEFAULT_CASES]
    if text == "all":
        return [Spec(c, s, s) for c, s in ALL_CASES]
    specs = []
    for item in filter(None, text.split(",")):
        coll, _, size = item.partition(":")
        if coll not in COLLS or not size:
            raise ValueError(f"case {item!r}: COLL:SIZE with COLL one of {', '.join(COLLS)}")
        lo, _, rest = size.partition("..")
        hi, _, factor = (rest or lo).partition("*")
        spec = Spec(coll, parse_size(lo), parse_size(hi), int(factor or 4))
        if spec.hi < spec.lo or spec.factor < 2:
            raise ValueError(f"case {item!r}: LO..HI with LO <= HI and a factor >= 2")
        specs.append(spec)
    return specs


@dataclass
class Point:
    """One (collective, n, size, hetccl variant) against the peer."""
    coll: str
    n: int
    size: int
    variant: str
    hetccl: List[float] = field(default_factory=list)
    peer: List[float] = field(default_factory=list)
    pairs: List[float] = field(default_factory=list)  # per-alternation ratios
    hetccl_rows: List[dict] = field(default_factory=list)
    peer_rows: List[dict] = field(default_factory=list)

    @property
    def metric(self) -> str:
        return "time_us" if self.size <= TIME_METRIC_MAX_BYTES else "busbw_GBps"

    def better(self, h: float, p: float) -> Optional[float]:
        """hetccl's advantage: > 1 when h beats p in this point's metric."""
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


def iterations(size: int, scale: float) -> Tuple[int, int]:
    """(iters, warmup): enough to average small sizes, few for large ones."""
    if size <= 64 * KIB:
        iters, warmup = 500, 50
    elif size <= 4 * MIB:
        iters, warmup = 50, 10
    else:
        iters, warmup = 10, 3
    return max(2, int(iters * scale)), max(1, int(warmup * scale))


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


def launcher_env(perf: Path) -> Dict[str, str]:
    env = dict(os.environ)
    if FROM_TREE:  # the launcher's ranks import it from there too
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"),
                                                          env.get("PYTHONPATH")]))
    lib = perf.parent.parent.parent / "libhetccl" / "libhetccl.so"  # build tree
    if "HETCCL_LIBRARY" not in env and lib.is_file():
        env["HETCCL_LIBRARY"] = str(lib)
    return env


# -- the MPI peers --------------------------------------------------------------------

PEER_HINTS = {
    "openmpi": "apt-get install -y openmpi-bin libopenmpi-dev && pip install mpi4py",
    "mpich": "python3 -m venv .peers/mpich && .peers/mpich/bin/pip install mpich mpi4py numpy",
}
PEER_VENDOR = {"openmpi": "Open MPI", "mpich": "MPICH"}


def clean_env() -> Dict[str, str]:
    """The environment without hetccl's knobs and another MPI's selection."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HETCCL_", "MPI4PY_", "OMPI_", "PMI_", "PMIX_", "HYDRA_"))}


class Peer:
    """How to start mpi_bench.py under one MPI: command prefix and environment."""

    def __init__(self, kind: str, args: argparse.Namespace) -> None:
        self.kind = kind
        self.args = args
        self.python: Optional[str] = None
        self.launcher: List[str] = []
        self.env: Dict[str, str] = clean_env()
        self.library = ""
        self.why = ""
        self.problem: Optional[str] = self._find()

    def _probe(self, python: str, env: Dict[str, str]) -> Optional[str]:
        """The MPI library version string this python's mpi4py loads, or None."""
        code = ("import numpy, mpi4py\nfrom mpi4py import MPI\n"
                "print(MPI.Get_library_version().replace('\\0', '').splitlines()[0])")
        try:
            proc = subprocess.run([python, "-c", code], capture_output=True, text=True,
                                  env=env, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    def _candidates(self) -> List[str]:
        out = [self.args.peer_python] if self.args.peer_python else []
        out.append(sys.executable)
        out += [str(p) for p in sorted(REPO.glob(".peers/*/bin/python"))]
        return list(dict.fromkeys(out))

    def _mpich_prefix(self, python: str) -> Tuple[Optional[Path], str]:
        """Where MPICH's bin/mpiexec and lib/libmpi.so.12 are: --mpi-prefix, else
        the environment of `python` (where pip puts the mpich wheel), else
        beside an `mpiexec` on PATH or a PYTHONPATH entry; and why not."""
        if self.args.mpi_prefix:
            tries = [Path(self.args.mpi_prefix)]
        else:
            tries = [Path(python).parent.parent]
            found = shutil.which("mpiexec")
            if found:
                tries.append(Path(found).resolve().parent.parent)
            tries += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        why = []
        for prefix in dict.fromkeys(tries):
            lib, mpiexec = prefix / "lib" / "libmpi.so.12", prefix / "bin" / "mpiexec"
            if lib.is_file() and mpiexec.is_file():
                return prefix, ""
            if mpiexec.is_file():  # pip install --target keeps the wheel's bin/, not its lib/
                why.append(f"{prefix} has bin/mpiexec but no lib/libmpi.so.12 (pip install "
                           "--target drops the mpich wheel's lib/: install it into a venv)")
        return None, "; ".join(why) or f"no MPICH (lib/libmpi.so.12, bin/mpiexec) in {tries[0]}"

    def _mpich_env(self, python: str) -> Optional[Dict[str, str]]:
        """MPICH's prefix is usually the environment mpi4py and the mpich wheel share."""
        prefix, self.why = self._mpich_prefix(python)
        if prefix is None:
            return None
        lib, mpiexec = prefix / "lib" / "libmpi.so.12", prefix / "bin" / "mpiexec"
        env = dict(clean_env(), MPI4PY_LIBMPI=str(lib), MPI4PY_MPIABI="mpich",
                   MPIR_CVAR_ENABLE_GPU="0",
                   PATH=os.pathsep.join([str(prefix / "bin"), os.environ.get("PATH", "")]))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(prefix / "lib"),
                                                               os.environ.get("LD_LIBRARY_PATH")]))
        self.launcher = [str(mpiexec), "-launcher", "fork"]
        return env

    def _find(self) -> Optional[str]:
        if self.kind == "openmpi" and shutil.which("mpirun") is None:
            return "mpirun not found"
        tried = []
        for python in self._candidates():
            env = self._mpich_env(python) if self.kind == "mpich" else clean_env()
            if env is None:
                tried.append(f"{python}: {self.why}")
                continue
            lib = self._probe(python, env)
            if lib is None:
                tried.append(f"{python}: mpi4py or numpy cannot be imported")
                continue
            if PEER_VENDOR[self.kind] not in lib:
                tried.append(f"{python}: mpi4py loads {lib!r}")
                continue
            self.python, self.env, self.library = python, env, lib
            if self.kind == "openmpi":
                self.launcher = ["mpirun", "--oversubscribe"] + \
                    (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            return None
        return "; ".join(tried) or "no Python to try"

    def command(self, n: int, bench_args: List[str]) -> List[str]:
        assert self.python
        if self.kind == "mpich":
            bind = ["-bind-to", "core"] if n <= (os.cpu_count() or 1) else []
            return self.launcher + ["-n", str(n)] + bind + [self.python, str(MPI_BENCH)] + \
                bench_args
        return self.launcher + ["-np", str(n), self.python, str(MPI_BENCH)] + bench_args


# -- running ----------------------------------------------------------------------------

class Runner:
    def __init__(self, args: argparse.Namespace, perf: Path, peer: Optional[Peer]) -> None:
        self.args = args
        self.perf = perf
        self.peer = peer
        self.env = launcher_env(perf)
        self.info: Dict[str, str] = {}
        self.errors: List[str] = []

    def common(self, spec: Spec) -> List[str]:
        iters, warmup = iterations(spec.hi, self.args.iters_scale)
        return [spec.coll, "-b", str(spec.lo), "-e", str(spec.hi), "-f", str(spec.factor),
                "-n", str(iters), "-w", str(warmup), "-c", "1" if self.args.check else "0",
                "-a", "3"]

    def launch(self, spec: Spec, n: int, who: str,
               extra_env: Dict[str, str]) -> Optional[List[dict]]:
        if who == "peer":
            assert self.peer is not None
            cmd, env = self.peer.command(n, self.common(spec)), self.peer.env
        else:
            cmd = [sys.executable, "-m", "hetccl", "run", "-n", str(n), "--timeout",
                   str(self.args.timeout), "--", str(self.perf)] + self.common(spec)
            env = dict(self.env, **extra_env)
        label = f"{who} {spec.label} n={n}"
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=self.args.timeout + 30)
            out, err, rc = proc.stdout.replace("\0", ""), proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            out, err, rc = "", f"timed out after {self.args.timeout} s", 124
        rows = parse_table(out)
        lib = header_value(out, "library")
        if who == "peer" and self.peer and PEER_VENDOR[self.peer.kind] not in lib:
            self.errors.append(f"{label}: the peer ran {lib or 'an unknown library'!r}, not "
                               f"{PEER_VENDOR[self.peer.kind]}")
            return None
        if rc != 0 or not rows:
            tail = (err.strip() or out.strip()).splitlines()[-3:]
            self.errors.append(f"{label} rc={rc}: " + " | ".join(tail))
            return None
        if who != "peer":
            want = env.get("HETCCL_LIBRARY")
            ran = lib.split(" (", 1)[0]
            if want and ran and Path(ran).resolve() != Path(want).resolve():
                self.errors.append(f"{label}: the ranks ran {ran}, not HETCCL_LIBRARY={want}")
                return None
        self.info.setdefault("peer_library" if who == "peer" else f"library {who}", lib)
        return rows


def value(point: Point, row: dict) -> float:
    col = row["ip" if point.coll in IN_PLACE_COLLS else "oop"]
    return col["time_us"] if point.metric == "time_us" else col["busbw"]


def run_all(runner: Runner, specs: List[Spec], ns: List[int],
            variants: List[Tuple[str, Dict[str, str]]], reps: int, progress: bool,
            checkpoint: Optional[Callable[[List[Point]], None]] = None) -> List[Point]:
    points: Dict[Tuple[str, int, int, str], Point] = {}
    for n in ns:
        for spec in specs:
            for size in spec.sizes:
                for name, _env in variants:
                    points[(spec.coll, n, size, name)] = Point(spec.coll, n, size, name)
    sides = (["peer"] if runner.peer else []) + [name for name, _ in variants]
    envs = dict(variants)
    started = time.time()
    for rep in range(reps):
        for n in ns:
            for spec in specs:
                k = rep % len(sides)
                got: Dict[str, Dict[int, dict]] = {}
                for who in sides[k:] + sides[:k]:
                    rows = runner.launch(spec, n, who, envs.get(who, {}))
                    got[who] = {r["size"]: r for r in rows or []}
                for size in spec.sizes:
                    peer_row = row_for(got.get("peer", {}), size, n)
                    for name, _ in variants:
                        pt, row = points[(spec.coll, n, size, name)], row_for(got[name], size, n)
                        if row:
                            pt.hetccl.append(value(pt, row))
                            pt.hetccl_rows.append(row)
                        if peer_row:
                            pt.peer.append(value(pt, peer_row))
                            pt.peer_rows.append(peer_row)
                        if row and peer_row:
                            pair = pt.better(value(pt, row), value(pt, peer_row))
                            if pair:
                                pt.pairs.append(pair)
                if progress:
                    done = [points[(spec.coll, n, s, v)] for s in spec.sizes for v, _ in variants]
                    text = " ".join(f"{p.variant}:{p.size}={p.pairs[-1]:.2f}" if p.pairs else
                                    f"{p.variant}:{p.size}=-" for p in done)
                    sys.stderr.write(f"bench_cpu: [{time.time() - started:5.0f} s] rep {rep + 1}"
                                     f"/{reps} n={n} {spec.coll}: {text}\n")
                    sys.stderr.flush()
        if checkpoint:  # a run cut short still leaves its finished alternations
            checkpoint(list(points.values()))
    return list(points.values())


def row_for(rows: Dict[int, dict], size: int, n: int) -> Optional[dict]:
    """The row of a requested size: the perf binaries round a size down to
    whole elements per rank (AllGather and ReduceScatter at n = 3 report
    262140 for 262144), so the largest reported size at most n elements of
    8 bytes below it."""
    if size in rows:
        return rows[size]
    near = [s for s in rows if size - 8 * n <= s < size]
    return rows[max(near)] if near else None


def fmt(values: List[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def print_table(points: List[Point], info: Dict[str, str], reps: int, peer_name: str,
                errors: List[str]) -> None:
    print(f"# hetccl vs {peer_name}, CPU ranks on one host, float32, out-of-place (broadcast: "
          f"in place); median of {reps} alternating runs each")
    for key, val in info.items():
        print(f"# {key}: {val}")
    print("# metric: time_us (lower is better) or busbw_GBps (higher is better); "
          "ratio > 1: hetccl better")
    print(f"# {'op':<14} {'n':>3} {'bytes':>10} {'variant':<10} {'metric':<10} {'hetccl':>9} "
          f"{'peer':>9} {'ratio':>6} {'paired':>6} {'wins':>5}")
    for p in points:
        ratio, paired = p.ratio(), p.paired()
        wins = f"{p.wins()}/{len(p.pairs)}" if p.pairs else "-"
        print(f"  {p.coll:<14} {p.n:>3} {p.size:>10} {p.variant:<10} {p.metric:<10} "
              f"{fmt(p.hetccl):>9} {fmt(p.peer):>9} {f'{ratio:.2f}' if ratio else '-':>6} "
              f"{f'{paired:.2f}' if paired else '-':>6} {wins:>5}")
    for e in errors:
        print(f"# error: {e}")


def parse_variant(text: str) -> Tuple[str, Dict[str, str]]:
    name, _, rest = text.partition(":")
    env = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise ValueError(f"variant {text!r}: NAME:VAR=VALUE,VAR=VALUE")
        env[k] = v
    if not name or name == "peer":
        raise ValueError(f"variant {text!r}: needs a name (not 'peer')")
    if any("libhetccl" in Path(x).name for x in env.get("LD_PRELOAD", "").replace(",", " ").split()):
        # hetccl run puts HETCCL_LIBRARY's library first in LD_PRELOAD, so
        # another one here would never be the one the ranks run
        raise ValueError(f"variant {text!r}: a libhetccl in LD_PRELOAD does not reach the "
                         "ranks; name the library with HETCCL_LIBRARY=<path>")
    return name, env


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--perf", help="hetccl-perf binary (default: newest build*/tools/perf)")
    p.add_argument("--peer", choices=("openmpi", "mpich", "none"), default="openmpi",
                   help="the MPI measured beside hetccl (default openmpi)")
    p.add_argument("--peer-python", help="a Python whose mpi4py loads the peer's MPI")
    p.add_argument("--mpi-prefix", help="MPICH's prefix (bin/mpiexec, lib/libmpi.so.12); "
                   "default: the peer Python's environment")
    p.add_argument("--n", default="2,4", help="rank counts, comma-separated (default 2,4)")
    p.add_argument("--cases", default="default",
                   help="default, all, or COLL:SIZE[..HI[*F]],... (see the docstring)")
    p.add_argument("--only", help="collectives to keep, comma-separated (e.g. all_reduce)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=V,...",
                   help="a hetccl run with these variables set; repeat for several "
                   "(default: one, 'hetccl', with none set)")
    p.add_argument("--reps", type=int, default=5, help="alternations (default 5)")
    p.add_argument("--iters-scale", type=float, default=1.0,
                   help="multiply the iteration counts (default 1)")
    p.add_argument("--check", action="store_true", help="also check results (-c 1)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--progress", action="store_true", help="a line per alternation on stderr")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    args = p.parse_args(argv)

    perf = find_perf(args.perf)
    if perf is None or not perf.is_file():
        sys.stderr.write("bench_cpu: hetccl-perf not found; build it (meson setup build && "
                         "ninja -C build) or pass --perf\n")
        return 2
    try:
        specs = parse_cases(args.cases)
        variants = [parse_variant(v) for v in args.variant] or [("hetccl", {})]
    except ValueError as e:
        p.error(str(e))
    if args.only:
        keep = set(args.only.split(","))
        specs = [s for s in specs if s.coll in keep]
    peer = None if args.peer == "none" else Peer(args.peer, args)
    info: Dict[str, str] = {"hetccl_perf": str(perf)}
    if peer and peer.problem:
        info["peer"] = f"{args.peer} unavailable ({peer.problem}); install: {PEER_HINTS[args.peer]}"
        sys.stderr.write(f"bench_cpu: {args.peer} peer unavailable: {peer.problem}\n"
                         f"  install it with: {PEER_HINTS[args.peer]}\n")
        peer = None
    elif peer:
        info["peer"] = f"{args.peer}: {' '.join(peer.launcher)} {peer.python}"
    for name, env in variants:
        info[f"variant {name}"] = " ".join(f"{k}={v}" for k, v in env.items()) or "(defaults)"
    runner = Runner(args, perf, peer)
    started = time.time()

    def document(points: List[Point]) -> dict:
        info.update(runner.info)
        info["wall_seconds"] = f"{time.time() - started:.0f}"
        return {"info": info, "peer": args.peer, "reps": args.reps, "points": [
            {"op": q.coll, "n": q.n, "bytes": q.size, "variant": q.variant, "metric": q.metric,
             "env": dict(variants)[q.variant], "hetccl": q.hetccl, "peer": q.peer,
             "hetccl_median": statistics.median(q.hetccl) if q.hetccl else None,
             "peer_median": statistics.median(q.peer) if q.peer else None,
             "ratio": q.ratio(), "paired_ratios": q.pairs, "paired_median": q.paired(),
             "wins": q.wins(), "hetccl_rows": q.hetccl_rows, "peer_rows": q.peer_rows}
            for q in points], "errors": runner.errors}

    def checkpoint(points: List[Point]) -> None:
        if args.json and args.json != "-":
            Path(args.json).write_text(json.dumps(document(points), indent=2) + "\n")

    points = run_all(runner, specs, [int(x) for x in args.n.split(",")], variants, args.reps,
                     args.progress, checkpoint)
    results = document(points)
    peer_name = {"openmpi": "OpenMPI", "mpich": "MPICH", "none": "no peer"}[args.peer]
    if args.json == "-":
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(points, info, args.reps, peer_name, runner.errors)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(q.hetccl for q in points) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
