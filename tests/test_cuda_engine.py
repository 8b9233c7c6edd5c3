"""Device buffers on an engine communicator (several islands), on a real GPU.

Islands are forced (HETCCL_ISLANDS=rank), so two or three processes on one
GPU run every collective on hetccl's engine with CUDA buffers staged through
pinned host memory on a side stream (exec/devpath.h); a mixed communicator
joins a CUDA rank and a host rank. Each rank checks its results against
numpy (tests/cuda_engine_rank.py). Needs torch with CUDA; skipped elsewhere.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import torch_cuda_ok
from libpath import find_library
from rank_procs import can_unshare_ipc, run_ranks

pytestmark = pytest.mark.cuda

LIB = find_library()
RANK_PY = Path(__file__).with_name("cuda_engine_rank.py")


if LIB is None or not torch_cuda_ok():
    pytest.skip("needs libhetccl.so and torch with a CUDA device", allow_module_level=True)


def launch(tmp_path: Path, modes: list[str], checks: str, timeout: float = 300,
           islands: str = "rank", devices: tuple[int, ...] = (),
           extra: dict | None = None, own_host: tuple[int, ...] = ()) -> list[dict]:
    """Start one process per mode, wait for all, return each rank's results.
    `devices`: each rank's GPU (default 0 for every rank); ranks in
    `own_host` run as hosts of their own (`unshare --ipc`)."""
    envs = []
    for rank, mode in enumerate(modes):
        env = dict(os.environ, T_LIB=str(LIB), T_RANK=str(rank), T_NRANKS=str(len(modes)),
                   T_ID_FILE=str(tmp_path / "id"), T_MODE=mode, T_CHECKS=checks,
                   T_DEV=str(devices[rank] if devices else 0),
                   HETCCL_ISLANDS=islands, NCCL_NVLS_ENABLE="0", HETCCL_DEBUG="WARN")
        env.update(extra or {})
        if mode == "host":
            env["HETCCL_DEVICE"] = "host"
        envs.append(env)
    prefixes = [["unshare", "--ipc"] if r in own_host else [] for r in range(len(modes))]
    return run_ranks(RANK_PY, envs, timeout, prefixes=prefixes)


def assert_all_true(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        bad = {k: v for k, v in res.items() if v is False or k.endswith(".first_bad")}
        assert not bad, f"rank {rank}: {bad}"
        assert res["async_error"] == 0, f"rank {rank}: async error {res['async_error']}"


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_on_device_buffers(tmp_path, n):
    results = launch(tmp_path, ["cuda"] * n, "sweep,group,chain")
    assert_all_true(results)
    assert any(k.startswith("allreduce/") for k in results[0])


def test_call_returns_before_the_stream_reaches_it(tmp_path):
    results = launch(tmp_path, ["cuda", "cuda"], "async")
    assert_all_true(results)
    for res in results:
        assert res["async_returned_while_stream_busy"], res
        assert res["async_result"], res


def test_cuda_rank_with_a_host_rank(tmp_path):
    """Also: capture into a graph is refused where a host rank moves data
    (tests/test_cuda_graph.py captures between CUDA ranks)."""
    results = launch(tmp_path, ["cuda", "host"], "sweep,group,chain,async,capture")
    assert_all_true(results)
    assert results[0]["async_returned_while_stream_busy"]
    assert results[0]["capture_refused"], results[0]


@pytest.mark.parametrize("rtc", ["nvrtc", "none"])
def test_two_gpu_ranks_and_a_host_rank_on_the_plane(tmp_path, rtc):
    """Three islands on one host: two CUDA ranks (on two GPUs where there
    are two) and a host rank share the data plane's segments, the GPUs
    moving and reducing with their copy engines and kernels, the host rank
    with its CPU; every collective checked against numpy, and each rank's
    log says which of the two moved its bytes. With no runtime compiler
    (HETCCL_NVRTC_LIBRARY=none) the reducing collectives fall back to the
    engine, device buffers staged, and the logs say so."""
    import torch
    second = 1 if torch.cuda.device_count() > 1 else 0
    extra = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT",
             "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    if rtc == "none":
        extra["HETCCL_NVRTC_LIBRARY"] = "none"
    results = launch(tmp_path, ["cuda", "cuda", "host"], "sweep,group,chain,async",
                     devices=(0, second, 0), extra=extra)
    assert_all_true(results)
    logs = [f.read_text() for f in tmp_path.glob("log.*")]
    assert sum("moved by this GPU's copy engines" in t for t in logs) == 2, logs
    assert sum("moved by this rank's CPU" in t for t in logs) == 1, logs
    fallback = sum("cannot reduce on its device" in t for t in logs)
    assert fallback == (3 if rtc == "none" else 0), logs


def needs_unshare():
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")


@pytest.mark.parametrize("rtc", ["nvrtc", "none"])
def test_gpu_ranks_on_the_plane_across_hosts(tmp_path, rtc):
    """The data plane spanning hosts (HETCCL_PLANE_HOSTS=all): rank 1 runs
    as a host of its own, so its channels to rank 0 (CUDA) and rank 2 (a
    host rank beside rank 0) are bridged, a segment on each side whose
    pieces cross by socket (plane/bridge.c), while ranks 0 and 2 share
    theirs; every collective checked against numpy."""
    needs_unshare()
    import torch
    second = 1 if torch.cuda.device_count() > 1 else 0
    extra = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT",
             "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p"), "HETCCL_PLANE_HOSTS": "all"}
    if rtc == "none":
        extra["HETCCL_NVRTC_LIBRARY"] = "none"
    results = launch(tmp_path, ["cuda", "cuda", "host"], "sweep,group,chain,async",
                     devices=(0, second, 0), extra=extra, own_host=(1,))
    assert_all_true(results)
    logs = [f.read_text() for f in tmp_path.glob("log.*")]
    assert sum("moved by this GPU's copy engines" in t for t in logs) == 2, logs
    assert sum("(2 of other hosts, bridged" in t for t in logs) == 1, logs
    assert sum("(1 of other hosts, bridged" in t for t in logs) == 2, logs
    fallback = sum("cannot reduce on its device" in t for t in logs)
    assert fallback == (3 if rtc == "none" else 0), logs


def test_plane_across_hosts_bandwidth_is_reported(tmp_path):
    """Not a speed goal: two CUDA ranks as two hosts, allreduce over socket
    on the plane's bridges (HETCCL_PLANE_HOSTS=all: GPU copies and kernels,
    pieces pipelined) against staging for the engine (one: whole buffers
    copied out, reduced by the CPU), in one run."""
    needs_unshare()
    import torch
    second = 1 if torch.cuda.device_count() > 1 else 0
    for hosts in ("all", "one"):
        (tmp_path / hosts).mkdir()
        results = launch(tmp_path / hosts, ["cuda", "cuda"], "bench", devices=(0, second),
                         extra={"HETCCL_PLANE_HOSTS": hosts}, own_host=(1,))
        assert_all_true(results)
        print(f"allreduce across two hosts by socket, HETCCL_PLANE_HOSTS={hosts}:",
              json.dumps(results[0]))


def test_staged_bandwidth_is_reported(tmp_path):
    """Not a speed goal: prints the figure (see the device notes)."""
    results = launch(tmp_path, ["cuda", "cuda"], "bench")
    assert_all_true(results)
    print("staged allreduce, 2 ranks on one GPU:", json.dumps(results[0]))
    assert all(v > 0 for k, v in results[0].items() if k.startswith("busbw"))


@pytest.mark.parametrize("islands", ["0,0,1,1", "0,0,0,1"])
def test_hierarchical_forms_on_device_buffers(tmp_path, islands):
    """Four CUDA ranks on one GPU in two forced islands, each island run by
    hetccl's engine (HETCCL_VENDOR=0: NCCL takes one rank per GPU): AllReduce,
    Broadcast, Reduce, AllGather and ReduceScatter in their hierarchical
    forms (hier/hier_ops.c) with device scratch at the leaders, the root of
    Broadcast and Reduce (rank 3) not its island's leader, AllReduce inside
    a group at the group's end, every result checked against numpy."""
    results = launch(tmp_path, ["cuda"] * 4, "sweep,group,chain", islands=islands,
                     extra={"HETCCL_VENDOR": "0"})
    assert_all_true(results)
    assert {r["backend"] for r in results} == {"hierarchical:engine"}, results


