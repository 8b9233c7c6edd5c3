"""Collectives and send/recv on a stream being captured into a HIP graph,
replayed, with no AMD GPU: HIP ranks in separate processes (tests/
graph_rank.py) on the stand-in libamdhip64 of tests/test_hip.py (ROCm 6
build), whose graph capture records every stream operation of the process
while a capture is open and hipGraphLaunch runs them again in order
(tests/c/vendor/fakes/fake_hip.c). Buffers are the stand-in's device
memory, so AllGather, Broadcast, AlltoAll and send/recv between two HIP
ranks of islands of their own go through the data plane (plane/), which
must capture them so that every replay moves the inputs of the moment;
reducing collectives go to the engine (the stand-in has no runtime
compiler), which refuses capture, as it refuses it with a host rank in
the communicator.

Each scenario checks every output exactly, every rank: replays
interleaved with eager calls on the same stream, two graphs replayed in a
mixed order, messages of more pieces than the plane's slots, three ranks
in a ring, and the refusals (after which the communicator still works).
The plane's lazy set-up happens inside the first capture, in global mode:
the stand-in refuses allocations there unless the library relaxed the
thread's capture mode, and no rank may have seen such a refusal. Skipped
without a C compiler (the stand-in is built here).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from rank_procs import can_unshare_ipc
from test_hip import TIMEOUT, fakes, hip_env, start_ranks  # noqa: F401 (fakes: the fixture)

pytestmark = pytest.mark.usefixtures("hetccl_library")

GRAPH_PY = Path(__file__).with_name("graph_rank.py")
CAPTURED = "captured into a graph"


def _hip(fakes: Dict[str, Path], scenario: str, **extra: str) -> Dict[str, str]:
    """A HIP rank of an island of its own, no vendor library: the data
    plane between HIP ranks."""
    return {**hip_env(fakes), "HETCCL_ISLANDS": "rank", "HETCCL_VENDOR": "0",
            "T_GRAPH": scenario, **extra}


def _run(tmp_path: Path, envs: List[Dict[str, str]], own_host: tuple = ()) -> List[dict]:
    results = start_ranks(tmp_path, envs, own_host=own_host, share_gpu=True, script=GRAPH_PY)
    for rank, res in enumerate(results):
        assert "error" not in res, f"rank {rank}: init failed: {res}"
    return results


def _all_right(results: List[dict], launches: int) -> None:
    """Every call succeeded and every output held what it should; the
    library relaxed the capture mode for whatever it set up meanwhile; the
    stand-in ran each replay."""
    for rank, res in enumerate(results):
        assert res["errors"] == [], f"rank {rank}: {res['errors']}"
        assert res["wrong"] == [], f"rank {rank}: {len(res['wrong'])} wrong: {res['wrong'][:6]}"
        if res["kind"] != "hip":
            continue
        assert res["fake_capture_refusals"] == 0, \
            f"rank {rank}: the stand-in refused {res['fake_capture_refusals']} calls in a capture"
        assert res["replays"] == launches, res
        assert res["fake_graph_launches"] == launches, res
        assert res["fake_graph_ops"] > 0 or not launches, res  # the graphs recorded something


@pytest.mark.timeout(TIMEOUT)
def test_captured_collectives_replay_between_eager_calls(tmp_path: Path,
                                                         fakes: Dict[str, Path]) -> None:
    """AllGather, Broadcast, a send/recv pair and AlltoAll, captured into one
    graph before the communicator ran anything, replayed 20 times with new
    inputs; every third replay is followed by the same calls run eagerly
    on the same stream."""
    log = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT",
           "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    results = _run(tmp_path, [_hip(fakes, "replay", **log)] * 2)
    assert [r["kind"] for r in results] == ["hip", "hip"], results
    _all_right(results, 20)
    logs = [f.read_text() for f in tmp_path.glob("log.*")]
    assert len(logs) == 2 and all("moved by this GPU's copy engines" in t for t in logs), logs


@pytest.mark.timeout(TIMEOUT)
def test_two_graphs_replay_in_any_order(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """G1 (AllGather) and G2 (Broadcast, captured in thread-local mode),
    captured one after the other, replayed G2, G1, G1, G2, G1."""
    _all_right(_run(tmp_path, [_hip(fakes, "two")] * 2), 5)


@pytest.mark.timeout(TIMEOUT)
def test_pieces_wrap_the_slots_within_a_replay(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """64 KiB per rank and call in 4 KiB pieces through 4 slots: each
    channel wraps its slots four times within one call of a replay, and
    the piece numbers go on across replays and eager calls."""
    env = _hip(fakes, "replay", T_COUNT=str(16 << 10), HETCCL_PLANE_PIECE="4096",
               HETCCL_PLANE_SLOTS="4")
    _all_right(_run(tmp_path, [env] * 2), 20)


@pytest.mark.timeout(TIMEOUT)
def test_three_ranks_replay_a_ring(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """Three HIP ranks: an AllGather and a ring of send/recv (to rank + 1,
    from rank - 1) in one graph, replayed 10 times (eager calls between)."""
    _all_right(_run(tmp_path, [_hip(fakes, "ring", T_ITERS="10")] * 3), 10)


@pytest.mark.timeout(TIMEOUT)
def test_captured_allreduce_of_device_buffers_is_refused(tmp_path: Path,
                                                         fakes: Dict[str, Path]) -> None:
    """The AllReduce goes to the engine, which cannot be captured: the call
    is refused as invalid usage, ncclGetLastError(comm) saying why; the
    capture ended, the same AllReduce runs eagerly."""
    results = _run(tmp_path, [_hip(fakes, "allreduce")] * 2)
    for rank, res in enumerate(results):
        [ref] = res["refusals"]
        assert ref["error"] == "ncclInvalidUsage", f"rank {rank}: {ref}"
        assert CAPTURED in ref["comm_last_error"], f"rank {rank}: {ref}"
    _all_right(results, 0)


@pytest.mark.timeout(TIMEOUT)
def test_capture_with_a_host_rank_is_refused(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """Two HIP ranks and a host rank: a captured AllGather is refused on the
    HIP ranks (a replay would need the host rank's CPU), the message
    naming the host rank; then all three run it eagerly."""
    host = {"HETCCL_DEVICE": "host", "HETCCL_ISLANDS": "rank", "HETCCL_VENDOR": "0",
            "T_GRAPH": "host"}
    results = _run(tmp_path, [_hip(fakes, "host"), _hip(fakes, "host"), host])
    assert [r["kind"] for r in results] == ["hip", "hip", "host"], results
    for rank, res in enumerate(results[:2]):
        [ref] = res["refusals"]
        assert ref["error"] == "ncclInvalidUsage", f"rank {rank}: {ref}"
        for msg in (ref["message"], ref["comm_last_error"]):
            assert CAPTURED in msg and "host rank" in msg, f"rank {rank}: {ref}"
    assert results[2]["refusals"] == [], results[2]
    _all_right(results, 0)


@pytest.mark.timeout(TIMEOUT)
def test_replay_after_the_peer_aborted_ends_with_the_error(tmp_path: Path,
                                                          fakes: Dict[str, Path]) -> None:
    """Rank 1 aborts its communicator after one replay; rank 0's replays
    after that end (the guard thread sees the failure mark and releases the
    mailboxes, again as each replay clears them) instead of waiting forever
    (the stand-in would wait 60 s per wait), and the async error says so."""
    results = _run(tmp_path, [_hip(fakes, "abort", HETCCL_PLANE_PIECE="4096",
                                   HETCCL_PLANE_SLOTS="4", T_COUNT="8192")] * 2)
    assert results[1].get("aborted"), results[1]
    r0 = results[0]
    assert r0["wrong"] == [] and r0["errors"] == [], r0
    assert len(r0["abort_replay_s"]) == 3 and max(r0["abort_replay_s"]) < 10, r0
    assert r0["async_error"] not in (0, None), r0
    assert "gave up" in r0["async_message"] or "aborted" in r0["async_message"], r0


@pytest.mark.timeout(TIMEOUT)
def test_capture_across_hosts_is_refused(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """Two HIP ranks, rank 1 a host of its own (`unshare --ipc`): their
    channel is bridged by the proxy thread, so a captured AllGather is
    refused, the message naming the rank on another host; then both run
    it eagerly through the bridges."""
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    results = _run(tmp_path, [_hip(fakes, "host")] * 2, own_host=(1,))
    for rank, res in enumerate(results):
        [ref] = res["refusals"]
        assert ref["error"] == "ncclInvalidUsage", f"rank {rank}: {ref}"
        for msg in (ref["message"], ref["comm_last_error"]):
            assert CAPTURED in msg and "on another host" in msg, f"rank {rank}: {ref}"
    _all_right(results, 0)
