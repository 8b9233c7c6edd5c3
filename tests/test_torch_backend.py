"""The PyTorch backend "hetccl" (python/hetccl/torch_backend.py) on CPU
ranks: one job of three real processes (tests/torch_ranks.py) runs every
collective torch's DDP and FSDP use on a hetccl group and on a gloo group
with the same inputs, then a 100-step DDP training on each. A second job
runs them as on a GPU machine: every rank has loaded a CUDA runtime (the
stand-ins of tests/c/vendor, one device that all processes share) and can
load an NCCL, and no HETCCL_* variable is set; CPU tensors make host
ranks, which the engine serves. Skipped where torch is not installed (CI
installs its CPU build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from libpath import REPO_ROOT
from rank_procs import run_ranks
from test_hip import FAKES, _build, _cc

NRANKS = 3  # odd, and within what two cores run in a few seconds
RANK_SCRIPT = Path(__file__).resolve().parent / "torch_ranks.py"


def _torch_or_skip() -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def _cpu_job(library: Path, workdir: Path, extra: Dict[str, str], parts: str,
             steps: int) -> List[dict]:
    """Every rank's RESULT of a job of CPU tensors (tests/torch_ranks.py)."""
    envs = []
    for rank in range(NRANKS):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HETCCL_")}
        env.update(T_RANK=str(rank), T_NRANKS=str(NRANKS), T_STORE=str(workdir / "store"),
                   T_DEVICES=",".join(["cpu"] * NRANKS), T_PARTS=parts, T_STEPS=str(steps),
                   OMP_NUM_THREADS="1", HETCCL_LIBRARY=str(library), **extra)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT / "python"), str(RANK_SCRIPT.parent),
                          os.environ.get("PYTHONPATH")]))
        envs.append(env)
    return run_ranks(RANK_SCRIPT, envs, timeout=240)


@pytest.fixture(scope="module")
def job(hetccl_library: Path, tmp_path_factory: pytest.TempPathFactory) -> List[dict]:
    """Every rank's RESULT of one CPU job: the checks and the DDP losses."""
    _torch_or_skip()
    return _cpu_job(hetccl_library, tmp_path_factory.mktemp("torch"), {}, "collectives,ddp", 100)


@pytest.fixture(scope="module")
def gpu_host_job(hetccl_library: Path, tmp_path_factory: pytest.TempPathFactory) -> List[dict]:
    """The same CPU job as on a GPU machine: each rank has loaded a CUDA
    runtime whose one device every process shares, and finds an NCCL
    (stand-ins), but never makes a CUDA context, as a CUDA build of torch
    on CPU tensors does not; no HETCCL_* variable. Ranks that became CUDA
    ranks of one island would be forwarded to that NCCL, which moves no
    data."""
    _torch_or_skip()
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler for the stand-in CUDA runtime")
    d = tmp_path_factory.mktemp("gpuhost")
    cudart = _build(cc, d / "cuda" / "libcudart.so.13", FAKES / "fakes" / "fake_cuda.c",
                    "libcudart.so.13", "-DFAKE_CUDART")
    driver = _build(cc, d / "cuda" / "libcuda.so.1", FAKES / "fakes" / "fake_cuda.c",
                    "libcuda.so.1", "-DFAKE_DRIVER")
    nccl = _build(cc, d / "nccl" / "libnccl.so.2", FAKES / "fake_nccl.c", "libnccl.so.2",
                  "-Wno-unused-parameter")
    extra = {"T_PRELOAD": f"{driver}:{cudart}:{nccl}", "FAKE_CUDA_NO_CONTEXT": "1"}
    return _cpu_job(hetccl_library, d, extra, "collectives,ddp", 20)


@pytest.mark.timeout(300)
def test_collectives_match_gloo(job: List[dict]) -> None:
    failed: Dict[str, str] = {}
    for res in job:
        assert res["comm_backend"] == "engine", res["comm_backend"]
        for name, c in res["checks"].items():
            if not c["ok"]:
                failed[f"rank {res['rank']} {name}"] = f"[{c['ref']}] {c['detail']}"
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())


@pytest.mark.timeout(300)
def test_cpu_tensors_on_a_gpu_host_make_host_ranks(gpu_host_job: List[dict]) -> None:
    """No knob, a CUDA runtime and an NCCL in every process, one GPU for
    all: every check right, host ranks on the engine that never initialise
    CUDA nor register memory with it (no data plane), and DDP's loss as
    gloo's."""
    failed = {f"rank {res['rank']} {name}": c["detail"] for res in gpu_host_job
              for name, c in res["checks"].items() if not c["ok"]}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())
    for res in gpu_host_job:
        assert (res["comm_backend"], res["comm_device"]) == ("engine", -1), res["comm_backend"]
        counts = res["stand_in_counts"]
        assert set(counts) == {"fake_inits", "fake_device_counts", "fake_registered"}, counts
        assert not any(counts.values()), counts
        ddp = res["ddp"]
        rel = max(abs(a - b) / abs(b) for a, b in zip(ddp["hetccl"], ddp["gloo"]))
        assert ddp["steps"] == 20 and rel <= 1e-6, (rel, ddp)