def test_hierarchical_island_of_two_gpus_with_a_host_rank(tmp_path):
    """Two GPUs in one island (NCCL serves it) and a host rank in another
    (hier/hier.h): AllReduce, Broadcast, Reduce, AllGather and
    ReduceScatter run inside the island on NCCL, across the islands on the
    engine, back on NCCL; the other collectives over all three ranks on the
    engine. Every result checked against numpy."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    results = launch(tmp_path, ["cuda", "cuda", "host"], "sweep,group,chain,async",
                     islands="0,0,1", devices=(0, 1, 0))
    assert_all_true(results)
    assert [r["backend"] for r in results] == \
        ["hierarchical:nccl", "hierarchical:nccl", "hierarchical:engine"], results


def test_rails_of_four_gpus(tmp_path):
    """Four GPUs in two islands of two, NCCL serving each (hier/hier.h):
    the islands have rails (GPUs 0 and 2, 1 and 3), and with the thresholds
    at 0 AllReduce, Broadcast, Reduce, AllGather and ReduceScatter take
    their rails' forms (AllReduce: reduce-scatter inside each island on
    NCCL, each half across on its own rail, all-gather on NCCL). Every
    result checked against numpy, in groups too."""
    import torch
    if torch.cuda.device_count() < 4:
        pytest.skip("needs four GPUs")
    results = launch(tmp_path, ["cuda"] * 4, "sweep,group,chain,async",
                     islands="0,0,1,1", devices=(0, 1, 2, 3),
                     extra={"HETCCL_HIER_RAILS_MIN": "0", "HETCCL_HIER_RAILS_MIN_GATHER": "0"})
    assert_all_true(results)
    assert [r["backend"] for r in results] == ["hierarchical:nccl"] * 4, results


@pytest.mark.parametrize("modes", [("cudahost", "cudahost", "host"),
                                   ("cuda", "cudahost", "host")])
def test_hierarchical_island_of_two_gpus_given_host_buffers(tmp_path, modes):
    """The same layout with GPU ranks handed numpy arrays (torch's barrier
    on a CPU tensor does this): NCCL cannot read host memory, so the
    island stages it through device memory (hier/hier_host.c) and the call
    returns with the result in place, as on the engine; also with one GPU
    rank on device buffers beside one on host buffers. Checked against
    numpy, in groups (staged forms finish after all are launched) too."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    results = launch(tmp_path, list(modes), "sweep,group,chain",
                     islands="0,0,1", devices=(0, 1, 0))
    assert_all_true(results)
    assert [r["backend"] for r in results] == \
        ["hierarchical:nccl", "hierarchical:nccl", "hierarchical:engine"], results


