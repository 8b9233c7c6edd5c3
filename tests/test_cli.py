"""The `hetccl` command: info, run (the launcher contract of
docs/launching.md), demo and perf; run as `python -m hetccl` on the package
the tests use."""

from __future__ import annotations

import json
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


def info_with(*args: str, **env: str) -> str:
    """`hetccl info ARGS`'s output with env added to this environment."""
    proc = subprocess.run([sys.executable, "-m", "hetccl", "info", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(TIMEOUT)
def test_info_shows_current_values() -> None:
    out = info_with(HETCCL_SHM_SLOTS="16")
    assert re.search(r"HETCCL_SHM_SLOTS\s+int\s+default='8'\s+value='16'", out)


@pytest.mark.timeout(TIMEOUT)
def test_info_says_what_shm_would_choose_here() -> None:
    """The shm transport's single copy and receive helper as a communicator
    of --ranks N ranks here would take them, with why: ranks beyond the
    CPUs turn single copy on, a CPU short of two per rank the helper off,
    and a knob wins over either default, saying so."""
    cpus = os.cpu_count() or 1
    def shm(*args: str, **env: str) -> str:
        out = info_with(*args, **env)
        m = re.search(r"^  shm    (.*)\n         (.*)$", out, re.M)
        assert m, out
        return m.group(1) + " | " + m.group(2)
    many = shm("--ranks", str(cpus + 1), HETCCL_SHM_CMA="", HETCCL_SHM_HELPER="")
    assert many.startswith(f"single copy on by default here: {cpus + 1} ranks on {cpus} CPUs"), many
    assert "receive helper thread off by default" in many, many
    one = shm("--ranks", "1", HETCCL_SHM_HELPER="")
    want = "on" if cpus >= 2 else "off"
    assert f"receive helper thread {want} by default: {cpus} CPUs for 1 ranks here" in one, one
    forced = shm("--ranks", str(cpus + 1), HETCCL_SHM_CMA="0", HETCCL_SHM_HELPER="1")
    assert forced == "single copy off (HETCCL_SHM_CMA=0) | receive helper thread on " \
        "(HETCCL_SHM_HELPER=1)", forced
    bad = hetccl("info", "--ranks", "0")
    assert bad.returncode == 2 and "--ranks" in bad.stderr, bad


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
def test_run_says_which_library_a_preload_does_not_replace(hetccl_library: Path,
                                                           tmp_path: Path) -> None:
    """Another libhetccl.so in LD_PRELOAD comes second to HETCCL_LIBRARY's,
    so the ranks never run it: hetccl run says so, and which one they run."""
    other = tmp_path / "libhetccl.so"
    shutil.copyfile(hetccl_library, other)
    env = dict(os.environ, LD_PRELOAD=str(other), HETCCL_LIBRARY=str(hetccl_library))
    proc = subprocess.run([sys.executable, "-m", "hetccl", "run", "-n", "1", "--", "true"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"LD_PRELOAD names {other}, but the ranks run {hetccl_library.resolve()}" \
        in proc.stderr, proc.stderr


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
    """Status 124, and the ranks still running named (it said only
    "timeout"; which rank hung was left to guess)."""
    start = time.monotonic()
    proc = hetccl("run", "-n", "3", "--timeout", "2", "--", sys.executable, "-c",
                  "import os, time; time.sleep(100 if os.environ['RANK'] != '0' else 0)")
    assert proc.returncode == 124
    assert time.monotonic() - start < 30
    assert "hetccl run: timeout after 2 s with ranks 1, 2 of 3 still running; stopping every " \
        "rank" in proc.stderr, proc.stderr


def test_run_without_command() -> None:
    assert hetccl("run", "-n", "2").returncode == 2


@pytest.mark.parametrize("args,complaint", [
    (["run", "-n", "0", "--", "true"], "argument -n: 0 must be at least 1"),
    (["demo", "-n", "0"], "argument -n: 0 must be at least 1"),
    (["run", "--timeout", "0", "--", "true"], "argument --timeout: 0 must be a positive"),
    (["run", "--timeout", "-1", "--", "true"], "argument --timeout: -1 must be a positive"),
    (["demo", "--timeout", "0"], "argument --timeout: 0 must be a positive"),
])
def test_bad_counts_and_timeouts_are_usage_errors(args: List[str], complaint: str) -> None:
    """-n 0 ended in a traceback; --timeout 0 and -1 killed the job at once."""
    proc = hetccl(*args)
    assert proc.returncode == 2, proc.stderr
    assert complaint in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(TIMEOUT)
def test_info_flags_a_refused_knob() -> None:
    """A value init refuses is flagged, named with the words allowed, and
    the status is 1 (it was shown unflagged, status 0)."""
    proc = subprocess.run([sys.executable, "-m", "hetccl", "info"], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, "HETCCL_ALGO": "bogus"})
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^  HETCCL_ALGO\s+enum\s+default='auto'\s+value='bogus'  <- INVALID$",
                     proc.stdout, re.M), proc.stdout
    assert "hetccl info: invalid knob: HETCCL_ALGO=bogus" in proc.stderr, proc.stderr
    assert "auto|ring|rd|direct" in proc.stderr, proc.stderr


SPLICE_SCRIPT = """
import os, sys, time
r = os.environ['HETCCL_LAUNCH_RANK']
# Half a line, a pause while the other rank writes its half, the rest.
os.write(1, f'rank {r} begins '.encode())
time.sleep(0.3)
os.write(1, f'rank {r} ends\\n'.encode())
os.write(2, f'rank {r} complains\\n'.encode())
sys.stdout.write(f'rank {r} has no newline')
"""


@pytest.mark.timeout(TIMEOUT)
def test_run_tag_output() -> None:
    """Each line behind its rank's tag, as mpirun --tag-output writes it,
    and whole: without pipes, the two ranks' halves splice."""
    proc = hetccl("run", "-n", "2", "--tag-output", "--", sys.executable, "-c", SPLICE_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    for r in (0, 1):
        assert f"[1,{r}]<stdout>:rank {r} begins rank {r} ends" in out, proc.stdout
        assert f"[1,{r}]<stdout>:rank {r} has no newline" in out, proc.stdout
        assert f"[1,{r}]<stderr>:rank {r} complains" in proc.stderr.splitlines(), proc.stderr
    assert len(out) == 4, proc.stdout


TORCH_VARS_SCRIPT = """
import os
names = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT']
os.write(1, (' '.join(os.environ.get(n, '-') for n in names) + '\\n').encode())
"""


@pytest.mark.timeout(TIMEOUT)
def test_run_gives_torch_its_variables() -> None:
    """torch.distributed's env:// variables on every rank (torch said
    "environment variable RANK expected, but not set"), one free port."""
    proc = hetccl("run", "-n", "3", "--", sys.executable, "-c", TORCH_VARS_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split() for line in proc.stdout.splitlines())
    ports = {row[5] for row in rows}
    assert [row[:5] for row in rows] == [[str(r), "3", str(r), "3", "127.0.0.1"]
                                         for r in range(3)], rows
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536, rows


@pytest.mark.timeout(TIMEOUT)
def test_run_keeps_the_callers_torch_variables() -> None:
    env = {**os.environ, "MASTER_PORT": "23456", "MASTER_ADDR": "10.9.8.7"}
    proc = subprocess.run([sys.executable, "-m", "hetccl", "run", "-n", "2", "--",
                           sys.executable, "-c", TORCH_VARS_SCRIPT], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert line.split()[4:] == ["10.9.8.7", "23456"], line


TORCH_JOB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t[0].item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(TIMEOUT)
def test_run_an_unchanged_torch_script() -> None:
    pytest.importorskip("torch")
    proc = hetccl("run", "-n", "2", "--tag-output", "--", sys.executable, "-c", TORCH_JOB)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[1,0]<stdout>:rank 0 of 2 sum 3",
                                                "[1,1]<stdout>:rank 1 of 2 sum 3"]


THREE_COMMUNICATORS = """
import os, numpy as np, hetccl
for i in range(3):
    comm, info = hetccl.init_from_env()
    x = np.full(3, info.rank + 1.0)
    comm.all_reduce(x)
    os.write(1, f"{info.launcher} rank {info.rank} communicator {i} sum {x[0]:g}\\n".encode())
    comm.destroy()
"""


@pytest.mark.timeout(TIMEOUT)
def test_run_repeated_init_from_env() -> None:
    """A second init_from_env under `hetccl run` waited out the connect
    timeout on the launch id, which serves one communicator."""
    env = {**os.environ, "HETCCL_CONNECT_TIMEOUT": "10"}
    proc = subprocess.run([sys.executable, "-m", "hetccl", "run", "-n", "3", "--timeout", "90",
                           "--", sys.executable, "-c", THREE_COMMUNICATORS],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(
        f"hetccl rank {r} communicator {i} sum 6" for r in range(3) for i in range(3))


def test_info_build_flags_compile_a_c_program(tmp_path: Path, hetccl_library: Path) -> None:
    """`hetccl info --cflags --libs`: what a C build needs, from the
    installed package or the checkout (the headers were in the repository
    only)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    cflags = hetccl("info", "--cflags")
    libs = hetccl("info", "--libs")
    assert cflags.returncode == 0 and libs.returncode == 0, cflags.stderr + libs.stderr
    assert cflags.stdout.startswith("-I") and "-lhetccl" in libs.stdout
    src = tmp_path / "version.c"
    src.write_text('#include <stdio.h>\n#include "nccl.h"\n#include "hetccl.h"\n'
                   "int main(void) {\n  int v = 0;\n"
                   "  if (ncclGetVersion(&v) != ncclSuccess) return 1;\n"
                   '  printf("%d %s\\n", v, hetcclVersionString());\n  return 0;\n}\n')
    exe = tmp_path / "version"
    subprocess.run([cc, str(src), "-o", str(exe), *cflags.stdout.split(), *libs.stdout.split()],
                   check=True, timeout=TIMEOUT)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT,
                         env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
    assert run.returncode == 0 and re.fullmatch(r"\d{5} \d+\.\d+\.\d+.*\n", run.stdout), run


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
def test_demo_under_a_launcher_is_one_job() -> None:
    """`hetccl run -n 2 -- hetccl demo` ran a separate 2-rank demo per rank
    (every line twice); now each launched rank is one rank of one job."""
    proc = hetccl("run", "-n", "2", "--", sys.executable, "-m", "hetccl", "demo", "--count",
                  "100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 6 and all(" ok: " in line for line in lines), proc.stdout
    for rank in range(2):
        assert sum(line.startswith(f"rank {rank}/2 ") for line in lines) == 3, proc.stdout


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


def test_package_installs_headers_and_perf_command(hetccl_library: Path) -> None:
    """The wheel carries nccl.h and hetccl.h (a C user had to find them in
    the repository) and puts hetccl-perf on PATH ("command not found" after
    pip install): the build's install plan and the package's scripts."""
    import tomllib

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hetccl-perf"] == "hetccl.cli:perf_main"
    build = hetccl_library.resolve().parents[1]
    meson = shutil.which("meson") or str(Path(sys.executable).with_name("meson"))
    if not (build / "meson-info").is_dir() or not Path(meson).exists():
        pytest.skip("the library was not built by meson here")
    plan = subprocess.run([meson, "introspect", "--installed", str(build)], check=True,
                          capture_output=True, text=True, timeout=TIMEOUT).stdout
    installed = {"/".join(Path(v).parts[-3:]) for v in json.loads(plan).values()}
    for want in ("hetccl/include/nccl.h", "hetccl/include/hetccl.h"):
        assert any(i.endswith(want) for i in installed), sorted(installed)
    assert any(i.endswith("hetccl/hetccl-perf") for i in installed), sorted(installed)


@pytest.mark.timeout(TIMEOUT)
def test_perf_command_runs_the_package_program() -> None:
    """hetccl.cli.perf_main, the hetccl-perf on PATH, runs the program
    that `hetccl perf` runs."""
    from hetccl.cli import find_perf

    if find_perf() is None:
        pytest.skip("hetccl-perf not built")
    proc = subprocess.run([sys.executable, "-c", "import sys; from hetccl.cli import perf_main; "
                           "sys.argv[0] = 'hetccl-perf'; sys.exit(perf_main())", "--help"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and "--agg_iters" in proc.stdout, proc.stdout + proc.stderr
