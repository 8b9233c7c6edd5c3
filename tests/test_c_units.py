"""Builds the C-level tests (tests/c, meson option -Dtests=true) in their own
build directory and runs them with `meson test`: transports, bootstrap,
reductions, vendor loading, the library's threads and the header checks,
each a real program. (test_sanitizers.py runs them again, sanitized.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from c_build import configure_and_build, run_meson_test
from libpath import REPO_ROOT

BUILD = REPO_ROOT / "build-tests"


@pytest.fixture(scope="module")
def build_dir() -> Path:
    configure_and_build(BUILD, ["--buildtype=debugoptimized"])
    return BUILD


@pytest.mark.timeout(900)
def test_c_units(build_dir: Path) -> None:
    proc = run_meson_test(build_dir)
    assert proc.returncode == 0, "meson test failed:\n" + proc.stdout[-4000:]
