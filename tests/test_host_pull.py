"""The pull algorithms' pieces (docs/host-engine.md): AllReduce and
ReduceScatter reduce a block in sub-blocks (algo/pull_rs.c), and a
single-copy message that lands by plain copy moves on two cores, the
receiver reading pieces from the front while an idle sender writes pieces
from the back (transport/shm/shm_ring.c), which the pull Broadcast's root
is.

Small knobs bring small buffers to many pieces: HETCCL_PIPELINE_CHUNK caps
the sub-block, HETCCL_SHM_CHUNK sets the piece of a shared message (two
slots' payload). What would go wrong:

- a sub-block reduced out of rank order, or sent in another order than
  its reader receives it: float sums that are no longer the rank-order sum
  bit for bit, or differ between ranks (a hang or a signature error for
  the second);
- a piece of a shared message written twice, at the wrong offset or not at
  all: a broadcast that is not bit-exact (odd sizes, sizes under one
  piece, every root, in place and out of place).
"""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from test_collectives import LARGE_SET, PULL_ALL, SHM, Sweep, rank_sweep

pytestmark = pytest.mark.usefixtures("hetccl_library")

F32 = nccl.NCCL_FLOAT32
U8 = nccl.NCCL_UINT8
SUM = nccl.NCCL_SUM

# Sub-blocks of 1 KiB (256 floats), shared messages in pieces of 128 bytes.
SMALL_PIECES = (("HETCCL_PIPELINE_CHUNK", "1024"), ("HETCCL_SHM_CHUNK", "64"),
                ("HETCCL_SHM_SLOTS", "4"))
# Broadcast sizes in bytes: under one piece, one, odd ones spanning many.
BCAST_BYTES = (1, 63, 64, 127, 128, 129, 255, 1000, 4099, 65537, 300007)
# AllReduce counts (floats): one sub-block, a few, one that blocks split
# unevenly, many.
AR_COUNTS = (1, 255, 257, 4099, 100003)


def ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def floats(rank: int, count: int, salt: int) -> np.ndarray:
    """Values whose sums round: order matters for the last bit."""
    rng = np.random.default_rng(1000 * salt + rank)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(np.float32)


def rank_order_sum(xs: List[np.ndarray]) -> np.ndarray:
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = acc + x  # float32, elementwise: rank 0 + 1, then + 2, ...
    return acc


def rank_bitwise() -> Dict[str, List[str]]:
    """AllReduce and ReduceScatter of float sums, in and out of place: each
    rank's result against the rank-order sum, bit for bit; the AllReduce
    results' bytes are returned so that the test compares ranks."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    wrong: List[str] = []
    results: List[str] = []
    try:
        for salt, count in enumerate(AR_COUNTS):
            xs = [floats(r, count, salt) for r in range(n)]
            want = rank_order_sum(xs)
            for inplace in (False, True):
                out = xs[me].copy() if inplace else np.zeros(count, np.float32)
                send = out if inplace else xs[me].copy()
                comm.allReduce(ptr(send), ptr(out), count, F32, SUM)
                if out.tobytes() != want.tobytes():
                    bad = int(np.flatnonzero(out.view(np.uint32) != want.view(np.uint32))[0])
                    wrong.append(f"allreduce count {count} inplace {inplace}: element {bad} "
                                 f"{out[bad]!r}, rank-order sum {want[bad]!r}")
                results.append(out.tobytes().hex())
            # ReduceScatter: count elements per rank.
            ys = [floats(r, count * n, salt + 100) for r in range(n)]
            rs_want = rank_order_sum(ys)[me * count:(me + 1) * count]
            for inplace in (False, True):
                if inplace:
                    buf = ys[me].copy()
                    comm.reduceScatter(ptr(buf), ptr(buf[me * count:]), count, F32, SUM)
                    got = buf[me * count:(me + 1) * count]
                else:
                    got = np.zeros(count, np.float32)
                    comm.reduceScatter(ptr(ys[me]), ptr(got), count, F32, SUM)
                if got.tobytes() != rs_want.tobytes():
                    wrong.append(f"reducescatter count {count} inplace {inplace}: not the "
                                 "rank-order sum")
    finally:
        comm.destroy()
    return {"wrong": wrong, "results": results}


def rank_broadcasts() -> Dict[str, object]:
    """Every size of BCAST_BYTES from every root, in and out of place,
    bit-exact; returns what this rank's shm transport copied during the
    in-place broadcasts that it was the root of."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    wrong: List[str] = []
    root_copied = 0
    try:
        for salt, nbytes in enumerate(BCAST_BYTES):
            rng = np.random.default_rng(salt)
            data = rng.integers(0, 256, nbytes, dtype=np.uint8)
            for root in range(n):
                for inplace in (True, False):
                    guard = 64
                    out = np.full(nbytes + guard, 0xA5, np.uint8)
                    if me == root and inplace:
                        out[:nbytes] = data
                    send = out if inplace or me != root else data.copy()
                    before = comm.copied_bytes()["shm"]
                    comm.broadcast(ptr(send), ptr(out), nbytes, U8, root)
                    if me == root and inplace:
                        root_copied += comm.copied_bytes()["shm"] - before
                    if not np.array_equal(out[:nbytes], data):
                        bad = int(np.flatnonzero(out[:nbytes] != data)[0])
                        wrong.append(f"broadcast {nbytes} bytes root {root} inplace {inplace}: "
                                     f"byte {bad} is {out[bad]}, want {data[bad]}")
                    if (out[nbytes:] != 0xA5).any():
                        wrong.append(f"broadcast {nbytes} bytes root {root} inplace {inplace}: "
                                     "wrote past the buffer")
    finally:
        comm.destroy()
    return {"wrong": wrong, "root_copied": root_copied}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_pull_sums_are_rank_order_bitwise(nranks: int) -> None:
    env = dict(SHM + PULL_ALL + SMALL_PIECES)
    got = hetccl.launch(rank_bitwise, nranks, env=env, timeout=240)
    wrong = [line for res in got for line in res["wrong"]]
    assert not wrong, "\n".join(wrong[:20])
    first = got[0]["results"]
    for r, res in enumerate(got[1:], 1):
        assert res["results"] == first, f"rank {r}'s AllReduce results differ from rank 0's"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3])
