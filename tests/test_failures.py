"""Failure is an answer (DESIGN.md): a dead peer, an abort, ranks that
disagree, a malformed knob, a foreign unique id give an NcclError with the
right ncclResult_t and a message, within a bounded time. (That nothing
leaks is test_leaks.py's.)

Every rank is a real process (multiprocessing "spawn", so each reads its own
HETCCL_* knobs). hetccl.launch gives up on the others 2 s after one rank
fails, and here ranks die on purpose, so `_run_ranks` below waits for every
rank up to its own deadline and reports each one as ok / raised / died /
hung. Each rank measures its own times and sends them back; `pytest -s`
prints them ("time to error").
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
import pytest

from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator
from rank_procs import become_another_host, can_unshare_ipc

pytestmark = pytest.mark.usefixtures("hetccl_library")

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
    os.environ.update(env)  # before the library reads its knobs
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
    ctx = multiprocessing.get_context("spawn")
    uid_hex = nccl.unique_id_to_hex(nccl.get_unique_id()) if uid == "new" else uid
    barrier = ctx.Barrier(survivors or nranks)
    procs, conns = [], []
    for rank in range(nranks):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_entry, name=f"failure-rank{rank}",
                        args=(fn, rank, nranks, uid_hex, dict(env or {}), barrier, writer,
                              args))
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


# -- 1. a dead peer ------------------------------------------------------------------

BIG = 16 << 20  # float32 elements: 64 MiB


def rank_dead_peer(rank: int, n: int, uid: str, barrier: Any, case: str,
                   victim: int) -> Outcome:
    """The victim SIGKILLs itself at the point `case` names; every survivor
    reports the error its first failing call gave, how long that call took,
    and how long ncclCommAbort then took."""
    if case == "init" and rank == victim:
        _die()
    t0 = time.monotonic()
    try:
        comm = NcclCommunicator(n, uid, rank)
    except NcclError as e:
        return _error(e, time.monotonic() - t0)
    if case == "init":  # the victim never joined: init must not succeed
        comm.abort()
        return {"kind": "ok", "s": time.monotonic() - t0}

    x, y = _arrays(BIG, 1.0, 2)
    comm.allReduce(_ptr(x), _ptr(y), BIG, F32, SUM)  # connections are up, data flows
    if y[0] != n:
        return {"kind": "wrong", "value": float(y[0])}
    got: Optional[NcclError] = None
    t0 = time.monotonic()
    try:
        if case == "allreduce":
            if rank == victim:
                _die_after(0.05)
            for _ in range(200):  # the victim dies inside one of them
                comm.allReduce(_ptr(x), _ptr(y), BIG, F32, SUM)
        elif case == "group":
            per = 4 << 20  # 16 MiB to and from every peer
            sends = _arrays(per, float(rank), n)
            recvs = _arrays(per, -1.0, n)
            if rank == victim:
                _die_after(0.05)
            for _ in range(200):
                nccl.groupStart()
                try:
                    for p in range(n):
                        if p != rank:
                            comm.send(_ptr(sends[p]), per, F32, p)
                            comm.recv(_ptr(recvs[p]), per, F32, p)
                finally:
                    nccl.groupEnd()
        elif case == "between":
            if rank == victim:
                _die()
            time.sleep(0.2)  # the victim is gone before the next call
            t0 = time.monotonic()
            comm.allReduce(_ptr(x), _ptr(y), 1024, F32, SUM)
    except NcclError as e:
        got = e
    elapsed = time.monotonic() - t0
    if got is None:
        comm.abort()
        return {"kind": "ok", "s": elapsed}
    out = _error(got, elapsed)
    # Every survivor holds its error before any of them aborts: an abort
    # closes connections, and the others would then blame the aborting rank.
    _line_up(barrier, DEAD_PEER_BOUND_S + 0.5)
    # A failed communicator stays failed: the next call gives the same answer.
    try:
        comm.allReduce(_ptr(x), _ptr(y), 16, F32, SUM)
        out["again"] = "ok"
    except NcclError as e:
        out["again"] = e.name
    t1 = time.monotonic()
    comm.abort()
    out["abort_s"] = time.monotonic() - t1
    return out


def _names_rank(message: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", message) is not None


DEAD_CASES = [(case, n, transport)
              for case in ("allreduce", "group", "between")
              for n in (2, 3, 4)
              for transport in ("shm", "socket")]


def _dead_case_param(case: str, n: int, transport: str) -> Any:
    return pytest.param(case, n, transport, id=f"{case}-n{n}-{transport}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,n,transport", [_dead_case_param(*c) for c in DEAD_CASES])
def test_dead_peer(case: str, n: int, transport: str) -> None:
    victim = n - 1 if n == 2 else 1  # n >= 3: a middle rank, with a survivor on each side
    _check_dead_peer(case, n, victim, {"HETCCL_TRANSPORT": transport}, f"{case} n={n} {transport}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "socket"])
@pytest.mark.parametrize("victim", [1, 2, 3])
def test_dead_peer_hierarchical(victim: int, transport: str) -> None:
    """Islands {0, 1} and {2, 3}: the AllReduce runs inside the islands and
    across their leaders 0 and 2 (core/hier.h). Whichever rank dies, and in
    whichever phase the others wait, every survivor fails promptly with a
    message that names the dead rank in this communicator's numbering."""
    env = {"HETCCL_TRANSPORT": transport, "HETCCL_ISLANDS": "0,0,1,1"}
    _check_dead_peer("allreduce", 4, victim, env, f"hierarchical victim {victim} {transport}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["allreduce", "group"])
@pytest.mark.parametrize("n", [2, 3])
def test_dead_peer_on_the_plane_across_hosts(case: str, n: int) -> None:
    """The data plane spanning hosts (plane/bridge.c): the victim runs as a
    host of its own, so its channels are bridged by socket, and its pid
    means nothing to the others; its lost connections must fail them, with
    its rank named, as on the engine."""
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    victim = n - 1
    env = {"HETCCL_PLANE": "on", "HETCCL_PLANE_HOSTS": "all", "T_OWN_HOST": str(victim)}
    _check_dead_peer(case, n, victim, env, f"plane across hosts {case} n={n}")


def _check_dead_peer(case: str, n: int, victim: int, env: Dict[str, str], label: str) -> None:
    results = _run_ranks(rank_dead_peer, n, case, victim, env=env, survivors=n - 1)
    assert results[victim][0] == "died" and results[victim][1] == -signal.SIGKILL, \
        results[victim]
    survivors = [r for r in range(n) if r != victim]
    wrong = []
    for r, got in zip(survivors, _ok_results(results, survivors)):
        print(f"\n[dead peer] {label}: rank {r} -> {got.get('name')} after "
              f"{got.get('s', 0):.3f} s, abort {got.get('abort_s', 0):.3f} s: "
              f"{got.get('message')!r}")
        if got["kind"] != "error":
            wrong.append(f"rank {r}: no error: {got}")
            continue
        if got["name"] not in (REMOTE, SYSTEM):
            wrong.append(f"rank {r}: {got['name']}, want {REMOTE} or {SYSTEM}")
        # A survivor may learn of the loss first from another survivor that
        # gave up on the dead rank: that one's failure note still names the
        # dead rank (both transports carry notes).
        if not _names_rank(got["message"], victim):
            wrong.append(f"rank {r}: message does not name dead rank {victim}: "
                         f"{got['message']!r}")
        if got["s"] > DEAD_PEER_BOUND_S:
            wrong.append(f"rank {r}: error after {got['s']:.1f} s > {DEAD_PEER_BOUND_S} s")
        if got["again"] != got["name"]:
            wrong.append(f"rank {r}: the next call gave {got['again']}, not {got['name']}")
        if got["abort_s"] > ABORT_RETURN_S:
            wrong.append(f"rank {r}: ncclCommAbort took {got['abort_s']:.1f} s")
    assert not wrong, "\n".join(wrong)


INIT_CONNECT_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def dead_at_init(hetccl_library: object) -> Dict[Tuple[int, str], List[Outcome]]:
    """A rank dies before ncclCommInitRank; what the others got, for every
    (n, transport), all at once (they only wait)."""
    env = {"HETCCL_CONNECT_TIMEOUT": str(INIT_CONNECT_TIMEOUT_S)}
    combos = [(n, t) for n in (2, 3, 4) for t in ("shm", "socket")]
    found: Dict[Tuple[int, str], List[Tuple[str, Any]]] = {}

    def one(n: int, t: str) -> None:
        found[(n, t)] = _run_ranks(rank_dead_peer, n, "init", n - 1,
                                   env={**env, "HETCCL_TRANSPORT": t}, survivors=n - 1)

    threads = [threading.Thread(target=one, args=c) for c in combos]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = {}
    for (n, t), results in sorted(found.items()):
        assert results[n - 1][0] == "died", results[n - 1]
        out[(n, t)] = _ok_results(results, range(n - 1))
        for r, got in enumerate(out[(n, t)]):
            print(f"\n[dead peer] init n={n} {t}: rank {r} -> {got.get('name')} after "
                  f"{got['s']:.3f} s: {got.get('message')!r}")
    return out


@pytest.mark.timeout(60)
def test_dead_peer_during_init(dead_at_init: Dict[Tuple[int, str], List[Outcome]]) -> None:
    """The others fail within the connect timeout, with a message."""
    wrong = []
    for (n, t), outs in sorted(dead_at_init.items()):
        for r, got in enumerate(outs):
            if got["kind"] != "error" or got["name"] not in (REMOTE, SYSTEM, TIMEOUT_ERR):
                wrong.append(f"n={n} {t} rank {r}: {got}")
            elif got["s"] > INIT_CONNECT_TIMEOUT_S + 3:
                wrong.append(f"n={n} {t} rank {r}: error after {got['s']:.1f} s")
            elif not got["message"].strip():
                wrong.append(f"n={n} {t} rank {r}: {got['name']} without a message")
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(60)
def test_dead_peer_during_init_names_the_missing_rank(
        dead_at_init: Dict[Tuple[int, str], List[Outcome]]) -> None:
    wrong = [f"n={n} {t} rank {r}: {got.get('message')!r}"
             for (n, t), outs in sorted(dead_at_init.items()) for r, got in enumerate(outs)
             if not _names_rank(got.get("message", ""), n - 1)]
    assert not wrong, "want the missing rank named:\n" + "\n".join(wrong)


def rank_failed_peer(rank: int, n: int, uid: str, barrier: Any) -> Outcome:
    """n = 3, rank 1 dies between ops. Rank 2 receives from rank 1 (fails:
    rank 1 is gone), then posts the receive that matches rank 0's send.
    Rank 0 sends to rank 2 only, once rank 2 has failed; rank 2 did call the
    matching receive, so rank 0 must hear of the failure too, not wait for
    HETCCL_TIMEOUT."""
    comm = NcclCommunicator(n, uid, rank)
    x, y = _arrays(BIG, 1.0, 2)
    comm.allReduce(_ptr(x), _ptr(y), 1024, F32, SUM)
    if rank == 1:
        _die()
    time.sleep(0.3)
    out: Outcome = {"kind": "ok"}
    t0 = time.monotonic()
    try:
        if rank == 2:
            try:
                comm.recv(_ptr(y), 1024, F32, 1)
            except NcclError as e:
                out["first"] = e.name
                out["first_message"] = e.message
            comm.recv(_ptr(y), BIG, F32, 0)
        else:
            time.sleep(1.0)  # rank 2 has failed by now
            t0 = time.monotonic()
            comm.send(_ptr(x), BIG, F32, 2)
    except NcclError as e:
        out = {**out, **_error(e, time.monotonic() - t0)}
    _line_up(barrier, 30)
    comm.abort()
    return out


FAILED_PEER_TIMEOUT_S = 11  # HETCCL_TIMEOUT: past the 10 s bound, so a hang shows as too slow


@pytest.mark.timeout(60)
def test_failed_peer_is_not_waited_on() -> None:
    found: Dict[str, List[Tuple[str, Any]]] = {}

    def one(t: str) -> None:
        found[t] = _run_ranks(rank_failed_peer, 3, survivors=2, timeout=40,
                              env={"HETCCL_TRANSPORT": t,
                                   "HETCCL_TIMEOUT": str(FAILED_PEER_TIMEOUT_S)})

    threads = [threading.Thread(target=one, args=(t,)) for t in ("shm", "socket")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wrong = []
    for t, results in sorted(found.items()):
        assert results[1][0] == "died", results[1]
        r0, r2 = _ok_results(results, [0, 2])
        print(f"\n[failed peer] {t}: rank 2 first {r2.get('first')}, then {r2.get('name')}; "
              f"rank 0 -> {r0.get('name')} after {r0.get('s', 0):.3f} s: {r0.get('message')!r}")
        if r2.get("first") not in (REMOTE, SYSTEM):
            wrong.append(f"{t}: rank 2's receive from dead rank 1 gave {r2.get('first')} "
                         f"({r2.get('first_message')!r})")
        if r0["kind"] != "error" or r0["name"] not in (REMOTE, SYSTEM):
            wrong.append(f"{t}: rank 0: {r0.get('name', r0['kind'])} ({r0.get('message')!r})")
        elif r0["s"] > DEAD_PEER_BOUND_S:
            wrong.append(f"{t}: rank 0: error after {r0['s']:.1f} s")
        elif not _names_rank(r0["message"], 1):  # rank 2's note carries the cause
            wrong.append(f"{t}: rank 0: the message does not name dead rank 1: "
                         f"{r0['message']!r}")
    assert not wrong, "\n".join(wrong)


# -- 2. abort from another thread ------------------------------------------------------

ABORT_AFTER_S = 0.5


def rank_abort_blocked(rank: int, n: int, uid: str, barrier: Any, what: str) -> Outcome:
    """Rank 0 blocks in a call that rank 1 never matches; another thread of
    rank 0 aborts the communicator. Rank 1 stays alive (in the barrier)
    until rank 0 is done, so only the abort can release rank 0."""
    comm = NcclCommunicator(n, uid, rank)
    if rank != 0:
        barrier.wait(20)
        comm.abort()
        return {"kind": "ok"}
    buf = np.zeros(1 << 20, dtype=np.float32)
    aborted: Dict[str, float] = {}

    def abort_later() -> None:
        time.sleep(ABORT_AFTER_S)
        aborted["at"] = time.monotonic()
        try:
            comm.abort()
            aborted["ok"] = 1.0
        except NcclError as e:
            aborted["error"] = 0.0
            aborted["message"] = e.message  # type: ignore[assignment]
        aborted["done"] = time.monotonic()

    th = threading.Thread(target=abort_later, daemon=True)
    handle = NcclCommunicator.from_handle(comm.comm)  # abort() clears comm's own handle
    th.start()
    out: Outcome = {"kind": "ok"}
    try:
        if what == "recv":
            handle.recv(_ptr(buf), buf.size, F32, 1)
        else:  # a collective rank 1 never joins
            handle.allReduce(_ptr(buf), _ptr(buf), buf.size, F32, SUM)
    except NcclError as e:
        out = _error(e, 0.0)
    returned = time.monotonic()
    th.join(10)
    barrier.wait(20)
    if "at" not in aborted:
        return {"kind": "returned before the abort", "out": out}
    out["after_abort_s"] = returned - aborted["at"]
    out["abort_call_s"] = aborted.get("done", float("inf")) - aborted["at"]
    out["abort_ok"] = "ok" in aborted
    return out


@pytest.fixture(scope="module")
def abort_results(hetccl_library: object) -> Dict[str, List[Tuple[str, Any]]]:
    """Both cases at once (rank 0 mostly waits)."""
    found: Dict[str, List[Tuple[str, Any]]] = {}
    threads = [threading.Thread(target=lambda w=w: found.__setitem__(
        w, _run_ranks(rank_abort_blocked, 2, w, timeout=30))) for w in ("recv", "allreduce")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return found


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["recv", "allreduce"])
def test_abort_unblocks_a_blocked_call(abort_results: Dict[str, List[Tuple[str, Any]]],
                                       what: str) -> None:
    got, _ = _ok_results(abort_results[what], range(2))
    print(f"\n[abort] blocked {what}: returned {got.get('after_abort_s', -1):.3f} s after "
          f"ncclCommAbort started; abort took {got.get('abort_call_s', -1):.3f} s; "
          f"{got.get('name')}: {got.get('message')!r}")
    assert got["kind"] == "error", got
    assert got["message"].strip(), got
    assert got["after_abort_s"] < 1.0, got
    assert got["abort_ok"] and got["abort_call_s"] < 1.5, got


def rank_shrink_after_failure(rank: int, n: int, uid: str, barrier: Any,
                              victims: Tuple[int, ...]) -> Outcome:
    """The victims die between two allreduces; each survivor's call fails,
    then the survivors shrink the victims away and go on working. With no
    victim, NCCL_SHRINK_ABORT on a healthy communicator takes the same
    path."""
    comm = NcclCommunicator(n, uid, rank)
    x, y = _arrays(1 << 16, float(rank + 1), 2)
    comm.allReduce(_ptr(x), _ptr(y), x.size, F32, SUM)
    if rank in victims:
        _die()
    failed: Outcome = {"kind": "ok", "name": None}
    if victims:
        time.sleep(0.2)
        try:
            comm.allReduce(_ptr(x), _ptr(y), x.size, F32, SUM)
            return {"kind": "ok-without-victim"}
        except NcclError as e:
            failed = _error(e, 0.0)
    t0 = time.monotonic()
    try:
        child = comm.commShrink(list(victims), abort=True)
    except NcclError as e:
        out = _error(e, time.monotonic() - t0)
        out["failed"] = failed
        return out
    shrink_s = time.monotonic() - t0
    sums = []
    for k in range(3):  # the new communicator works, more than once
        x[:] = rank + 1 + k
        child.allReduce(_ptr(x), _ptr(y), x.size, F32, SUM)
        sums.append(float(y[0]))
    out = {"kind": "ok", "failed": failed, "shrink_s": shrink_s, "size": child.size(),
           "rank": child.rank_id(), "sums": sums}
    child.destroy()
    comm.abort()
    return out


SHRINK_CASES = [(3, (2,)), (3, (1,)), (4, (2,)), (3, (0,)), (4, (0, 1)), (4, (1, 3)), (3, ())]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n,victims", [pytest.param(n, v, id=f"n{n}-dead{'-'.join(map(str, v))}")
                                       for n, v in SHRINK_CASES])