@pytest.mark.timeout(300)
def test_every_listed_collective_is_checked(job: List[dict]) -> None:
    """The job covers every collective and operator of the backend's
    contract, and most checks had gloo itself as the reference."""
    names = set(job[0]["checks"])
    wanted = ["all_reduce/sum/", "all_reduce/product/", "all_reduce/min/", "all_reduce/max/",
              "all_reduce/avg/", "all_reduce/premul_sum/", "all_reduce/async_work",
              "all_reduce/async_goes_on",
              "broadcast/", "all_gather/float32", "all_gather/uneven",
              "all_gather_into_tensor/", "all_gather_into_tensor/async_input_dropped",
              "reduce_scatter/sum/", "reduce_scatter/uneven",
              "reduce_scatter_tensor/", "all_to_all/uneven", "all_to_all_single/even",
              "all_to_all_single/uneven", "send_recv/ring", "send_recv/isend_irecv",
              "send_recv/isend_goes_on", "barrier"]
    missing = [w for w in wanted if not any(n.startswith(w) for n in names)]
    assert not missing, missing
    for dtype in ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32",
                  "int64", "bool"):
        assert f"all_reduce/sum/{dtype}" in names, dtype
    by_gloo = [n for n, c in job[0]["checks"].items() if c["ref"].startswith("gloo")]
    assert len(by_gloo) >= 0.6 * len(names), (len(by_gloo), len(names))


@pytest.mark.timeout(300)
def test_ddp_loss_matches_gloo(job: List[dict]) -> None:
    for res in job:
        ddp = res["ddp"]
        mine, ref = ddp["hetccl"], ddp["gloo"]
        assert ddp["steps"] == len(mine) == len(ref) == 100
        assert ddp["finite"]
        assert abs(mine[0] - mine[-1]) > 1e-3, "the loss did not move: nothing was trained"
        rel = max(abs(a - b) / abs(b) for a, b in zip(mine, ref))
        assert rel <= 1e-6, f"rank {res['rank']}: loss differs from gloo's by {rel:.3g} relative"


def test_importing_hetccl_does_not_import_torch(hetccl_library: Path) -> None:
    code = "import sys, hetccl; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_dtype_map_and_registration(hetccl_library: Path) -> None:
    _torch_or_skip()
    import torch
    import torch.distributed as dist

    from hetccl import nccl, torch_backend

    assert torch_backend.nccl_dtype(torch.bfloat16) == nccl.NCCL_BFLOAT16
    assert torch_backend.nccl_dtype(torch.bool) == nccl.NCCL_UINT8
    assert torch_backend.nccl_dtype(torch.int64) == nccl.NCCL_INT64
    with pytest.raises(TypeError, match="int16"):
        torch_backend.nccl_dtype(torch.int16)
    torch_backend.register()  # again: no second registration, no error
    assert dist.Backend.backend_list.count("hetccl") == 1
    assert dist.Backend("hetccl") == "hetccl"
    assert set(dist.Backend.backend_capability["hetccl"]) == {"cpu", "cuda"}
    # The base class is what the installed torch lets Python subclass.
    base = (torch._C._distributed_c10d.Backend if torch_backend.SUBCLASSES_BACKEND
            else dist.ProcessGroup)
    assert torch_backend.HetcclBackend.__mro__[1] is base
    assert torch_backend._premul_factor(dist._make_nccl_premul_sum(2.5)) == 2.5


def test_entry_point_names_the_registrar() -> None:
    """torch (2.14; not 2.11) looks backends up in this entry point group
    and calls the object it names."""
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."torch.distributed.backends"]' in text
    assert 'hetccl = "hetccl.torch_backend:register"' in text


def test_bench_torch_times_the_library_alone(hetccl_library: Path, tmp_path: Path) -> None:
    """tools/bench_torch.py --direct: beside gloo's and the backend's time,
    each point has the same collective's time through the library alone
    on the backend's communicator, and the table prints that column. A
    variant's HETCCL_LIBRARY is the library its ranks run, whatever the
    caller's environment names; --rank-logs keeps each rank's stderr."""
    _torch_or_skip()
    out = tmp_path / "bench.json"
    copy = tmp_path / "copy" / "libhetccl.so"
    copy.parent.mkdir()
    shutil.copyfile(hetccl_library, copy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETCCL_")}
    env["HETCCL_LIBRARY"] = str(hetccl_library)
    p = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "bench_torch.py"), "-n", "2",
                        "--reps", "1", "--sizes", "1K", "--colls", "all_reduce,send_recv",
                        "--ddp-steps", "0", "--budget", "0.005", "--direct", "--json", str(out),
                        "--variant", f"copy:HETCCL_LIBRARY={copy},HETCCL_DEBUG=INFO",
                        "--rank-logs", str(tmp_path / "logs")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| library |" in p.stdout
    rows = {r["op"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"all_reduce", "send_recv"}
    for r in rows.values():
        assert 0 < r["library"] < 1.0 and 0 < r["hetccl"] < 1.0, r
    runs = json.loads(out.read_text())["runs"]
    assert runs["gloo"][0]["direct"] == {}  # gloo's ranks have no library to call
    assert Path(runs["hetccl"][0]["library"]).resolve() == hetccl_library.resolve()
    assert Path(runs["hetccl:copy"][0]["library"]).resolve() == copy.resolve()
    # --rank-logs: each rank's stderr, with the library's INFO lines where a
    # variant asked for them (the variant's own HETCCL_DEBUG) and none where not
    for rank in (0, 1):
        assert "hetccl INFO" in (tmp_path / "logs" / "hetccl-copy" / f"rank{rank}.err").read_text()
        assert "hetccl INFO" not in (tmp_path / "logs" / "hetccl" / f"rank{rank}.err").read_text()
