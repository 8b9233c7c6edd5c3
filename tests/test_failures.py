"""Failure is an answer (DESIGN.md): a dead peer, or an abort, gives an
NcclError with the right ncclResult_t and a message naming the rank, within
a bounded time. Ranks that disagree, malformed knobs and foreign unique ids
are test_disagreements.py's; that nothing leaks is test_leaks.py's; the
ranks' harness is failing_ranks.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from failing_ranks import (DEAD_PEER_BOUND_S, F32, Outcome, REMOTE, SUM, SYSTEM, TIMEOUT_ERR,
                           _arrays, _die, _die_after, _error, _line_up, _names_rank, _ok_results,
                           _ptr, _run_ranks, survivor_outcome, survivors_wrong)
from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator
from rank_procs import can_unshare_ipc

pytestmark = pytest.mark.usefixtures("hetccl_library")


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
    return survivor_outcome(comm, got, time.monotonic() - t0, barrier, DEAD_PEER_BOUND_S + 0.5)



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
@pytest.mark.parametrize("form", ["leaders", "rails"])
@pytest.mark.parametrize("transport", ["shm", "socket"])
@pytest.mark.parametrize("victim", [1, 2, 3])
def test_dead_peer_hierarchical(victim: int, transport: str, form: str) -> None:
    """Islands {0, 1} and {2, 3}: the AllReduce runs inside the islands and
    across their leaders 0 and 2, or across both rails (0 and 2, 1 and 3)
    at once (hier/hier.h). Whichever rank dies, and in whichever phase the
    others wait, every survivor fails promptly with a message that names
    the dead rank in this communicator's numbering."""
    env = {"HETCCL_TRANSPORT": transport, "HETCCL_ISLANDS": "0,0,1,1"}
    env.update({"HETCCL_HIER_RAILS": "0"} if form == "leaders" else {"HETCCL_HIER_RAILS_MIN": "0"})
    _check_dead_peer("allreduce", 4, victim, env,
                     f"hierarchical {form} victim {victim} {transport}")


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


def rank_plane_gives_up(rank: int, n: int, uid: str, barrier: Any) -> Outcome:
    """Rank 0 (HETCCL_TIMEOUT=3) calls an AllReduce that rank 1, a host of
    its own (HETCCL_TIMEOUT=60), joins only 6 s later: rank 0's plane gives
    up, and rank 1, which sees no failure mark and no pid across hosts,
    must hear of it at once when it calls, not after its own 60 s."""
    os.environ["HETCCL_TIMEOUT"] = "3" if rank == 0 else "60"
    comm = NcclCommunicator(n, uid, rank)
    x, y = _arrays(1 << 20, 1.0, 2)
    comm.allReduce(_ptr(x), _ptr(y), 1 << 20, F32, SUM)  # connections are up
    if rank == 1:
        time.sleep(6)
    t0 = time.monotonic()
    try:
        comm.allReduce(_ptr(x), _ptr(y), 1 << 20, F32, SUM)
        out: Outcome = {"kind": "ok", "s": time.monotonic() - t0}
    except NcclError as e:
        out = _error(e, time.monotonic() - t0)
    _line_up(barrier, 30)
    comm.abort()
    return out


@pytest.mark.timeout(60)
def test_plane_that_gives_up_tells_the_ranks_across_hosts() -> None:
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    env = {"HETCCL_PLANE": "on", "HETCCL_PLANE_HOSTS": "all", "T_OWN_HOST": "1"}
    r0, r1 = _ok_results(_run_ranks(rank_plane_gives_up, 2, env=env, timeout=50), [0, 1])
    print(f"\n[plane gives up] rank 0 -> {r0.get('name')} after {r0.get('s', 0):.1f} s; "
          f"rank 1 -> {r1.get('name')} after {r1.get('s', 0):.3f} s: {r1.get('message')!r}")
    assert r0["kind"] == "error" and r0["name"] == TIMEOUT_ERR, r0
    assert r1["kind"] == "error" and r1["s"] < 2.0, r1
    assert _names_rank(r1["message"], 0) and "HETCCL_TIMEOUT" in r1["message"], r1


def _check_dead_peer(case: str, n: int, victim: int, env: Dict[str, str], label: str) -> None:
    results = _run_ranks(rank_dead_peer, n, case, victim, env=env, survivors=n - 1)
    assert results[victim][0] == "died" and results[victim][1] == -signal.SIGKILL, \
        results[victim]
    survivors = [r for r in range(n) if r != victim]
    wrong = survivors_wrong(results, survivors, victim, f"[dead peer] {label}", again=True)
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


def rank_left_after_its_part(rank: int, n: int, uid: str, barrier: Any) -> Outcome:
    """n = 3 on the data plane: rank 0 takes part in an AllReduce, then its
    process exits, as one whose work is done may. Ranks 1 and 2 go on with
    a send and receive of their own, rank 2 late, so that rank 1 waits on
    rank 2 (the message fills the slots) long after rank 0 has gone. Rank
    0's exit is no failure of theirs."""
    comm = NcclCommunicator(n, uid, rank)
    count = 1 << 18  # float32: 1 MiB, 256 pieces of 4 KiB through 2 slots
    x, y = _arrays(count, float(rank + 1), 2)
    comm.allReduce(_ptr(x), _ptr(y), count, F32, SUM)
    if rank == 0:
        os._exit(0)
    out: Outcome = {"kind": "ok", "allreduce": float(y[0])}
    try:
        if rank == 1:
            comm.send(_ptr(x), count, F32, 2)
        else:
            time.sleep(0.5)
            comm.recv(_ptr(y), count, F32, 1)
            out["received"] = float(y[0])
    except NcclError as e:
        out = {**out, **_error(e, 0.0)}
    _line_up(barrier, 30)
    comm.abort()
    return out


@pytest.mark.timeout(60)
def test_a_peer_that_left_after_its_part_is_no_failure() -> None:
    results = _run_ranks(rank_left_after_its_part, 3, survivors=2, timeout=40,
                         env={"HETCCL_PLANE": "on", "HETCCL_PLANE_PIECE": "4096",
                              "HETCCL_PLANE_SLOTS": "2"})
    assert results[0] == ("died", 0), results[0]
    r1, r2 = _ok_results(results, [1, 2])
    assert r1["kind"] == "ok" and r1["allreduce"] == 6.0, r1
    assert r2["kind"] == "ok" and r2["received"] == 2.0, r2


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
