"""The ib transport (RDMA verbs) on a real kernel verbs stack.

Marked `rdma`: skipped where no verbs device has an active port (CI, this
development machine). Inside a Soft-RoCE VM (the rxe-vm tool) they run
real processes with HETCCL_TRANSPORT=ib; tools/rdma/run_vm.sh is the
command (docs/transports.md):

- every collective, every type and operator, counts 0/7/1031 and a
  multi-chunk size, in place and not, on 2, 3 and 4 ranks, and with 64-byte
  pieces and 2 slots so that every message is many pieces (the checks and
  the reference are test_collectives.py's);
- ranks that disagree (operation, count, root, and a plain size mismatch
  with signatures off): ncclInvalidUsage;
- a peer killed during traffic (eager pieces, or RDMA WRITEs of
  registered buffers) or between calls: ncclRemoteError naming it,
  within a few seconds;
- 50 init/destroy cycles leave fds, threads and mappings as they were;
- two VMs joined by a wire (`--hosts 2`): send/recv and allreduce across
  them, forced (HETCCL_TRANSPORT=ib) and by default (auto), and a
  send/recv on ncclMemAlloc buffers that the CPU copies nothing of;
- zero copy: send/recv, allgather and broadcast on registered buffers
  (ncclMemAlloc, ncclCommRegister, ncclCommWindowRegister) go by RDMA WRITE with no byte copied
  by the CPU (hetcclCommCopiedBytes), nor does an allreduce (its reduce
  half lands in the receiver's bounce buffer), plain buffers still copy (a
  plain destination within HETCCL_IB_BOUNCE: the receiver's one copy),
  and a buffer freed and allocated again at the same address
  between two calls gets the right data (the registration went with it);
- the transport alone: tests/c/transport/conformance over ib (meson suite
  `rdma`), every contract of transport.h through the table, as for shm and
  socket.

One test runs where there is no device: HETCCL_TRANSPORT=ib then fails
init with ncclSystemError and a message saying why. Which transport each
pair of ranks on several hosts takes is tests/test_ib_pairs.py.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pytest

import hetccl
from c_build import configure_and_build, run_meson_test, select_tests
from conftest import active_verbs_device
from libpath import REPO_ROOT
from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator
from test_collectives import LARGE_SET, MOVE, SMALL_CHUNKS, SUM, Sweep, rank_sweep
from failing_ranks import (INVALID_USAGE, REMOTE, SYSTEM, Outcome, _die, _die_after, _error,
                           _line_up, _names_rank, _ok_results, _run_ranks, survivor_outcome,
                           survivors_wrong)
from test_disagreements import (MISMATCH_CASES, SAME_ROOT_CASES, _describe, _learned,
                                rank_mismatch)
from test_leaks import RSS_BOUND_KIB, run_leak_script

pytestmark = pytest.mark.usefixtures("hetccl_library")

IB = (("HETCCL_TRANSPORT", "ib"),)
IB_ENV = dict(IB)
F32 = nccl.NCCL_FLOAT32
DEAD_PEER_BOUND_S = 5.0
MAX_SHOWN = 40

# -- every collective ------------------------------------------------------------------

IB_SMALL_PIECES = IB + SMALL_CHUNKS + (("HETCCL_IB_CHUNK", "64"), ("HETCCL_IB_SLOTS", "2"))
IB_SWEEPS = [
    Sweep("n2-ib", 2, IB, counts=(0, 7, 1031), large=LARGE_SET),
    Sweep("n3-ib", 3, IB, counts=(0, 7, 1031),
          large=(("allreduce", "float32", SUM), ("reducescatter", "float32", SUM),
                 ("allgather", "uint8", MOVE))),
    Sweep("n4-ib", 4, IB, counts=(7,)),
    Sweep("n2-ib-small-pieces", 2, IB_SMALL_PIECES, counts=(1, 1031)),
    Sweep("n3-ib-small-pieces", 3, IB_SMALL_PIECES, counts=(1, 1031)),
]


@pytest.mark.rdma
@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", IB_SWEEPS, ids=[s.name for s in IB_SWEEPS])
def test_ib_sweep(spec: Sweep) -> None:
    t0 = time.monotonic()
    results = hetccl.launch(rank_sweep, spec.nranks, spec, env=dict(spec.env), timeout=840)
    failures = [line for _checks, lines in results for line in lines]
    checks = sum(c for c, _lines in results)
    print(f"\n[ib sweep] {spec.name}: {checks} checks in {time.monotonic() - t0:.1f} s")
    assert checks > 0
    shown = "\n".join(failures[:MAX_SHOWN])
    assert not failures, f"{len(failures)} of {checks} checks failed:\n{shown}"


# -- the transport alone ---------------------------------------------------------------

@pytest.mark.rdma
@pytest.mark.timeout(1200)
def test_ib_transport_conformance() -> None:
    """The C conformance test over ib (tests/c/transport/meson.build, suite
    'rdma'). Inside the VM, from the build run_vm.sh names
    (HETCCL_RDMA_BUILD), which it brought up to date on the host: only
    checked here (a build inside the emulator takes long). Elsewhere (a host
    with a real device), test_c_units.py's build directory, built here.
    HETCCL_IB_CONFORMANCE (comma-separated test names, e.g. ib-np2,ib-np3)
    runs only those: CI leaves out the 16 MiB-message case, which takes
    minutes under emulation."""
    given = os.environ.get("HETCCL_RDMA_BUILD")
    only = [n for n in os.environ.get("HETCCL_IB_CONFORMANCE", "").split(",") if n]
    build = Path(given) if given else REPO_ROOT / "build-tests"
    if not given:
        configure_and_build(build, ["--buildtype=debugoptimized"])
    names = select_tests(build, lambda name, suites: "rdma" in suites and
                         (not only or name.split(":")[-1] in only))
    if not names:
        pytest.skip(f"{build} has no ib conformance test: configured without -Dtests=true "
                    "or without infiniband/verbs.h")
    proc = run_meson_test(build, names, timeout_multiplier=1)
    assert proc.returncode == 0, "meson test failed:\n" + proc.stdout[-4000:]


# -- ranks that disagree ---------------------------------------------------------------

MISMATCH_ENV = {**IB_ENV, "HETCCL_TIMEOUT": "2"}


@pytest.mark.rdma
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
def test_ib_mismatch_is_invalid_usage(n: int) -> None:
    """test_disagreements' ranks over ib: every rank ends with
    ncclInvalidUsage (the receiver that sees the odd frame names both
    operations; the others learn it through the failure notes)."""
    uids = [nccl.unique_id_to_hex(nccl.get_unique_id()) for _ in MISMATCH_CASES]
    results = _run_ranks(rank_mismatch, n, uids, MISMATCH_CASES, env=MISMATCH_ENV, timeout=150)
    ranks = _ok_results(results, range(n))
    wrong = []
    for case in MISMATCH_CASES:
        outs = [got[case] for got in ranks]
        for r, o in enumerate(outs):
            print(f"\n[ib mismatch] n={n} {case}: rank {r} -> {_describe(o)}")
        wrong += [f"{case}: rank {r}: {_describe(o)}" for r, o in enumerate(outs)
                  if _learned(o).get("name") != INVALID_USAGE]
        if case in SAME_ROOT_CASES and not any(
                o.get("name") == INVALID_USAGE and "different operation" in o["message"]
                for o in outs):
            wrong.append(f"{case}: no rank named the two operations")
    assert not wrong, "\n".join(wrong)


def rank_size_mismatch(rank: int, n: int, uid: str, barrier: Any) -> Outcome:
    """Signatures off (HETCCL_CHECK_MISMATCH=0): rank 0 sends 1000 floats,
    rank 1 posts a receive of 500. Only the frame's byte count can tell."""
    comm = NcclCommunicator(n, uid, rank)
    x = np.ones(1000, dtype=np.float32)
    t0 = time.monotonic()
    try:
        if rank == 0:
            comm.send(int(x.ctypes.data), 1000, F32, 1)
            comm.allReduce(int(x.ctypes.data), int(x.ctypes.data), 1, F32, SUM)
        else:
            comm.recv(int(x.ctypes.data), 500, F32, 0)
        out: Outcome = {"kind": "ok"}
    except NcclError as e:
        out = _error(e, time.monotonic() - t0)
    barrier.wait(30)
    comm.abort()
    return out