def test_pull_broadcast_pieces_on_two_cores(nranks: int) -> None:
    env = dict(SHM + PULL_ALL + SMALL_PIECES)
    got = hetccl.launch(rank_broadcasts, nranks, env=env, timeout=240)
    wrong = [line for res in got for line in res["wrong"]]
    assert not wrong, "\n".join(wrong[:20])
    # Roots wrote some pieces themselves: in place a root copies nothing else.
    copied = [res["root_copied"] for res in got]
    assert sum(copied) > 0, f"no root helped its readers: {copied}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", [(("HETCCL_SHM_CMA", "0"),), (("HETCCL_SHM_CMA", "1"),)],
                         ids=["cma-off", "cma-on"])
def test_pull_broadcast_with_single_copy_off_and_on(env: Tuple[Tuple[str, str], ...]) -> None:
    """Without single copy the same algorithms run over the ring (no
    pieces to share); with it, messages from half a slot on are shared."""
    full = dict(SHM + (("HETCCL_ALGO", "pull"),) + SMALL_PIECES + env)
    got = hetccl.launch(rank_broadcasts, 2, env=full, timeout=240)
    wrong = [line for res in got for line in res["wrong"]]
    assert not wrong, "\n".join(wrong[:20])


def rank_one_broadcast(nbytes: int) -> List[str]:
    """One broadcast of nbytes from rank 1, checked bit for bit."""
    comm = hetccl.communicator()
    me = comm.rank_id()
    data = np.random.default_rng(7).integers(0, 256, nbytes, dtype=np.uint8)
    out = data.copy() if me == 1 else np.zeros(nbytes, np.uint8)
    try:
        comm.broadcast(ptr(out), ptr(out), nbytes, U8, 1)
    finally:
        comm.destroy()
    return [] if np.array_equal(out, data) else [f"rank {me}: broadcast not bit-exact"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [4, 5])
def test_broadcast_reads_only_for_few_readers(tmp_path, nranks: int) -> None:
    """With single copy on, a large Broadcast is read from the root's buffer
    by up to three readers; with more, the chain carries it (algo/select.c,
    PULL_BCAST_MAX_RANKS: many readers of one buffer contend), unless the
    ranks outnumber the CPUs (os.sysconf's count, as the library's), where
    the reads stay."""
    takes = "reads" if nranks <= 4 or nranks > os.sysconf("SC_NPROCESSORS_ONLN") else "chain"
    env = dict(SHM + (("HETCCL_SHM_CMA", "1"), ("HETCCL_DEBUG", "INFO"),
                      ("HETCCL_DEBUG_SUBSYS", "COLL"),
                      ("HETCCL_DEBUG_FILE", str(tmp_path / "rank.%p.log"))))
    got = hetccl.launch(rank_one_broadcast, nranks, 1 << 20, env=env, timeout=240)
    assert not [line for res in got for line in res]
    said = [ln for f in tmp_path.glob("rank.*.log") for ln in f.read_text().splitlines()
            if "Broadcast of 1048576 bytes" in ln]
    assert len(said) == nranks, said
    assert all(f"takes {takes} " in ln for ln in said), said