def test_shrink_after_failure(n: int, victims: Tuple[int, ...]) -> None:
    """ncclCommShrink(NCCL_SHRINK_ABORT) on the survivors of dead ranks
    (rank 0 among them or not) gives a working communicator of the others,
    in rank order."""
    results = _run_ranks(rank_shrink_after_failure, n, victims, survivors=n - len(victims))
    live = [r for r in range(n) if r not in victims]
    for v in victims:
        assert results[v][0] == "died", results[v]
    outs = _ok_results(results, live)
    for new_rank, (r, o) in enumerate(zip(live, outs)):
        print(f"\n[shrink] n={n} dead {victims}: rank {r} failed with "
              f"{o.get('failed', {}).get('name')}, shrink {o.get('shrink_s', 0):.3f} s -> {o}")
        assert o["kind"] == "ok", o
        if victims:
            assert o["failed"]["name"] in (REMOTE, SYSTEM), o
        assert (o["size"], o["rank"]) == (len(live), new_rank), o
        want = [float(sum(p + 1 + k for p in live)) for k in range(3)]
        assert o["sums"] == want, o


# -- 3. ranks that disagree ------------------------------------------------------------

COUNT = 4096


def _mismatch_call(comm: NcclCommunicator, rank: int, case: str, x: np.ndarray,
                   y: np.ndarray) -> None:
    """Rank 0 makes the reference call; rank 1 (and any other) differs as `case` says."""
    odd = rank != 0
    xp, yp = _ptr(x), _ptr(y)
    if case == "allreduce vs broadcast":
        if odd:
            comm.broadcast(xp, yp, COUNT, F32, 0)
        else:
            comm.allReduce(xp, yp, COUNT, F32, SUM)
    elif case == "count":
        comm.allReduce(xp, yp, COUNT // 2 if odd else COUNT, F32, SUM)
    elif case == "dtype (same size)":
        comm.allReduce(xp, yp, COUNT, nccl.NCCL_INT32 if odd else F32, SUM)
    elif case == "dtype (other size)":
        comm.allReduce(xp, yp, COUNT // 2 if odd else COUNT,
                       nccl.NCCL_FLOAT64 if odd else F32, SUM)
    elif case == "op":
        comm.allReduce(xp, yp, COUNT, F32, MAX if odd else SUM)
    elif case == "root":
        comm.broadcast(xp, yp, COUNT, F32, 1 if odd else 0)
    elif case == "reduce root":
        comm.reduce(xp, yp, COUNT, F32, SUM, 1 if odd else 0)
    else:
        raise ValueError(case)


MISMATCH_CASES = ["allreduce vs broadcast", "count", "dtype (same size)", "dtype (other size)",
                  "op", "root", "reduce root"]


def rank_mismatch(rank: int, n: int, uid: str, barrier: Any, uids: List[str],
                  cases: List[str]) -> Dict[str, Outcome]:
    """Each case on its own fresh communicator (a failed one stays failed)."""
    out: Dict[str, Outcome] = {}
    for case, case_uid in zip(cases, uids):
        comm = NcclCommunicator(n, case_uid, rank)
        x = np.full(COUNT, rank + 1, dtype=np.float32)
        y = np.zeros(COUNT, dtype=np.float32)
        t0 = time.monotonic()
        try:
            _mismatch_call(comm, rank, case, x, y)
            out[case] = {"kind": "ok", "s": time.monotonic() - t0, "y0": float(y[0])}
        except NcclError as e:
            out[case] = _error(e, time.monotonic() - t0)
        if out[case]["kind"] == "ok":
            # Its part was consistent with every message it saw; the peers
            # that caught the mismatch say so to its next call.
            t1 = time.monotonic()
            try:
                comm.allReduce(_ptr(x), _ptr(y), 1, F32, SUM)
                out[case]["next"] = {"kind": "ok", "s": time.monotonic() - t1}
            except NcclError as e:
                out[case]["next"] = _error(e, time.monotonic() - t1)
        barrier.wait(30)  # nobody aborts while a peer still waits on it
        comm.abort()
    return out


MISMATCH_TIMEOUT_S = 1  # HETCCL_TIMEOUT here: a rank left waiting ends with ncclTimeout
SAME_ROOT_CASES = [c for c in MISMATCH_CASES if "root" not in c]
ROOT_CASES = [c for c in MISMATCH_CASES if "root" in c]


MISMATCH_RUNS = [(n, t) for n in (2, 3) for t in ("shm", "socket")]
MismatchResults = Dict[Tuple[int, str], List[Dict[str, Outcome]]]


def _mismatch_param(n: int, transport: str) -> Any:
    return pytest.param(n, transport, id=f"n{n}-{transport}")


@pytest.fixture(scope="module")
def mismatch_results(hetccl_library: object) -> MismatchResults:
    """Every case for n = 2 and 3 over each transport (the rank that catches
    a mismatch tells the others through the transport's failure notes), once
    for the tests below, all at once (they mostly wait). HETCCL_TIMEOUT
    turns a hang into ncclTimeout, so a rank left waiting is reported, not a
    stuck test."""
    found: MismatchResults = {}
    errors: List[str] = []

    def one(n: int, t: str) -> None:
        env = {"HETCCL_TIMEOUT": str(MISMATCH_TIMEOUT_S), "HETCCL_TRANSPORT": t}
        uids = [nccl.unique_id_to_hex(nccl.get_unique_id()) for _ in MISMATCH_CASES]
        results = _run_ranks(rank_mismatch, n, uids, MISMATCH_CASES, env=env, timeout=60)
        try:
            found[(n, t)] = _ok_results(results, range(n))
        except AssertionError as e:
            errors.append(f"n={n} {t}: {e}")

    threads = [threading.Thread(target=one, args=run) for run in MISMATCH_RUNS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, "\n".join(errors)
    for (n, t), ranks in sorted(found.items()):
        for case in MISMATCH_CASES:
            for r, got in enumerate(ranks):
                o = got[case]
                print(f"\n[mismatch] n={n} {t} {case}: rank {r} -> {_describe(o)} after "
                      f"{o['s']:.3f} s")
    return found


def _describe(o: Outcome) -> str:
    text = f"{o.get('name', o['kind'])} ({o.get('message', o)!r})"
    if "next" in o:
        text += f", next call: {_describe(o['next'])}"
    return text


def _learned(o: Outcome) -> Outcome:
    """What the rank was told: its call's error, or, if its call completed
    (everything it saw agreed), its next call's outcome."""
    return o.get("next", o) if o["kind"] == "ok" else o


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,transport", [_mismatch_param(*r) for r in MISMATCH_RUNS])
def test_mismatch_is_detected(mismatch_results: MismatchResults, n: int,
                              transport: str) -> None:
    """Different operation, count, dtype or op: no rank succeeds, and the rank
    that receives the odd message gets ncclInvalidUsage naming the mismatch."""
    wrong = []
    for case in SAME_ROOT_CASES:
        outs = [got[case] for got in mismatch_results[(n, transport)]]
        if any(o["kind"] != "error" for o in outs):
            wrong.append(f"{case}: a rank succeeded: {[_describe(o) for o in outs]}")
        hits = [o for o in outs if o.get("name") == INVALID_USAGE
                and "different operation" in o["message"]]
        if not hits:
            wrong.append(f"{case}: no rank got {INVALID_USAGE}: {[_describe(o) for o in outs]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,transport", [_mismatch_param(*r) for r in MISMATCH_RUNS])
def test_mismatch_every_rank_gets_invalid_usage(
        mismatch_results: MismatchResults, n: int, transport: str) -> None:
    """The rank that catches it tells the others why (docs/errors.md): each
    gets ncclInvalidUsage naming the two ranks, not a bare ncclRemoteError."""
    wrong = [f"{case}: rank {r}: {_describe(got[case])}"
             for case in SAME_ROOT_CASES
             for r, got in enumerate(mismatch_results[(n, transport)])
             if got[case].get("name") != INVALID_USAGE
             or "called different operations" not in got[case]["message"]]
    assert not wrong, "want ncclInvalidUsage on every rank:\n" + "\n".join(wrong)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,transport", [_mismatch_param(*r) for r in MISMATCH_RUNS])
def test_root_mismatch_is_an_error(mismatch_results: MismatchResults, n: int,
                                   transport: str) -> None:
    """Ranks naming different roots: at least one rank fails in the call
    itself, naming both roots; a rank whose part completed (all it saw
    agreed, e.g. a reduce leaf) gets ncclInvalidUsage from its next call.
    No rank is left with a silent success."""
    wrong = []
    for case in ROOT_CASES:
        outs = [got[case] for got in mismatch_results[(n, transport)]]
        if not any(o["kind"] == "error" and o.get("name") == INVALID_USAGE and
                   "root" in o["message"] for o in outs):
            wrong.append(f"{case}: no rank failed in the call naming the roots: "
                         f"{[_describe(o) for o in outs]}")
        wrong += [f"{case}: rank {r}: {_describe(o)}" for r, o in enumerate(outs)
                  if _learned(o).get("name") != INVALID_USAGE]
    assert not wrong, "want ncclInvalidUsage on every rank:\n" + "\n".join(wrong)


def rank_mismatch_unchecked(rank: int, n: int, uid: str, barrier: Any) -> Outcome:
    comm = NcclCommunicator(n, uid, rank)
    x = np.full(COUNT, rank + 1, dtype=np.float32)
    y = np.zeros(COUNT, dtype=np.float32)
    _mismatch_call(comm, rank, "op", x, y)  # sum vs max, same bytes: goes through
    comm.destroy()
    return {"kind": "ok", "y0": float(y[0])}


@pytest.mark.timeout(60)
def test_mismatch_check_can_be_turned_off() -> None:
    results = _run_ranks(rank_mismatch_unchecked, 2, env={"HETCCL_CHECK_MISMATCH": "0",
                                                          "HETCCL_TIMEOUT": "10"}, timeout=30)
    for got in _ok_results(results, range(2)):
        assert got["kind"] == "ok"
        assert got["y0"] in (2.0, 3.0), got  # max(1, 2) or 1 + 2, whichever rank reduced


# -- 4. malformed knobs -------------------------------------------------------------------

BAD_KNOBS = [("HETCCL_TIMEOUT", "abc"), ("HETCCL_SHM_SLOTS", "1"),
             ("HETCCL_TRANSPORT", "bogus"), ("HETCCL_CONNECT_TIMEOUT", "0"),
             ("HETCCL_SOCKET_CHUNK", "12Q")]


def rank_bad_knob(rank: int, n: int, uid: str, barrier: Any,
                  var: str) -> Dict[str, Outcome]:
    out: Dict[str, Outcome] = {}
    try:
        own = nccl.get_unique_id()
        out["get_unique_id"] = {"kind": "ok"}
    except NcclError as e:
        own = None
        out["get_unique_id"] = _error(e, 0.0)
    # nranks 1 with its own id when it has one, else the launcher's id of 2
    # ranks (the other is the same knob, failing alike, never joining)
    t0 = time.monotonic()
    try:
        if own is not None:
            NcclCommunicator(1, own, 0).destroy()
        else:
            NcclCommunicator(n, uid, rank).destroy()
        out["init"] = {"kind": "ok"}
    except NcclError as e:
        out["init"] = _error(e, time.monotonic() - t0)
    return out


@pytest.mark.timeout(60)
def test_malformed_knobs() -> None:
    found: Dict[str, List[Tuple[str, Any]]] = {}

    def one(var: str, value: str) -> None:
        found[var] = _run_ranks(rank_bad_knob, 1, var, env={var: value}, timeout=30)

    threads = [threading.Thread(target=one, args=kv) for kv in BAD_KNOBS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wrong = []
    for var, value in BAD_KNOBS:
        got = _ok_results(found[var], [0])[0]
        print(f"\n[knob] {var}={value}: get_unique_id -> {got['get_unique_id']}, "
              f"init -> {got['init']}")
        init = got["init"]
        if init["kind"] != "error" or init["name"] != INVALID_ARGUMENT:
            wrong.append(f"{var}={value}: init gave {init}, want {INVALID_ARGUMENT}")
        elif var not in init["message"]:
            wrong.append(f"{var}={value}: init message does not name it: {init['message']!r}")
        uid = got["get_unique_id"]
        if uid["kind"] == "error" and (uid["name"] != INVALID_ARGUMENT
                                       or var not in uid["message"]):
            wrong.append(f"{var}={value}: get_unique_id gave {uid}")
    assert not wrong, "\n".join(wrong)


# -- 5. nothing leaks: test_leaks.py ----------------------------------------------------


# -- 6. a unique id from another job ------------------------------------------------------

# Long enough that job A's ranks, started 0.5 s after job B's root, reach
# that root before it gives up even when Python starts slowly (a loaded
# machine took over 3 s: they then met a closed port, not the refusal).
FOREIGN_CONNECT_TIMEOUT_S = 6


def _with_wrong_secret(uid_hex: str) -> str:
    raw = bytearray(bytes.fromhex(uid_hex))
    assert raw[:8] == b"HETCCLID"
    for i in range(16, 24):  # id layout: magic[8], version, flags, secret (u64), root address
        raw[i] ^= 0x5A
    return raw.hex()


def rank_foreign_id(rank: int, n: int, uid: str, barrier: Any,
                    plan: List[Tuple[str, int, int, float]]) -> Outcome:
    """plan[rank] = (unique id, nranks, rank, delay before init)."""
    their_uid, nranks, as_rank, delay = plan[rank]
    time.sleep(delay)
    t0 = time.monotonic()
    try:
        comm = NcclCommunicator(nranks, their_uid, as_rank)
    except NcclError as e:
        return _error(e, time.monotonic() - t0)
    comm.abort()
    return {"kind": "ok", "s": time.monotonic() - t0}


@pytest.fixture(scope="module")
def foreign_id_results(hetccl_library: object) -> List[Outcome]:
    env = {"HETCCL_CONNECT_TIMEOUT": str(FOREIGN_CONNECT_TIMEOUT_S)}
    job_b = nccl.unique_id_to_hex(nccl.get_unique_id())
    forged = _with_wrong_secret(nccl.unique_id_to_hex(nccl.get_unique_id()))
    plan = [
        (job_b, 2, 0, 0.0),    # job B's rank 0 joins; its rank 1 never comes
        (job_b, 3, 0, 0.5),    # job A (3 ranks) uses B's id: wrong shape, and rank 0 again
        (job_b, 3, 1, 0.5),
        (forged, 2, 0, 0.0),   # job C: the right magic, a wrong secret
        (forged, 2, 1, 0.0),
    ]
    results = _run_ranks(rank_foreign_id, len(plan), plan, env=env, uid=None, timeout=30)
    outs = _ok_results(results, range(len(plan)))
    for r, got in enumerate(outs):
        print(f"\n[foreign id] process {r} (nranks, rank) {plan[r][1:3]}: "
              f"{got.get('name', got['kind'])} after {got['s']:.3f} s: {got.get('message')!r}")
    return outs


@pytest.mark.timeout(60)
def test_unique_id_of_another_job(foreign_id_results: List[Outcome]) -> None:
    """Job A uses job B's id while B's root waits; job C forges an id with a
    wrong secret: every init fails within the connect timeout, with a message."""
    wrong = []
    for r, got in enumerate(foreign_id_results):
        if got["kind"] != "error":
            wrong.append(f"process {r}: init succeeded with a foreign id")
        elif got["s"] > FOREIGN_CONNECT_TIMEOUT_S + 3:
            wrong.append(f"process {r}: error after {got['s']:.1f} s")
        elif not got["message"].strip():
            wrong.append(f"process {r}: {got['name']} without a message")
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(60)
def test_unique_id_of_another_job_says_why(foreign_id_results: List[Outcome]) -> None:
    """Processes 1-4 were dropped by the root: their message must say that the
    unique id (or the shape) does not match, not just that a socket closed."""
    wrong = [f"process {r}: {got.get('message')!r}"
             for r, got in enumerate(foreign_id_results) if r > 0
             and not re.search(r"unique id|secret|nranks", got.get("message", ""))]
    assert not wrong, "want the reason in the message:\n" + "\n".join(wrong)
