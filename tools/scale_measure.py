#!/usr/bin/env python3
"""Measure what a communicator costs as it grows (docs/scale.md).

One process per host rank, the NCCL ABI through ctypes (as a new user would
call it), all ranks started first and then released together, so that the
init time is the library's, not Python's start-up. Per n it reports:

- init time (ncclCommInitRank) over the ranks: max and median;
- socket descriptors a rank holds (from /proc/self/fd, less those it held
  before init) after init, after a ring AllReduce and after an AlltoAll;
- messages and bytes the busiest process handled in the bootstrap during
  init (the library's INFO lines "bootstrap ... stats: M messages, B
  bytes"; rank 0's process also serves the root, whose line is added).

Usage (the library to measure, rank counts):

    python3 tools/scale_measure.py --lib build/libhetccl/libhetccl.so --n 2 4 8 16 32 64

Default transport: socket (on one host shm would carry the data, and its
connections are mappings, not descriptors). Prints a markdown table, and
with --json one JSON object per n.
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
import tempfile
import time
from typing import Dict, List

RANK_CODE = r'''
import ctypes, json, os, sys, time
lib = ctypes.CDLL(os.environ["SCALE_LIB"])
rank, n, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def sockets():
    k = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            k += os.readlink("/proc/self/fd/" + f).startswith("socket:")
        except OSError:
            pass
    return k
class Uid(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid = Uid()
if rank == 0:
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    with open(d + "/id.tmp", "wb") as f:
        f.write(ctypes.string_at(ctypes.byref(uid), 128))
    os.rename(d + "/id.tmp", d + "/id")
else:
    while not os.path.exists(d + "/id"):
        time.sleep(0.005)
    raw = open(d + "/id", "rb").read()
    ctypes.memmove(ctypes.byref(uid), raw, len(raw))
base = sockets()
open(d + "/ready.%d" % rank, "w").close()
while not os.path.exists(d + "/go"):
    time.sleep(0.001)
comm = ctypes.c_void_p()
t0 = time.perf_counter()
rc = lib.ncclCommInitRank(ctypes.byref(comm), n, uid, rank)
t_init = time.perf_counter() - t0
assert rc == 0, rc
after_init = sockets() - base
count = 1 << 16
x = (ctypes.c_float * (count))(*([1.0] * 8))
y = (ctypes.c_float * (count))()
assert lib.ncclAllReduce(x, y, ctypes.c_size_t(count), 7, 0, comm, None) == 0
assert abs(y[0] - n) < 1e-3, y[0]
after_ar = sockets() - base
per = 256
a = (ctypes.c_float * (per * n))(*([float(rank)] * (per * n)))
b = (ctypes.c_float * (per * n))()
assert lib.ncclAlltoAll(a, b, ctypes.c_size_t(per), 7, comm, None) == 0
assert all(b[p * per] == float(p) for p in range(n))
after_a2a = sockets() - base
lib.ncclCommDestroy(comm)
print("RESULT " + json.dumps({"rank": rank, "pid": os.getpid(), "init_s": t_init,
                              "fd_init": after_init, "fd_allreduce": after_ar,
                              "fd_alltoall": after_a2a}), flush=True)
'''

STATS = re.compile(r"bootstrap (?:rank \d+|root) stats: (\d+) messages, (\d+) bytes")


def run_n(lib: str, n: int, env_extra: Dict[str, str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="hetccl-scale-") as d:
        env = dict(os.environ)
        env.update({"SCALE_LIB": lib, "HETCCL_TRANSPORT": "socket", "HETCCL_ALGO": "ring",
                    "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "BOOTSTRAP",
                    "HETCCL_DEBUG_FILE": d + "/log.%p"})
        env.update(env_extra)
        procs = [subprocess.Popen([sys.executable, "-c", RANK_CODE, str(r), str(n), d], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(n)]
        deadline = time.time() + timeout
        while sum(f.startswith("ready.") for f in os.listdir(d)) < n:
            if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError(f"n={n}: ranks did not start: "
                                   + "".join(p.communicate()[0][-2000:] for p in procs[:2]))
            time.sleep(0.01)
        open(d + "/go", "w").close()
        results = []
        for p in procs:
            out = p.communicate(timeout=max(1.0, deadline - time.time()))[0]
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            if p.returncode != 0 or not lines:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"n={n}: a rank failed:\n{out[-3000:]}")
            results.append(json.loads(lines[-1][7:]))
        msgs: Dict[int, int] = {}
        nbytes: Dict[int, int] = {}
        for f in os.listdir(d):
            if not f.startswith("log."):
                continue
            pid = int(f[4:])
            for m in STATS.finditer(open(os.path.join(d, f)).read()):
                msgs[pid] = msgs.get(pid, 0) + int(m.group(1))
                nbytes[pid] = nbytes.get(pid, 0) + int(m.group(2))
    init = [r["init_s"] for r in results]
    busiest = max(msgs, key=lambda k: msgs[k]) if msgs else None
    return {
        "n": n,
        "init_max_s": max(init), "init_median_s": statistics.median(init),
        "fd_init_max": max(r["fd_init"] for r in results),
        "fd_allreduce_max": max(r["fd_allreduce"] for r in results),
        "fd_alltoall_max": max(r["fd_alltoall"] for r in results),
        "fd_alltoall_min": min(r["fd_alltoall"] for r in results),
        "busiest_msgs": msgs.get(busiest, 0) if busiest else 0,
        "busiest_bytes": nbytes.get(busiest, 0) if busiest else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="libhetccl.so to measure")
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every rank")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in a.env)
    lib = os.path.abspath(a.lib)
    ctypes.CDLL(lib)  # fail here, not in 64 ranks
    print("| n | init max (s) | init median (s) | sockets/rank after init | after ring AllReduce "
          "| after AlltoAll | busiest process: bootstrap messages | bytes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in a.n:
        r = run_n(lib, n, extra, a.timeout)
        if a.json:
            print(json.dumps(r), file=sys.stderr)
        print(f"| {n} | {r['init_max_s']:.3f} | {r['init_median_s']:.3f} | {r['fd_init_max']} "
              f"| {r['fd_allreduce_max']} | {r['fd_alltoall_max']} | {r['busiest_msgs']} "
              f"| {r['busiest_bytes']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
