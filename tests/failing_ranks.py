"""Ranks that may fail, for the failure tests (test_failures.py,
test_disagreements.py, and the ib ones that reuse them).

Every rank is a real process that reads its own HETCCL_* knobs, started as
hetccl.launch starts ranks (hetccl.launcher.start_context: spawned, or
forked from a server that never loaded the library). hetccl.launch gives
up on the others 2 s after one rank fails, and here ranks die on purpose,
so `_run_ranks` waits for every rank up to its own deadline and reports
each one as ok / raised / died / hung.
Each rank measures its own times and sends them back; `pytest -s` prints
them ("time to error"). A rank listed in its environment's T_OWN_HOST runs
as a host of its own (rank_procs.become_another_host).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.launcher import enter_rank_env, rank_process_env, start_context
from rank_procs import become_another_host

F32 = nccl.NCCL_FLOAT32
SUM, MAX = nccl.NCCL_SUM, nccl.NCCL_MAX
REMOTE, SYSTEM, TIMEOUT_ERR = "ncclRemoteError", "ncclSystemError", "ncclTimeout"
INVALID_ARGUMENT, INVALID_USAGE = "ncclInvalidArgument", "ncclInvalidUsage"
DEAD_PEER_BOUND_S = 10.0   # default knobs: a survivor learns of a dead peer within this
ABORT_RETURN_S = 2.0       # ncclCommAbort on a survivor returns within this
RUN_DEADLINE_S = 40.0      # a whole multi-rank scenario; past it every rank left is "hung"

Outcome = Dict[str, Any]   # what a rank sends back: always has "kind"


# -- running ranks that may die ------------------------------------------------------

def _rank_entry(fn: Callable[..., Any], rank: int, nranks: int, uid: Optional[str],
                env: Dict[str, str], barrier: Any, conn: Any, args: Sequence[Any]) -> None:
    enter_rank_env(env)  # before the library reads its knobs
    try:
        if str(rank) in env.get("T_OWN_HOST", "").split(","):
            become_another_host()  # a host of its own (rank_procs)
        reply: Tuple[str, Any] = ("ok", fn(rank, nranks, uid, barrier, *args))
    except BaseException:  # noqa: B902 - every failure goes back to the parent
        reply = ("raised", traceback.format_exc())
    try:
        conn.send(reply)
    except Exception:
        conn.send(("raised", traceback.format_exc()))
    conn.close()


def _run_ranks(fn: Callable[..., Any], nranks: int, *args: Any,
               env: Optional[Dict[str, str]] = None, uid: Optional[str] = "new",
               survivors: Optional[int] = None,
               timeout: float = RUN_DEADLINE_S) -> List[Tuple[str, Any]]:
    """fn(rank, nranks, uid_hex, barrier, *args) on `nranks` spawned processes.

    `uid` "new": a fresh unique id served by this process; None: no id.
    `barrier` is a multiprocessing.Barrier of `survivors` parties (default
    nranks) for the ranks to line up without the library. Returns one
    (kind, value) per rank: ("ok", result), ("raised", traceback),
    ("died", exitcode) or ("hung", None) when it outlived `timeout`."""
    ctx = start_context(preload=[fn.__module__])
    uid_hex = nccl.unique_id_to_hex(nccl.get_unique_id()) if uid == "new" else uid
    barrier = ctx.Barrier(survivors or nranks)
    procs, conns = [], []
    for rank in range(nranks):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_entry, name=f"failure-rank{rank}",
                        args=(fn, rank, nranks, uid_hex, rank_process_env(env or {}), barrier,
                              writer, args))
        p.start()
        writer.close()
        procs.append(p)
        conns.append(reader)
    out: List[Optional[Tuple[str, Any]]] = [None] * nranks
    deadline = time.monotonic() + timeout
    try:
        while any(o is None for o in out):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waiting = {}
            for r in range(nranks):
                if out[r] is None:
                    waiting[conns[r]] = r
                    waiting[procs[r].sentinel] = r
            for ready in multiprocessing.connection.wait(list(waiting), left):
                r = waiting[ready]
                if out[r] is not None:
                    continue
                try:
                    if conns[r].poll():
                        out[r] = conns[r].recv()
                        continue
                except (EOFError, OSError):
                    pass
                if ready is conns[r] or not procs[r].is_alive():
                    procs[r].join(5)
                    out[r] = ("died", procs[r].exitcode)
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                if out[r] is None:
                    out[r] = ("hung", None)
                p.kill()
            p.join(5)
    return [o if o is not None else ("hung", None) for o in out]


def _error(e: NcclError, elapsed: float) -> Outcome:
    return {"kind": "error", "name": e.name, "message": e.message, "s": elapsed}


def _ok_results(results: List[Tuple[str, Any]], ranks: Sequence[int]) -> List[Outcome]:
    bad = [f"rank {r}: {results[r][0]}: {results[r][1]}" for r in ranks
           if results[r][0] != "ok"]
    assert not bad, "\n".join(bad)
    return [results[r][1] for r in ranks]


def _line_up(barrier: Any, seconds: float) -> None:
    """Wait until every survivor holds its error, so that none aborts (and
    closes connections another would then blame it for) too soon; a rank
    that gave up waiting breaks the barrier, and the others go on."""
    try:
        barrier.wait(seconds)
    except threading.BrokenBarrierError:
        pass


def survivor_outcome(comm: nccl.NcclCommunicator, got: Optional[NcclError], elapsed: float,
                     barrier: Any, wait_s: float, again: bool = True) -> Outcome:
    """What a survivor reports once the failure reached it (or did not:
    got None): the error and how soon; then, once every survivor holds its
    error, whether the next call on the failed communicator fails the same
    way (`again`), and how long the abort took."""
    if got is None:
        comm.abort()
        return {"kind": "ok", "s": elapsed}
    out = _error(got, elapsed)
    # Every survivor holds its error before any of them aborts: an abort
    # closes connections, and the others would then blame the aborting rank.
    _line_up(barrier, wait_s)
    if again:  # a failed communicator stays failed: the next call says so
        x = np.zeros(16, dtype=np.float32)
        try:
            comm.allReduce(_ptr(x), _ptr(x), 16, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
            out["again"] = "ok"
        except NcclError as e:
            out["again"] = e.name
    t1 = time.monotonic()
    comm.abort()
    out["abort_s"] = time.monotonic() - t1
    return out


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_after(seconds: float) -> None:
    t = threading.Timer(seconds, _die)
    t.daemon = True
    t.start()


def _arrays(count: int, value: float, k: int = 1) -> List[np.ndarray]:
    return [np.full(count, value, dtype=np.float32) for _ in range(k)]


def _ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def _names_rank(message: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", message) is not None


def survivors_wrong(results: List[Tuple[str, Any]], survivors: Sequence[int], victim: int,
                    label: str, again: bool = False,
                    bound_s: float = DEAD_PEER_BOUND_S) -> List[str]:
    """What the survivors of a killed `victim` got wrong, one line each: no
    error, one other than ncclRemoteError / ncclSystemError, a message that
    does not name the victim (a survivor may learn of the loss first from
    another survivor that gave up on it: that one's failure note still
    names the victim), an error later than bound_s, an abort
    slower than ABORT_RETURN_S, and with `again` a next call that gave
    another error. Prints each survivor's outcome after `label`."""
    wrong = []
    for r, got in zip(survivors, _ok_results(results, survivors)):
        print(f"\n{label}: rank {r} -> {got.get('name')} after {got.get('s', 0):.3f} s, "
              f"abort {got.get('abort_s', 0):.3f} s: {got.get('message')!r}")
        if got["kind"] != "error":
            wrong.append(f"rank {r}: no error: {got}")
            continue
        if got["name"] not in (REMOTE, SYSTEM):
            wrong.append(f"rank {r}: {got['name']}, want {REMOTE} or {SYSTEM}")
        if not _names_rank(got["message"], victim):
            wrong.append(f"rank {r}: message does not name dead rank {victim}: "
                         f"{got['message']!r}")
        if got["s"] > bound_s:
            wrong.append(f"rank {r}: error after {got['s']:.1f} s > {bound_s} s")
        if again and got["again"] != got["name"]:
            wrong.append(f"rank {r}: the next call gave {got['again']}, not {got['name']}")
        if got["abort_s"] > ABORT_RETURN_S:
            wrong.append(f"rank {r}: ncclCommAbort took {got['abort_s']:.1f} s")
    return wrong
