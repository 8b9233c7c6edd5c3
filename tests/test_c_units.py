"""Builds the C-level tests (tests/c, meson option -Dtests=true) in their own
build directory and runs them with `meson test`: transports, bootstrap,
reductions, vendor loading and the header checks, each a real program."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build-tests"


def _tool(name: str) -> list[str] | None:
    exe = shutil.which(name)
    if exe:
        return [exe]
    try:  # the pip packages provide `python -m mesonbuild.mesonmain`
        if name == "meson":
            import mesonbuild  # noqa: F401
            return [sys.executable, "-m", "mesonbuild.mesonmain"]
    except ImportError:
        pass
    return None


@pytest.fixture(scope="module")
def build_dir() -> Path:
    meson = _tool("meson")
    if meson is None or shutil.which("ninja") is None:
        pytest.skip("meson and ninja are needed to build the C tests (pip install meson ninja)")
    if not (BUILD / "build.ninja").exists():
        subprocess.run(meson + ["setup", str(BUILD), str(ROOT), "-Dtests=true",
                                "--buildtype=debugoptimized"], check=True, cwd=ROOT)
    subprocess.run(["ninja", "-C", str(BUILD)], check=True, cwd=ROOT)
    return BUILD


@pytest.mark.timeout(900)
def test_c_units(build_dir: Path) -> None:
    meson = _tool("meson")
    assert meson is not None
    proc = subprocess.run(meson + ["test", "-C", str(build_dir), "--print-errorlogs",
                                   "--timeout-multiplier", "3"],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HETCCL_DEBUG": os.environ.get("HETCCL_DEBUG", "")})
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-5000:])
    assert proc.returncode == 0, "meson test failed:\n" + proc.stdout[-4000:]
