"""The C-level tests (tests/c) once more, built with sanitizers: one build
with AddressSanitizer + UndefinedBehaviorSanitizer (leak checking on, every
rank process checked at exit), one with ThreadSanitizer. A single report
fails the test: the runtimes halt on the first error, and the test log is
searched for reports besides.

Build directories live under pytest's temporary directory, never in the
source tree: libpath.py takes the newest build*/ library there, and a
sanitized libhetccl.so cannot be loaded into an unsanitized Python.

What runs where (2 to 3 minutes for both on 2 cores, builds included):
  ASan+UBSan  every C test but the throughput benchmark (suite 'bench') and
              algo-np9-big (nine ranks on large buffers: the wide rules'
              selection; the algorithms it reaches run in the smaller
              sweeps too).
  TSan        the tests in which one process runs several threads: the
              library's own threads beside the caller's (suite 'threads'),
              the bootstrap (its root thread; ranks as threads), the vendor
              loader, and the algorithm sweeps (rank 0 serves the bootstrap
              root while it joins). Left out: the shared-memory and socket
              transport tests, whose ranks are single-threaded processes
              sharing memory ThreadSanitizer cannot see (and which run for
              minutes under it), algo-np3-big, algo-np3-pull-big and
              algo-np9-big (the same paths again, on larger buffers), and
              the single-threaded reduction kernels.

Skipped where the compiler cannot build and run a sanitized program, and
with HETCCL_TEST_SANITIZERS=0.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple

import pytest

from c_build import configure_and_build, run_meson_test, select_tests


class Variant(NamedTuple):
    name: str
    sanitize: str                        # meson's b_sanitize
    env: Dict[str, str]                  # the runtime's options
    keep: Callable[[str, List[str]], bool]  # (test name, suites) -> run it?


def _asan_keep(name: str, suites: List[str]) -> bool:
    return "bench" not in suites and name != "algo-np9-big"


_TSAN_SUITES = {"threads", "net", "vendor", "abi", "algo"}


def _tsan_keep(name: str, suites: List[str]) -> bool:
    if not _TSAN_SUITES.intersection(suites) or "bench" in suites:
        return False
    return not name.startswith("socket-") and name not in ("algo-np3-big", "algo-np3-pull-big", "algo-np9-big")


VARIANTS = [
    Variant("asan", "address,undefined",
            {"ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1:abort_on_error=0:exitcode=66",
             "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=66"},
            _asan_keep),
    Variant("tsan", "thread",
            {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1:exitcode=66"},
            _tsan_keep),
]

# How each runtime starts a report.
REPORT = re.compile(r"ERROR: (?:Address|Leak)Sanitizer|WARNING: ThreadSanitizer|"
                    r"runtime error:|ERROR: ThreadSanitizer")


def _compiler_runs(sanitize: str, workdir: Path) -> str:
    """'' when the C compiler builds and runs a program with -fsanitize=X,
    else why not."""
    cc = os.environ.get("CC", "cc")
    src = workdir / "probe.c"
    exe = workdir / "probe"
    src.write_text("int main(void) { return 0; }\n")
    try:
        built = subprocess.run([cc, f"-fsanitize={sanitize}", str(src), "-o", str(exe)],
                               capture_output=True, text=True, timeout=120)
        if built.returncode != 0:
            return f"{cc} -fsanitize={sanitize}: {built.stderr.strip()[-300:]}"
        ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cc} -fsanitize={sanitize}: {e}"
    if ran.returncode != 0:
        return f"a -fsanitize={sanitize} program does not run here: {ran.stderr.strip()[-300:]}"
    return ""


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_c_units_sanitized(variant: Variant, tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.environ.get("HETCCL_TEST_SANITIZERS", "1") == "0":
        pytest.skip("HETCCL_TEST_SANITIZERS=0")
    work = tmp_path_factory.mktemp(f"san-{variant.name}")
    why = _compiler_runs(variant.sanitize, work)
    if why:
        pytest.skip(why)
    build = work / "build"
    t0 = time.monotonic()
    # -fno-sanitize-recover: undefined behaviour stops the program whatever
    # UBSAN_OPTIONS says. b_lundef=false: sanitized shared libraries leave
    # the runtime's symbols to the executable.
    configure_and_build(build, [f"-Db_sanitize={variant.sanitize}", "-Db_lundef=false",
                                "--buildtype=debugoptimized",
                                "-Dc_args=-fno-sanitize-recover=all",
                                "-Dcpp_args=-fno-sanitize-recover=all"])
    built = time.monotonic()
    names = select_tests(build, variant.keep)
    assert names, "no C test selected"
    proc = run_meson_test(build, names, env=variant.env)
    log = (build / "meson-logs" / "testlog.txt").read_text(errors="replace")
    reports = REPORT.findall(log)
    print(f"\n[{variant.name}] build {built - t0:.0f} s, {len(names)} tests in "
          f"{time.monotonic() - built:.0f} s, {len(reports)} sanitizer reports")
    assert not reports, (f"{len(reports)} sanitizer reports; first ones:\n"
                         + "\n".join(_report_excerpts(log)))
    assert proc.returncode == 0, "meson test failed:\n" + proc.stdout[-4000:]


def _report_excerpts(log: str, limit: int = 3, lines: int = 30) -> List[str]:
    text = log.splitlines()
    out = []
    for i, line in enumerate(text):
        if REPORT.search(line):
            out.append("\n".join(text[i:i + lines]))
            if len(out) == limit:
                break
    return out