@pytest.mark.rdma
@pytest.mark.timeout(90)
def test_ib_size_mismatch_on_the_receiver() -> None:
    env = {**MISMATCH_ENV, "HETCCL_CHECK_MISMATCH": "0"}
    sender, receiver = _ok_results(_run_ranks(rank_size_mismatch, 2, env=env), range(2))
    print(f"\n[ib size mismatch] sender: {_describe(sender)}\n  receiver: {_describe(receiver)}")
    assert receiver.get("name") == INVALID_USAGE, receiver
    assert "4000 bytes" in receiver["message"] and "2000" in receiver["message"], receiver
    assert sender["kind"] == "error", sender  # told by the receiver's note, or timed out


# -- a dead peer -----------------------------------------------------------------------

DEAD_COUNT = 1 << 18  # float32 elements: 1 MiB, several pieces


def rank_ib_dead_peer(rank: int, n: int, uid: str, barrier: Any, case: str,
                      victim: int) -> Outcome:
    """The victim SIGKILLs itself during a stream of allreduces ("during"),
    during a stream of ring send/recvs of registered buffers, which go by
    RDMA WRITE ("during-rdv"), or before the survivors' next call
    ("between")."""
    comm = NcclCommunicator(n, uid, rank)
    x = np.ones(DEAD_COUNT, dtype=np.float32)
    y = np.zeros(DEAD_COUNT, dtype=np.float32)
    xp, yp = int(x.ctypes.data), int(y.ctypes.data)
    comm.allReduce(xp, yp, DEAD_COUNT, F32, SUM)  # connections are up, data flows
    if y[0] != n:
        return {"kind": "wrong", "value": float(y[0])}
    if case == "during-rdv":
        mem = HostMemory(comm)
        xp, yp = mem.mem_alloc(ZC_BYTES), mem.mem_alloc(ZC_BYTES)
    got: Optional[NcclError] = None
    t0 = time.monotonic()
    try:
        if case.startswith("during"):
            if rank == victim:
                _die_after(0.2)
            for _ in range(100000):
                if case == "during":
                    comm.allReduce(xp, yp, DEAD_COUNT, F32, SUM)
                    continue
                nccl.groupStart()
                comm.send(xp, ZC_COUNT, F32, (rank + 1) % n)
                comm.recv(yp, ZC_COUNT, F32, (rank - 1) % n)
                nccl.groupEnd()
        else:
            if rank == victim:
                _die()
            comm.allReduce(xp, yp, 1024, F32, SUM)
    except NcclError as e:
        got = e
    return survivor_outcome(comm, got, time.monotonic() - t0, barrier, DEAD_PEER_BOUND_S + 5,
                            again=False)


