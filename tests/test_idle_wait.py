"""A rank that waits on a late peer gives its CPU back (p2p/engine.c, docs/threads.md).

The engine's idle wait spins HETCCL_SPIN polls, yields for HETCCL_IDLE_YIELD
(unset: 200 us on a host rank with a CPU for each rank of its host, else
1 ms), then sleeps up to HETCCL_IDLE_NAP microseconds at a time. Two host
ranks on this machine: rank 1 comes to an AllReduce 1.5 s after rank 0,
which waits in it. The CPU time rank 0's calling thread (the one that
drives a blocking communicator's engine) spends in that call is measured:
with the sleeps it is a small part of the wait; with HETCCL_IDLE_NAP=0
(yield for ever) the thread stays runnable the whole time, which the
second case shows, without asserting a figure that depends on what else
runs here. Last, the yield's length each rank took, from its INFO line.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import numpy as np
import pytest

from hetccl import nccl
from hetccl.nccl import NcclCommunicator
from failing_ranks import _run_ranks

pytestmark = pytest.mark.usefixtures("hetccl_library")

LATE_S = 1.5


def rank_late_peer(rank: int, n: int, uid: str, barrier: Any) -> Dict[str, float]:
    comm = NcclCommunicator(n, uid, rank)
    x = np.full(1024, rank + 1, np.float32)
    comm.allReduce(x.ctypes.data, x.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    barrier.wait()
    if rank == 1:
        time.sleep(LATE_S)
    wall0, cpu0 = time.monotonic(), time.thread_time()
    comm.allReduce(x.ctypes.data, x.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out = {"wall": time.monotonic() - wall0, "cpu": time.thread_time() - cpu0,
           "value": float(x[0])}
    comm.destroy()
    return out


def _waiter(env: Dict[str, str]) -> Dict[str, float]:
    results = _run_ranks(rank_late_peer, 2, env={"HETCCL_TRANSPORT": "auto", **env})
    for kind, value in results:
        assert kind == "ok", f"a rank ended {kind}: {value}"
    assert results[0][1]["value"] == results[1][1]["value"] == 6.0  # (1 + 2), then doubled
    return results[0][1]


def test_waiting_rank_sleeps() -> None:
    w = _waiter({})
    print(f"\n[idle wait] default: rank 0 waited {w['wall']:.2f} s, {w['cpu']:.3f} s of CPU")
    assert w["wall"] > 0.8 * LATE_S, f"rank 0 did not wait for its late peer: {w}"
    assert w["cpu"] < 0.35 * w["wall"], (
        f"rank 0 used {w['cpu']:.2f} s of CPU in a {w['wall']:.2f} s wait: the idle wait "
        "should sleep after yielding for HETCCL_IDLE_YIELD")


def test_yield_for_ever_contrast() -> None:
    w = _waiter({"HETCCL_IDLE_NAP": "0"})
    print(f"\n[idle wait] HETCCL_IDLE_NAP=0: rank 0 waited {w['wall']:.2f} s, "
          f"{w['cpu']:.3f} s of CPU")
    assert w["wall"] > 0.8 * LATE_S


def rank_init(rank: int, n: int, uid: str, barrier: Any) -> float:
    comm = NcclCommunicator(n, uid, rank)
    x = np.full(16, rank + 1, np.float32)
    comm.allReduce(x.ctypes.data, x.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    comm.destroy()
    return float(x[0])


CPUS = os.cpu_count() or 1


@pytest.mark.parametrize("nranks, env, yield_us", [
    (2, {}, 200 if CPUS >= 2 else 1000),
    (2, {"HETCCL_IDLE_YIELD": "1000"}, 1000),
    (CPUS + 1, {}, 1000),
], ids=["unset", "set", "more-ranks-than-cpus"])
def test_host_rank_yield_default(tmp_path: Any, nranks: int, env: Dict[str, str],
                                 yield_us: int) -> None:
    """A host rank's idle wait yields for 200 us unset where the host has a
    CPU for each of its ranks (comm/transports.c: HOST_IDLE_YIELD_US), 1 ms
    with more ranks than CPUs, what HETCCL_IDLE_YIELD says when set; every
    rank's INFO line at init says which."""
    if nranks > max(2, CPUS) and CPUS > 4:
        pytest.skip(f"{nranks} ranks: too many for a test on {CPUS} CPUs")
    log = tmp_path / "rank.%p.log"
    results = _run_ranks(rank_init, nranks, env={"HETCCL_DEBUG": "INFO",
                                                 "HETCCL_DEBUG_SUBSYS": "INIT",
                                                 "HETCCL_DEBUG_FILE": str(log), **env})
    total = float(sum(range(1, nranks + 1)))
    assert results == [("ok", total)] * nranks
    lines = [ln for f in tmp_path.glob("rank.*.log") for ln in f.read_text().splitlines()
             if "engine ready" in ln]
    assert len(lines) == nranks, lines
    for ln in lines:
        assert f"yields {yield_us} us, then sleeps" in ln, ln
