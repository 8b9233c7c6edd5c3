"""Start N local ranks (docs/launching.md is the contract).

Two front ends share the environment each rank receives:

- `run_command(cmd, nranks, ...)`: N processes of a command (`hetccl run`),
  with libhetccl.so preloaded so that unmodified NCCL programs use it.
- `launch(fn, nranks, *args, ...)`: a picklable function in N fresh Python
  processes (the library reads its HETCCL_* knobs once per process, so
  every rank starts clean with its own environment); returns the per-rank
  results or raises LaunchError with the failing rank's traceback.

How `launch` starts a rank (`start_method`, else $HETCCL_LAUNCH_START):
"spawn" (the default) starts an interpreter per rank, which then imports
the function's module; "forkserver" forks each rank from one server
process that imported numpy, hetccl and the first launched function's
module once, and never loaded the library. Both give a rank this
process's environment as it is at the launch, plus the rank's variables.
Forks start in a fraction of the time where starting Python is slow (an
emulated machine: 5-10 s per rank in the Soft-RoCE VMs of CI).

This process creates the unique id, so it serves the bootstrap of the
ranks' first communicator and must outlive their init (it waits for them).
A rank's later communicators (a second hetccl.init_from_env) take ids that
rank 0 makes and serves at HETCCL_ROOT_ADDR, an address on 127.0.0.1 with
a port free at the launch (hetccl.discovery).

`run_command` also gives each rank torch.distributed's variables (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
MASTER_PORT free at the launch on every address: hetccl.ports), so that `init_process_group(...,
init_method="env://")` runs unchanged; none that the caller's environment
already sets is replaced.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import _lib
from .nccl import NcclCommunicator, get_unique_id, unique_id_to_hex
from .ports import free_ports
from .ranklines import RankLines

ENV_RANK = "HETCCL_LAUNCH_RANK"
ENV_NRANKS = "HETCCL_LAUNCH_NRANKS"
ENV_LOCAL_RANK = "HETCCL_LAUNCH_LOCAL_RANK"
ENV_ID = "HETCCL_LAUNCH_ID"
ENV_START = "HETCCL_LAUNCH_START"
ENV_ROOT = "HETCCL_ROOT_ADDR"
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT")
START_METHODS = ("spawn", "forkserver")

TIMEOUT_STATUS = 124   # exit status of `hetccl run` when --timeout expires
KILL_GRACE_S = 3.0     # SIGTERM, then SIGKILL after this long
REPORT_GRACE_S = 2.0   # after a rank fails, how long the others may still report


class LaunchError(RuntimeError):
    """A launched rank failed (raised, died, or the launch timed out).
    `rank` is the first rank that failed (None on a timeout), `details` maps
    each failed rank to its traceback or exit description."""

    def __init__(self, message: str, rank: Optional[int] = None,
                 details: Optional[Dict[int, str]] = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.details = details or {}


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    nranks: int
    local_rank: int
    unique_id: str  # 256 hex digits


def new_launch_id() -> str:
    return unique_id_to_hex(get_unique_id())


def rank_env(rank: int, nranks: int, launch_id: str) -> Dict[str, str]:
    """The HETCCL_LAUNCH_* variables of one rank (one host: local = rank)."""
    return {ENV_RANK: str(rank), ENV_NRANKS: str(nranks), ENV_LOCAL_RANK: str(rank),
            ENV_ID: launch_id}


def job_env(base: Mapping[str, str], port: int) -> Dict[str, str]:
    """What every rank of one local job shares, where `base` lacks it: the
    address where rank 0 serves the ids of later communicators."""
    return {} if ENV_ROOT in base else {ENV_ROOT: f"127.0.0.1:{port}"}


def torch_env(rank: int, nranks: int, master_port: int,
              base: Mapping[str, str]) -> Dict[str, str]:
    """torch.distributed's env:// variables of one local rank, less those
    `base` sets."""
    values = {"RANK": rank, "WORLD_SIZE": nranks, "LOCAL_RANK": rank,
              "LOCAL_WORLD_SIZE": nranks, "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": master_port}
    return {k: str(v) for k, v in values.items() if k not in base}


def start_context(method: Optional[str] = None,
                  preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """The multiprocessing context that starts rank processes: `method`, else
    $HETCCL_LAUNCH_START, else "spawn". For "forkserver", `preload` (module
    names) joins numpy and hetccl.nccl among what the server imports when
    it starts, that is at the first launch from this process; a module it
    cannot import is left to the ranks. Their processes must take their
    environment from `rank_process_env` (the server's is from when it
    started) through `enter_rank_env`."""
    name = method or os.environ.get(ENV_START) or "spawn"
    if name not in START_METHODS:
        raise ValueError(f"start method {name!r} (from {'start_method' if method else ENV_START}):"
                         f" not one of {', '.join(START_METHODS)}")
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        ctx.set_forkserver_preload(["numpy", "hetccl.nccl", *preload])
    return ctx


def rank_process_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """The whole environment of a rank process: this process's now, plus
    `extra`."""
    return {**os.environ, **extra}


def enter_rank_env(env: Mapping[str, str]) -> None:
    """In a rank process, before anything reads a knob: make `env`
    (rank_process_env's) the environment, whatever the process started
    with."""
    os.environ.clear()
    os.environ.update(env)


def launch_info() -> Optional[LaunchInfo]:
    """This process's place in a launch, or None when not launched."""
    if ENV_ID not in os.environ:
        return None
    return LaunchInfo(int(os.environ[ENV_RANK]), int(os.environ[ENV_NRANKS]),
                      int(os.environ.get(ENV_LOCAL_RANK, os.environ[ENV_RANK])),
                      os.environ[ENV_ID])


def communicator() -> NcclCommunicator:
    """This rank's communicator over every launched process; a one-rank
    communicator when the process was not launched. Each call makes a new
    one, as hetccl.init_from_env does (the two share the sequence of ids)."""
    from .discovery import init_from_env

    return init_from_env()[0].nccl


# -- processes of a command ----------------------------------------------------

def preload_env(base: Mapping[str, str]) -> Dict[str, str]:
    """`base` with libhetccl.so first in LD_PRELOAD and named by HETCCL_LIBRARY."""
    env = dict(base)
    path = str(_lib.library_path())
    env["HETCCL_LIBRARY"] = path
    others = [p for p in env.get("LD_PRELOAD", "").replace(",", " ").split() if p != path]
    shadowed = [p for p in others if os.path.basename(p).startswith("libhetccl")]
    if shadowed:  # the first one preloaded is the one the ranks run
        _say(f"LD_PRELOAD names {', '.join(shadowed)}, but the ranks run {path} "
             "(HETCCL_LIBRARY, or the package's library): to run another, set HETCCL_LIBRARY")
    env["LD_PRELOAD"] = " ".join([path, *others])
    return env


def _say(message: str) -> None:
    sys.stderr.write(f"hetccl run: {message}\n")
    sys.stderr.flush()


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _signal_all(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # each rank leads its own process group
            except ProcessLookupError:
                pass


def _stop_all(procs: Sequence[subprocess.Popen]) -> None:
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def core_binding(nranks: int) -> List[Optional[List[int]]]:
    """The CPUs each local rank is bound to: an equal block of consecutive
    ones each (the remainder to the first ranks), as mpirun's
    `--map-by slot:PE=n` would; none when there are fewer CPUs than ranks
    (the scheduler places them). Unbound ranks that poll for each other can
    start on one core and spin against each other until the kernel migrates
    one; a rank held to one core shares it with its own proxy thread, which
    moves a cross-host pair's bytes (measured on 2 x H200:
    docs/launching.md)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if nranks > len(cpus):
        return [None] * nranks
    share, extra = divmod(len(cpus), nranks)
    blocks, start = [], 0
    for rank in range(nranks):
        n = share + (1 if rank < extra else 0)
        blocks.append(cpus[start:start + n])
        start += n
    return blocks


def run_command(cmd: Sequence[str], nranks: int, timeout: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None, preload: bool = True,
                bind: bool = True, tag_output: bool = False) -> int:
    """Run N copies of `cmd`; the exit status of `hetccl run`: 0, the first
    non-zero status of a rank (128+signal when killed), or 124 on timeout.
    With `bind`, each rank is pinned to a block of CPUs of its own when there
    are enough (core_binding). With `tag_output`, the ranks' output comes
    through pipes as whole lines behind a rank tag (hetccl.ranklines);
    otherwise the ranks write to this process's stdout and stderr directly.
    A failing rank or the timeout (with the ranks still running) is named on
    stderr before the other ranks are stopped: a rank that dies by a signal
    says nothing itself, and the output the others still buffer is lost
    with them."""
    if nranks < 1:
        raise ValueError(f"the number of ranks must be at least 1, not {nranks}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"the timeout must be a positive number of seconds, not {timeout:g}")
    base = dict(os.environ if env is None else env)
    base = preload_env(base) if preload else base
    launch_id = new_launch_id()
    root_port, master_port = free_ports(2)
    base.update(job_env(base, root_port))
    procs: List[subprocess.Popen] = []
    forwarded: List[int] = []
    lines = RankLines() if tag_output else None
    out = subprocess.PIPE if tag_output else None

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        _signal_all(procs, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        cpus = core_binding(nranks) if bind else [None] * nranks
        for rank in range(nranks):
            cpu = cpus[rank]
            pin = (lambda c=cpu: os.sched_setaffinity(0, c)) if cpu is not None else None
            rank_vars = {**rank_env(rank, nranks, launch_id),
                         **torch_env(rank, nranks, master_port, base)}
            procs.append(subprocess.Popen(list(cmd), env={**base, **rank_vars},
                                          start_new_session=True, preexec_fn=pin,
                                          stdout=out, stderr=out))
            if lines is not None:
                lines.add(rank, procs[-1])
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _say(f"rank {rank} {_exit_words(code)}; stopping the other ranks")
                _stop_all(procs)
                return _status(code)
            if all(c == 0 for c in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                running = [str(r) for r, c in enumerate(codes) if c is None]
                _say(f"timeout after {timeout:g} s with rank{'s' if len(running) > 1 else ''} "
                     f"{', '.join(running)} of {nranks} still running; stopping every rank")
                _stop_all(procs)
                return TIMEOUT_STATUS
            if lines is not None:
                lines.pump(0.02)
            else:
                time.sleep(0.02)
    finally:
        if any(p.poll() is None for p in procs):
            _stop_all(procs)
        if lines is not None:
            lines.drain()
        for s, handler in old.items():
            signal.signal(s, handler)


# -- a Python function on N ranks --------------------------------------------------

def _rank_main(fn: Callable[..., Any], args: Sequence[Any], env: Dict[str, str],
               conn: multiprocessing.connection.Connection) -> None:
    enter_rank_env(env)  # before the first library call reads the knobs
    try:
        reply = (True, fn(*args))
    except BaseException:  # noqa: B902 - every failure goes back to the parent
        reply = (False, traceback.format_exc())
    try:
        conn.send(reply)
    except Exception:  # the result did not pickle
        conn.send((False, traceback.format_exc()))
    conn.close()


def _exit_words(code: Optional[int]) -> str:
    if code is not None and code < 0:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


def _describe_exit(code: Optional[int]) -> str:
    words = _exit_words(code)
    return words if code is not None and code < 0 else f"{words} without a result"


def launch(fn: Callable[..., Any], nranks: int, *args: Any, timeout: float = 300.0,
           env: Optional[Mapping[str, str]] = None,
           start_method: Optional[str] = None) -> List[Any]:
    """fn(*args) on `nranks` processes with the HETCCL_LAUNCH_* environment
    (plus `env`); returns [result of rank 0, ...]. `fn`, `args` and the
    results must pickle. start_method: "spawn" or "forkserver" (the module
    docstring), default $HETCCL_LAUNCH_START, else "spawn"."""
    if nranks < 1:
        raise ValueError("nranks must be at least 1")
    ctx = start_context(start_method, [fn.__module__])
    launch_id = new_launch_id()
    extra = dict(env or {})
    extra.update(job_env({**os.environ, **extra}, free_ports(1)[0]))
    readers: Dict[Any, int] = {}
    procs = []
    for rank in range(nranks):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, name=f"hetccl-rank{rank}",
                        args=(fn, args,
                              rank_process_env({**extra, **rank_env(rank, nranks, launch_id)}),
                              writer))
        p.start()
        writer.close()
        readers[reader] = rank
        procs.append(p)
    try:
        return _collect(procs, readers, timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(KILL_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()


def _collect(procs: List[Any], readers: Dict[Any, int], timeout: float) -> List[Any]:
    conn_of = {rank: conn for conn, rank in readers.items()}
    results: Dict[int, Any] = {}
    failures: Dict[int, str] = {}
    first: Optional[int] = None
    deadline = time.monotonic() + timeout
    while len(results) + len(failures) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            if first is not None:
                break
            pending = sorted(set(range(len(procs))) - set(results))
            raise LaunchError(f"launch timed out after {timeout:g} s; ranks still running: "
                              f"{pending}")
        running = [r for r in range(len(procs)) if r not in results and r not in failures]
        waitable = {conn_of[r]: r for r in running}
        waitable.update({procs[r].sentinel: r for r in running})
        for ready in multiprocessing.connection.wait(list(waitable), left):
            rank = waitable[ready]
            if rank in results or rank in failures:
                continue
            reply = _read(conn_of[rank])
            if reply is None:
                if ready is conn_of[rank]:
                    procs[rank].join(KILL_GRACE_S)  # closed without a reply: it is exiting
                elif procs[rank].is_alive():
                    continue
                failures[rank] = _describe_exit(procs[rank].exitcode)
            elif reply[0]:
                results[rank] = reply[1]
            else:
                failures[rank] = reply[1]
            if rank in failures and first is None:
                first = rank
                deadline = min(deadline, time.monotonic() + REPORT_GRACE_S)
    if first is None:
        return [results[r] for r in range(len(procs))]
    order = [first] + sorted(r for r in failures if r != first)
    text = "\n".join(f"--- rank {r} ---\n{failures[r]}" for r in order)
    raise LaunchError(f"rank {first} of {len(procs)} failed:\n{text}", first, failures)


def _read(conn: Any) -> Optional[Any]:
    """The rank's (ok, value) reply, or None when it closed without one."""
    try:
        if conn.poll():
            return conn.recv()
    except (EOFError, OSError):
        pass
    return None