@pytest.mark.rdma
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["during", "during-rdv", "between"])
@pytest.mark.parametrize("n", [2, 3])
def test_ib_dead_peer(case: str, n: int) -> None:
    check_dead_peer(case, n, IB_ENV)


def check_dead_peer(case: str, n: int, env: Dict[str, str]) -> None:
    """rank_ib_dead_peer under `env`: every survivor fails, naming the
    victim, within DEAD_PEER_BOUND_S, and aborts quickly."""
    victim = n - 1 if n == 2 else 1
    results = _run_ranks(rank_ib_dead_peer, n, case, victim, env=env, survivors=n - 1,
                         timeout=90)
    assert results[victim][0] == "died", results[victim]
    survivors = [r for r in range(n) if r != victim]
    wrong = survivors_wrong(results, survivors, victim, f"[ib dead peer] {case} n={n}",
                            bound_s=DEAD_PEER_BOUND_S)
    assert not wrong, "\n".join(wrong)


# -- connections on first use ---------------------------------------------------------

IB_CONNECTED = re.compile(r"ib rank (\d+): connected to rank (\d+) \(QP")
FIRST_USE_N = 4
FIRST_USE_COUNT = 1 << 15  # 128 KiB of float32: above HETCCL_SMALL_BYTES, a ring AllReduce


def _ib_connected(log_dir: str, rank: int) -> List[int]:
    """The peers this process's ib transport has connected so far, from
    its INFO lines (HETCCL_DEBUG_FILE=log_dir/log.%p, flushed per line)."""
    path = Path(log_dir) / f"log.{os.getpid()}"
    text = path.read_text() if path.exists() else ""
    return sorted(int(p) for me, p in IB_CONNECTED.findall(text) if int(me) == rank)


def rank_first_use(rank: int, n: int, uid: str, barrier: Any, log_dir: str) -> Dict[str, Any]:
    """Which ib pairs exist after init, a ring AllReduce and an AlltoAll,
    with every result checked against numpy."""
    t0 = time.monotonic()
    comm = NcclCommunicator(n, uid, rank)
    out: Dict[str, Any] = {"init_s": time.monotonic() - t0, "wrong": []}
    out["init"] = _ib_connected(log_dir, rank)
    x = np.arange(FIRST_USE_COUNT, dtype=np.float32) % 97 + rank
    y = np.zeros(FIRST_USE_COUNT, dtype=np.float32)
    comm.allReduce(int(x.ctypes.data), int(y.ctypes.data), FIRST_USE_COUNT, F32, SUM)
    want = n * (np.arange(FIRST_USE_COUNT, dtype=np.float32) % 97) + n * (n - 1) / 2
    if not np.array_equal(y, want):
        out["wrong"].append("allreduce")
    out["allreduce"] = _ib_connected(log_dir, rank)
    per = 1031
    a = np.concatenate([np.full(per, rank * 1000 + p, dtype=np.float32) for p in range(n)])
    b = np.full(per * n, -1, dtype=np.float32)
    comm.alltoall(int(a.ctypes.data), int(b.ctypes.data), per, F32)
    want = np.concatenate([np.full(per, p * 1000 + rank, dtype=np.float32) for p in range(n)])
    if not np.array_equal(b, want):
        out["wrong"].append("alltoall")
    out["alltoall"] = _ib_connected(log_dir, rank)
    comm.destroy()
    return out


