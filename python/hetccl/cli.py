"""The `hetccl` command (also `python -m hetccl`).

  hetccl info [--ranks N]           library, versions, exported API, device runtimes
                                    and vendor libraries found, what each transport
                                    would choose here for N ranks on this host, every
                                    knob (status 1 when a knob's value is refused)
  hetccl info --cflags | --libs     compiler / linker flags for a C program using
                                    nccl.h and hetccl.h with libhetccl.so
  hetccl run -n N [--timeout S] [--tag-output] -- CMD ARGS...
                                    N ranks of CMD on this host, libhetccl.so preloaded
  hetccl run --launcher mpirun|srun|torchrun -n N [--hosts H1,H2] [--dry-run] -- CMD
                                    N ranks across hosts through that launcher
  hetccl rank -- CMD                one rank under a launcher: rank and unique id from
                                    its environment, then CMD as under `hetccl run`
  hetccl demo [-n N]                a checked multi-rank job (hetccl.demo); under a
                                    launcher, one rank of the launched job
  hetccl perf ARGS...               the hetccl-perf benchmark (tools/perf); also
                                    installed as the command hetccl-perf
  hetccl plot FILE... -o PNG        busbw against size of hetccl-perf results
  hetccl trace OUT.json FILE|DIR|GLOB...
                                    merge HETCCL_TRACE's per-rank files into one Chrome
                                    trace (Perfetto), and sum each rank's time per phase
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import __version__, _lib, delegate
from .elfsyms import nccl_api_symbols


def _version_text(code: int) -> str:
    major, rest = divmod(code, 10000) if code >= 10000 else divmod(code, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def knobs() -> List[Tuple[str, str, str, str, str]]:
    """(name, type, default, value, help) of every knob, from the library."""
    L, ffi = _lib.lib(), _lib.ffi
    out = []
    fields = [ffi.new("const char **") for _ in range(5)]
    for i in range(L.hetcclKnobCount()):
        if L.hetcclKnobInfo(i, *fields) != 0:
            continue
        out.append(tuple(ffi.string(f[0]).decode() if f[0] != ffi.NULL else ""
                         for f in fields))
    return out  # type: ignore[return-value]


def _text(ptr: Any) -> str:
    return _lib.ffi.string(ptr).decode(errors="replace") if ptr != _lib.ffi.NULL else ""


def _backends(count: Callable[[], int], info: Callable[..., int]) -> List[Tuple[str, int, str]]:
    """(name, number, detail) rows of hetcclRuntimeInfo / hetcclVendorInfo
    (same shape: index, name, an int, detail)."""
    ffi = _lib.ffi
    name, detail, number = ffi.new("const char **"), ffi.new("const char **"), ffi.new("int *")
    return [(_text(name[0]), int(number[0]), _text(detail[0]))
            for i in range(count()) if info(i, name, number, detail) == 0]


def runtimes() -> List[Tuple[str, bool, str]]:
    """(name, available, detail) of every device runtime: the files it
    loaded and the devices it sees, or why it could not be loaded."""
    L = _lib.lib()
    return [(n, bool(a), d) for n, a, d in _backends(L.hetcclRuntimeCount, L.hetcclRuntimeInfo)]


def vendors() -> List[Tuple[str, int, str]]:
    """(name, version or 0, file or why not) of every vendor library."""
    L = _lib.lib()
    return _backends(L.hetcclVendorCount, L.hetcclVendorInfo)


def transport_choices(local_ranks: int) -> List[Tuple[str, str]]:
    """(transport, what it would choose on this host for a communicator of
    `local_ranks` ranks here, knobs included) for each transport that says
    (hetcclTransportHostInfo; shm: single copy and the receive helper)."""
    L, ffi = _lib.lib(), _lib.ffi
    name, text = ffi.new("const char **"), ffi.new("const char **")
    out = []
    for i in range(L.hetcclTransportCount()):
        if L.hetcclTransportHostInfo(i, local_ranks, name, text) == 0 and ffi.string(text[0]):
            out.append((ffi.string(name[0]).decode(), ffi.string(text[0]).decode()))
    return out


def build_flags(cflags: bool, libs: bool) -> str:
    """What a C build needs: -I for the headers; -L, -l and an rpath for
    the library this package loads."""
    out = []
    if cflags:
        out.append(f"-I{_lib.include_dir()}")
    if libs:
        lib = _lib.library_path()
        name = lib.name[3:].split(".so")[0] if lib.name.startswith("lib") else "hetccl"
        out += [f"-L{lib.parent}", f"-Wl,-rpath,{lib.parent}", f"-l{name}"]
    return " ".join(out)


def _knob_problem() -> str:
    """hetcclKnobsCheck's complaint about the environment's knobs, or ""."""
    from .errors import last_error

    return last_error() if _lib.lib().hetcclKnobsCheck() != 0 else ""


def cmd_info(args: argparse.Namespace) -> int:
    from .nccl import get_version

    if args.cflags or args.libs:
        print(build_flags(args.cflags, args.libs))
        return 0
    if args.ranks < 1:
        print(f"hetccl info: --ranks {args.ranks}: at least 1", file=sys.stderr)
        return 2
    path = _lib.loaded_path()
    L, ffi = _lib.lib(), _lib.ffi
    version = get_version()
    print(f"hetccl {ffi.string(L.hetcclVersionString()).decode()} "
          f"(python package {__version__})")
    print(f"library: {path}")
    print(f"NCCL API version: {_version_text(version)} ({version})")
    print(f"exported NCCL API symbols: {len(nccl_api_symbols(path))} (nccl* and pnccl*)")
    print("device runtimes (loaded here to ask; a rank loads only its own):")
    for name, available, detail in runtimes():
        print(f"  {name:<5} {'available' if available else 'unavailable':<12} {detail}")
    print("vendor libraries:")
    for name, vcode, detail in vendors():
        state = f"{_version_text(vcode)} ({vcode})" if vcode else "not loaded"
        print(f"  {name:<5} {state:<12} {detail}")
    print(f"transports on this host, for a communicator of {args.ranks} ranks here "
          "(--ranks):")
    for name, text in transport_choices(args.ranks):
        print(f"  {name:<6} " + "\n         ".join(text.split("; ")))
    _print_launchers()
    table = knobs()
    problem = _knob_problem()
    bad = problem.split("=", 1)[0] if problem else ""
    print(f"knobs: {len(table)} (environment variables; value '' = unset)")
    width = max((len(k[0]) for k in table), default=0)
    for name, kind, default, value, help_text in table:
        kind, _, words = kind.partition(":")  # "enum:auto|shm|..." lists the allowed words
        flag = "  <- INVALID" if name == bad else ""
        print(f"  {name:<{width}}  {kind.lower():<4}  default={default!r:<8} "
              f"value={value!r}{flag}")
        if words:
            print(f"  {'':<{width}}  one of: {', '.join(words.split('|'))}")
        print(f"  {'':<{width}}  {help_text}")
    if problem:
        sys.stdout.flush()
        print(f"hetccl info: invalid knob: {problem}; a communicator's init refuses it",
              file=sys.stderr)
        return 1
    return 0


def _print_launchers() -> None:
    """The launcher table of hetccl.discovery and what it finds here."""
    from . import discovery

    print("launchers (hetccl.discovery; first match wins; variables: rank, size, local rank):")
    for l in discovery.LAUNCHERS:
        fields = [" or ".join(f) for f in (l.rank, l.size, l.local_rank) if f]
        print(f"  {l.name:<9} {', '.join(fields)}")
    try:
        info = discovery.discover()
        print(f"  this process: {info.describe() if info else 'not launched'}")
    except discovery.LaunchEnvError as e:
        print(f"  this process: {e}")
    print("launcher knobs (read by the Python package):")
    for name, default, help_text in discovery.KNOBS:
        print(f"  {name:<20} default={default!r:<8} value={os.environ.get(name, '')!r}")
        print(f"  {'':<20} {help_text}")


def _split_command(cmd: Sequence[str]) -> List[str]:
    cmd = list(cmd)
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def cmd_run(args: argparse.Namespace) -> int:
    from .launcher import run_command

    cmd = _split_command(args.cmd)
    if args.launcher:
        return _run_delegated(args, cmd)
    if args.dry_run:
        print("hetccl run: --dry-run shows a --launcher's command", file=sys.stderr)
        return 2
    if not cmd:
        print("hetccl run: no command (hetccl run -n N -- CMD ARGS...)", file=sys.stderr)
        return 2
    return run_command(cmd, args.n, timeout=args.timeout, preload=not args.no_preload,
                       bind=not args.no_bind, tag_output=args.tag_output)


def _run_delegated(args: argparse.Namespace, cmd: List[str]) -> int:
    from . import delegate

    try:
        argv, add = delegate.build(delegate.options_from(args), cmd)
    except delegate.DelegateError as e:
        print(f"hetccl run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(delegate.show(argv, add))
        return 0
    return delegate.run(argv, add, args.timeout)


def cmd_rank(args: argparse.Namespace) -> int:
    from .delegate import rank_main

    cmd = _split_command(args.cmd)
    if not cmd:
        print("hetccl rank: no command (hetccl rank -- CMD ARGS...)", file=sys.stderr)
        return 2
    return rank_main(cmd, preload=not args.no_preload)


def cmd_demo(args: argparse.Namespace) -> int:
    """N ranks of hetccl.demo; under a launcher (its rank variables set),
    this process is one rank of the launched job instead."""
    from . import demo
    from .discovery import LaunchEnvError, discover
    from .launcher import run_command

    try:
        info = discover()
    except LaunchEnvError as e:
        print(f"hetccl demo: {e}", file=sys.stderr)
        return 2
    if info is not None:
        if args.n is not None and args.n != info.size:
            print(f"hetccl demo: -n {args.n} ignored: this is rank {info.rank} of the "
                  f"{info.size} that {info.launcher} launched", file=sys.stderr)
        return demo.main(["--count", str(args.count)])
    cmd = [sys.executable, "-m", "hetccl.demo", "--count", str(args.count)]
    return run_command(cmd, 2 if args.n is None else args.n, timeout=args.timeout)


def find_perf() -> Optional[Path]:
    """hetccl-perf: in this package, in a build tree of the source checkout,
    then on PATH."""
    pkg = Path(__file__).resolve().parent
    inside = pkg / "hetccl-perf"
    if inside.is_file():
        return inside
    repo = pkg.parent.parent
    built = [p for p in repo.glob("build*/tools/perf/hetccl-perf") if p.is_file()]
    built += [p for p in Path.cwd().glob("build*/tools/perf/hetccl-perf") if p.is_file()]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    found = shutil.which("hetccl-perf")
    return Path(found) if found else None


def exec_perf(args: Sequence[str], name: str = "hetccl perf") -> int:
    """Replace this process with hetccl-perf ARGS, told which library to
    load (this package's); 2 when the program is not there."""
    perf = find_perf()
    if perf is None:
        print(f"{name}: no hetccl-perf program found (build tools/perf with meson)",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("HETCCL_PERF_LIB", str(_lib.library_path()))
    sys.stdout.flush()
    os.execve(str(perf), [str(perf), *args], env)
    return 0  # not reached


def cmd_perf(args: argparse.Namespace) -> int:
    return exec_perf(_split_command(args.args))


def perf_main() -> int:
    """The `hetccl-perf` command pip installs: the program of this package
    (which sits beside libhetccl.so, not on PATH)."""
    try:
        return exec_perf(sys.argv[1:], "hetccl-perf")
    except OSError as e:
        print(f"hetccl-perf: {e}", file=sys.stderr)
        return 1


def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import PlotError, plot

    try:
        n = plot([Path(f) for f in args.files], Path(args.output), labels=args.label or None,
                 placement=args.placement, title=args.title)
    except PlotError as e:
        print(f"hetccl plot: {e}", file=sys.stderr)
        return 2
    print(f"hetccl plot: {n} lines from {len(args.files)} files -> {args.output}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    import json

    from .trace import TraceError, expand, merge, summary, summary_table

    out = Path(args.output)
    try:
        files = expand(args.files, exclude=out)
        doc = merge(files)
    except TraceError as e:
        print(f"hetccl trace: {e}", file=sys.stderr)
        return 2
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    for w in doc["otherData"]["warnings"]:
        print(f"hetccl trace: warning: {w}", file=sys.stderr)
    ranks = doc["otherData"]["ranks"]
    print(f"hetccl trace: {len(files)} files, {len(ranks)} ranks -> {out} "
          f"(open it in https://ui.perfetto.dev or chrome://tracing)")
    dropped = doc["otherData"]["dropped_events"]
    if dropped:
        print(f"# {dropped} events dropped: buffers full (raise HETCCL_TRACE_EVENTS)")
    if not args.quiet:
        print(summary_table(summary(doc)))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetccl", description="hetccl: the NCCL API for "
                                "mixed-vendor and CPU ranks")
    p.add_argument("--version", action="version", version=f"hetccl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="library, versions and every knob; status 1 when a "
                          "knob's value is refused")
    info.add_argument("--cflags", action="store_true",
                      help="print the compiler flags for nccl.h and hetccl.h, and nothing else")
    info.add_argument("--libs", action="store_true",
                      help="print the linker flags for libhetccl.so, and nothing else")
    info.add_argument("--ranks", type=int, default=2, metavar="N",
                      help="ranks of one communicator on this host, for what the transports "
                      "would choose (default 2)")
    info.set_defaults(fn=cmd_info)

    run = sub.add_parser("run", help="start N ranks of a command with libhetccl.so preloaded: "
                         "on this host, or across hosts through --launcher")
    run.add_argument("-n", type=_positive_int, default=2, help="number of processes (default 2)")
    run.add_argument("--timeout", type=_positive_float, default=None,
                     help="seconds before every rank is killed (exit status 124)")
    run.add_argument("--tag-output", action="store_true",
                     help="each line of the ranks' output behind its rank, as mpirun's "
                          "--tag-output: [1,RANK]<stdout>: or [1,RANK]<stderr>:; lines are "
                          "read through pipes and never spliced")
    run.add_argument("--no-bind", action="store_true",
                     help="do not pin each process to CPUs of its own (an equal block each, when there are enough)")
    run.add_argument("--no-preload", action="store_true",
                     help="do not put libhetccl.so in LD_PRELOAD")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    delegate.add_arguments(run)
    run.set_defaults(fn=cmd_run)

    rank = sub.add_parser("rank", help="one rank under mpirun, srun or torchrun: discover "
                          "the rank, fetch the unique id, run CMD with HETCCL_LAUNCH_*")
    rank.add_argument("--no-preload", action="store_true",
                      help="do not put libhetccl.so in LD_PRELOAD")
    rank.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    rank.set_defaults(fn=cmd_rank)

    demo = sub.add_parser("demo", help="a checked allreduce/allgather/broadcast job on N ranks")
    demo.add_argument("-n", type=_positive_int, default=None,
                      help="number of ranks (default 2; under a launcher, its ranks)")
    demo.add_argument("--count", type=_positive_int, default=1 << 20,
                      help="elements per buffer")
    demo.add_argument("--timeout", type=_positive_float, default=300.0,
                      help="seconds before every rank is killed (default 300)")
    demo.set_defaults(fn=cmd_demo)

    perf = sub.add_parser("perf", help="run hetccl-perf (nccl-tests style benchmarks)",
                          add_help=False)
    perf.add_argument("args", nargs=argparse.REMAINDER)
    perf.set_defaults(fn=cmd_perf)

    plot = sub.add_parser("plot", help="busbw against size of several result files, as PNG "
                          "(needs matplotlib: pip install 'hetccl[plot]')")
    plot.add_argument("files", nargs="+", help="hetccl-perf -J files, or saved text tables of "
                      "hetccl-perf / tools/peers/mpi_bench.py")
    plot.add_argument("-o", "--output", required=True, help="the PNG to write")
    plot.add_argument("--label", action="append", help="a legend label per file, in order")
    plot.add_argument("--placement", choices=("oop", "ip"), default="oop",
                      help="out-of-place (default) or in-place columns")
    plot.add_argument("--title", default=None)
    plot.set_defaults(fn=cmd_plot)

    trace = sub.add_parser("trace", help="merge the per-rank files of HETCCL_TRACE into one "
                           "Chrome trace-event file, and print each rank's time per phase")
    trace.add_argument("output", help="the merged JSON file to write")
    trace.add_argument("files", nargs="+", help="rank files, directories (their *.json) or "
                       "globs (quoted)")
    trace.add_argument("-q", "--quiet", action="store_true", help="no per-rank summary")
    trace.set_defaults(fn=cmd_trace)
    return p


def _argv_with_command(argv: List[str]) -> Tuple[List[str], Optional[List[str]]]:
    """Split `run ... -- CMD` and `perf ARGS` before argparse, which would
    read the command's own options as ours."""
    if argv[:1] == ["perf"]:
        return ["perf"], argv[1:]
    if argv[:1] in (["run"], ["rank"]) and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ours, command = _argv_with_command(list(sys.argv[1:] if argv is None else argv))
    args = parser().parse_args(ours)
    if command is not None:
        setattr(args, "cmd" if args.command in ("run", "rank") else "args", command)
    try:
        return int(args.fn(args))
    except OSError as e:
        print(f"hetccl {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
