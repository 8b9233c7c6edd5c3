"""The AMD side (runtime/hip.c, RCCL through vendor_ccl/loader.c, the island
rules of comm/islands.c) on a machine with no AMD GPU.

Three kinds of check:
- HETCCL_DEVICE=hip with whatever HIP this machine has: ncclCommInitRank
  fails cleanly, its message naming the missing library or, where
  libamdhip64 is installed (Debian's libamdhip64-5), the HIP call that found
  no device; a host process never loads libamdhip64.
- The real libamdhip64, where installed: `hetccl info` shows it loaded (every
  symbol hip.c takes resolved) and no device. Skipped where absent.
- Islands with stand-ins compiled here from tests/c/vendor (a libamdhip64
  with two "devices", an NCCL-API library under RCCL's and NCCL's names, a
  libcudart + libcuda): two HIP ranks with one RCCL forward to it; HIP with a
  host rank, and HIP with a CUDA rank, run on the engine; a HIP rank that
  cannot load RCCL fails init naming RCCL and HETCCL_RCCL_LIBRARY; a HIP
  rank's device buffers are staged through the HIP table. Skipped without a
  C compiler.

Each rank is its own process (tests/hip_rank.py); loading happens once per
process.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from libpath import REPO_ROOT
from rank_procs import can_unshare_ipc, run_ranks

pytestmark = pytest.mark.usefixtures("hetccl_library")

TIMEOUT = 120
RANK_PY = Path(__file__).with_name("hip_rank.py")
FAKES = REPO_ROOT / "tests" / "c" / "vendor"
HIP_NAMES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")


def real_hip() -> Optional[str]:
    """A libamdhip64 the loader finds by name, or None. Asked in a child
    process, so that this one never maps it."""
    code = ("import ctypes, sys\n"
            f"for n in {HIP_NAMES!r}:\n"
            "    try:\n"
            "        ctypes.CDLL(n); print(n); sys.exit(0)\n"
            "    except OSError:\n"
            "        pass\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    return out or None


def start_ranks(tmp_path: Path, envs: List[Dict[str, str]],
                own_host: tuple = (), share_gpu: bool = False,
                script: Path = RANK_PY) -> List[dict]:
    """One process per entry of envs (added to this environment); each
    returns the dict its rank script (`script`, hip_rank.py unless given)
    prints. Ranks in own_host run as hosts of their own (`unshare --ipc`:
    hetccl's host identity differs). Ranks
    that load the same stand-in runtimes select a device each, in rank
    order (T_GPU), as a job of one GPU per rank does; `share_gpu`: they
    all stay on the stand-in's default device."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    seen: Dict[str, int] = {}
    gpus = []
    for extra in envs:
        preload = extra.get("T_PRELOAD", "")
        gpus.append({} if share_gpu or not preload else {"T_GPU": str(seen.get(preload, 0))})
        seen[preload] = seen.get(preload, 0) + 1
    full = [{**os.environ, "T_RANK": str(rank), "T_NRANKS": str(len(envs)),
             "T_ID_FILE": str(tmp_path / "id"), "HETCCL_CONNECT_TIMEOUT": "30", **gpu, **extra}
            for rank, (gpu, extra) in enumerate(zip(gpus, envs))]
    prefixes = [["unshare", "--ipc"] if r in own_host else [] for r in range(len(envs))]
    return run_ranks(script, full, TIMEOUT, prefixes=prefixes)


# --- whatever HIP this machine has ---------------------------------------------


@pytest.mark.timeout(TIMEOUT)
def test_hip_rank_without_amd_gpu_fails_init_cleanly(tmp_path: Path) -> None:
    [res] = start_ranks(tmp_path, [{"HETCCL_DEVICE": "hip"}])
    assert res.get("error") == "ncclUnhandledCudaError", res
    msg = res["message"]
    assert "cannot read the current hip device" in msg, msg
    if real_hip():
        assert "hipGetDevice failed" in msg, msg
        assert res["hip_mapped"], res
    else:
        assert "could not be loaded" in msg and "libamdhip64.so" in msg, msg
        assert not res["hip_mapped"], res


@pytest.mark.timeout(TIMEOUT)
def test_host_and_cuda_ranks_never_load_hip(tmp_path: Path) -> None:
    """The auto rule looks at what is loaded; it never loads libamdhip64
    (installed or not), and HETCCL_DEVICE=host never does either."""
    for env in ({}, {"HETCCL_DEVICE": "host"}):
        [res] = start_ranks(tmp_path / str(len(env)), [env])
        assert res.get("backend") == "engine" and res.get("sum") == 1.0, res
        assert not res["hip_mapped"], res


@pytest.mark.timeout(TIMEOUT)
def test_real_libamdhip64_loads_and_sees_no_device() -> None:
    name = real_hip()
    if name is None:
        pytest.skip("no libamdhip64 on this machine (Debian: apt-get install libamdhip64-5)")
    proc = subprocess.run([sys.executable, "-m", "hetccl", "info"], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("  hip ")]
    # A path means hip.c took every symbol it needs and read the version.
    assert "libamdhip64" in line and "(HIP " in line, line
    if not Path("/dev/kfd").exists():
        assert " unavailable " in line and ": 0 devices" in line, line


# --- islands, with stand-ins -------------------------------------------------------


def _cc() -> Optional[str]:
    return shutil.which(os.environ.get("CC", "cc"))


def _build(cc: str, out: Path, src: Path, soname: str, *args: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), f"-Wl,-soname,{soname}",
                    "-I", str(REPO_ROOT / "include"), *args, str(src)], check=True,
                   capture_output=True, timeout=120)
    return out