def _first_use_env(tmp_path: Path, **extra: str) -> Dict[str, str]:
    return {**IB_ENV, "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "NET",
            "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p"), **extra}


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_connects_on_first_use(tmp_path: Path) -> None:
    """HETCCL_TRANSPORT=ib, 4 ranks, the default HETCCL_RUNTIME_CONNECT=1:
    no queue pair is connected after init, a ring AllReduce connects each
    rank to its two neighbours only, an AlltoAll to every peer."""
    n = FIRST_USE_N
    results = _ok_results(_run_ranks(rank_first_use, n, str(tmp_path), timeout=240,
                                     env=_first_use_env(tmp_path)), range(n))
    wrong = []
    for r, got in enumerate(results):
        print(f"\n[ib first use] rank {r}: init {got['init_s']:.3f} s, connected after init "
              f"{got['init']}, ring {got['allreduce']}, alltoall {got['alltoall']}")
        ring = sorted({(r - 1) % n, (r + 1) % n})
        if got["wrong"]:
            wrong.append(f"rank {r}: wrong results of {got['wrong']}")
        if got["init"]:
            wrong.append(f"rank {r}: connected to {got['init']} at init, want none")
        if got["allreduce"] != ring:
            wrong.append(f"rank {r}: connected to {got['allreduce']} after a ring AllReduce, "
                         f"want its neighbours {ring}")
        if got["alltoall"] != [p for p in range(n) if p != r]:
            wrong.append(f"rank {r}: connected to {got['alltoall']} after AlltoAll, want all")
    assert not wrong, "\n".join(wrong)


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_runtime_connect_off_connects_every_pair_at_init(tmp_path: Path) -> None:
    n = FIRST_USE_N
    env = _first_use_env(tmp_path, HETCCL_RUNTIME_CONNECT="0")
    results = _ok_results(_run_ranks(rank_first_use, n, str(tmp_path), timeout=240, env=env),
                          range(n))
    for r, got in enumerate(results):
        print(f"\n[ib at init] rank {r}: init {got['init_s']:.3f} s, connected {got['init']}")
        everyone = [p for p in range(n) if p != r]
        assert not got["wrong"], (r, got)
        assert got["init"] == everyone and got["alltoall"] == everyone, (r, got)


def rank_note_before_connect(rank: int, n: int, uid: str, barrier: Any, case: str) -> Outcome:
    """Three ranks, no pair connected after init; rank `victim` is killed
    at once. "lower": rank 0 fails on its way to the victim (rank 2: its
    listener is gone), having never connected to rank 1, which waits for
    it; rank 0's note must reach rank 1. "higher": rank 2 fails waiting
    for the victim (rank 1, its pid is gone) while rank 0's connection
    waits in its listener, unanswered; rank 2's note must reach rank 0.
    Either way the waiting rank's error names the victim, long before
    HETCCL_TIMEOUT."""
    victim = 2 if case == "lower" else 1
    failing, waiting, waits_on = (0, 1, 0) if case == "lower" else (2, 0, 2)
    comm = NcclCommunicator(n, uid, rank)
    if rank == victim:
        time.sleep(0.3)  # every rank is past init (its last bootstrap steps need the victim)
        _die()
    x = np.ones(1024, dtype=np.float32)
    out: Outcome = {"kind": "ok"}
    t0 = time.monotonic()
    try:
        if rank == waiting and case == "lower":
            comm.recv(int(x.ctypes.data), 1024, F32, waits_on)
        elif rank == waiting:
            comm.send(int(x.ctypes.data), 1024, F32, waits_on)
        elif rank == failing:
            time.sleep(1.0)  # the victim is gone; the waiting rank's connection is in
            t0 = time.monotonic()
            comm.recv(int(x.ctypes.data), 1024, F32, victim)
    except NcclError as e:
        out = _error(e, time.monotonic() - t0)
    _line_up(barrier, 30)
    comm.abort()
    return out


NOTE_TIMEOUT_S = 20  # HETCCL_TIMEOUT: a note that never comes shows as this wait


@pytest.mark.rdma
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["lower", "higher"])
def test_ib_note_reaches_a_peer_never_connected(case: str) -> None:
    env = {**IB_ENV, "HETCCL_TIMEOUT": str(NOTE_TIMEOUT_S)}
    victim, waiting = (2, 1) if case == "lower" else (1, 0)
    results = _run_ranks(rank_note_before_connect, 3, case, env=env, survivors=2, timeout=90)
    assert results[victim][0] == "died", results[victim]
    survivors = [r for r in range(3) if r != victim]
    outs = dict(zip(survivors, _ok_results(results, survivors)))
    for r, got in outs.items():
        print(f"\n[ib note] {case}: rank {r} -> {_describe(got)} after {got.get('s', 0):.3f} s")
    got = outs[waiting]
    assert got["kind"] == "error" and got["name"] in (REMOTE, SYSTEM), got
    assert got["s"] < DEAD_PEER_BOUND_S, got
    assert _names_rank(got["message"], victim), got