# Every collective, type and operator over the small pieces (the whole
# sweep of tests/test_collectives.py), odd and even rank counts.
SWEEPS = [
    Sweep("n2-pull-pieces", 2, SHM + PULL_ALL + SMALL_PIECES, counts=(1, 7, 1031, 6007)),
    Sweep("n3-pull-pieces", 3, SHM + PULL_ALL + SMALL_PIECES, counts=(0, 13, 1031, 6007)),
    Sweep("n4-pull-large", 4, SHM + PULL_ALL + (("HETCCL_PIPELINE_CHUNK", "64K"),),
          counts=(1031,), large=LARGE_SET),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", SWEEPS, ids=[s.name for s in SWEEPS])
def test_pull_pieces_sweep(spec: Sweep) -> None:
    results = hetccl.launch(rank_sweep, spec.nranks, spec, env=dict(spec.env), timeout=540)
    failures = [line for _checks, lines in results for line in lines]
    assert sum(c for c, _lines in results) > 0
    assert not failures, f"{len(failures)} checks failed:\n" + "\n".join(failures[:40])


# --- the receive helper thread (transport/shm/shm_helper.h) ---------------------

# Single copy on, the helper forced on, pieces of 8 KiB (two 4 KiB slots).
HELPER = (("HETCCL_SHM_CMA", "1"), ("HETCCL_SHM_CMA_MIN", "0"), ("HETCCL_SHM_HELPER", "1"),
          ("HETCCL_SHM_CHUNK", "4096"))


def helper_threads() -> int:
    """Threads of this process named as the receive helper."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                n += f.read().strip() == "hetccl-shmhelp"
        except OSError:
            pass
    return n


def rank_helper_exchange() -> Dict[str, object]:
    """Sendrecv both ways and AllGather of odd sizes, checked exactly; how
    many helper threads ran during and after the communicator."""
    comm = hetccl.communicator()
    rank, size = comm.rank_id(), comm.size()
    bad: List[str] = []
    try:
        for nbytes in (8191, 8192 * 5 + 3, 1 << 20, 3000017):
            src = ((np.arange(nbytes, dtype=np.int64) * 7 + rank * 131) % 251).astype(np.uint8)
            dst = np.zeros(nbytes, np.uint8)
            peer = (rank + 1) % size
            left = (rank - 1) % size
            nccl.groupStart()
            comm.send(ptr(src), nbytes, U8, peer)
            comm.recv(ptr(dst), nbytes, U8, left)
            nccl.groupEnd()
            want = ((np.arange(nbytes, dtype=np.int64) * 7 + left * 131) % 251).astype(np.uint8)
            if not np.array_equal(dst, want):
                bad.append(f"sendrecv {nbytes}: first wrong byte at "
                           f"{int(np.argmax(dst != want))}")
            out = np.zeros(nbytes * size, np.uint8)
            comm.allGather(ptr(src), ptr(out), nbytes, U8)
            for r in range(size):
                w = ((np.arange(nbytes, dtype=np.int64) * 7 + r * 131) % 251).astype(np.uint8)
                if not np.array_equal(out[r * nbytes:(r + 1) * nbytes], w):
                    bad.append(f"all_gather {nbytes}: rank {r}'s block wrong")
        during = helper_threads()
    finally:
        comm.destroy()
    return {"bad": bad, "during": during, "after": helper_threads()}


@pytest.mark.parametrize("nranks", [2, 3])
def test_receive_helper_exact_and_gone_after_destroy(nranks: int) -> None:
    """Every byte right when the helper reads from the back; its thread
    runs while a communicator may use it and is joined at destroy (a
    helper that claimed a piece twice, or none, breaks the bytes; one left
    running shows in `after`)."""
    got = hetccl.launch(rank_helper_exchange, nranks, env=dict(SHM + HELPER), timeout=240)
    for rank, res in enumerate(got):
        assert res["bad"] == [], f"rank {rank}: {res['bad']}"
        assert res["during"] == 1, f"rank {rank}: {res['during']} helper threads during"
        assert res["after"] == 0, f"rank {rank}: {res['after']} helper threads after destroy"
