"""The hierarchical forms as plans (hier/plan.h): the forms whose phases
grow with the map (the leaders' AllGather and ReduceScatter on unequal
islands, a phase across per island; AlltoAll, Gather and Scatter as
pairs, a send and a receive per peer) on many islands, alone and inside a
group (built once, run slot by slot), against numpy; and the trace of
the leaders' ReduceScatter, whose grouped sends inside the island are one
phase, in the plan's order."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import hetccl
from hetccl import nccl

F64 = nccl.NCCL_FLOAT64
ISLANDS = "0,0,1,2,3,4"     # five islands, the first of two ranks: unequal, contiguous
N = 6


def rank_many(count: int, grouped: bool) -> Dict[str, bool]:
    """AllGather, ReduceScatter, AlltoAll, Gather (root 4) and Scatter
    (root 1), each once, against numpy; with `grouped`, all in one group."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    total = count * n
    x = np.arange(total, dtype=np.float64) * (me + 1) + me
    own = x[me * count:(me + 1) * count].copy()
    out = {k: np.zeros(total) for k in ("ag", "a2a", "gather")}
    out["rs"] = np.zeros(count)
    out["scatter"] = np.zeros(count)
    if grouped:
        nccl.groupStart()
    comm.allGather(own.ctypes.data, out["ag"].ctypes.data, count, F64)
    comm.reduceScatter(x.ctypes.data, out["rs"].ctypes.data, count, F64, nccl.NCCL_SUM)
    comm.alltoall(x.ctypes.data, out["a2a"].ctypes.data, count, F64)
    comm.gather(own.ctypes.data, out["gather"].ctypes.data, count, F64, 4)
    comm.scatter(x.ctypes.data, out["scatter"].ctypes.data, count, F64, 1)
    if grouped:
        nccl.groupEnd()
    comm.destroy()
    base = np.arange(total, dtype=np.float64)
    xs = [base * (q + 1) + q for q in range(n)]
    gathered = np.concatenate([xs[q][q * count:(q + 1) * count] for q in range(n)])
    block = slice(me * count, (me + 1) * count)
    return {
        "AllGather": bool(np.array_equal(out["ag"], gathered)),
        "ReduceScatter": bool(np.array_equal(out["rs"], sum(xs)[block])),
        "AlltoAll": bool(np.array_equal(
            out["a2a"], np.concatenate([xs[q][block] for q in range(n)]))),
        "Gather": me != 4 or bool(np.array_equal(out["gather"], gathered)),
        "Scatter": bool(np.array_equal(out["scatter"], xs[1][block])),
    }


HIER_LINE = re.compile(r"nccl(\w+) rank (\d+): hierarchical")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in-group"])
def test_forms_that_grow_with_the_map(grouped: bool, tmp_path: Path) -> None:
    env = {"HETCCL_ISLANDS": ISLANDS, "NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL",
           "NCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    for rank, ok in enumerate(hetccl.launch(rank_many, N, 13, grouped, env=env, timeout=200)):
        assert all(ok.values()), (rank, ok)
    taken: Dict[str, set] = {}
    for log in tmp_path.glob("log.*"):
        for fn, rank in HIER_LINE.findall(log.read_text(errors="replace")):
            taken.setdefault(fn, set()).add(int(rank))
    assert taken == {fn: set(range(N)) for fn in
                     ("AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter")}, taken


def rank_reduce_scatter(count: int) -> bool:
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    x = np.arange(count * n, dtype=np.float64) + me
    out = np.zeros(count)
    comm.reduceScatter(x.ctypes.data, out.ctypes.data, count, F64, nccl.NCCL_SUM)
    comm.destroy()
    want = (np.arange(count * n, dtype=np.float64) * n + n * (n - 1) / 2)[me * count:(me + 1) * count]
    return bool(np.array_equal(out, want))


def phases(path: Path) -> List[Dict]:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sorted((e for e in events if e.get("cat") == "phase"), key=lambda e: e["ts"])


@pytest.mark.timeout(180)
def test_leaders_reduce_scatter_trace(tmp_path: Path) -> None:
    """Leader 0 (island of ranks 0, 1): the island's Reduce, one Reduce
    across the leaders per island (unequal islands), then its sends of the
    island's blocks and its own receive in one group, traced as one Send
    of the island's two blocks; rank 1: the Reduce and its receive."""
    count = 5
    env = {"HETCCL_ISLANDS": ISLANDS, "HETCCL_TRACE": str(tmp_path / "run.json")}
    assert hetccl.launch(rank_reduce_scatter, N, count, env=env, timeout=150) == [True] * N
    lead = phases(tmp_path / "run.0.json")
    assert [(p["name"], p["args"]["op"]) for p in lead] == \
        [("island", "Reduce")] + [("leaders", "Reduce")] * 5 + [("island", "Send")]
    assert [p["args"]["step"] for p in lead] == list(range(7))
    assert lead[-1]["args"]["bytes"] == 2 * count * 8
    member = phases(tmp_path / "run.1.json")
    assert [(p["name"], p["args"]["op"]) for p in member] == \
        [("island", "Reduce"), ("island", "Recv")]
    assert [p["args"]["bytes"] for p in member] == [N * count * 8, count * 8]