@pytest.mark.parametrize("buf", ["device", "host"])
def test_one_thread_drives_two_gpu_ranks_of_an_island(tmp_path, buf):
    """ncclCommInitAll's layout inside a hierarchical communicator: one
    thread initialises and drives ranks 0 and 1 (GPUs 0 and 1, one island
    that NCCL serves), each call of the two in a group, beside a host rank
    in another process. The vendor needs both ranks' calls of a phase in
    one group, so the group's forms run in step (hier/hier_ops.c), two of
    them (AllReduce and AllGather) in one group; on host buffers the staged
    ones finish after all are launched (hier/hier_host.c). Checked against
    numpy on every rank."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    envs = []
    for role in ("pair", "host"):
        env = dict(os.environ, T_LIB=str(LIB), T_ROLE=role, T_BUF=buf,
                   T_ID_FILE=str(tmp_path / "id"), HETCCL_ISLANDS="0,0,1",
                   NCCL_NVLS_ENABLE="0", HETCCL_DEBUG="WARN")
        if role == "host":
            env["HETCCL_DEVICE"] = "host"
        envs.append(env)
    pair, host = run_ranks(Path(__file__).with_name("cuda_pair_rank.py"), envs, 240)
    assert pair["backend"] == ["hierarchical:nccl"] * 2, pair
    assert host["backend"] == ["hierarchical:engine"], host
    for res in (pair, host):
        bad = {k: v for k, v in res.items()
               if v is False or k.endswith(".first_bad") or (k.startswith("async") and v)}
        assert not bad, bad
    assert sum(k.startswith("allreduce/") for k in pair) == 4, pair


def test_hierarchical_bandwidth_is_reported(tmp_path):
    """Not a speed goal: the same three ranks (two GPUs in one island, a
    host rank in another) with HETCCL_HIER=1 and 0, rank 0's busbw and the
    ratio, for the note."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    got = {}
    for hier in ("1", "0", "1", "0"):
        run_dir = tmp_path / f"run{sum(len(v) for v in got.values())}"
        run_dir.mkdir()
        res = launch(run_dir, ["cuda", "cuda", "host"], "bench",
                     islands="0,0,1", devices=(0, 1, 0), extra={"HETCCL_HIER": hier})
        assert_all_true(res)
        got.setdefault(hier, []).append(res[0])
    for key in got["1"][0]:
        if not key.startswith("busbw"):
            continue
        on = max(r[key] for r in got["1"])
        off = max(r[key] for r in got["0"])
        print(f"hierarchical {key}: {on} GB/s with HETCCL_HIER=1, {off} without, "
              f"ratio {on / off:.2f} (best of 2 each)")


