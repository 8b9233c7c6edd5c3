"""Shared pytest set-up: where libhetccl.so and the hetccl package are, and
the `cuda` and `rdma` markers.

The library is $HETCCL_LIBRARY, else the installed package's own
hetccl/libhetccl.so, else the newest build*/libhetccl/libhetccl.so (see
libpath.py). Unless it is the installed package's, the package is taken from
the source tree (python/), so that tests run the code beside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from libpath import REPO_ROOT, _from_package, find_library

PYTHON_DIR = REPO_ROOT / "python"

_LIBRARY = find_library()
if _LIBRARY is None or _LIBRARY != _from_package():
    sys.path.insert(0, str(PYTHON_DIR))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PYTHON_DIR), os.environ.get("PYTHONPATH")]))

# Ranks of hetccl.launch (and of failing_ranks) fork from a server that has
# imported numpy, hetccl and the first launched test module, rather than
# each starting Python and importing them: 5-10 s a rank in CI's emulated
# VMs (HETCCL_LAUNCH_START=spawn runs the suite the other way). The server
# finds the test modules through PYTHONPATH, as the ranks do.
os.environ.setdefault("HETCCL_LAUNCH_START", "forkserver")
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.environ.get("PYTHONPATH"), str(Path(__file__).resolve().parent)]))


def _have_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def torch_cuda_ok() -> bool:
    """torch imports and sees a CUDA device (what the cuda tests drive)."""
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def active_verbs_device() -> Optional[str]:
    """Name of an RDMA device with an active port (the kernel's view in
    sysfs, no verbs library needed), or None."""
    for dev in sorted(Path("/sys/class/infiniband").glob("*")):
        for state in sorted(dev.glob("ports/*/state")):
            try:
                if "ACTIVE" in state.read_text():
                    return dev.name
            except OSError:
                continue
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line(
        "markers", "rdma: needs an active RDMA verbs device (skipped without one; "
        "tools/rdma/run_vm.sh runs them in a Soft-RoCE VM)")
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's per-test limit")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if any("cuda" in item.keywords for item in items) and not _have_gpu():
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
    if any("rdma" in item.keywords for item in items) and active_verbs_device() is None:
        skip = pytest.mark.skip(reason="no active RDMA verbs device (/sys/class/infiniband); "
                                "tools/rdma/run_vm.sh runs them in a Soft-RoCE VM")
        for item in items:
            if "rdma" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def hetccl_library() -> Iterator[Path]:
    """Path of libhetccl.so, exported as HETCCL_LIBRARY for this process and
    every rank it launches; skips the test when the library is not built."""
    if _LIBRARY is None:
        pytest.skip("libhetccl.so not built (set HETCCL_LIBRARY or build into build*/)")
    old = os.environ.get("HETCCL_LIBRARY")
    os.environ["HETCCL_LIBRARY"] = str(_LIBRARY)
    yield _LIBRARY
    if old is None:
        os.environ.pop("HETCCL_LIBRARY", None)
    else:
        os.environ["HETCCL_LIBRARY"] = old