# -- nothing leaks ---------------------------------------------------------------------

IB_LEAK_CYCLES = 50
IB_LEAK_WARM = 5


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_no_leaks_over_init_destroy_cycles() -> None:
    """test_leaks' cycle (initAll(2) + allreduce + destroy) over ib: each
    cycle opens the device, registers memory and makes queue pairs; after
    50 the process has the fds, threads and mappings it had."""
    got = run_leak_script(IB_LEAK_CYCLES, IB_LEAK_WARM, 2, {**os.environ, **IB_ENV},
                          timeout=280)
    print(f"\n[ib leak] {IB_LEAK_CYCLES} cycles: before {got['before']}, after {got['after']}, "
          f"peak {got['peak']}")
    before, after = got["before"], got["after"]
    for what in ("fds", "threads", "maps"):
        assert after[what] <= before[what], (what, got)
    assert after["rss_kib"] <= before["rss_kib"] + RSS_BOUND_KIB, got


# -- zero copy: RDMA WRITE from registered memory -----------------------------------------

ZC_BYTES = 8 << 20   # above HETCCL_IB_ZCOPY_THRESHOLD and a collective's pipeline piece
ZC_COUNT = ZC_BYTES // 4
BOUNCED = (2 << 20) // 4  # float32s: above the threshold, within HETCCL_IB_BOUNCE (4 MiB)
PROT_RW, MAP_ANON_PRIVATE, M_MMAP_THRESHOLD = 0x3, 0x22, -3


class HostMemory:
    """ncclMemAlloc / ncclCommRegister through the C ABI, and anonymous
    mappings placed at a chosen address (libc's mmap with a hint), so that
    a buffer can be freed and made again where it was."""

    def __init__(self, comm: Optional[NcclCommunicator] = None) -> None:
        from hetccl import _lib
        self.L = ctypes.CDLL(str(_lib.loaded_path()))
        self.libc = ctypes.CDLL(None)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        # Large blocks from mmap, always: ncclMemFree then gives the pages
        # back and the next ncclMemAlloc of the size is mapped afresh.
        self.libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)
        self.comm = ctypes.c_void_p(comm.comm if comm else None)

    def mem_alloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        assert self.L.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        return int(p.value)

    def mem_free(self, ptr: int) -> None:
        assert self.L.ncclMemFree(ctypes.c_void_p(ptr)) == 0

    def map(self, nbytes: int, at: int = 0) -> int:
        p = self.libc.mmap(ctypes.c_void_p(at or None), nbytes, PROT_RW, MAP_ANON_PRIVATE, -1, 0)
        assert p not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        return int(p)

    def unmap(self, ptr: int, nbytes: int) -> None:
        assert self.libc.munmap(ctypes.c_void_p(ptr), nbytes) == 0

    def register(self, ptr: int, nbytes: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        assert self.L.ncclCommRegister(self.comm, ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes),
                                       ctypes.byref(h)) == 0
        return h

    def deregister(self, handle: ctypes.c_void_p) -> None:
        assert self.L.ncclCommDeregister(self.comm, handle) == 0

    def window(self, ptr: int, nbytes: int) -> ctypes.c_void_p:
        w = ctypes.c_void_p()
        assert self.L.ncclCommWindowRegister(self.comm, ctypes.c_void_p(ptr),
                                             ctypes.c_size_t(nbytes), ctypes.byref(w), 0) == 0
        return w

    def window_drop(self, w: ctypes.c_void_p) -> None:
        assert self.L.ncclCommWindowDeregister(self.comm, w) == 0


def f32_at(ptr: int, count: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * (4 * count)).from_address(ptr), dtype=np.float32)


def zc_pattern(rank: int, salt: int, count: int = ZC_COUNT) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + 1000 * rank + salt) % 65521).astype(np.float32)


