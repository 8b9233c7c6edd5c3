"""Hierarchical communicators (hier/hier.h, hier/hier_ops.c) with host ranks
in forced islands: which communicators become hierarchical, which
collectives take their hierarchical form, inside groups too, and islands
following the ranks into smaller communicators. The results of every
collective under these layouts, every type and operator, are
test_collectives.py's sweeps (n4-islands-hier and its neighbours)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl

F64 = nccl.NCCL_FLOAT64


# -- which collectives take the hierarchical form ---------------------------------

def rank_forms(count: int, grouped: bool) -> Dict[str, bool]:
    """Each collective with a hierarchical form once, against numpy; with
    `grouped`, all of them inside one group (distinct buffers)."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    total = count * n
    x = np.arange(total, dtype=np.float64) * (me + 1)
    out = {k: np.zeros(total) for k in ("ar", "bc", "red", "ag")}
    out["rs"] = np.zeros(count)
    if me == 2:
        out["bc"][:] = x
    if grouped:
        nccl.groupStart()
    comm.allReduce(x.ctypes.data, out["ar"].ctypes.data, total, F64, nccl.NCCL_SUM)
    comm.broadcast(out["bc"].ctypes.data, out["bc"].ctypes.data, total, F64, 2)
    comm.reduce(x.ctypes.data, out["red"].ctypes.data, total, F64, nccl.NCCL_MAX, 1)
    comm.allGather(x[me * count:(me + 1) * count].ctypes.data, out["ag"].ctypes.data, count, F64)
    comm.reduceScatter(x.ctypes.data, out["rs"].ctypes.data, count, F64, nccl.NCCL_SUM)
    if grouped:
        nccl.groupEnd()
    comm.destroy()
    base = np.arange(total, dtype=np.float64)
    gathered = np.concatenate([base[q * count:(q + 1) * count] * (q + 1) for q in range(n)])
    tri = n * (n + 1) / 2
    return {
        "AllReduce": bool(np.array_equal(out["ar"], base * tri)),
        "Broadcast": bool(np.array_equal(out["bc"], base * 3)),
        "Reduce": me != 1 or bool(np.array_equal(out["red"], base * n)),
        "AllGather": bool(np.array_equal(out["ag"], gathered)),
        "ReduceScatter": bool(np.array_equal(out["rs"], base[me * count:(me + 1) * count] * tri)),
    }


