"""Failure is an answer (DESIGN.md), continued: ranks that disagree
(operations, counts, types, operators, roots), a malformed knob and a
unique id from another job give an NcclError with the right ncclResult_t
and a message, on every rank, within a bounded time. The ranks' harness is
failing_ranks.py.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from failing_ranks import (F32, INVALID_ARGUMENT, INVALID_USAGE, MAX, Outcome, SUM, _error,
                           _ok_results, _ptr, _run_ranks)
from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator

pytestmark = pytest.mark.usefixtures("hetccl_library")


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