HIP_VERSIONS = {6: 60242134, 5: 50200000}  # HIP_VERSION of the stand-in per ROCm major


def build_hip(cc: str, d: Path, major: int) -> Path:
    """The stand-in libamdhip64.so.MAJOR, numbering things as that ROCm does."""
    return _build(cc, d / f"hip{major}" / f"libamdhip64.so.{major}", FAKES / "fakes" / "fake_hip.c",
                  f"libamdhip64.so.{major}", f"-DFAKE_HIP_VERSION={HIP_VERSIONS[major]}")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler for the stand-in libraries")
    d = tmp_path_factory.mktemp("fakes")
    return {
        "hip": build_hip(cc, d, 6),
        "rccl": _build(cc, d / "rccl" / "librccl.so.1", FAKES / "fake_nccl.c", "librccl.so.1",
                       "-Wno-unused-parameter"),
        "rccl_old": _build(cc, d / "rccl_old" / "librccl.so.1", FAKES / "fake_nccl.c",
                           "librccl.so.1", "-Wno-unused-parameter", "-DFAKE_NO_CONFIG"),
        "nccl": _build(cc, d / "nccl" / "libnccl.so.2", FAKES / "fake_nccl.c", "libnccl.so.2",
                       "-Wno-unused-parameter"),
        "cudart": _build(cc, d / "cuda" / "libcudart.so.13", FAKES / "fakes" / "fake_cuda.c",
                         "libcudart.so.13", "-DFAKE_CUDART"),
        "cuda": _build(cc, d / "cuda" / "libcuda.so.1", FAKES / "fakes" / "fake_cuda.c",
                       "libcuda.so.1", "-DFAKE_DRIVER"),
    }


def hip_env(fakes: Dict[str, Path], rccl: Optional[str] = None) -> Dict[str, str]:
    """A rank whose program uses HIP (libamdhip64 loaded before the first
    call, as PyTorch's ROCm build does) and finds RCCL through the knob."""
    return {"T_PRELOAD": str(fakes["hip"]),
            "HETCCL_RCCL_LIBRARY": rccl if rccl is not None else str(fakes["rccl"])}


@pytest.mark.timeout(TIMEOUT)
def test_hip_ranks_with_one_rccl_forward_to_it(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    log = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "COLL",
           "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    results = start_ranks(tmp_path, [dict(hip_env(fakes), **log)] * 2)
    for res in results:
        assert res.get("backend") == "vendor:rccl", res
        assert res["kind"] == "hip" and res["hip_mapped"] and not res["cudart_mapped"], res
    # exec/form.h says where the calls went, once per operation
    said = "".join(p.read_text(errors="replace") for p in tmp_path.glob("log.*"))
    assert re.search(r"ncclAllReduce on comm \w+ \(2 ranks\) goes to the vendor library, rccl",
                     said), said[-2000:]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["hip", "cuda"])