def rank_zero_copy(rank: int, n: int, uid: str, barrier: Any) -> Dict[str, Any]:
    """Two ranks over ib, in phases: registered buffers (copy counter must
    not move; by ncclCommRegister, ncclMemAlloc and ncclCommWindowRegister),
    plain ones (it must), reductions (it must not: bounced), a registered sender
    with a plain receiver (declined beyond the bounce buffer: the eager
    path; within it, bounced: the receiver's one copy), and buffers freed and
    made again at the same address between two send/recvs."""
    mem = HostMemory()
    # Allocated before the communicator: its device context registers them
    # when it opens; the ones allocated again below, when they are made.
    s, r = mem.mem_alloc(ZC_BYTES), mem.mem_alloc(ZC_BYTES)
    comm = NcclCommunicator(n, uid, rank)
    mem.comm = ctypes.c_void_p(comm.comm)
    peer = 1 - rank
    out: Dict[str, Any] = {"wrong": [], "copied": {}, "same_address": {}}

    def ib() -> int:
        return comm.copied_bytes()["ib"]

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            out["wrong"].append(f"{what}: element {bad} is {got[bad]}, want {want[bad]}")

    def sendrecv(sp: int, rp: int, what: str, salt: int) -> None:
        f32_at(sp, ZC_COUNT)[:] = zc_pattern(rank, salt)
        f32_at(rp, ZC_COUNT)[:] = -1
        nccl.groupStart()
        comm.send(sp, ZC_COUNT, F32, peer)
        comm.recv(rp, ZC_COUNT, F32, peer)
        nccl.groupEnd()
        check(what, f32_at(rp, ZC_COUNT), zc_pattern(peer, salt))

    def counted(key: str, sp: int, rp: int, what: str, salt: int) -> None:
        """sendrecv, and the bytes ib's CPU copies for it under copied[key]."""
        before = ib()
        sendrecv(sp, rp, what, salt)
        out["copied"][key] = ib() - before

    try:
        x, y = f32_at(s, ZC_COUNT), f32_at(r, ZC_COUNT)
        half = ZC_COUNT // 2
        before = ib()
        sendrecv(s, r, "sendrecv, ncclMemAlloc", 1)
        x[:half] = zc_pattern(rank, 2, half)
        comm.allGather(s, r, half, F32)
        check("allgather", y, np.concatenate([zc_pattern(0, 2, half), zc_pattern(1, 2, half)]))
        y[:] = zc_pattern(0, 3) if rank == 0 else -1
        comm.broadcast(r, r, ZC_COUNT, F32, 0)
        check("broadcast", y, zc_pattern(0, 3))
        ms, mr = mem.map(ZC_BYTES), mem.map(ZC_BYTES)
        hs, hr = mem.register(ms, ZC_BYTES), mem.register(mr, ZC_BYTES)
        sendrecv(ms, mr, "sendrecv, ncclCommRegister", 4)
        out["copied"]["registered"] = ib() - before

        before = ib()
        px, py = np.zeros(ZC_COUNT, np.float32), np.zeros(ZC_COUNT, np.float32)
        sendrecv(int(px.ctypes.data), int(py.ctypes.data), "sendrecv, plain buffers", 5)
        out["copied"]["plain"] = ib() - before
        before = ib()
        x[:] = zc_pattern(rank, 6)
        comm.allReduce(s, r, ZC_COUNT, F32, SUM)
        check("allreduce", y, zc_pattern(0, 6) + zc_pattern(1, 6))
        out["copied"]["allreduce"] = ib() - before
        before = ib()
        if rank == 0:  # a registered source, a plain destination: the receiver declines
            x[:] = zc_pattern(0, 7)
            comm.send(s, ZC_COUNT, F32, 1)
        else:
            py[:] = -1
            comm.recv(int(py.ctypes.data), ZC_COUNT, F32, 0)
            check("registered to plain", py, zc_pattern(0, 7))
        out["copied"]["declined"] = ib() - before
        before = ib()
        if rank == 0:  # the same within HETCCL_IB_BOUNCE: it lands in the receiver's bounce buffer
            x[:BOUNCED] = zc_pattern(0, 8, BOUNCED)
            comm.send(s, BOUNCED, F32, 1)
        else:
            py[:] = -1
            comm.recv(int(py.ctypes.data), BOUNCED, F32, 0)
            check("registered to plain, bounced", py[:BOUNCED], zc_pattern(0, 8, BOUNCED))
        out["copied"]["bounced"] = ib() - before
        # A plain source, a registered destination: the receiver clears it to
        # send before it is asked (5 > the ring of 4 records). With
        # HETCCL_IB_STAGED_WRITE the sender takes an offer that is there when
        # the send starts (it waits 0.3 s for it here) and writes from its
        # staging ring; without, or where the offer comes late, the offer goes
        # unused: the sender goes eager and its pieces void it.
        before = ib()
        for i in range(5):
            if rank == 0:
                px[:] = zc_pattern(0, 20 + i)
                time.sleep(0.3)
                comm.send(int(px.ctypes.data), ZC_COUNT, F32, 1)
            else:
                y[:] = -1
                comm.recv(r, ZC_COUNT, F32, 0)
                check(f"plain to registered {i}", y, zc_pattern(0, 20 + i))
        out["copied"]["plain to registered"] = ib() - before
        counted("after unused offers", s, r, "sendrecv, registered after unused offers", 12)

        # Freed, then mapped again at the same address, plain: a registration
        # that outlived its memory would write into (and read from) the old
        # pages, which the NIC still holds, and the data would be wrong.
        mem.deregister(hs)
        mem.deregister(hr)
        mem.unmap(ms, ZC_BYTES)
        mem.unmap(mr, ZC_BYTES)
        again = (mem.map(ZC_BYTES, ms), mem.map(ZC_BYTES, mr))
        out["same_address"]["ncclCommRegister"] = again == (ms, mr)
        counted("deregistered", ms, mr,
                "sendrecv, same address after ncclCommDeregister and munmap", 8)
        hs, hr = mem.register(ms, ZC_BYTES), mem.register(mr, ZC_BYTES)
        counted("registered again", ms, mr, "sendrecv, same address registered again", 9)
        mem.deregister(hs)
        mem.deregister(hr)
        # NCCL's windows, on an engine communicator a registration (comm/window.c)
        ws, wr = mem.window(ms, ZC_BYTES), mem.window(mr, ZC_BYTES)
        counted("window", ms, mr, "sendrecv, ncclCommWindowRegister", 13)
        mem.window_drop(ws)
        mem.window_drop(wr)
        counted("window dropped", ms, mr, "sendrecv, after ncclCommWindowDeregister", 14)
        mem.unmap(ms, ZC_BYTES)
        mem.unmap(mr, ZC_BYTES)
        mem.mem_free(s)
        mem.mem_free(r)
        again = (mem.map(ZC_BYTES, s), mem.map(ZC_BYTES, r))
        out["same_address"]["ncclMemFree"] = again == (s, r)
        counted("freed", s, r, "sendrecv, same address after ncclMemFree", 10)
        mem.unmap(s, ZC_BYTES)
        mem.unmap(r, ZC_BYTES)
        s2, r2 = mem.mem_alloc(ZC_BYTES), mem.mem_alloc(ZC_BYTES)
        counted("allocated again", s2, r2, "sendrecv, ncclMemAlloc after ncclMemFree", 11)
        mem.mem_free(s2)
        mem.mem_free(r2)
    finally:
        comm.destroy()
    return out


