"""Device reductions (libhetccl/runtime/devreduce.h) on a CUDA GPU: builds the
C tests (as test_c_units.py does) and runs tests/c/reduce/test_devreduce,
which compares every dtype x op x {plain, avg, premul, premul with a device
scalar} against the host's reductions bit for bit, with b in mapped host
memory, and prints a table and the fp32 bandwidth.

The program opens the CUDA runtime itself; when the process has none on its
library path, the one from the nvidia-* pip wheels (what PyTorch uses) is
passed as HETCCL_TEST_CUDART, and NVRTC is then found beside it (the wheel's
cuda_nvrtc sibling). Skipped without a GPU, or when the program finds no
CUDA runtime or NVRTC (it exits 77 and says which).
"""
from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path
from typing import Dict, Optional

import pytest

from c_build import configure_and_build
from libpath import REPO_ROOT

pytestmark = pytest.mark.cuda

BUILD = REPO_ROOT / "build-tests"
SKIP = 77


def wheel_cudart() -> Optional[str]:
    """libcudart from an installed nvidia-* wheel (cu13 layout first), or None."""
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for pattern in ("cu13/lib/libcudart.so.*", "cuda_runtime/lib/libcudart.so.*"):
            found = sorted(glob.glob(os.path.join(root, pattern)))
            if found:
                return found[-1]
    return None


@pytest.mark.timeout(1800)
def test_devreduce_gpu() -> None:
    configure_and_build(BUILD, ["--buildtype=debugoptimized"])
    program = BUILD / "tests" / "c" / "reduce" / "test_devreduce"
    assert program.is_file(), f"{program} was not built"
    env: Dict[str, str] = dict(os.environ)
    cudart = env.get("HETCCL_TEST_CUDART") or wheel_cudart()
    if cudart:
        env["HETCCL_TEST_CUDART"] = cudart
    proc = subprocess.run([str(program), "gpu"], capture_output=True, text=True, env=env,
                          timeout=1700, cwd=Path(REPO_ROOT))
    print(proc.stdout[-30000:])
    print(proc.stderr[-10000:])
    if proc.returncode == SKIP:
        pytest.skip(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "skipped")
    assert proc.returncode == 0, "test_devreduce failed:\n" + proc.stderr[-4000:]
