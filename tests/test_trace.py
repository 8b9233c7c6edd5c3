"""The per-operation trace (HETCCL_TRACE, trace/trace.h, docs/trace.md) and
`hetccl trace`, which merges its per-rank files: a hierarchical AllReduce on
four host ranks in two forced islands, traced and merged, read back phase by
phase; nothing written when the knob is unset; a full buffer's drops
counted; a directory that cannot be written refused at init; malformed
files refused by the merge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl

COUNT = 1000                # float32 elements: 4000 bytes, latency-bound algorithms
NBYTES = COUNT * 4
ISLANDS = "0,0,1,1"         # islands {0, 1} and {2, 3}; leaders 0 and 2
LEADERS = {0, 2}


def rank_allreduce(count: int, grouped: bool) -> float:
    """One AllReduce of (rank + 1); with `grouped`, a second one inside a
    group (its hierarchical form runs at the group's end). Destroys the
    communicator, which writes the trace."""
    comm = hetccl.communicator()
    x = np.full(count, comm.rank_id() + 1, dtype=np.float32)
    out = np.zeros(count, dtype=np.float32)
    comm.allReduce(x.ctypes.data, out.ctypes.data, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    if grouped:
        nccl.groupStart()
        comm.allReduce(x.ctypes.data, x.ctypes.data, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
        nccl.groupEnd()
    comm.destroy()
    return float(out[0])


def run_merge(out: Path, *inputs: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetccl", "trace", str(out), *inputs],
                          capture_output=True, text=True, timeout=60)


def by_rank(doc: Dict[str, Any]) -> Dict[int, List[Dict[str, Any]]]:
    """Complete events per rank, by start (an enclosing event first)."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            out.setdefault(ev["pid"] - 1, []).append(ev)  # pid: rank + 1
    for evs in out.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return out


def inside(ev: Dict[str, Any], outer: Dict[str, Any]) -> bool:
    return outer["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def assert_nested(events: Dict[int, List[Dict[str, Any]]]) -> None:
    """On every track (rank, tid) events nest or follow each other, never
    overlap in part: what Perfetto draws as a stack of slices."""
    for rank, evs in events.items():
        open_ends: Dict[int, List[float]] = {}
        for e in evs:  # by start, an enclosing event first
            stack = open_ends.setdefault(e["tid"], [])
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= start + 5e-4:
                stack.pop()
            assert not stack or end <= stack[-1] + 5e-4, (rank, e)
            stack.append(end)


def piece_bytes(evs: List[Dict[str, Any]], name: str) -> Dict[int, int]:
    """Bytes of the messages `name` ("send" / "recv") per peer."""
    out: Dict[int, int] = {}
    for e in evs:
        if e["cat"] == "piece" and e["name"] == name:
            out[e["args"]["peer"]] = out.get(e["args"]["peer"], 0) + e["args"]["bytes"]
    return out


# What each rank's phases are, per form: the leaders' (HETCCL_HIER_RAILS=0)
# and the rails' (each island's rank j carries slice j across).
def leaders_form(rank: int) -> Tuple[List[str], List[str], List[int]]:
    if rank in LEADERS:
        return ["island", "leaders", "island"], ["Reduce", "AllReduce", "Broadcast"], [NBYTES] * 3
    return ["island", "island"], ["Reduce", "Broadcast"], [NBYTES] * 2


def rails_form(rank: int) -> Tuple[List[str], List[str], List[int]]:
    return (["island", "rail", "island"], ["ReduceScatter", "AllReduce", "AllGather"],
            [NBYTES // 2] * 3)


# What the algorithms move, per (sender, receiver). Leaders: the island's
# Reduce sends the member's buffer to its leader, the leaders swap theirs
# (2 ranks: one direct exchange), the island's Broadcast sends the result
# back. Rails: inside each island the ReduceScatter and the AllGather swap
# a half each way; across, rail 0 (ranks 0, 2) and rail 1 (1, 3) swap
# their halves.
LEADERS_BYTES = {(1, 0): NBYTES, (3, 2): NBYTES, (0, 2): NBYTES, (2, 0): NBYTES,
                 (0, 1): NBYTES, (2, 3): NBYTES}
RAILS_BYTES = {(0, 1): NBYTES, (1, 0): NBYTES, (2, 3): NBYTES, (3, 2): NBYTES,
               (0, 2): NBYTES // 2, (2, 0): NBYTES // 2, (1, 3): NBYTES // 2,
               (3, 1): NBYTES // 2}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rails", ["0", "1"], ids=["leaders", "rails"])
def test_hier_allreduce_trace(rails: str, tmp_path: Path) -> None:
    form = rails_form if rails == "1" else leaders_form
    env = {"HETCCL_ISLANDS": ISLANDS, "HETCCL_TRACE": str(tmp_path / "run.json"),
           "HETCCL_HIER_RAILS": rails, "HETCCL_HIER_RAILS_MIN": "0"}
    assert hetccl.launch(rank_allreduce, 4, COUNT, True, env=env, timeout=150) == [10.0] * 4
    files = sorted(p.name for p in tmp_path.glob("run.*.json"))
    assert files == [f"run.{r}.json" for r in range(4)]
    merged = tmp_path / "merged.json"
    res = run_merge(merged, str(tmp_path))
    assert res.returncode == 0, res.stderr
    summary = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("  ")]
    assert [int(row[0]) for row in summary] == [0, 1, 2, 3], res.stdout
    assert all(int(row[1]) == 3 for row in summary), res.stdout  # 2 AllReduce + GroupEnd

    doc = json.loads(merged.read_text())
    names = {ev["pid"] - 1: ev["args"]["name"] for ev in doc["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 3]
    assert all(names[r].startswith(f"rank {r} (") for r in names), names
    assert doc["otherData"]["dropped_events"] == 0

    events = by_rank(doc)
    assert sorted(events) == [0, 1, 2, 3]
    assert_nested(events)
    sends: Dict[Tuple[int, int], int] = {}
    across: Dict[int, str] = {}
    recvs: Dict[Tuple[int, int], int] = {}
    for rank, evs in events.items():
        leader = rank in LEADERS
        calls = [e for e in evs if e["cat"] == "call" and e["name"] == "AllReduce"]
        assert len(calls) == 2, (rank, calls)
        call = calls[0]
        assert call["args"]["bytes"] == NBYTES and call["args"]["op"] == "sum"
        assert call["args"]["dtype"] == "float32" and call["args"]["seq"] == 0
        assert calls[1]["args"]["seq"] == 1

        # The phases, nested in the call and in order: inside the island,
        # across (leaders: the leaders only), inside again.
        phases = [e for e in evs if e["cat"] == "phase" and inside(e, call)]
        want, ops, nbytes = form(rank)
        assert [p["name"] for p in phases] == want, (rank, phases)
        assert [p["args"]["op"] for p in phases] == ops
        assert [p["args"]["step"] for p in phases] == list(range(len(want)))
        for a, b in zip(phases, phases[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (rank, a, b)
        assert [p["args"]["bytes"] for p in phases] == nbytes
        if len(phases) == 3:  # the phase across runs on another communicator than the island's
            assert phases[1]["args"]["comm"] != phases[0]["args"]["comm"]
            assert phases[0]["args"]["comm"] == phases[2]["args"]["comm"]
            across[rank] = phases[1]["args"]["comm"]

        # Each phase ran one engine collective inside it; its messages lie
        # inside the call, on the phase's communicator.
        for p in phases:
            engine = [e for e in evs if e["cat"] == "engine" and inside(e, p)]
            assert [e["name"] for e in engine] == [p["args"]["op"]], (rank, p, engine)
        pieces = [e for e in evs if e["cat"] == "piece" and inside(e, call)]
        assert pieces and all(e["args"]["seq"] == 0 for e in pieces)
        comms = {p["args"]["comm"] for p in phases}
        assert {e["args"]["comm"] for e in pieces} <= comms
        mine = [e for e in evs if inside(e, call)]
        for peer, n in piece_bytes(mine, "send").items():
            sends[rank, peer] = n
        for peer, n in piece_bytes(mine, "recv").items():
            recvs[peer, rank] = n
        # Leaders: a leader reduces what its island member sent, then what
        # the other leader sent. Rails: every rank reduces its island
        # peer's half, then its rail peer's.
        reduces = [e for e in mine if e["cat"] == "reduce"]
        assert len(reduces) == (2 if leader or rails == "1" else 0), (rank, reduces)

    expected = RAILS_BYTES if rails == "1" else LEADERS_BYTES
    assert sends == expected
    if rails == "1":  # rail 0 is the leaders' communicator, rail 1 another
        assert across[0] == across[2] != across[1] == across[3], across
    assert recvs == expected  # every byte sent was received, by the peer it was sent to

    # The grouped AllReduce: its phases run inside ncclGroupEnd.
    for rank, evs in events.items():
        group = [e for e in evs if e["cat"] == "call" and e["name"] == "GroupEnd"]
        assert len(group) == 1, (rank, group)
        phases = [e["name"] for e in evs if e["cat"] == "phase" and inside(e, group[0])]
        assert phases == form(rank)[0], (rank, phases)


def rank_calls(count: int, calls: int) -> int:
    comm = hetccl.communicator()
    x = np.ones(count, dtype=np.float64)
    for _ in range(calls):
        comm.allReduce(x.ctypes.data, x.ctypes.data, count, nccl.NCCL_FLOAT64, nccl.NCCL_SUM)
    comm.destroy()
    return int(x[0])


@pytest.mark.timeout(120)
def test_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the ranks' working directory too
    monkeypatch.delenv("HETCCL_TRACE", raising=False)
    assert hetccl.launch(rank_calls, 2, 16, 3, env={"HETCCL_TRACE": ""}, timeout=100) == [8, 8]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(120)
def test_full_buffer_counts_drops(tmp_path: Path) -> None:
    env = {"HETCCL_TRACE": str(tmp_path / "t-%r.json"), "HETCCL_TRACE_EVENTS": "16"}
    assert hetccl.launch(rank_calls, 2, 16, 20, env=env, timeout=100) == [2 ** 20] * 2
    for r in range(2):
        doc = json.loads((tmp_path / f"t-{r}.json").read_text())
        other = doc["otherData"]
        assert other["events"] == 16 and other["events_per_thread"] == 16
        assert other["dropped_events"] > 0  # 20 calls of several events each
    res = run_merge(tmp_path / "m.json", str(tmp_path / "t-*.json"))
    assert res.returncode == 0, res.stderr
    assert "events dropped" in res.stdout


def rank_init_error() -> Tuple[int, str]:
    try:
        hetccl.communicator()
    except nccl.NcclError as e:
        return e.result, str(e)
    return 0, ""


@pytest.mark.timeout(60)
def test_unwritable_directory_fails_init(tmp_path: Path) -> None:
    env = {"HETCCL_TRACE": str(tmp_path / "missing" / "t.json")}
    [(code, message)] = hetccl.launch(rank_init_error, 1, env=env, timeout=50)
    assert code == 4, message  # ncclInvalidArgument
    assert "HETCCL_TRACE" in message and "missing" in message


GOOD_EVENT = {"name": "AllReduce", "cat": "call", "ph": "X", "ts": 1.0, "dur": 2.0, "pid": 0,
              "tid": 1, "args": {}}


@pytest.mark.parametrize("text,why", [
    ("{\"traceEvents\": [", "not JSON"),
    ("[1, 2]", "no \"traceEvents\" list"),
    (json.dumps({"traceEvents": [dict(GOOD_EVENT, ts="soon")]}), "event 0: 'ts'"),
    (json.dumps({"traceEvents": [GOOD_EVENT, dict(GOOD_EVENT, pid=None)]}), "event 1: 'pid'"),
    (json.dumps({"traceEvents": [dict(GOOD_EVENT, dur=-1)]}), "event 0: 'dur'"),
])
def test_merge_refuses_malformed_file(tmp_path: Path, text: str, why: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"traceEvents": [GOOD_EVENT]}))
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    out = tmp_path / "out.json"
    res = run_merge(out, str(good), str(bad))
    assert res.returncode == 2
    assert str(bad) in res.stderr and why in res.stderr, res.stderr
    assert not out.exists()


def test_merge_needs_files(tmp_path: Path) -> None:
    res = run_merge(tmp_path / "out.json", str(tmp_path / "none-*.json"))
    assert res.returncode == 2 and "matches no file" in res.stderr