@pytest.mark.rdma
@pytest.mark.timeout(240)
@pytest.mark.parametrize("staged", ["1", "0"], ids=["staged-writes", "no-staged-writes"])
def test_ib_zero_copy_on_registered_memory(staged: str) -> None:
    """Registered buffers: the CPU copies no payload byte on either rank
    and the data is right; the copy path still counts what it copies; a
    registration never outlives the memory it was made for; a plain source
    costs the sender's copy alone where the receiver's buffer is
    registered (staged writes), one copy each side without them."""
    check_zero_copy({**IB_ENV, "HETCCL_IB_STAGED_WRITE": staged})


def check_zero_copy(env: Dict[str, str]) -> None:
    """rank_zero_copy under `env`, and what it must find."""
    t0 = time.monotonic()
    results = _ok_results(_run_ranks(rank_zero_copy, 2, env=env, timeout=200), range(2))
    for r, got in enumerate(results):
        print(f"\n[ib zero copy] rank {r}: copied {got['copied']}, "
              f"same address {got['same_address']}, wrong {got['wrong']}")
    print(f"[ib zero copy] {time.monotonic() - t0:.1f} s")
    for r, got in enumerate(results):
        assert got["wrong"] == [], f"rank {r}: {got['wrong']}"
        c = got["copied"]
        for zero in ("registered", "registered again", "allocated again", "window"):
            assert c[zero] == 0, (r, zero, c)
        # Into the send slots and out of the receive slots: plain buffers,
        # and memory whose registration went with it.
        for copy in ("plain", "deregistered", "freed", "window dropped"):
            assert c[copy] >= 2 * ZC_BYTES, (r, copy, c)
        # reductions of registered buffers land in the bounce buffer and are
        # reduced from there: no copy
        assert c["allreduce"] == 0, (r, c)
        assert c["declined"] >= ZC_BYTES, (r, c)  # plain and beyond the bounce: eager, both copy
        # plain within the bounce buffer: the receiver's one copy out of it
        assert c["bounced"] == (0 if r == 0 else 4 * BOUNCED), (r, c)
        # a plain source to a registered destination: the sender copies each
        # message once, into its slots or its staging ring; the receiver copies
        # out of its slots only where the sender went eager (no staged writes,
        # or an offer that came after the send began: it waits 0.3 s for it)
        staged = env.get("HETCCL_IB_STAGED_WRITE", "1") == "1"
        got_plain = c["plain to registered"]
        if r == 0 or not staged:
            assert got_plain == 5 * ZC_BYTES, (r, c)
        else:
            assert got_plain <= ZC_BYTES, ("fewer than 4 of 5 took the staging ring", c)
        assert c["after unused offers"] == 0, (r, c)
        # The plain send/recvs ran on new pages at the registered ones' addresses.
        assert got["same_address"] == {"ncclCommRegister": True, "ncclMemFree": True}, got


# -- two hosts -------------------------------------------------------------------------

TWO_HOSTS = os.environ.get("RXE_VM_PEER") is not None
UID_WAIT_S = 120.0


