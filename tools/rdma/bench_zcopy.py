#!/usr/bin/env python3
"""hetccl's ib transport between two hosts against perftest and socket, in one run.

Runs in both VMs of `tools/rdma/run_vm.sh --hosts 2 -- python3
tools/rdma/bench_zcopy.py` (one rank per VM, RXE_VM_HOST 0 or 1); host 0
prints the table. Each configuration is a fresh pair of processes (knobs
are read once per process) on buffers from ncclMemAlloc, which register
with the ib device:

    ib zcopy     sendrecv, HETCCL_IB_ZCOPY_THRESHOLD=1: every message by
                 RDMA WRITE into the peer's registered buffer
    ib eager     sendrecv, the threshold out of reach: every message copied
                 through the staging slots (the path of unregistered memory)
    socket       sendrecv, HETCCL_TRANSPORT=socket between the same VMs
    ib zcopy 1w  one way: host 0 sends, host 1 receives
    ib_write_bw  perftest, host 0 writing to host 1 on the same device
    ib_write_bw_b  perftest -b, both writing at once; reported per
                 direction (perftest prints the sum), the peer of sendrecv

sendrecv figures are nccl-tests' bus bandwidth for 2 ranks (size / time per
call, each rank sending and receiving `size` at once); one-way ones and
perftest's are one direction. Columns of configurations alternate over
--reps runs (median), so drift hits all alike; the ratios are of medians.
`--sizes` and `--configs` pick a subset (the threshold measurement:
`--sizes 64K,128K,256K,512K,1M,2M --configs zcopy,eager`). `--variant
LABEL=BASE:KEY=VAL[;KEY=VAL...]` adds a configuration: BASE's with more
knobs, and `--ratios-to CONFIG` adds a column per other configuration
against it (queue pairs per connection:
`--variant qps1=zcopy:HETCCL_IB_QPS=1 --variant qps2=zcopy:HETCCL_IB_QPS=2
--configs qps1,qps2 --ratios-to qps1`).

Soft-RoCE in a TCG VM is emulation: the figures compare paths of one run,
never RDMA speeds.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
KIB, MIB = 1 << 10, 1 << 20
NEVER = str(1 << 62)
CONFIGS: Dict[str, Dict[str, str]] = {
    "zcopy": {"HETCCL_TRANSPORT": "ib", "HETCCL_IB_ZCOPY_THRESHOLD": "1"},
    "eager": {"HETCCL_TRANSPORT": "ib", "HETCCL_IB_ZCOPY_THRESHOLD": NEVER},
    "socket": {"HETCCL_TRANSPORT": "socket"},
    "zcopy1w": {"HETCCL_TRANSPORT": "ib", "HETCCL_IB_ZCOPY_THRESHOLD": "1"},
}
PERFTEST = {"ib_write_bw": [], "ib_write_bw_b": ["-b"]}
TITLES = {"zcopy": "ib zcopy", "eager": "ib eager", "socket": "socket",
          "zcopy1w": "ib zcopy 1w", "ib_write_bw": "ib_write_bw",
          "ib_write_bw_b": "ib_write_bw -b"}
BASE: Dict[str, str] = {c: c for c in CONFIGS}  # a --variant's label -> what it measures
WAIT_S = 300.0


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": 1 << 30}[m.group(2)]


def iters_for(size: int, budget: int) -> int:
    """Timed calls per size: about `budget` bytes each way, at least 2."""
    return max(2, min(50, budget // size))


# -- one rank (a child process) -------------------------------------------------------

def worker(config: str, uid_file: Path, sizes: List[int], budget: int) -> None:
    """One rank of `config`: host 0 makes the unique id and leaves it in
    uid_file (a directory both VMs see), host 1 waits for it and removes it. Prints one
    JSON line: MB/s per size and the CPU-copied bytes of the timed calls."""
    sys.path.insert(0, str(REPO / "python"))
    import numpy as np
    from hetccl import _lib, nccl
    from hetccl.nccl import NcclCommunicator

    me = int(os.environ["RXE_VM_HOST"])
    if me == 0:
        tmp = uid_file.with_suffix(".tmp")
        tmp.write_text(nccl.unique_id_to_hex(nccl.get_unique_id()))
        tmp.rename(uid_file)
    deadline = time.monotonic() + WAIT_S
    while not uid_file.exists():
        if time.monotonic() > deadline:
            sys.exit(f"bench_zcopy: no {uid_file} after {WAIT_S} s")
        time.sleep(0.1)
    uid = uid_file.read_text()
    if me == 1:
        uid_file.unlink()  # read: the next configuration's file is a new one
    comm = NcclCommunicator(2, uid, me)
    L = ctypes.CDLL(str(_lib.loaded_path()))
    bufs = []
    for _ in range(2):
        p = ctypes.c_void_p()
        if L.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(max(sizes))) != 0:
            sys.exit("bench_zcopy: ncclMemAlloc failed")
        bufs.append(int(p.value))
    src, dst = bufs
    np.frombuffer((ctypes.c_char * max(sizes)).from_address(src), np.uint8)[:] = 1 + me
    one_way = config == "zcopy1w"
    scratch = np.zeros(1, np.float32)
    flag = int(scratch.ctypes.data)
    f32 = nccl.NCCL_FLOAT32

    def call(count: int) -> None:
        if one_way:
            if me == 0:
                comm.send(src, count, f32, 1)
            else:
                comm.recv(dst, count, f32, 0)
            return
        nccl.groupStart()
        comm.send(src, count, f32, 1 - me)
        comm.recv(dst, count, f32, 1 - me)
        nccl.groupEnd()

    out: Dict[str, Dict[int, float]] = {"mbps": {}, "copied": {}}
    for size in sizes:
        count, n = size // 4, iters_for(size, budget)
        call(count)  # warm-up; also lines the two ranks up
        c0 = sum(comm.copied_bytes().values())
        t0 = time.perf_counter()
        for _ in range(n):
            call(count)
        if one_way:  # the receiver's end is the transfer's: one more round to learn it
            comm.allReduce(flag, flag, 1, f32, nccl.NCCL_SUM)
        dt = (time.perf_counter() - t0) / n
        out["mbps"][size] = size / dt / 1e6
        out["copied"][size] = (sum(comm.copied_bytes().values()) - c0) / n / size
    got = np.frombuffer((ctypes.c_char * max(sizes)).from_address(dst), np.uint8)
    if not one_way or me == 1:
        assert (got[:max(sizes)] == 2 - me).all(), "wrong data"
    comm.destroy()
    for p in bufs:
        L.ncclMemFree(ctypes.c_void_p(p))
    print(json.dumps(out), flush=True)


# -- one host -----------------------------------------------------------------------

def add_variant(spec: str) -> str:
    """LABEL=BASE:KEY=VAL[;KEY=VAL...] -> LABEL, now a configuration."""
    m = re.fullmatch(r"([\w.-]+)=(\w+):(.*)", spec)
    if not m or m.group(2) not in CONFIGS or m.group(1) in CONFIGS:
        raise argparse.ArgumentTypeError(f"not LABEL=BASE:KEY=VAL[;KEY=VAL...] with BASE one of "
                                         f"{', '.join(CONFIGS)}: {spec!r}")
    label, base = m.group(1), m.group(2)
    extra = dict(kv.split("=", 1) for kv in m.group(3).split(";") if kv)
    CONFIGS[label] = {**CONFIGS[base], **extra}
    BASE[label] = BASE[base]
    TITLES[label] = label
    return label


def rxe_counters(dev: str) -> Dict[str, int]:
    """The device's port counters (rxe: packets, retransmission timeouts,
    RNR NAKs, out-of-sequence packets); empty where the device has none."""
    d = Path(f"/sys/class/infiniband/{dev}/ports/1/hw_counters")
    out: Dict[str, int] = {}
    for f in sorted(d.glob("*")) if d.is_dir() else []:
        try:
            out[f.name] = int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def report_counters(config: str, dev: str, before: Dict[str, int]) -> None:
    """Print the counters that moved since `before`, as `name=+n` (packet
    counts first), for this host and configuration."""
    after = rxe_counters(dev)
    moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    keys = sorted(moved, key=lambda k: (not k.endswith("_pkts"), k))
    text = " ".join(f"{k}=+{moved[k]}" for k in keys) or "none moved"
    print(f"# host {os.environ['RXE_VM_HOST']} {config}: {dev} counters {text}", flush=True)


def run_config(config: str, tag: str, sizes: List[int], budget: int) -> Dict[int, float]:
    run = os.environ.get("HETCCL_RDMA_RUN", "bench")
    uid_file = REPO / f".rdma-uid-{run}-bench-{tag}"
    env = {**os.environ, **CONFIGS[config]}
    cmd = [sys.executable, __file__, "--worker", BASE[config], "--uid-file", str(uid_file),
           "--sizes", ",".join(map(str, sizes)), "--budget", str(budget)]
    dev = os.environ.get("RXE_VM_DEV", "rxe0")
    c0 = rxe_counters(dev)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    report_counters(config, dev, c0)
    if out.returncode != 0:
        raise RuntimeError(f"{config}: {' '.join(cmd)} exited with {out.returncode}\n"
                           f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    copied = {int(k): v for k, v in got["copied"].items()}
    if os.environ["RXE_VM_HOST"] == "0":
        print(f"# {config}: CPU-copied bytes per payload byte {copied}", flush=True)
    return {int(k): v for k, v in got["mbps"].items()}


def perftest(size: int, iters: int, dev: str, gid: int, flags: List[str]) -> Optional[float]:
    """ib_write_bw from host 0 (client) to host 1 (server): MB/s one way
    (it refuses fewer than 5 iterations: the caller asks for at least 5).
    With -b both write at once and perftest reports the sum of the two
    directions: this returns half of it, the figure per direction that
    a sendrecv's bus bandwidth is."""
    common = ["ib_write_bw", "-d", dev, "-x", str(gid), "-s", str(size), "-n", str(iters),
              "-F", "--report_gbits"] + flags
    if os.environ["RXE_VM_HOST"] == "1":
        subprocess.run(common, capture_output=True, text=True, timeout=900)
        return None
    for _ in range(120):  # until the server in the other VM listens
        out = subprocess.run(common + [os.environ["RXE_VM_PEER"]], capture_output=True,
                             text=True, timeout=900)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                f = line.split()
                if len(f) >= 4 and f[0] == str(size) and re.fullmatch(r"[0-9.]+", f[3]):
                    per_dir = 2 if "-b" in flags else 1
                    return float(f[3]) * 1e3 / 8 / per_dir  # Gbit/s -> MB/s
            return None
        time.sleep(0.5)
    return None


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M,16M,64M",
                    type=lambda s: [parse_size(x) for x in s.split(",")])
    ap.add_argument("--configs", default="zcopy,eager,socket,zcopy1w,ib_write_bw,ib_write_bw_b")
    ap.add_argument("--variant", action="append", default=[], type=add_variant,
                    help="LABEL=BASE:KEY=VAL[;KEY=VAL...]: BASE with more knobs, as LABEL")
    ap.add_argument("--ratios-to", help="a column per other configuration: it / this one")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=parse_size, default=parse_size("96M"),
                    help="bytes per size and run, each way (sets the timed calls)")
    ap.add_argument("--dev", default=os.environ.get("RXE_VM_DEV", "rxe0"))
    ap.add_argument("--gid", type=int, default=1, help="GID index for perftest (rxe-vm: 1)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--uid-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, Path(args.uid_file), args.sizes, args.budget)
        return 0
    if "RXE_VM_HOST" not in os.environ:
        print("bench_zcopy: run in two VMs: tools/rdma/run_vm.sh --hosts 2 -- python3 "
              "tools/rdma/bench_zcopy.py", file=sys.stderr)
        return 2
    host0 = os.environ["RXE_VM_HOST"] == "0"
    configs = args.configs.split(",")
    runs: Dict[str, List[Dict[int, float]]] = {c: [] for c in configs}
    t0 = time.monotonic()
    for rep in range(args.reps):
        for c in configs:  # alternate, so that drift hits every column alike
            if c in PERFTEST:
                c0 = rxe_counters(args.dev)
                got = {s: perftest(s, max(5, iters_for(s, args.budget)), args.dev, args.gid,
                                   PERFTEST[c])
                       for s in args.sizes}
                report_counters(c, args.dev, c0)
                runs[c].append({s: v for s, v in got.items() if v is not None})
            else:
                try:
                    runs[c].append(run_config(c, f"{c}-{rep}", args.sizes, args.budget))
                except RuntimeError as e:  # reported, and the other columns still measured
                    lines = [ln for ln in str(e).splitlines() if "WARN" in ln or "Error" in ln]
                    print(f"# {c}: run {rep} failed: {(lines or [str(e)])[-1][:300]}",
                          flush=True)
                    runs[c].append({})
    if not host0:
        return 0
    med = {c: {s: statistics.median([r[s] for r in runs[c] if s in r])
               for s in args.sizes if any(s in r for r in runs[c])} for c in configs}
    print(f"# two VMs (Soft-RoCE, emulation), MB/s, median of {args.reps} runs "
          f"({time.monotonic() - t0:.0f} s); sendrecv = busbw of 2 ranks, 1w and "
          f"ib_write_bw one way")
    ratios = [(a, b) for a, b in (("zcopy", "ib_write_bw_b"), ("zcopy", "ib_write_bw"),
                                  ("zcopy1w", "ib_write_bw"),
                                  ("zcopy", "socket"), ("zcopy", "eager"))
              if a in configs and b in configs]
    if args.ratios_to in configs:
        ratios += [(c, args.ratios_to) for c in configs
                   if c != args.ratios_to and c not in PERFTEST]
    head = [TITLES[c] for c in configs] + [f"{TITLES[a]}/{TITLES[b]}" for a, b in ratios]
    print(f"{'size':>10}" + "".join(f"{h:>24}" for h in head))
    for s in args.sizes:
        cells = [f"{med[c][s]:24.1f}" if s in med[c] else f"{'n/a':>24}" for c in configs]
        for a, b in ratios:
            ok = s in med[a] and s in med[b] and med[b][s] > 0
            cells.append(f"{med[a][s] / med[b][s]:24.2f}" if ok else f"{'n/a':>24}")
        print(f"{s:>10}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
