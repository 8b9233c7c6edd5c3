"""Ranks as separate processes, for tests whose ranks must each load
libraries their own way (tests/test_cuda_engine.py, tests/test_hip.py).

The test side starts one process per rank script and collects the line
"RESULT {json}" each prints; the rank side passes rank 0's unique id to the
others through a file. Standard library only: rank scripts import it
before anything else.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional


def run_ranks(script: Path, envs: List[Dict[str, str]], timeout: float,
              prefixes: Optional[List[List[str]]] = None,
              args: Optional[List[List[str]]] = None) -> List[dict]:
    """One process of `script` per entry of envs (each a full environment),
    waited for together; each must exit 0 and print a RESULT line, whose
    dicts are returned in rank order. prefixes: per rank, a command that
    runs the rank (as `unshare --ipc`), or [] for none; args: per rank, the
    script's arguments."""
    prefixes = prefixes or [[] for _ in envs]
    args = args or [[] for _ in envs]
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
    results = []
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{out[-4000:]}"
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, f"rank {rank} printed no result:\n{out[-4000:]}"
        results.append(json.loads(line[-1][7:]))
    return results


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
