"""hetccl-perf (tools/perf): every collective with the data check on, on one
and two ranks (threads of one process, -g groups, and launched processes),
host memory, small and odd sizes (count 0 included); its command line; and
its CUDA-less start."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_cpu import parse_table  # noqa: E402

COLLS = ["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall",
         "gather", "scatter", "sendrecv"]
# 0, 1, 9, 81, 729, 6561 bytes: empty, sub-element, odd and non-divisible counts
SIZES = ["-b", "0", "-e", "40000", "-f", "9", "-n", "2", "-w", "1", "-c", "1"]
TIMEOUT = 120


def _meson() -> list[str] | None:
    exe = shutil.which("meson")
    if exe:
        return [exe]
    if importlib.util.find_spec("mesonbuild"):
        return [sys.executable, "-m", "mesonbuild.mesonmain"]
    return None


@pytest.fixture(scope="module")
def perf() -> Path:
    """$HETCCL_PERF, else the newest build*/tools/perf/hetccl-perf that has a
    libhetccl.so beside it in the build tree, else a fresh build-perf."""
    env = os.environ.get("HETCCL_PERF")
    if env:
        return Path(env)
    built = [p for p in ROOT.glob("build*/tools/perf/hetccl-perf")
             if (p.parents[2] / "libhetccl" / "libhetccl.so").is_file()]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    meson = _meson()
    if meson is None or shutil.which("ninja") is None:
        pytest.skip("meson and ninja are needed to build hetccl-perf")
    build = ROOT / "build-perf"
    if not (build / "build.ninja").exists():
        subprocess.run(meson + ["setup", str(build), str(ROOT)], check=True, cwd=ROOT)
    subprocess.run(["ninja", "-C", str(build)], check=True, cwd=ROOT)
    return build / "tools" / "perf" / "hetccl-perf"


def _library(perf: Path) -> Path:
    return Path(os.environ.get("HETCCL_PERF_LIB") or perf.parents[2] / "libhetccl" / "libhetccl.so")


def _env(perf: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETCCL_LAUNCH_")}
    env.setdefault("HETCCL_LIBRARY", str(_library(perf)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)


# In-place alltoall and sendrecv overlap what is sent with what is received:
# undefined in NCCL, so timed but not checked (N/A).
UNCHECKED_INPLACE = {"alltoall", "sendrecv"}


def _assert_clean(proc: subprocess.CompletedProcess, want_rows: int, coll: str = "") -> None:
    msg = f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, msg
    rows = parse_table(proc.stdout)
    assert len(rows) == want_rows, msg
    ip_wrong = None if coll in UNCHECKED_INPLACE else 0
    for r in rows:
        assert r["oop"]["wrong"] == 0 and r["ip"]["wrong"] == ip_wrong, msg
        assert r["oop"]["time_us"] > 0 and r["ip"]["time_us"] > 0, msg
    assert "# Wrong elements       : 0 OK" in proc.stdout, msg
    assert "# Avg bus bandwidth" in proc.stdout, msg
    assert "# library: " in proc.stdout, msg


def _launcher_ready() -> bool:
    sys.path.insert(0, str(ROOT / "python"))
    try:
        return importlib.util.find_spec("hetccl.launcher") is not None
    finally:
        sys.path.pop(0)


N_SIZES = 6


@pytest.mark.timeout(TIMEOUT * 2)
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("ranks", ["t1", "t2", "g2"])
def test_one_process(perf: Path, coll: str, ranks: str) -> None:
    """1 rank, 2 thread ranks (-t 2), 2 ranks of one thread in a group (-g 2),
    all made by ncclCommInitAll."""
    flag = {"t1": ["-t", "1"], "t2": ["-t", "2"], "g2": ["-g", "2"]}[ranks]
    root = ["-r", "1"] if ranks != "t1" else []
    _assert_clean(_run([str(perf), coll, *SIZES, *flag, *root], _env(perf)), N_SIZES, coll)


@pytest.mark.timeout(TIMEOUT * 2)
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("chunks", ["default", "small"])
def test_launched(perf: Path, coll: str, chunks: str) -> None:
    """2 processes under `hetccl run`; with small chunks the sizes here cross
    several pipeline steps and shared-memory slots."""
    if not _launcher_ready():
        pytest.skip("python/hetccl/launcher.py is not there yet")
    extra = {"HETCCL_PIPELINE_CHUNK": "4K", "HETCCL_SHM_CHUNK": "4K"} if chunks == "small" else {}
    cmd = [sys.executable, "-m", "hetccl", "run", "-n", "2", "--timeout", str(TIMEOUT - 10), "--",
           str(perf), coll, *SIZES,
           "-r", "1"]
    _assert_clean(_run(cmd, _env(perf, **extra)), N_SIZES, coll)


@pytest.mark.timeout(TIMEOUT * 2)
def test_every_type_and_op(perf: Path) -> None:
    """The exact-value scheme holds for every type and operator on 3 ranks."""
    sizes = ["-b", "0", "-e", "300", "-f", "17", "-n", "1", "-w", "0"]
    cmd = [str(perf), "all_reduce", *sizes, "-t", "3", "-d", "all", "-o", "all"]
    _assert_clean(_run(cmd, _env(perf)), 4 * 12 * 5)
    cmd = [str(perf), "reduce_scatter", *sizes, "-t", "3", "-d", "all", "-o", "all"]
    _assert_clean(_run(cmd, _env(perf)), 4 * 12 * 5)


def test_command_line(perf: Path, tmp_path: Path) -> None:
    env = _env(perf)
    assert _run([str(perf), "--help"], env).returncode == 0
    for bad in (["nosuchcoll"], ["all_reduce", "-b", "1Q"], ["all_reduce", "-d", "float7"],
                ["all_reduce", "-b", "2M", "-e", "1M"], []):
        proc = _run([str(perf), *bad], env)
        assert proc.returncode == 2 and "hetccl-perf:" in proc.stderr, (bad, proc.stderr)
    # nccl-tests names: a link called all_gather_perf runs all_gather
    link = tmp_path / "all_gather_perf"
    link.symlink_to(perf)
    proc = _run([str(link), "-b", "64", "-e", "64", "-n", "1", "-w", "0"],
                _env(perf, HETCCL_PERF_LIB=str(_library(perf))))
    _assert_clean(proc, 1)
    assert "hetccl-perf all_gather:" in proc.stdout


def test_cuda_less_start(perf: Path) -> None:
    """--mem_type cuda where libcudart cannot be loaded (or has no device) is a clear
    error, never a crash; host memory never touches CUDA."""
    env = _env(perf, HETCCL_PERF_CUDART="/nonexistent/libcudart.so",
               LD_LIBRARY_PATH="/nonexistent")
    proc = _run([str(perf), "all_reduce", "--mem_type", "cuda", "-b", "8", "-e", "8"], env)
    if proc.returncode == 0:
        pytest.skip("this machine has a usable CUDA device")
    assert proc.returncode in (1, 2) and "hetccl-perf:" in proc.stderr, proc.stderr


def test_missing_library(perf: Path) -> None:
    proc = _run([str(perf), "all_reduce", "-b", "8", "-e", "8"],
                _env(perf, HETCCL_PERF_LIB="/nonexistent/libnccl.so.2"))
    assert proc.returncode == 2 and "cannot load the NCCL library" in proc.stderr


# --- nccl-tests' options, with nccl-tests' meanings ----------------------------

@pytest.mark.timeout(TIMEOUT)
def test_nccl_tests_options(perf: Path) -> None:
    """-m is the aggregation count (it was the memory type), -N repeats the
    sweep, -p makes the ranks in their threads, -c N checks N times; -z, -y,
    -C, -S, -R 1, -u and -T are taken and the data stays right."""
    sizes = ["-b", "8", "-e", "1000", "-f", "5", "-n", "2", "-w", "1"]  # 8, 40, 200, 1000
    cmd = [str(perf), "all_reduce", *sizes, "-t", "2", "-p", "1", "-m", "3", "-N", "2", "-c", "2",
           "-z", "3", "-y", "1", "-C", "1", "-R", "1", "-u", "1", "-T", "100"]
    proc = _run(cmd, _env(perf))
    _assert_clean(proc, 2 * 4)
    assert "agg iters: 3" in proc.stdout and "cycles: 2" in proc.stdout, proc.stdout
    assert "ncclCommInitRank in each thread (-p 1)" in proc.stdout, proc.stdout
    proc = _run([str(perf), "all_reduce", *sizes, "-S", "1"], _env(perf))
    rows = [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert proc.returncode == 0 and len(rows) == 4, proc.stdout + proc.stderr
    assert all(re.search(r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", r) for r in rows), rows
    for flag in (["-z", "1"], ["-z", "2"], ["-g", "2", "-m", "2", "-u", "3", "-d", "half"]):
        _assert_clean(_run([str(perf), "reduce_scatter", *sizes, *flag], _env(perf)), 4)


@pytest.mark.parametrize("args,named", [
    (["-G", "2"], "-G 2"), (["-R", "2"], "-R 2"), (["-x", "1"], "-x 1"), (["-D", "1"], "-D 1"),
    (["-V", "16"], "-V 16"), (["-M", "1"], "-M 1"), (["-I", "1"], "-I 1"), (["-K", "3"], "-K 3"),
    (["-o", "mulsum"], "-o mulsum"), (["-m", "cuda"], "--mem_type cuda"),
])
def test_options_it_cannot_honour(perf: Path, args: list[str], named: str) -> None:
    """One line naming the option and status 2, never silently ignored (-m
    host|cuda points to --mem_type)."""
    proc = _run([str(perf), "all_reduce", "-b", "8", "-e", "8", *args], _env(perf))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr


def test_nccl_tests_split_is_refused(perf: Path) -> None:
    proc = _run([str(perf), "all_reduce", "-b", "8", "-e", "8"],
                _env(perf, NCCL_TESTS_SPLIT="MOD 2"))
    assert proc.returncode == 2 and "NCCL_TESTS_SPLIT=MOD 2: not supported" in proc.stderr


@pytest.mark.parametrize("floor,ok", [("0", True), ("1e9", False)])
def test_nccl_tests_min_bw(perf: Path, floor: str, ok: bool) -> None:
    """NCCL_TESTS_MIN_BW was ignored: below 0.9 x it the run fails."""
    proc = _run([str(perf), "all_reduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0"],
                _env(perf, NCCL_TESTS_MIN_BW=floor))
    assert proc.returncode == (0 if ok else 1), proc.stdout + proc.stderr
    assert re.search(rf"^# Avg bus bandwidth    : \S+ {'OK' if ok else 'FAILED'}$", proc.stdout,
                     re.M), proc.stdout


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.usefixtures("hetccl_library")
def test_timeout_ends_a_hung_run(perf: Path) -> None:
    """-T: rank 0 of 2 with no rank 1 waits in init; the watchdog ends it."""
    from hetccl import nccl

    launch = {"HETCCL_LAUNCH_ID": nccl.unique_id_to_hex(nccl.get_unique_id()),
              "HETCCL_LAUNCH_RANK": "0", "HETCCL_LAUNCH_NRANKS": "2"}
    env = {**_env(perf), **launch}  # _env drops the HETCCL_LAUNCH_* of this process
    proc = _run([str(perf), "all_reduce", "-b", "8", "-e", "8", "-T", "2"], env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "test timeout (-T 2 s): the communicators' init did not finish" in proc.stderr


# --- tools/device/paired_latency.c, on host ranks -----------------------------

PAIRED_COLLS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "alltoall",
                "sendrecv"]


@pytest.fixture(scope="module")
def paired(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("paired") / "paired_latency"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", str(ROOT / "tools/device/paired_latency.c"),
                    "-ldl", "-lm", "-o", str(exe)], check=True, timeout=TIMEOUT)
    return exe


def test_paired_latency_rows(paired: Path, hetccl_library: Path) -> None:
    """hetccl against itself on two host ranks: one row per collective and
    size, the median difference inside its interval, the ratio that of the
    medians. The bar is not asserted (host timings on a shared machine)."""
    lib = str(hetccl_library)
    proc = subprocess.run([str(paired), lib, lib, "--memory", "host", "--sizes", "8,1K",
                           "--rounds", "10", "--iters", "2"],
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env=dict(os.environ, HETCCL_DEVICE="host"))
    assert proc.returncode in (0, 1), proc.stderr
    rows = [line.replace("[", " ").replace("]", " ").replace(",", " ").split()
            for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [(r[0], int(r[1])) for r in rows] == \
        [(c, b) for c in PAIRED_COLLS for b in (8, 1024)], proc.stdout
    for r in rows:
        nccl_us, het_us, diff = float(r[2]), float(r[3]), float(r[4])
        lo, hi = float(r[5]), float(r[6])
        assert nccl_us > 0 and het_us > 0, r
        assert lo <= diff <= hi, r
        assert r[7] in ("met", "MISSED") and (r[7] == "met") == (hi < 0.5), r
        # The medians print to 0.01 us and the ratio to 0.001, each rounded
        # from the unrounded values: allow what that rounding can move.
        ratio = nccl_us / het_us
        slack = ratio * (0.005 / nccl_us + 0.005 / het_us) + 0.0005
        assert float(r[8]) == pytest.approx(ratio, abs=slack + 1e-9), r
    assert proc.returncode == (1 if any(r[7] == "MISSED" for r in rows) else 0)


@pytest.mark.parametrize("args,message", [
    (["--sizes", "6"], "not a multiple of 8 bytes"),
    (["--rounds", "3"], "--rounds must be >= 10"),
    (["--colour", "red"], "unknown option --colour"),
])
def test_paired_latency_bad_input(paired: Path, hetccl_library: Path, args: list[str],
                                  message: str) -> None:
    lib = str(hetccl_library)
    proc = subprocess.run([str(paired), lib, lib, "--memory", "host", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


# --- -J JSON rows, the progress line, `hetccl plot` -----------------------------

def _json_run(perf: Path, tmp_path: Path, name: str, *args: str) -> tuple:
    out = tmp_path / f"{name}.json"
    proc = _run([str(perf), *args, "-J", str(out)], _env(perf))
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_json_rows(perf: Path, tmp_path: Path) -> None:
    """Every table row is a JSON row with the same numbers; header and totals."""
    proc, doc = _json_run(perf, tmp_path, "ar", "all_reduce", *SIZES, "-t", "2",
                          "-d", "all", "-o", "max")
    table = parse_table(proc.stdout)
    assert len(doc["rows"]) == len(table) == N_SIZES * 12
    for row, t in zip(doc["rows"], table):
        assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == \
            (t["size"], t["count"], t["type"], t["redop"], t["root"])
        for place in ("oop", "ip"):
            assert row[place]["wrong"] == t[place]["wrong"] == 0
            # the table rounds what the file keeps
            assert row[place]["time_us"] == pytest.approx(t[place]["time_us"], rel=0.01, abs=0.01)
            assert row[place]["busbw"] == pytest.approx(t[place]["busbw"], abs=0.006)
    assert doc["program"] == "hetccl-perf" and doc["collective"] == "all_reduce"
    assert doc["nranks"] == 2 and doc["threads"] == 2 and doc["memory"] == "host"
    assert doc["library"] == str(_library(perf).resolve()) or doc["library"].endswith(".so")
    assert doc["wrong"] == 0 and doc["avg_busbw"] >= 0
    # unchecked in-place placement: null, as the table's N/A
    _, doc = _json_run(perf, tmp_path, "sr", "sendrecv", "-b", "64", "-e", "64", "-t", "2",
                       "-n", "1", "-w", "0")
    assert doc["rows"][0]["ip"]["wrong"] is None and doc["rows"][0]["oop"]["wrong"] == 0


def test_json_file_that_cannot_be_written(perf: Path) -> None:
    proc = _run([str(perf), "all_reduce", "-b", "8", "-e", "8", "-J", "/nonexistent/d/x.json"],
                _env(perf))
    assert proc.returncode == 2 and "cannot write -J /nonexistent/d/x.json" in proc.stderr
    assert "# hetccl-perf" not in proc.stdout  # refused before the run


def test_progress_line(perf: Path) -> None:
    """Past --progress seconds a sweep reports on stderr (here from the
    start), stdout keeps only the table; --progress off silences it."""
    args = [str(perf), "all_reduce", "-b", "8", "-e", "64", "-f", "2", "-n", "1", "-w", "0",
            "-d", "all"]
    proc = _run(args + ["--progress", "0"], _env(perf))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hetccl-perf: all_reduce")]
    assert lines and re.fullmatch(r"hetccl-perf: all_reduce int8 sum: size 8 B done "
                                  r"\(1 of 48 rows, [\d.]+ s\)", lines[0]), proc.stderr
    assert "done (" not in proc.stdout and len(parse_table(proc.stdout)) == 48
    quiet = _run(args + ["--progress", "off"], _env(perf))
    assert quiet.returncode == 0 and "done (" not in quiet.stderr
    assert _run(args + ["--progress", "soon"], _env(perf)).returncode == 2


def test_plot(perf: Path, tmp_path: Path) -> None:
    """A PNG of two runs (a JSON file and a text table) with a line each."""
    pytest.importorskip("matplotlib")
    _, doc = _json_run(perf, tmp_path, "one", "all_reduce", "-b", "8", "-e", "1M", "-f", "8",
                       "-n", "2", "-w", "1")
    table = _run([str(perf), "all_reduce", "-b", "8", "-e", "1M", "-f", "8", "-n", "2", "-w",
                  "1", "-t", "2"], _env(perf))
    (tmp_path / "two.txt").write_text(table.stdout)
    png = tmp_path / "busbw.png"
    cmd = [sys.executable, "-m", "hetccl", "plot", str(tmp_path / "one.json"),
           str(tmp_path / "two.txt"), "--label", "1 rank", "--label", "2 ranks", "-o", str(png)]
    proc = _run(cmd, _env(perf))
    assert proc.returncode == 0, proc.stderr
    assert "2 lines from 2 files" in proc.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # a file with no rows is refused by name
    (tmp_path / "empty.txt").write_text("# nothing\n")
    proc = _run(cmd[:4] + [str(tmp_path / "empty.txt"), "-o", str(png)], _env(perf))
    assert proc.returncode == 2 and "empty.txt: no result rows" in proc.stderr


def test_bench_cpu_variants_run_the_library_they_name(perf: Path, tmp_path: Path) -> None:
    """A variant's HETCCL_LIBRARY is the library its ranks run, and the JSON
    says so per variant; a libhetccl in a variant's LD_PRELOAD, which hetccl
    run would put behind HETCCL_LIBRARY's, is refused before anything runs."""
    from bench_cpu import parse_variant
    with pytest.raises(ValueError, match="HETCCL_LIBRARY"):
        parse_variant(f"old:LD_PRELOAD={tmp_path / 'libhetccl.so'}")
    copy = tmp_path / "copy" / "libhetccl.so"
    copy.parent.mkdir()
    shutil.copyfile(_library(perf), copy)
    out = tmp_path / "b.json"
    env = _env(perf)  # its HETCCL_LIBRARY: the library a variant without one runs
    proc = _run([sys.executable, str(ROOT / "tools" / "bench_cpu.py"), "--perf", str(perf),
                 "--peer", "none", "--n", "2", "--reps", "1", "--cases", "all_reduce:1K",
                 "--variant", "new:", "--variant", f"copy:HETCCL_LIBRARY={copy}",
                 "--json", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    info = json.loads(out.read_text())["info"]
    assert info["library copy"].startswith(str(copy.resolve())), info
    assert info["library new"].startswith(str(Path(env["HETCCL_LIBRARY"]).resolve())), info