def _shared_uid(name: str) -> str:
    """Host 0 makes the unique id and leaves it in a file of the shared
    directory; host 1 waits for it. HETCCL_RDMA_RUN names the run, so that a
    file of an earlier run is never read."""
    run = os.environ.get("HETCCL_RDMA_RUN", "default")
    path = Path(f".rdma-uid-{run}-{name}")
    if os.environ["RXE_VM_HOST"] == "0":
        tmp = path.with_suffix(".tmp")
        tmp.write_text(nccl.unique_id_to_hex(nccl.get_unique_id()))
        tmp.rename(path)
        return path.read_text()
    deadline = time.monotonic() + UID_WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"host 0 wrote no {path} in {UID_WAIT_S} s"
        time.sleep(0.2)
    return path.read_text()


def rank_two_hosts(rank: int, n: int, uid: str, barrier: Any) -> Dict[str, Any]:
    me = int(os.environ["RXE_VM_HOST"])
    comm = NcclCommunicator(2, uid, me)
    out: Dict[str, Any] = {"checked": []}
    try:
        for count in (0, 7, 1031, 1 << 20):  # 4 MiB: 32 pieces of 128 KiB
            x = (np.arange(count, dtype=np.float32) % 1000) + me
            y = np.full(count, -1, dtype=np.float32)
            nccl.groupStart()
            comm.send(int(x.ctypes.data), count, F32, 1 - me)
            comm.recv(int(y.ctypes.data), count, F32, 1 - me)
            nccl.groupEnd()
            want = (np.arange(count, dtype=np.float32) % 1000) + (1 - me)
            assert (y == want).all(), f"sendrecv {count}: wrong data"
            comm.allReduce(int(x.ctypes.data), int(y.ctypes.data), count, F32, SUM)
            want = 2 * (np.arange(count, dtype=np.float32) % 1000) + 1
            assert (y == want).all(), f"allreduce {count}: wrong data"
            out["checked"].append(count)
        mem = HostMemory(comm)  # the same across the wire from ncclMemAlloc: RDMA WRITE
        sp, rp = mem.mem_alloc(ZC_BYTES), mem.mem_alloc(ZC_BYTES)
        f32_at(sp, ZC_COUNT)[:] = zc_pattern(me, 1)
        before = comm.copied_bytes()["ib"]
        nccl.groupStart()
        comm.send(sp, ZC_COUNT, F32, 1 - me)
        comm.recv(rp, ZC_COUNT, F32, 1 - me)
        nccl.groupEnd()
        out["zero_copy"] = comm.copied_bytes()["ib"] - before
        assert np.array_equal(f32_at(rp, ZC_COUNT), zc_pattern(1 - me, 1)), "registered: wrong data"
        mem.mem_free(sp)
        mem.mem_free(rp)
    finally:
        comm.destroy()
    return out


@pytest.mark.rdma
@pytest.mark.timeout(300)
@pytest.mark.skipif(not TWO_HOSTS, reason="needs two VMs: tools/rdma/run_vm.sh --hosts 2")
@pytest.mark.parametrize("mode", ["forced", "auto"])
def test_ib_two_hosts(mode: str, tmp_path: Path) -> None:
    """One rank per VM; the pair goes over rxe0 on the wire between them."""
    uid = _shared_uid(mode)
    env = {"HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "NET",
           "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    env.update(IB_ENV if mode == "forced" else {"HETCCL_TRANSPORT": "auto"})
    results = _run_ranks(rank_two_hosts, 1, env=env, uid=uid, timeout=240)
    got = _ok_results(results, [0])[0]
    log = "".join(p.read_text() for p in tmp_path.glob("log.*"))
    print(f"\n[ib two hosts] {mode}: host {os.environ['RXE_VM_HOST']} checked {got['checked']}")
    assert got["checked"] == [0, 7, 1031, 1 << 20]
    assert got["zero_copy"] == 0, got
    assert re.search(r"ib rank \d+: connected to rank \d+ \(QP", log), log[-2000:]


# -- no device ---------------------------------------------------------------------------

def rank_init_only(rank: int, n: int, uid: str, barrier: Any,
                   knobs: Sequence[Dict[str, str]] = ()) -> Outcome:
    """Init, then abort; knobs[rank], if given, set first (knobs are read once)."""
    if knobs:
        os.environ.update(knobs[rank])
    try:
        comm = NcclCommunicator(n, uid, rank)
    except NcclError as e:
        return _error(e, 0.0)
    comm.abort()
    return {"kind": "ok"}


@pytest.mark.timeout(90)
@pytest.mark.skipif(active_verbs_device() is not None, reason="a verbs device is active here")
def test_ib_without_a_device_fails_init_with_a_reason() -> None:
    env = {**IB_ENV, "HETCCL_CONNECT_TIMEOUT": "5"}
    outs = _ok_results(_run_ranks(rank_init_only, 2, env=env), range(2))
    for o in outs:
        print(f"\n[ib without device] {_describe(o)}")
    assert any(o.get("name") == SYSTEM and "ib:" in o["message"] for o in outs), outs
    assert all(o["kind"] == "error" for o in outs), outs