def _perf_beside_library() -> Path | None:
    """$HETCCL_PERF, else the hetccl-perf of LIB's build tree."""
    env = os.environ.get("HETCCL_PERF")
    if env:
        return Path(env)
    exe = LIB.parents[1] / "tools" / "perf" / "hetccl-perf"
    return exe if exe.is_file() else None


@pytest.mark.parametrize("coll", ["all_reduce", "sendrecv", "reduce_scatter"])
def test_one_thread_drives_two_ranks_on_the_plane(coll):
    """ncclCommInitAll's layout (nccl-tests -g 2): one thread, two GPU ranks
    (on one GPU here, or two), forced islands. 256 MiB is more than 16
    pieces, so each rank's share is enqueued by a launch thread of its own
    (exec/dataplane.c): before, one thread enqueueing both blocked on a
    full stream queue. Every element is checked by hetccl-perf; the log says
    the plane carried it."""
    import subprocess

    perf = _perf_beside_library()
    if perf is None:
        pytest.skip("no hetccl-perf beside the library (set HETCCL_PERF)")
    env = dict(os.environ, HETCCL_PERF_LIB=str(LIB), HETCCL_ISLANDS="rank",
               NCCL_NVLS_ENABLE="0", HETCCL_DEBUG="INFO", HETCCL_DEBUG_SUBSYS="INIT")
    proc = subprocess.run([str(perf), coll, "--mem_type", "cuda", "-g", "2", "-c", "1", "-n", "2",
                           "-w", "1", "-b", "1M", "-e", "256M", "-f", "256"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.strip() and line.lstrip()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1 << 20, 256 << 20], proc.stdout
    for r in rows:  # #wrong of the out-of-place and in-place runs
        wrong = [r[8], r[12]]
        assert all(w in ("0", "N/A") for w in wrong), f"{coll}: {r}"
    assert "moved by this GPU's copy engines" in proc.stderr + proc.stdout, \
        "the data plane did not carry it:\n" + proc.stderr[-2000:]