HIER_LINE = re.compile(r"nccl(\w+) rank (\d+): hierarchical")
ALL_FORMS = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("islands,forms", [
    ("0,0,1,1", ALL_FORMS),                                   # contiguous, equal
    ("0,0,0,1,1", ALL_FORMS),                                 # contiguous, unequal
    ("0,1,1", ALL_FORMS),                                     # a leader alone
    ("1,0,1,0", {"AllReduce", "Broadcast", "Reduce"}),        # interleaved
])
@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in-group"])
def test_hierarchical_forms(islands: str, forms: set, grouped: bool, tmp_path: Path) -> None:
    n = islands.count(",") + 1
    env = {"HETCCL_ISLANDS": islands, "NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL",
           "NCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    for rank, ok in enumerate(hetccl.launch(rank_forms, n, 1031, grouped, env=env, timeout=120)):
        assert all(ok.values()), (rank, ok)
    taken: Dict[str, set] = {}
    for log in tmp_path.glob("log.*"):
        for fn, rank in HIER_LINE.findall(log.read_text(errors="replace")):
            taken.setdefault(fn, set()).add(int(rank))
    assert set(taken) == forms, taken
    for fn, ranks in taken.items():
        assert ranks == set(range(n)), (fn, ranks)
    # One place says where each call went (exec/form.h), at INFO.
    said = "".join(log.read_text(errors="replace") for log in tmp_path.glob("log.*"))
    for fn in forms:
        assert re.search(rf"nccl{fn} on comm \w+ \({n} ranks\) takes its hierarchical form, "
                         r"(through the leaders|on the rails)", said), fn


@pytest.mark.timeout(150)
@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in-group"])
def test_rails_forms_on_interleaved_islands(grouped: bool, tmp_path: Path) -> None:
    """Interleaved equal islands (ranks 0, 2 and 1, 3) have rails: with the
    rails at every size (HETCCL_HIER_RAILS_MIN and _GATHER 0), AllGather and
    ReduceScatter take their rails' form there too, where the leaders'
    forms need contiguous islands, and AllReduce, Broadcast and Reduce
    theirs;
    every result against numpy, and the trace shows each one's phase
    across on a rail."""
    env = {"HETCCL_ISLANDS": "1,0,1,0", "HETCCL_HIER_RAILS_MIN": "0",
           "HETCCL_HIER_RAILS_MIN_GATHER": "0",
           "HETCCL_TRACE": str(tmp_path / "run.json")}
    for rank, ok in enumerate(hetccl.launch(rank_forms, 4, 1031, grouped, env=env, timeout=120)):
        assert all(ok.values()), (rank, ok)
    for rank in range(4):
        doc = json.loads((tmp_path / f"run.{rank}.json").read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        across = {e["args"]["op"] for e in events if e.get("cat") == "phase" and e["name"] == "rail"}
        assert {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"} <= across, \
            (rank, across)


# -- which communicators become hierarchical ---------------------------------------

def rank_hier(count: int) -> Tuple[str, List[float], List[float]]:
    """backend(), then AllReduce sums of (rank + 1) * index outside a group
    and inside one (where it runs at the group's end), in place and not."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    x = (np.arange(count, dtype=np.float64) + 1) * (me + 1)
    out = np.zeros(count, dtype=np.float64)
    comm.allReduce(x.ctypes.data, out.ctypes.data, count, nccl.NCCL_FLOAT64, nccl.NCCL_SUM)
    grouped = x.copy()
    nccl.groupStart()
    comm.allReduce(grouped.ctypes.data, grouped.ctypes.data, count, nccl.NCCL_FLOAT64,
                   nccl.NCCL_SUM)
    nccl.groupEnd()
    result = (comm.backend(), out[:3].tolist(), grouped[:3].tolist())
    comm.destroy()
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("islands,hier,backend", [
    ("0,0,1,1", "1", "hierarchical:engine"),
    ("0,1,1", "1", "hierarchical:engine"),
    ("0,0,1,1", "0", "engine"),
    ("rank", "1", "engine"),          # no island holds two ranks
    ("0,0,0", "1", "engine"),         # one island
])
def test_hier_choice(islands: str, hier: str, backend: str) -> None:
    n = 4 if islands.count(",") == 3 or islands == "rank" else 3
    env = {"HETCCL_ISLANDS": islands, "HETCCL_HIER": hier}
    total = n * (n + 1) // 2
    for got, out, grouped in hetccl.launch(rank_hier, n, 4099, env=env, timeout=100):
        assert got == backend
        assert out == [total * 1.0, total * 2.0, total * 3.0]
        assert grouped == out


# -- forced islands follow the ranks into smaller communicators -------------------

def rank_islands_follow() -> Tuple[str, Optional[str], Optional[str], Optional[float]]:
    """Under HETCCL_ISLANDS=0,0,1,1: the parent's backend, then a split of
    ranks 0-2 (islands 0,0,1 inherited) and a communicator of ranks 0-2
    made from a new unique id (islands remembered per process), each
    checked with an AllReduce; rank 3 takes part in the split only."""
    comm = hetccl.communicator()
    me = comm.rank_id()
    parent = comm.backend()
    raw = bytes.fromhex(nccl.unique_id_to_hex(nccl.get_unique_id())) if me == 0 else bytes(128)
    uid = np.frombuffer(raw, dtype=np.uint8).copy()
    comm.broadcast(uid.ctypes.data, uid.ctypes.data, uid.size, nccl.NCCL_UINT8, 0)
    child = comm.commSplit(0 if me < 3 else nccl.NCCL_SPLIT_NOCOLOR, me)
    split = fresh = total = None
    if child is not None:
        split = child.backend()
        fresh_comm = nccl.NcclCommunicator(3, nccl.unique_id_from_hex(uid.tobytes().hex()), me)
        fresh = fresh_comm.backend()
        x = np.full(5, me + 1.0)
        fresh_comm.allReduce(x.ctypes.data, x.ctypes.data, 5, nccl.NCCL_FLOAT64, nccl.NCCL_SUM)
        total = float(x[0])
        fresh_comm.destroy()
        child.destroy()
    comm.destroy()
    return parent, split, fresh, total


@pytest.mark.timeout(120)
def test_islands_follow_ranks_into_smaller_communicators() -> None:
    got = hetccl.launch(rank_islands_follow, 4, env={"HETCCL_ISLANDS": "0,0,1,1"}, timeout=100)
    for rank, (parent, split, fresh, total) in enumerate(got):
        assert parent == "hierarchical:engine", (rank, parent)
        if rank < 3:  # islands 0, 0, 1: the hierarchy again, on both
            assert (split, fresh, total) == ("hierarchical:engine", "hierarchical:engine", 6.0), rank
        else:
            assert split is None
