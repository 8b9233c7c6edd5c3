"""Configuring, building and running the C-level tests (tests/c, meson option
-Dtests=true) for the pytest files that drive them: test_c_units.py (a plain
build) and test_sanitizers.py (sanitized builds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import pytest

from libpath import REPO_ROOT


def meson_command() -> Optional[List[str]]:
    """How to run meson here, or None when it is not installed."""
    exe = shutil.which("meson")
    if exe:
        return [exe]
    try:  # the pip package provides `python -m mesonbuild.mesonmain`
        import mesonbuild  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "mesonbuild.mesonmain"]


def require_meson() -> List[str]:
    """meson's command line; skips the calling test without meson or ninja."""
    meson = meson_command()
    if meson is None or shutil.which("ninja") is None:
        pytest.skip("meson and ninja are needed to build the C tests (pip install meson ninja)")
    return meson


def configure_and_build(build: Path, options: Sequence[str]) -> None:
    """Set up `build` with the C tests and `options` (once), then bring it
    up to date with ninja."""
    meson = require_meson()
    if not (build / "build.ninja").exists():
        subprocess.run(meson + ["setup", str(build), str(REPO_ROOT), "-Dtests=true", *options],
                       check=True, cwd=REPO_ROOT)
    subprocess.run(["ninja", "-C", str(build)], check=True, cwd=REPO_ROOT)


def select_tests(build: Path, keep: Callable[[str, List[str]], bool]) -> List[str]:
    """Names of the tests in `build` for which keep(name, suites) holds;
    suites without the project prefix ("algo", not "hetccl:algo")."""
    with open(build / "meson-info" / "intro-tests.json", encoding="utf-8") as f:
        tests = json.load(f)
    return [t["name"] for t in tests
            if keep(t["name"], [s.split(":", 1)[-1] for s in t.get("suite", [])])]


def run_meson_test(build: Path, names: Sequence[str] = (),
                   env: Optional[Mapping[str, str]] = None,
                   timeout_multiplier: int = 3) -> subprocess.CompletedProcess:
    """`meson test` in `build` (every test, or those named), its output
    echoed (tail) for pytest's report. HETCCL_DEBUG is passed on only when
    the caller set it: the tests' own settings otherwise."""
    meson = require_meson()
    run_env: Dict[str, str] = {**os.environ, "HETCCL_DEBUG": os.environ.get("HETCCL_DEBUG", "")}
    run_env.update(env or {})
    proc = subprocess.run(meson + ["test", "-C", str(build), "--print-errorlogs",
                                   "--timeout-multiplier", str(timeout_multiplier), *names],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=run_env)
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-5000:])
    return proc
