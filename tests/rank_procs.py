"""Ranks as separate processes, for tests whose ranks must each load
libraries their own way (tests/test_cuda_engine.py, tests/test_hip.py).

The test side starts one process per rank script and collects the line
"RESULT {json}" each prints; the rank side passes rank 0's unique id to the
others through a file. Standard library only: rank scripts import it
before anything else.

A rank is a fresh interpreter running the script, or, where the suite
starts ranks from a fork server (HETCCL_LAUNCH_START=forkserver, the
default of tests/conftest.py), a process forked from that server which
runs the script as __main__: the server has imported numpy and hetccl
once, never the library, so the script loads what it loads in the order
it does, as a fresh process would, without paying the interpreter's start
and those imports again (seconds a rank under CI's emulated VMs). The
rank's environment is then the one given, as for an exec, but read at the
script's start, so the dynamic loader's own variables (LD_PRELOAD,
LD_LIBRARY_PATH) would not apply: no rank script here relies on them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple


UNSHARE_IPC = ["unshare", "--ipc"]


def run_ranks(script: Path, envs: List[Dict[str, str]], timeout: float,
              prefixes: Optional[List[List[str]]] = None,
              args: Optional[List[List[str]]] = None,
              forked: Optional[bool] = None) -> List[dict]:
    """One process of `script` per entry of envs (each a full environment),
    waited for together; each must exit 0 and print a RESULT line, whose
    dicts are returned in rank order. prefixes: per rank, a command that
    runs the rank (as `unshare --ipc`), or [] for none; args: per rank, the
    script's arguments. forked: from the fork server (True), as fresh
    interpreters (False), or as the suite starts ranks (None); forked, a
    prefix may only be UNSHARE_IPC, which the rank then does itself."""
    prefixes = prefixes or [[] for _ in envs]
    args = args or [[] for _ in envs]
    if forked is None:
        forked = os.environ.get("HETCCL_LAUNCH_START") == "forkserver"
    if forked:
        codes, outs = _run_forked(script, envs, timeout, prefixes, args)
    else:
        codes, outs = _run_exec(script, envs, timeout, prefixes, args)
    results = []
    for rank, (code, out) in enumerate(zip(codes, outs)):
        assert code == 0, f"rank {rank} failed ({code}):\n{out[-4000:]}"
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, f"rank {rank} printed no result:\n{out[-4000:]}"
        results.append(json.loads(line[-1][7:]))
    return results


def _run_exec(script: Path, envs: List[Dict[str, str]], timeout: float,
              prefixes: List[List[str]], args: List[List[str]]) -> Tuple[List[int], List[str]]:
    """Each rank a fresh interpreter: exit codes and outputs."""
    procs = [subprocess.Popen(pre + [sys.executable, str(script)] + arg, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for env, pre, arg in zip(envs, prefixes, args)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], outs


def _run_forked(script: Path, envs: List[Dict[str, str]], timeout: float,
                prefixes: List[List[str]], args: List[List[str]]) -> Tuple[List[int], List[str]]:
    """Each rank forked from the fork server, running the script as
    __main__ (module doc): exit codes and outputs. A rank still running at
    the timeout is killed and reported as such."""
    import tempfile
    from hetccl.launcher import start_context

    for pre in prefixes:
        if pre not in ([], UNSHARE_IPC):
            raise ValueError(f"a forked rank cannot run under {pre!r}: only {UNSHARE_IPC!r}")
    ctx = start_context("forkserver")
    with tempfile.TemporaryDirectory(prefix="hetccl-ranks-") as d:
        logs = [os.path.join(d, f"rank{r}.out") for r in range(len(envs))]
        procs = [ctx.Process(target=_script_rank,
                             args=(str(script), env, arg, pre == UNSHARE_IPC, log))
                 for env, pre, arg, log in zip(envs, prefixes, args, logs)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            late = [p for p in procs if p.exitcode is None]
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                    p.join()
        outs = []
        for p, log in zip(procs, logs):
            with open(log, errors="replace") as f:
                out = f.read()
            if p in late:
                out += f"\n[killed: still running after {timeout} s]"
            outs.append(out)
    return [p.exitcode for p in procs], outs


def _script_rank(script: str, env: Dict[str, str], arg: List[str], own_host: bool,
                 log: str) -> None:
    """In a forked rank: output to `log`, `env` as the environment, then
    the script as __main__ with `arg` as its arguments."""
    import runpy
    from hetccl.launcher import enter_rank_env
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    enter_rank_env(env)
    if own_host:
        become_another_host()
    sys.argv = [script, *arg]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


_UNSHARE_OK: Optional[bool] = None


def can_unshare_ipc() -> bool:
    """Whether `unshare --ipc` works here (util-linux present, and the
    right to make a namespace): how tests run a rank as a host of its own,
    hetccl's host identity including the IPC namespace."""
    global _UNSHARE_OK
    if _UNSHARE_OK is None:
        try:
            _UNSHARE_OK = subprocess.run(["unshare", "--ipc", "true"], capture_output=True,
                                         timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _UNSHARE_OK = False
    return _UNSHARE_OK


CLONE_NEWIPC = 0x08000000


def become_another_host() -> None:
    """This process into an IPC namespace of its own, as `unshare --ipc`
    would start it (call it before the first communicator)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWIPC)")


def publish(path: str, data: bytes) -> None:
    """Write data to path at once (readers never see part of it)."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def wait_for(path: str, timeout: float = 60) -> bytes:
    """The contents of path once it exists; RuntimeError after timeout s."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError(f"rank 0 wrote no unique id to {path}")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()
