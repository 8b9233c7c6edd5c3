"""The `hetccl` command: info, run (the launcher contract of
docs/launcher.md), demo and perf; run as `python -m hetccl` on the package
the tests use."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from libpath import REPO_ROOT, SHARED_DIR

pytestmark = pytest.mark.usefixtures("hetccl_library")

TIMEOUT = 120
KNOBS_H = REPO_ROOT / "libhetccl" / "util" / "knobs.h"
SYMBOL_LIST = SHARED_DIR / "abi" / "nccl-2.32.3-symbols.txt"


def hetccl(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetccl", *args], capture_output=True,
                          text=True, timeout=timeout)


def _knob_names() -> List[str]:
    return re.findall(r'^\s*X\(\w+,\s*"(\w+)"', KNOBS_H.read_text(), re.M)


@pytest.mark.timeout(TIMEOUT)
def test_info(hetccl_library: Path) -> None:
    proc = hetccl("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"library: {hetccl_library.resolve()}" in out
    assert re.search(r"^hetccl \d+\.\d+\.\d+", out, re.M)
    assert re.search(r"^NCCL API version: \d+\.\d+\.\d+ \(\d+\)", out, re.M)
    want = 193
    if SYMBOL_LIST.is_file():
        want = sum(1 for s in SYMBOL_LIST.read_text().splitlines()
                   if s.strip() and not s.startswith("#"))
    assert f"exported NCCL API symbols: {want} " in out
    # Every device runtime and vendor library, found or with the reason why not.
    assert "device runtimes" in out and "vendor libraries:" in out
    assert re.search(r"^  host\s+available\s+built in", out, re.M)
    for runtime in ("cuda", "hip"):
        assert re.search(rf"^  {runtime}\s+(available|unavailable)\s+\S", out, re.M), runtime
    hip = re.search(r"^  hip\s+\S+\s+(.*)$", out, re.M)
    assert hip and "libamdhip64" in hip.group(1), hip  # its file, or the names it tried
    for vendor in ("nccl", "rccl"):
        assert re.search(rf"^  {vendor}\s+(\d+\.\d+\.\d+ \(\d+\)|not loaded)\s+\S", out,
                         re.M), vendor
    names = _knob_names()
    assert len(names) >= 20
    for name in names:
        assert re.search(rf"^  {name}\s+(int|str|enum)\s+default=", out, re.M), name
    # An ENUM knob lists its words on the line below its own.
    assert re.search(r"^  HETCCL_TRANSPORT\s+enum\s+default='auto'.*\n\s+one of: auto, shm, "
                     r"socket, ib$", out, re.M), out
    assert f"knobs: {len(names)} " in out


def info_with(**env: str) -> str:
    """`hetccl info`'s output with env added to this environment."""
    proc = subprocess.run([sys.executable, "-m", "hetccl", "info"], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(TIMEOUT)
def test_info_shows_current_values() -> None:
    out = info_with(HETCCL_SHM_SLOTS="16")
    assert re.search(r"HETCCL_SHM_SLOTS\s+int\s+default='8'\s+value='16'", out)


@pytest.mark.timeout(TIMEOUT)
def test_info_names_the_rccl_it_was_told() -> None:
    out = info_with(HETCCL_RCCL_LIBRARY="/nonexistent/librccl.so.1")
    assert re.search(r"^  rccl\s+not loaded\s+HETCCL_RCCL_LIBRARY=/nonexistent/librccl.so.1 "
                     r"cannot be used: .*No such file", out, re.M), out


def test_dynsym_reader_matches_nm(hetccl_library: Path) -> None:
    from hetccl.elfsyms import exported_symbols

    if shutil.which("nm") is None:
        pytest.skip("nm not installed")
    out = subprocess.run(["nm", "-D", "--defined-only", str(hetccl_library)], check=True,
                         capture_output=True, text=True).stdout
    nm = sorted({f[2].split("@")[0] for f in (ln.split() for ln in out.splitlines())
                 if len(f) >= 3})
    assert exported_symbols(hetccl_library) == nm


RANK_SCRIPT = """
import ctypes, os, numpy as np
import hetccl
from hetccl import nccl
info = hetccl.launch_info()
# the preloaded library answers the NCCL API for the whole process
v = ctypes.c_int()
assert ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v)) == 0
comm = hetccl.communicator()
x = np.full(3, info.rank + 1, dtype=np.float32)
comm.allReduce(x.ctypes.data, x.ctypes.data, 3, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
comm.destroy()
print(f"rank {info.rank} of {info.nranks} local {info.local_rank} id {len(info.unique_id)} "
      f"sum {x[0]:g} version {v.value}", flush=True)
"""


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_run_python_ranks(n: int, hetccl_library: Path) -> None:
    proc = hetccl("run", "-n", str(n), "--", sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(n):
        assert (f"rank {rank} of {n} local {rank} id 256 sum {n * (n + 1) // 2:g}"
                in proc.stdout), proc.stdout


@pytest.mark.timeout(TIMEOUT)
def test_run_sets_preload(hetccl_library: Path) -> None:
    proc = hetccl("run", "-n", "2", "--", sys.executable, "-c",
                  "import os; os.write(1, (os.environ['LD_PRELOAD'].split()[0] + ' ' + "
                  "os.environ['HETCCL_LAUNCH_RANK'] + '\\n').encode())")  # one write: no interleaving
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.split("\n"))[-2:]
    assert lines == [f"{hetccl_library.resolve()} 0", f"{hetccl_library.resolve()} 1"]


def test_core_binding_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each local rank gets an equal block of consecutive CPUs, disjoint
    from the others' (the first ranks one more where they do not divide);
    none when there are fewer CPUs than ranks."""
    from hetccl import launcher
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(4, 20)))
    assert launcher.core_binding(2) == [list(range(4, 12)), list(range(12, 20))]
    blocks = launcher.core_binding(3)
    assert [len(b) for b in blocks] == [6, 5, 5]
    assert sorted(c for b in blocks for c in b) == list(range(4, 20))
    assert launcher.core_binding(17) == [None] * 17


@pytest.mark.timeout(TIMEOUT)
def test_run_binds_each_rank_to_its_block() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    proc = hetccl("run", "-n", "2", "--", sys.executable, "-c",
                  "import os; os.write(1, (os.environ['HETCCL_LAUNCH_RANK'] + ' ' + "
                  "' '.join(map(str, sorted(os.sched_getaffinity(0)))) + '\\n').encode())")
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line)
    half = len(cpus) // 2
    assert got == {"0": " ".join(map(str, cpus[:len(cpus) - half])),
                   "1": " ".join(map(str, cpus[len(cpus) - half:]))}


@pytest.mark.timeout(TIMEOUT)
def test_run_exit_status_and_kill() -> None:
    """A failing rank's status is the launcher's, and the others are killed."""
    script = ("import os, sys, time\n"
              "if os.environ['HETCCL_LAUNCH_RANK'] == '1': sys.exit(7)\n"
              "time.sleep(100)\n")
    start = time.monotonic()
    proc = hetccl("run", "-n", "3", "--", sys.executable, "-c", script)
    assert proc.returncode == 7
    assert time.monotonic() - start < 30
    assert "hetccl run: rank 1 exited with status 7; stopping the other ranks" in proc.stderr


@pytest.mark.timeout(TIMEOUT)
def test_run_names_a_rank_killed_by_a_signal() -> None:
    """A rank killed by a signal prints nothing itself, and the output the
    others buffer dies with them: the launcher's line is all there is."""
    script = ("import os, signal, sys, time\n"
              "print('buffered, never flushed')\n"
              "if os.environ['HETCCL_LAUNCH_RANK'] == '0': os.kill(os.getpid(), signal.SIGSEGV)\n"
              "time.sleep(100)\n")
    proc = hetccl("run", "-n", "2", "--", sys.executable, "-c", script)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    assert "hetccl run: rank 0 killed by signal 11 (SIGSEGV)" in proc.stderr, proc.stderr


@pytest.mark.timeout(TIMEOUT)
def test_run_timeout() -> None:
    start = time.monotonic()
    proc = hetccl("run", "-n", "2", "--timeout", "2", "--", sys.executable, "-c",
                  "import time; time.sleep(100)")
    assert proc.returncode == 124
    assert time.monotonic() - start < 30
    assert "hetccl run: timeout after 2 s; stopping every rank" in proc.stderr


def test_run_without_command() -> None:
    assert hetccl("run", "-n", "2").returncode == 2


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [2, 3])
def test_demo(n: int) -> None:
    proc = hetccl("demo", "-n", str(n), "--count", "10007")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(n):
        for coll in ("allreduce", "allgather", "broadcast"):
            assert re.search(rf"^rank {rank}/{n} {coll}\s.* ok: ", proc.stdout, re.M), \
                proc.stdout


@pytest.mark.timeout(TIMEOUT)
def test_demo_through_run() -> None:
    """The README's first command, spelled out."""
    proc = hetccl("run", "-n", "2", "--", sys.executable, "-m", "hetccl.demo", "--count", "100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" ok: ") == 6


@pytest.mark.timeout(TIMEOUT)
def test_perf_help() -> None:
    from hetccl.cli import find_perf

    if find_perf() is None:
        pytest.skip("hetccl-perf not built")
    proc = hetccl("perf", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "hetccl-perf" in proc.stdout + proc.stderr


def test_version() -> None:
    proc = hetccl("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("hetccl ")
