"""include/nccl.h compiles in C11 and C++17 with warnings as errors, and
matches NCCL 2.32.3's values and layouts (tests/c/abi asserts them).

Compiled to an object and run, so no meson build is needed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from libpath import REPO_ROOT

ABI_DIR = REPO_ROOT / "tests" / "c" / "abi"
INCLUDE = REPO_ROOT / "include"
FLAGS = ["-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{INCLUDE}"]

CASES = [
    pytest.param("cc", "-std=c11", "header_c.c", id="c11"),
    pytest.param("c++", "-std=c++17", "header_cpp.cpp", id="cxx17"),
]


@pytest.mark.parametrize("compiler, std, source", CASES)
def test_header_compiles_and_matches(compiler: str, std: str, source: str,
                                     tmp_path: Path) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler} compiler")
    exe = tmp_path / Path(source).stem
    build = subprocess.run([compiler, std, *FLAGS, str(ABI_DIR / source), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, f"{run.returncode} initializer fields differ from NCCL's"


@pytest.mark.parametrize("compiler, std, ext", [("cc", "-std=c11", "c"),
                                                ("c++", "-std=c++17", "cpp")])
def test_cuda_runtime_may_come_after(compiler: str, std: str, ext: str,
                                     tmp_path: Path) -> None:
    """A later cuda_runtime.h repeats our stream typedef; that must be legal."""
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler} compiler")
    fake = tmp_path / "cuda_runtime.h"
    fake.write_text("#ifndef __CUDA_RUNTIME_H__\n#define __CUDA_RUNTIME_H__\n"
                    "typedef struct CUstream_st *cudaStream_t;\n"
                    "typedef struct CUevent_st *cudaEvent_t;\n#endif\n")
    src = tmp_path / f"order.{ext}"
    src.write_text('#include "nccl.h"\n#include "cuda_runtime.h"\n#include "nccl.h"\n'
                   "int use(cudaStream_t s, cudaEvent_t e) { return s == 0 && e == 0; }\n")
    build = subprocess.run([compiler, std, *FLAGS, f"-I{tmp_path}", "-c", str(src),
                            "-o", str(tmp_path / "order.o")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
