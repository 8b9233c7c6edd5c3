#!/usr/bin/env python3
"""The ib transport against the socket transport and perftest, in one run.

Runs where a verbs device is active (inside the Soft-RoCE VM:
`tools/rdma/run_vm.sh -- python3 tools/rdma/bench_ib.py`). For each
collective it starts hetccl-perf on 2 processes (`python -m hetccl run -n 2`)
once per transport, alternately, --reps times, and takes the median; then
perftest's ib_write_bw and ib_send_bw between two processes on the same
device, as the ceiling of the verbs stack itself. Prints one table:

    size  sendrecv ib  sendrecv socket  all_reduce ib  all_reduce socket  ib_write_bw  ib_send_bw

sendrecv and all_reduce columns are hetccl-perf's bus bandwidth (nccl-tests
factors; for 2 ranks algbw = busbw for sendrecv, busbw = algbw for
all_reduce), perftest's its average bandwidth of one direction; all in MB/s
(10^6 bytes a second). `--json FILE` also writes every run.

Under rdma_rxe in a TCG VM these are emulation figures: compare columns of
one run, never read them as RDMA speeds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from bench_cpu import find_perf, launcher_env, parse_table  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SIZES = [64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB]
COLLS = ["sendrecv", "all_reduce"]
TRANSPORTS = ["ib", "socket"]


def hetccl_run(perf: Path, coll: str, transport: str, iters: int) -> dict[int, float]:
    """Bus bandwidth in MB/s per size, out-of-place, from the time column
    (the GB/s columns have two decimals, too coarse here). On 2 ranks the
    nccl-tests bus factor is 1 for both collectives: size / time."""
    env = launcher_env(perf)
    env["HETCCL_TRANSPORT"] = transport
    cmd = [sys.executable, "-m", "hetccl", "run", "-n", "2", "--", str(perf), coll,
           "-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "4", "-n", str(iters), "-w", "2",
           "-c", "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"HETCCL_TRANSPORT={transport} {' '.join(cmd)} exited with status "
                           f"{out.returncode}\n--- its stdout ---\n{out.stdout[-8000:]}"
                           f"--- its stderr ---\n{out.stderr[-8000:]}--- end ---")
    return {r["size"]: r["size"] / r["oop"]["time_us"] for r in parse_table(out.stdout)}


def perf_of_the_library() -> Optional[Path]:
    """The hetccl-perf built beside $HETCCL_LIBRARY (run_vm.sh names its
    build's), so that the program measured comes from the build under test,
    not from whichever build*/ directory was built last."""
    lib = os.environ.get("HETCCL_LIBRARY")
    if not lib:
        return None
    perf = Path(lib).resolve().parent.parent / "tools" / "perf" / "hetccl-perf"
    return perf if perf.is_file() else None


def perftest(tool: str, dev: str, gid: int, size: int, iters: int) -> Optional[float]:
    """Average bandwidth of ib_write_bw / ib_send_bw in MB/s (10^6 B/s), from
    its Gbit/s report, between a server and a client on this host."""
    common = [tool, "-d", dev, "-x", str(gid), "-s", str(size), "-n", str(iters), "-F",
              "--report_gbits"]
    server = subprocess.Popen(common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    time.sleep(1.0)  # its TCP port for the exchange of QP numbers
    client = None
    for _ in range(20):
        client = subprocess.run(common + ["127.0.0.1"], capture_output=True, text=True,
                                timeout=300)
        if client.returncode == 0:
            break
        time.sleep(0.5)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    if client is None or client.returncode != 0:
        return None
    for line in client.stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == str(size) and re.fullmatch(r"[0-9.]+", f[3]):
            return float(f[3]) * 1e3 / 8  # Gbit/s -> MB/s
    return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--perf", help="hetccl-perf to run (default: the one in $HETCCL_LIBRARY's "
                    "build tree, else the newest build*/)")
    ap.add_argument("--reps", type=int, default=3, help="runs per transport (median)")
    ap.add_argument("--iters", type=int, default=20, help="hetccl-perf iterations per size")
    ap.add_argument("--dev", default=os.environ.get("RXE_VM_DEV", "rxe0"))
    ap.add_argument("--gid", type=int, default=1, help="GID index for perftest (rxe-vm: 1)")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args(argv)
    perf = find_perf(args.perf) if args.perf else perf_of_the_library() or find_perf(None)
    if perf is None:
        print("bench_ib: no hetccl-perf (build it: ninja -C build-ib)", file=sys.stderr)
        return 2
    print(f"# hetccl-perf: {perf}; library: {launcher_env(perf).get('HETCCL_LIBRARY', 'beside it')}",
          flush=True)
    runs: dict[str, list[dict[int, float]]] = {}
    for _rep in range(args.reps):
        for coll in COLLS:
            for t in TRANSPORTS:  # alternate, so that drift hits both alike
                runs.setdefault(f"{coll} {t}", []).append(hetccl_run(perf, coll, t, args.iters))
    for tool in ("ib_write_bw", "ib_send_bw"):
        runs[tool] = [{s: perftest(tool, args.dev, args.gid, s, 200 if s <= MIB else 50)
                       for s in SIZES}]
    cols = [f"{c} {t}" for c in COLLS for t in TRANSPORTS] + ["ib_write_bw", "ib_send_bw"]
    print("# MB/s (10^6 B/s); median of", args.reps, "runs for hetccl-perf (2 processes, "
          "busbw, out-of-place), one perftest run; emulation figures (rdma_rxe in a VM)")
    print(f"{'size':>10}" + "".join(f"{c:>19}" for c in cols))
    for s in SIZES:
        cells = []
        for c in cols:
            vals = [r[s] for r in runs[c] if r.get(s) is not None]
            cells.append(f"{statistics.median(vals):19.1f}" if vals else f"{'n/a':>19}")
        print(f"{s:>10}" + "".join(cells))
    if args.json:
        Path(args.json).write_text(json.dumps({c: runs[c] for c in cols}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