def test_ranks_sharing_a_gpu_are_never_one_vendor_island(tmp_path: Path, fakes: Dict[str, Path],
                                                         kind: str) -> None:
    """Two processes on one GPU, each able to load the vendor library, and
    no knob set: NCCL and RCCL refuse two ranks on one device, so they run
    on hetccl's engine (one INFO line says why) and reduce right. A third
    rank on the other GPU of the same kind is an island with neither."""
    if kind == "hip":
        env = hip_env(fakes)
    else:
        env = {"T_PRELOAD": f"{fakes['cuda']}:{fakes['cudart']}",
               "HETCCL_NCCL_LIBRARY": str(fakes["nccl"])}
    log = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT",
           "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    results = start_ranks(tmp_path, [{**env, **log}] * 2, share_gpu=True)
    for res in results:
        assert res.get("backend") == "engine" and res.get("sum") == 3.0, res
        assert res["kind"] == kind, res
    lines = [ln for f in tmp_path.glob("log.*") for ln in f.read_text().splitlines()
             if "share a GPU with another rank" in ln]
    assert len(lines) == 1 and "2 of its 2 ranks" in lines[0], lines
    # Three ranks, 0 and 2 on one device, 1 on the other: nobody shares
    # an island, and every sum is right.
    three = [{**env, "T_GPU": "1"}, {**env, "T_GPU": "0"}, {**env, "T_GPU": "1"}]
    results = start_ranks(tmp_path / "three", three)
    assert [r.get("sum") for r in results] == [6.0, 6.0, 6.0], results
    assert {r.get("backend") for r in results} == {"engine"}, results


