"""Nothing leaks: 1000 cycles of ncclCommInitAll(2) + AllReduce + destroy in
one process, on each transport (and 200 of a 4-rank hierarchical one, two
islands of two), leave the process with the file
descriptors, threads, /dev/shm entries and memory mappings it had, and its
resident memory within a small bound.

The bound on resident memory is 4 MiB over the 1000 cycles, i.e. 4 KiB a
cycle on average. Anything a cycle could lose is larger than that: a
communicator (its struct alone is about 6 KiB), its engine and transport
endpoints, a shared-memory ring (mapped, hundreds of KiB) or a staging
buffer; a lost mapping shows in the mapping count first. Measured growth is
about 0.1 MiB (allocator bookkeeping), so the bound leaves ample room for
the allocator and none for a leak. Small heap blocks lost per cycle (a task,
a sync object) are below what RSS can show: the C test `threads-initall`,
run under LeakSanitizer by test_sanitizers.py, catches those.

Each transport runs in a fresh Python process, so that nothing else in the
test session shares the counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from typing import Any, Dict, Mapping

import pytest

pytestmark = pytest.mark.usefixtures("hetccl_library")

LEAK_CYCLES = 1000
WARM_CYCLES = 20          # one-time state (knobs, log, runtimes) first
RSS_BOUND_KIB = 4 * 1024  # over LEAK_CYCLES; see the module docstring

LEAK_SCRIPT = r"""
import json, os, sys, threading, time
import numpy as np
from hetccl import nccl
from hetccl.nccl import NcclCommunicator

def counts():
    pid = os.getpid()
    shm = [e for e in os.listdir('/dev/shm') if e.startswith('hetccl-') and f'-p{pid}-' in e]
    rss = [l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0].split()[1]
    with open('/proc/self/maps') as f:
        maps = sum(1 for _ in f)
    return {'fds': len(os.listdir('/proc/self/fd')), 'threads': len(os.listdir('/proc/self/task')),
            'shm': len(shm), 'maps': maps, 'rss_kib': int(rss)}

def cycle():
    comms = NcclCommunicator.initAll(N)
    xs = [np.full(1024, r + 1, dtype=np.float32) for r in range(N)]
    ys = [np.zeros(1024, dtype=np.float32) for r in range(N)]
    def work(r):
        comms[r].allReduce(int(xs[r].ctypes.data), int(ys[r].ctypes.data), 1024,
                           nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    ts = [threading.Thread(target=work, args=(r,)) for r in range(N)]
    for t in ts: t.start()
    for t in ts: t.join()
    want = N * (N + 1) / 2
    assert all((y == want).all() for y in ys), [y[:4] for y in ys]
    for c in comms: c.destroy()

def settled(threads):
    # The bootstrap root is a detached thread that leaves once every rank
    # has the table: give it a moment (its stack is a mapping too).
    for _ in range(200):
        now = counts()
        if now['threads'] <= threads:
            break
        time.sleep(0.01)
    return now

cycles, warm, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
start = counts()  # no communicator yet: none of the library's threads
for _ in range(warm):
    cycle()
before = settled(start['threads'])
peak = dict(before)
for i in range(cycles):
    cycle()
    now = counts()
    peak = {k: max(peak[k], now[k]) for k in now}
after = settled(before['threads'])
print(json.dumps({'before': before, 'after': after, 'peak': peak}))
"""


def run_leak_script(cycles: int, warm: int, nranks: int, env: Mapping[str, str],
                    timeout: float) -> Dict[str, Any]:
    """LEAK_SCRIPT in a fresh process: `warm` cycles, then `cycles` counted
    ones of initAll(nranks). Its counts (before, after, peak). The one place
    that knows the script's arguments (test_ib.py runs it over ib)."""
    # One malloc arena: glibc makes a new one (two mappings) whenever
    # threads contend for the heap, which on a loaded machine can first
    # happen after the warm-up; that is the allocator, not a leak.
    env = {**env, "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run([sys.executable, "-c", LEAK_SCRIPT, str(cycles), str(warm),
                           str(nranks)], capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got: Dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,nranks,islands,cycles", [
    ("shm", 2, "", LEAK_CYCLES), ("socket", 2, "", LEAK_CYCLES),
    # islands of two: each communicator also makes its island and leaders
    # communicators (hier/hier.h), and AllReduce runs through them
    ("shm", 4, "0,0,1,1", LEAK_CYCLES // 5)])
def test_no_leaks_over_init_destroy_cycles(transport: str, nranks: int, islands: str,
                                           cycles: int) -> None:
    env = {**os.environ, "HETCCL_TRANSPORT": transport, "HETCCL_ISLANDS": islands}
    t0 = time.monotonic()
    got = run_leak_script(cycles, WARM_CYCLES, nranks, env, timeout=100)
    took = time.monotonic() - t0
    print(f"\n[leak] {transport} {islands or 'one island'}: {cycles} cycles of "
          f"initAll({nranks})+allreduce+destroy in "
          f"{took:.1f} s: before {got['before']}, after {got['after']}, peak {got['peak']}")
    before, after = got["before"], got["after"]
    for what in ("fds", "threads", "shm", "maps"):
        assert after[what] <= before[what], (what, got)
    assert after["rss_kib"] <= before["rss_kib"] + RSS_BOUND_KIB, got
