"""CUDA graphs across islands, on a real GPU: two processes on cuda:0, which
hetccl never hands to NCCL as one island (each is an island of its own, and
the data plane carries what they exchange), capture collectives and
send/recv into CUDA graphs and replay them, the library driven through
ctypes as vLLM's pynccl wrapper drives NCCL (tests/cuda_graph_rank.py):

1. one graph of a 4 MiB all_reduce, a 1 MiB all_reduce in place, an
   all_gather, a reduce_scatter, a broadcast, an AlltoAll in place and a
   send/recv pair in a group, replayed 100 times with new inputs, every
   output checked exactly, eager calls of the same between replays
   (torch.cuda.graph's capture_error_mode global, and thread_local);
2. a second graph (1 KiB all_reduce in place, 64 MiB all_gather) replayed
   alternately with the first;
3. a 4 MiB all_reduce alone in a graph: time per replay beside the eager
   call's, printed as "TIMING all_reduce 4MiB eager_us=... replay_us=...";
4. torch.distributed's "nccl" backend with libhetccl.so in LD_PRELOAD:
   dist.all_reduce captured and replayed; skipped, with the reason, when
   torch's NCCL is not a shared library that LD_PRELOAD replaces;
5. a communicator with a host rank refuses the capture (ncclInvalidUsage,
   "captured into a graph"), torch's capture ends cleanly, and the
   communicator still works;
6. three processes on cuda:0: one graph of every collective (all_reduce out
   of place and in place, reduce, all_gather, reduce_scatter, broadcast,
   AlltoAll out of place and in place, Gather, Scatter) and a ring of
   send/recv in a group, replayed 30 times with new inputs, every output
   checked exactly on every rank, eager calls of the same between replays.

No HETCCL_* variable is set, except HETCCL_DEVICE=host for scenario 5's
host rank. Each rank starts as a fresh interpreter (scenario 4 needs the
exec for LD_PRELOAD), has 100 s before it dumps its stacks and exits, and
is killed at 120 s (scenario 6: 130 s and 150 s). Needs torch with CUDA;
skipped elsewhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import torch_cuda_ok
from hetccl.ports import free_ports
from libpath import find_library

pytestmark = pytest.mark.cuda

LIB = find_library()
RANK_PY = Path(__file__).with_name("cuda_graph_rank.py")
TIMEOUT = 120  # s, per launch of both ranks
THREE_TIMEOUT = 150  # s, scenario 6's launch of three ranks
NCCL_INVALID_USAGE = 5

if LIB is None or not torch_cuda_ok():
    pytest.skip("needs libhetccl.so and torch with a CUDA device", allow_module_level=True)


@dataclass
class Rank:
    code: Optional[int]  # exit status (negative: killed by that signal)
    res: Optional[dict]  # its RESULT line
    out: str             # everything it printed


def launch(tmp_path: Path, mode: str, extra: Optional[Dict[str, str]] = None,
           per_rank: Optional[Dict[int, Dict[str, str]]] = None,
           timeout: float = TIMEOUT, nranks: int = 2) -> List[Rank]:
    """The `nranks` ranks of `mode` as fresh interpreters, waited for
    together (the ones still running at `timeout` are killed); their exit
    statuses, results and outputs, whatever happened."""
    procs, logs = [], []
    for rank in range(nranks):
        env = dict(os.environ, T_LIB=str(LIB), T_RANK=str(rank), T_NRANKS=str(nranks),
                   T_ID_FILE=str(tmp_path / "id"), T_MODE=mode,
                   T_DEADLINE=str(timeout - 20), PYTHONUNBUFFERED="1")
        env.update(extra or {})
        env.update((per_rank or {}).get(rank, {}))
        log = tmp_path / f"rank{rank}.out"
        with open(log, "w") as f:
            procs.append(subprocess.Popen([sys.executable, str(RANK_PY)], env=env, stdout=f,
                                          stderr=subprocess.STDOUT, cwd=str(RANK_PY.parent)))
        logs.append(log)
    deadline = time.monotonic() + timeout
    late = set()
    try:
        for i, p in enumerate(procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late.add(i)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranks = []
    for i, (p, log) in enumerate(zip(procs, logs)):
        out = log.read_text(errors="replace")
        if i in late:
            out += f"\n[killed: still running after {timeout} s]"
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        ranks.append(Rank(p.returncode, json.loads(lines[-1][7:]) if lines else None, out))
    return ranks


def describe(ranks: List[Rank]) -> str:
    return "\n".join(f"--- rank {i} (exit {r.code}):\n{r.out[-4000:]}" for i, r in enumerate(ranks))


def assert_ran(ranks: List[Rank]) -> None:
    """Every rank exited 0 with a result and no error."""
    for r in ranks:
        assert r.code == 0 and r.res is not None and "error" not in r.res, describe(ranks)


def assert_captured(info: dict, ranks: List[Rank]) -> None:
    assert info["exception"] is None and not info["issued"], f"{info}\n{describe(ranks)}"
    assert not info["capturing_after"], info


@pytest.mark.parametrize("capture_mode", ["global", "thread_local"])
def test_captured_collectives_replayed_between_eager_calls(tmp_path, capture_mode):
    """Scenario 1: all_reduce (4 MiB), all_reduce in place (1 MiB),
    all_gather, reduce_scatter, broadcast from rank 0, AlltoAll in place
    (blocks just over one 4 MiB piece; it and the in-place all_reduce make
    the two-rank exchange wait until what a piece overwrites has been sent)
    and a send/recv pair in a group, warmed up eagerly, captured in one
    graph, replayed 100 times with new inputs (outputs set to -1 before
    each, the in-place calls' buffers refilled), every output checked
    exactly; every 10th iteration the same calls eagerly on other tensors,
    queued before or after the replay with no synchronisation between. With
    torch's default capture mode (global: the library's own threads may not
    make unsafe CUDA calls while the capture is open) and with thread_local
    (NCCL's advice for threaded programs)."""
    ranks = launch(tmp_path, "capture", {"T_CAPTURE_MODE": capture_mode})
    assert_ran(ranks)
    for r in ranks:
        res = r.res
        assert res["warmup_bad"] == [], res["warmup_bad"]
        assert_captured(res["capture"], ranks)
        assert res["replays"] == 100 and res["replay_bad"] == [], res["replay_bad"]
        assert res["eager_rounds"] == 10 and res["eager_bad"] == [], res["eager_bad"]
        assert res["async_error"] == 0, res
    print(f"capture ({capture_mode}): 100 replays in {ranks[0].res['replay_loop_s']} s "
          f"(checks included); torch's warnings: {ranks[0].res['capture']['warnings']}")


def test_two_graphs_replayed_alternately(tmp_path):
    """Scenario 2: scenario 1's graph and a second one (a 1 KiB all_reduce in
    place, a 64 MiB all_gather), the second captured on torch's own capture
    stream; 30 rounds, each with new inputs for both and the two replayed
    back to back, in alternating order, then every output checked."""
    ranks = launch(tmp_path, "two_graphs")
    assert_ran(ranks)
    for r in ranks:
        res = r.res
        assert res["warmup_bad"] == [], res["warmup_bad"]
        assert_captured(res["capture_first"], ranks)
        assert_captured(res["capture_second"], ranks)
        assert res["rounds"] == 30 and res["bad"] == [], res["bad"]
        assert res["async_error"] == 0, res


def test_captured_all_reduce_timing(tmp_path):
    """Scenario 3, not a speed goal: a 4 MiB all_reduce alone in a graph,
    the mean time per replay over 200 replays (cuda events) beside the
    eager ncclAllReduce's over 200 calls, printed; the results are checked
    after each loop."""
    ranks = launch(tmp_path, "timing")
    assert_ran(ranks)
    for r in ranks:
        res = r.res
        print(f"TIMING all_reduce 4MiB eager_us={res['eager_us']:.1f} "
              f"replay_us={res['replay_us']:.1f} rank={res['rank']} "
              f"eager_host_us={res['eager_host_us']:.1f} replay_host_us={res['replay_host_us']:.1f}")
    for r in ranks:
        assert_captured(r.res["capture"], ranks)
        assert r.res["bad"] == [], r.res["bad"]
        assert r.res["async_error"] == 0, r.res


def test_torch_distributed_all_reduce_captured_under_ld_preload(tmp_path):
    """Scenario 4: torch.distributed's "nccl" backend with libhetccl.so in
    LD_PRELOAD (env:// init), dist.all_reduce warmed up on a side stream,
    captured in torch.cuda.graph, replayed 20 times with new inputs and
    checked, then once more eagerly. Each rank first says (PRELOAD lines)
    which libraries are mapped, where ncclAllReduce resolves, whether
    torch's library imports NCCL's symbols or links NCCL in, and after the
    warm-up where torch's GOT slots for them point. Skipped, with that
    reason, when torch's NCCL is linked in or bound elsewhere: LD_PRELOAD
    cannot replace it."""
    preload = ":".join(filter(None, [str(LIB), os.environ.get("LD_PRELOAD")]))
    extra = {"LD_PRELOAD": preload, "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_ports(1)[0]), "WORLD_SIZE": "2"}
    per_rank = {r: {"RANK": str(r), "LOCAL_RANK": str(r)} for r in range(2)}
    ranks = launch(tmp_path, "dist", extra, per_rank)
    for i, r in enumerate(ranks):
        if r.res is not None:
            print(f"rank {i}: probe {json.dumps(r.res.get('probe'))}")
            print(f"rank {i}: served by {json.dumps(r.res.get('served_by'))}, "
                  f"torch.cuda.nccl.version() {r.res.get('torch_nccl_version')}")
    for r in ranks:
        if r.res is not None and r.res.get("skip"):
            pytest.skip(r.res["skip"])
    for r in ranks:
        served = (r.res or {}).get("served_by") or {}
        if served.get("verdict") == "other":
            pytest.skip(f"torch's NCCL calls are bound to {served}, not to the preloaded "
                        f"{LIB}: LD_PRELOAD cannot replace torch's NCCL here "
                        f"(error, if any: {r.res.get('error')})")
    assert_ran(ranks)
    for r in ranks:
        res = r.res
        assert res["served_by"]["verdict"] == "hetccl", res["served_by"]
        assert_captured(res["capture"], ranks)
        assert res["replays"] == 20 and res["bad"] == [], res["bad"]


def test_capture_with_a_host_rank_is_refused(tmp_path):
    """Scenario 5: rank 1 is a host rank (HETCCL_DEVICE=host, CPU tensors).
    Rank 0's all_reduce inside torch.cuda.graph returns ncclInvalidUsage and
    ncclGetLastError(comm) says the stream is being captured into a graph;
    the capture is then ended (whatever torch says at its end is printed),
    the stream no longer captures and synchronises. Rank 1 makes no call for
    the refused one: it waits for rank 0's word (a file) and then both make
    one eager all_reduce, checked, and no async error."""
    ranks = launch(tmp_path, "refuse", per_rank={1: {"HETCCL_DEVICE": "host"}})
    assert_ran(ranks)
    r0, r1 = ranks[0].res, ranks[1].res
    info = r0["capture"]
    print(f"refused: rc {r0.get('rc')}, ncclGetLastError(comm): {r0.get('error_comm')!r}; "
          f"torch at the capture's end: exception {info['exception']!r}, "
          f"warnings {info['warnings']}; synchronize after: {r0.get('synchronize_after')}")
    assert r0["device"].startswith("cuda") and r1["device"] == "cpu", (r0, r1)
    assert r0["outcome"] == "refused" and r1["outcome"] == "refused", (r0, r1)
    assert r0["rc"] == NCCL_INVALID_USAGE, r0
    assert "captured into a graph" in r0["error_comm"], r0
    assert not info["capturing_after"], info
    assert r0["synchronize_after"] == "ok", r0
    for res in (r0, r1):
        assert res["eager_before_bad"] == [] and res["eager_after_bad"] == [], res
        assert res["async_error"] == 0, res


THREE_OUTPUTS = {"all_reduce", "all_reduce_inplace", "all_gather", "reduce_scatter",
                 "broadcast", "alltoall", "alltoall_inplace", "scatter", "recv"}
THREE_ROOTED = {0: {"gather"}, 1: {"reduce"}, 2: set()}  # defined on the root only


def test_three_ranks_every_collective_captured(tmp_path):
    """Scenario 6: three processes on cuda:0 (the data plane's rings and
    chains of three, not the two-rank exchange): all_reduce 1 MiB out of place
    and 64 KiB in place, reduce (sum) to rank 1, all_gather,
    reduce_scatter, broadcast from rank 2, AlltoAll out of place and in
    place (blocks just over one 4 MiB piece), Gather to rank 0, Scatter from
    rank 1 and a ring of send/recv (to rank + 1, from rank - 1) in a group,
    most counts odd (uneven chunks); warmed up eagerly, captured in one
    graph, replayed 30 times with new inputs, every output checked exactly
    on every rank (Reduce's and Gather's on their root, where they are
    defined); every 5th iteration the same calls eagerly on other tensors,
    queued before or after the replay with no synchronisation between."""
    ranks = launch(tmp_path, "three", nranks=3, timeout=THREE_TIMEOUT)
    assert_ran(ranks)
    for i, r in enumerate(ranks):
        res = r.res
        assert set(res["checked"]) == THREE_OUTPUTS | THREE_ROOTED[i], res["checked"]
        assert res["warmup_bad"] == [], res["warmup_bad"]
        assert_captured(res["capture"], ranks)
        assert res["replays"] == 30 and res["replay_bad"] == [], res["replay_bad"]
        assert res["eager_rounds"] == 6 and res["eager_bad"] == [], res["eager_bad"]
        assert res["async_error"] == 0, res
    print(f"three ranks: 30 replays in {ranks[0].res['replay_loop_s']} s "
          f"(checks included); torch's warnings: {ranks[0].res['capture']['warnings']}")