@pytest.mark.timeout(TIMEOUT)
def test_config_collectives_reach_the_vendor(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """ncclAllReduceConfig on a forwarded communicator goes to the vendor's
    ncclAllReduceConfig with the caller's config; a vendor without the
    *Config collectives gets the plain call."""
    for res in start_ranks(tmp_path / "new", [{**hip_env(fakes), "T_CONFIG": "1"}] * 2):
        assert res["config_result"] == 0, res
        assert (res["config_calls"], res["plain_calls"]) == (1, 0), res
        assert res["config_magic"] == 0xcafebeef, res
    old = hip_env(fakes, str(fakes["rccl_old"]))
    for res in start_ranks(tmp_path / "old", [{**old, "T_CONFIG": "1"}] * 2):
        assert res["config_result"] == 0, res
        assert (res["config_calls"], res["plain_calls"]) == (0, 1), res


@pytest.mark.timeout(TIMEOUT)
def test_rccl_linked_by_the_program_is_found(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """No knob: the librccl.so.1 the program loaded is RCCL, and linking it
    makes the process a HIP rank."""
    env = {"T_PRELOAD": f"{fakes['hip']}:{fakes['rccl']}", "HETCCL_RCCL_LIBRARY": ""}
    for res in start_ranks(tmp_path, [env] * 2):
        assert res.get("backend") == "vendor:rccl", res


@pytest.mark.timeout(TIMEOUT)
def test_hip_and_host_ranks_run_on_the_engine(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    results = start_ranks(tmp_path, [hip_env(fakes), {"HETCCL_DEVICE": "host"}])
    for res in results:
        assert res.get("backend") == "engine" and res.get("sum") == 3.0, res
    assert results[0]["kind"] == "hip" and results[1]["kind"] == "host"
    assert not results[1]["hip_mapped"]


@pytest.mark.timeout(TIMEOUT)
def test_hip_and_cuda_ranks_run_on_the_engine(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    cuda = {"T_PRELOAD": f"{fakes['cuda']}:{fakes['cudart']}",
            "HETCCL_NCCL_LIBRARY": str(fakes["nccl"])}
    flat = {"HETCCL_HIER": "0"}
    results = start_ranks(tmp_path, [{**hip_env(fakes), **flat}, {**cuda, **flat},
                                     {**hip_env(fakes), **flat}])
    for res in results:
        assert res.get("backend") == "engine" and res.get("sum") == 6.0, res
    assert [r["kind"] for r in results] == ["hip", "cuda", "hip"]
    assert not results[1]["hip_mapped"], "the CUDA rank loaded libamdhip64"


@pytest.mark.timeout(TIMEOUT)
def test_hip_island_goes_to_rccl_in_a_hierarchy(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """Two HIP ranks and a CUDA rank (hier/hier.h): the HIP island's phases
    go to RCCL, the CUDA rank is alone in its island. The stand-in RCCL
    moves no data, so the in-place AllReduce of 1, 2, 3 leaves 1 + 2 on the
    two leaders (ranks 0 and 1, the engine's phase) and 3 on rank 2. The
    HIP ranks' buffers are host memory, which RCCL cannot reach: they are
    staged through the stand-in HIP runtime's device memory, in place
    (hier/hier_host.c), and the call returns with the result in them."""
    cuda = {"T_PRELOAD": f"{fakes['cuda']}:{fakes['cudart']}",
            "HETCCL_NCCL_LIBRARY": str(fakes["nccl"])}
    results = start_ranks(tmp_path, [hip_env(fakes), cuda, hip_env(fakes)])
    assert [r.get("backend") for r in results] == \
        ["hierarchical:rccl", "hierarchical:engine", "hierarchical:rccl"], results
    assert [r.get("sum") for r in results] == [3.0, 3.0, 3.0], results


@pytest.mark.timeout(TIMEOUT)
def test_a_failed_staging_keeps_its_root_cause(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """The same layout with a host buffer larger than the stand-in's 16 MiB
    of device memory: staging it for RCCL fails in the HIP runtime, which
    logs the cause (hipMalloc failed) where it is born; the hierarchy adds
    where (hier/hier_host.c) in front of it, without a second WARN, so
    ncclGetLastError, the thread's and the communicator's, still names the
    root cause, and the log has one WARN for it."""
    cuda = {"T_PRELOAD": f"{fakes['cuda']}:{fakes['cudart']}",
            "HETCCL_NCCL_LIBRARY": str(fakes["nccl"])}
    big = {"T_HOST_BYTES": str(20 << 20), "HETCCL_TIMEOUT": "30", "HETCCL_DEBUG": "WARN",
           "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    r0, _r1, r2 = start_ranks(tmp_path, [{**hip_env(fakes), **big}, {**cuda, **big},
                                         {**hip_env(fakes), **big}])
    for res in (r0, r2):
        assert res.get("call_error") == "ncclUnhandledCudaError", res
        for msg in (res["call_message"], res["comm_last_error"]):
            assert "to stage host buffers for its island's" in msg, msg
            assert "hipMalloc failed" in msg, msg
    warns = [ln for f in tmp_path.glob("log.*") for ln in f.read_text().splitlines()
             if " WARN " in ln and ("hipMalloc" in ln or "stage host buffers" in ln)]
    assert len(warns) == 2 and all("hipMalloc failed" in w for w in warns), warns


@pytest.mark.timeout(TIMEOUT)
def test_sends_inside_a_hip_island_go_to_rccl(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """The same layout, a ring of send/recv in one group (hier/hier_ops.c):
    ranks 2 and 0 share the HIP island, so 2's send to 0 and 0's receive
    from 2 go to RCCL, addressed by their ranks in the island (0 and 1),
    on host buffers staged through the HIP runtime; 0 -> 1 and 1 -> 2 cross
    islands on the engine and arrive. The stand-in RCCL moves no data, so
    rank 0 does not get rank 2's 30 (the engine would have delivered it)."""
    cuda = {"T_PRELOAD": f"{fakes['cuda']}:{fakes['cudart']}",
            "HETCCL_NCCL_LIBRARY": str(fakes["nccl"]), "T_P2P": "1"}
    hip = {**hip_env(fakes), "T_P2P": "1"}
    r0, r1, r2 = start_ranks(tmp_path, [hip, cuda, hip])
    assert r1["p2p_recv"] == 10.0 and r2["p2p_recv"] == 20.0, (r1, r2)
    assert r0["p2p_recv"] != 30.0, r0
    assert (r0["vendor_sends"], r0["vendor_recvs"], r0["vendor_recv_peer"]) == (0, 1, 1), r0
    assert (r2["vendor_sends"], r2["vendor_recvs"], r2["vendor_send_peer"]) == (1, 0, 0), r2


@pytest.mark.timeout(TIMEOUT)
def test_hip_rank_without_rccl_fails_init(tmp_path: Path, fakes: Dict[str, Path]) -> None:
    missing = str(tmp_path / "nowhere" / "librccl.so.1")
    results = start_ranks(tmp_path, [hip_env(fakes, missing), hip_env(fakes)])
    for res in results:
        assert res.get("error") == "ncclSystemError", res
    msg = results[0]["message"]
    assert "is a hip rank but could not load RCCL" in msg and "HETCCL_RCCL_LIBRARY" in msg, msg
    assert missing in msg, msg


@pytest.mark.timeout(TIMEOUT)
def test_hip_device_buffers_are_staged_through_the_hip_runtime(tmp_path: Path,
                                                              fakes: Dict[str, Path]) -> None:
    """exec/devpath.c, unchanged, over the hip table: copies in and out and
    the ready/done counters go through the stand-in's HIP calls."""
    results = start_ranks(tmp_path, [{**hip_env(fakes), "T_DEVBUF": "1"},
                                   {"HETCCL_DEVICE": "host"}])
    assert results[0].get("backend") == "engine" and results[0].get("sum") == 3.0, results[0]
    assert results[1].get("sum") == 3.0, results[1]
    res = results[0]
    assert res["copies"] >= 2 and res["writes"] >= 1 and res["waits"] >= 1, res


@pytest.mark.timeout(TIMEOUT)
def test_device_memory_of_a_runtime_loaded_after_init_is_refused(
        tmp_path: Path, fakes: Dict[str, Path]) -> None:
    """Two host ranks: each process loads the stand-in libamdhip64 only after
    its communicator was made (as a CuPy program may, at its first device
    call), then passes its 'device' memory. The CPU would read it (a real
    device buffer would fault): the call is refused, naming the way out,
    and the communicator still reduces host buffers."""
    late = {"T_LATE_HIP": str(fakes["hip"])}
    for res in start_ranks(tmp_path, [late, late]):
        assert res.get("kind") == "host" and res.get("late_error") == "ncclInvalidArgument", res
        msg = res["late_message"]
        assert "is hip device memory" in msg and "is a host rank" in msg, msg
        assert "HETCCL_DEVICE=hip" in msg, msg
        assert res.get("sum") == 3.0, res


@pytest.mark.timeout(TIMEOUT)
def test_hip_ranks_with_forced_islands_run_on_the_engine(tmp_path: Path,
                                                         fakes: Dict[str, Path]) -> None:
    env = {**hip_env(fakes), "HETCCL_ISLANDS": "rank"}
    for res in start_ranks(tmp_path, [env] * 2):
        assert res.get("backend") == "engine" and res.get("sum") == 3.0, res


@pytest.mark.timeout(TIMEOUT)
def test_hip_rank_that_left_after_its_part_is_no_failure(tmp_path: Path,
                                                         fakes: Dict[str, Path]) -> None:
    """The data plane's watch of a GPU rank's streams (plane.c) fails the
    communicator when a peer it still waits on has exited, and only then:
    rank 0 leaves after its send; rank 1's stream then waits on late rank 2
    for free slots (1 MiB through four slots of 16 KiB: the stand-in's
    device memory is too small for the default slots to fill). Three ranks
    on one device, no other knob: the data plane carries their messages."""
    env = {**hip_env(fakes), "T_LEFT": "1", "HETCCL_PLANE_PIECE": "16384",
           "HETCCL_PLANE_SLOTS": "4"}
    r0, r1, r2 = start_ranks(tmp_path, [env] * 3, share_gpu=True)
    assert r0.get("left") and r0["kind"] == "hip", r0
    assert r1.get("backend") == "engine", r1  # not forwarded: the ranks share a device
    assert r1.get("got") == [1.0], r1
    assert r2.get("got") == [1.0], r2


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("streams,hosts,wide", [("1", 1, 0), ("2", 1, 0), ("1", 2, 0),
                                                ("1", 1, 1), ("2", 1, 1)])
def test_hip_device_buffers_on_the_data_plane(tmp_path: Path, fakes: Dict[str, Path],
                                              streams: str, hosts: int, wide: int) -> None:
    """The data plane's stream executor (plane/exec_stream.c) over the hip
    table, the stand-in running each stream operation as it is enqueued:
    two HIP ranks in two islands move sendrecv, broadcast and allgather of
    256 KiB of stand-in device memory in 16 KiB pieces through 4 slots, so
    that every channel wraps its slots many times and a phase takes a lane
    per peer and direction, its pieces spread over `streams` streams; each
    result is checked. (The allreduce goes to the engine: the stand-in has
    no runtime compiler.) With two hosts (rank 1 in an IPC namespace of its
    own, HETCCL_PLANE_HOSTS=all) each channel is a segment on each side and
    the pieces cross by socket (plane/bridge.c). `wide`: 272 KiB messages
    move in wide pieces of two slots (32 KiB) and a narrow one, so that the
    next starts at an odd slot and wide pieces run on past the last."""
    if hosts == 2 and not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    env = {**hip_env(fakes), "HETCCL_ISLANDS": "rank", "HETCCL_VENDOR": "0", "T_IBDEV": "1",
           "T_BYTES": str((256 + 16 * wide) << 10), "HETCCL_PLANE_PIECE": "16384",
           "HETCCL_PLANE_SLOTS": "4",
           "HETCCL_PLANE_LANE_STREAMS": streams, "HETCCL_DEBUG": "INFO",
           "HETCCL_DEBUG_SUBSYS": "INIT", "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p"),
           "HETCCL_PLANE_WIDE_MIN": "32K" if wide else "0"}
    results = start_ranks(tmp_path, [env, env], own_host=(1,) if hosts == 2 else ())
    for rank, res in enumerate(results):
        assert "error" not in res and res["kind"] == "hip", res
        assert res["wrong"] == [], f"rank {rank}: wrong data in {res['wrong']}"
    logs = [f.read_text() for f in tmp_path.glob("log.*")]
    assert len(logs) == 2 and all("moved by this GPU's copy engines" in t for t in logs), logs
    assert all(f"data plane streams: {streams} per peer and direction" in t for t in logs), logs
    assert all(("two a piece from 32768 bytes" in t) == bool(wide) for t in logs), logs
    if hosts == 2:
        assert all("(1 of other hosts, bridged" in t for t in logs), logs
    else:
        assert not any("of other hosts" in t for t in logs), logs


@pytest.mark.timeout(TIMEOUT)
def test_hip_ranks_of_two_hosts_staged_with_plane_hosts_one(tmp_path: Path,
                                                           fakes: Dict[str, Path]) -> None:
    """HETCCL_PLANE_HOSTS=one keeps the data plane to one host: two HIP
    ranks of two hosts (rank 1 in an IPC namespace of its own) get none,
    and their device buffers are staged for the socket transport, right
    all the same."""
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    env = {**hip_env(fakes), "HETCCL_ISLANDS": "rank", "HETCCL_VENDOR": "0", "T_IBDEV": "1",
           "T_BYTES": str(256 << 10), "HETCCL_PLANE_HOSTS": "one", "HETCCL_DEBUG": "INFO",
           "HETCCL_DEBUG_SUBSYS": "INIT", "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    results = start_ranks(tmp_path, [env, env], own_host=(1,))
    for rank, res in enumerate(results):
        assert "error" not in res and res["kind"] == "hip", res
        assert res["wrong"] == [], f"rank {rank}: wrong data in {res['wrong']}"
    logs = [f.read_text() for f in tmp_path.glob("log.*")]
    assert len(logs) == 2 and not any("moved by this GPU's copy engines" in t for t in logs), logs
