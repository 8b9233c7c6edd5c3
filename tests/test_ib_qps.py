"""The ib transport with several queue pairs per connection (HETCCL_IB_QPS).

Marked `rdma`, run in a Soft-RoCE VM as tests/test_ib.py (tools/rdma/run_vm.sh).
With N > 1 queue pairs a rendezvous message's RDMA WRITEs are striped over
them and each queue pair's last write carries the immediate
(libhetccl/transport/ib/ib_rdv.c):

- zero copy with 4 queue pairs: test_ib.py's registered-memory phases,
  no byte copied by the CPU, the data and the allreduce right;
- every collective (test_collectives' sweep) with 3 queue pairs and
  4 KiB chunks;
- registered buffers with 3 queue pairs, 4 KiB chunks and every message by
  rendezvous (HETCCL_IB_ZCOPY_THRESHOLD=1) on 3 ranks: sizes that take
  fewer writes than queue pairs, as many, and many more, straight into the
  destination (send/recv, allgather, broadcast) and through the bounce
  buffer (allreduce, reducescatter);
- offers ahead (HETCCL_IB_OFFER): a group of eight messages, mostly into
  registered buffers, with 1 and 3 queue pairs, three rounds (the ring of
  4 clear-to-send records wraps): receives behind the head land on offers
  made before they headed, with one into plain memory and one from plain
  memory among them; with HETCCL_IB_OFFER=1 none does;
- a peer killed while registered buffers go by RDMA WRITE over 2 queue
  pairs: the survivors name it;
- ranks that disagree on the count fail init with a message naming both.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from hetccl.nccl import NcclCommunicator
from test_collectives import MOVE, SUM, Sweep, rank_sweep
from failing_ranks import _ok_results, _run_ranks
from test_ib import (F32, IB, IB_ENV, MAX_SHOWN, HostMemory, check_dead_peer, check_zero_copy,
                     f32_at, rank_init_only)

pytestmark = pytest.mark.usefixtures("hetccl_library")

CHUNK = 4096
QPS3 = {**IB_ENV, "HETCCL_IB_QPS": "3", "HETCCL_IB_CHUNK": str(CHUNK)}


@pytest.mark.rdma
@pytest.mark.timeout(240)
def test_ib_qps_zero_copy_on_registered_memory() -> None:
    check_zero_copy({**IB_ENV, "HETCCL_IB_QPS": "4"})


QPS_SWEEP = Sweep("n2-ib-qps3", 2, IB + (("HETCCL_IB_QPS", "3"), ("HETCCL_IB_CHUNK", str(CHUNK))),
                  counts=(0, 7, 1031),
                  large=(("allreduce", "float32", SUM), ("allgather", "uint8", MOVE)))


@pytest.mark.rdma
@pytest.mark.timeout(900)
def test_ib_qps_sweep() -> None:
    t0 = time.monotonic()
    results = hetccl.launch(rank_sweep, QPS_SWEEP.nranks, QPS_SWEEP, env=dict(QPS_SWEEP.env),
                            timeout=840)
    failures = [line for _checks, lines in results for line in lines]
    checks = sum(c for c, _lines in results)
    print(f"\n[ib qps sweep] {checks} checks in {time.monotonic() - t0:.1f} s")
    assert checks > 0
    assert not failures, f"{len(failures)} of {checks} checks failed:\n" + \
        "\n".join(failures[:MAX_SHOWN])


# Float32 counts: 1 write; 2 (< 3 queue pairs); 3 (one per queue pair);
# 4 (QP 0 twice); many, with a short last one; 1031 and 65537 (primes).
RDV_COUNTS = (1, CHUNK // 4 + 1, 3 * CHUNK // 4, 3 * CHUNK // 4 + 1, 1031, 40 * CHUNK // 4 + 5,
              65537)


def pattern(rank: int, salt: int, count: int) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 3 + 100 * rank + salt) % 4093).astype(np.float32)


def rank_rdv_sweep(rank: int, n: int, uid: str, barrier: Any) -> Dict[str, Any]:
    """Every message by rendezvous from ncclMemAlloc buffers; the data must
    be right and the CPU must copy nothing but out of the bounce buffer."""
    comm = NcclCommunicator(n, uid, rank)
    mem = HostMemory(comm)
    top = max(RDV_COUNTS) * n
    s, r = mem.mem_alloc(4 * top), mem.mem_alloc(4 * top)
    x, y = f32_at(s, top), f32_at(r, top)
    wrong: List[str] = []
    copied_direct = 0

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            wrong.append(f"{what}: element {bad} is {got[bad]}, want {want[bad]}")

    try:
        for salt, c in enumerate(RDV_COUNTS):
            before = comm.copied_bytes()["ib"]
            x[:c] = pattern(rank, salt, c)
            y[:] = -1
            nccl.groupStart()
            comm.send(s, c, F32, (rank + 1) % n)
            comm.recv(r, c, F32, (rank - 1) % n)
            nccl.groupEnd()
            check(f"sendrecv {c}", y[:c], pattern((rank - 1) % n, salt, c))
            comm.allGather(s, r, c, F32)
            check(f"allgather {c}", y[:n * c],
                  np.concatenate([pattern(p, salt, c) for p in range(n)]))
            y[:c] = pattern(0, salt, c) if rank == 0 else -1
            comm.broadcast(r, r, c, F32, 0)
            check(f"broadcast {c}", y[:c], pattern(0, salt, c))
            copied_direct += comm.copied_bytes()["ib"] - before
            x[:n * c] = np.tile(pattern(rank, salt, c), n)
            comm.allReduce(s, r, n * c, F32, SUM)
            check(f"allreduce {n * c}", y[:n * c],
                  np.tile(sum(pattern(p, salt, c) for p in range(n)), n))
            comm.reduceScatter(s, r, c, F32, SUM)
            check(f"reducescatter {c}", y[:c], sum(pattern(p, salt, c) for p in range(n)))
    finally:
        mem.mem_free(s)
        mem.mem_free(r)
        comm.destroy()
    return {"wrong": wrong, "copied_direct": copied_direct}


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_qps_rendezvous_sizes() -> None:
    env = {**QPS3, "HETCCL_IB_ZCOPY_THRESHOLD": "1"}
    results = _ok_results(_run_ranks(rank_rdv_sweep, 3, env=env, timeout=240), range(3))
    for r, got in enumerate(results):
        print(f"\n[ib qps rendezvous] rank {r}: copied {got['copied_direct']} into registered "
              f"destinations, wrong {got['wrong'][:5]}")
        assert got["wrong"] == [], (r, got["wrong"][:MAX_SHOWN])
        assert got["copied_direct"] == 0, (r, got)


# Offers ahead: float32 counts of one group's messages (1, 2, 3 and many
# writes of CHUNK bytes with 3 queue pairs); PLAIN_DST lands in plain
# memory (not offered ahead: the head's own offer, into the bounce buffer,
# or eager), PLAIN_SRC comes from plain memory (the sender copies it into
# its staging ring when the offer is there, or goes eager).
GROUP_COUNTS = (40 * CHUNK // 4 + 5, CHUNK // 4 + 1, 3 * CHUNK // 4, 65537, 1031,
                3 * CHUNK // 4 + 1, 20 * CHUNK // 4, 2 * CHUNK // 4)
PLAIN_DST, PLAIN_SRC = 3, 5
ROUNDS = 3


def rank_offers_ahead(rank: int, n: int, uid: str, barrier: Any) -> Dict[str, Any]:
    """Rank 1 posts a group of receives from rank 0, which sends them a
    moment later in a group of its own, three rounds; every message checked."""
    comm = NcclCommunicator(n, uid, rank)
    mem = HostMemory(comm)
    offs = np.cumsum((0,) + GROUP_COUNTS)
    total = int(offs[-1])
    buf = mem.mem_alloc(4 * total)
    reg = f32_at(buf, total)
    plain = np.zeros(total, np.float32)
    wrong: List[str] = []
    try:
        for rnd in range(ROUNDS):
            if rank == 0:
                for i, c in enumerate(GROUP_COUNTS):
                    src = plain if i == PLAIN_SRC else reg
                    src[offs[i]:offs[i] + c] = pattern(0, 10 * rnd + i, c)
            else:
                reg[:] = -1
                plain[:] = -1
            barrier.wait()
            if rank == 0:
                time.sleep(0.3)  # the receives are posted, and offered, first
            nccl.groupStart()
            for i, c in enumerate(GROUP_COUNTS):
                if rank == 0:
                    at = (int(plain.ctypes.data) if i == PLAIN_SRC else buf) + 4 * int(offs[i])
                    comm.send(at, c, F32, 1)
                else:
                    at = (int(plain.ctypes.data) if i == PLAIN_DST else buf) + 4 * int(offs[i])
                    comm.recv(at, c, F32, 0)
            nccl.groupEnd()
            if rank == 1:
                for i, c in enumerate(GROUP_COUNTS):
                    got = (plain if i == PLAIN_DST else reg)[offs[i]:offs[i] + c]
                    if not np.array_equal(got, pattern(0, 10 * rnd + i, c)):
                        wrong.append(f"round {rnd} message {i} ({c} floats)")
    finally:
        mem.mem_free(buf)
        comm.destroy()
    return {"wrong": wrong}


OFFER_LINE = re.compile(r"(\d+) rendezvous receives landed on a clear-to-send made before the "
                        r"sender asked, (\d+) of them behind the head")


@pytest.mark.rdma
@pytest.mark.timeout(240)
@pytest.mark.parametrize("qps", ["1", "3"])
@pytest.mark.parametrize("offer", ["4", "1"])
def test_ib_offers_ahead(tmp_path: Path, qps: str, offer: str) -> None:
    env = {**IB_ENV, "HETCCL_IB_QPS": qps, "HETCCL_IB_CHUNK": str(CHUNK),
           "HETCCL_IB_ZCOPY_THRESHOLD": "1", "HETCCL_IB_OFFER": offer, "HETCCL_DEBUG": "INFO",
           "HETCCL_DEBUG_SUBSYS": "NET", "HETCCL_DEBUG_FILE": str(tmp_path / "log.%p")}
    results = _ok_results(_run_ranks(rank_offers_ahead, 2, env=env, timeout=200), range(2))
    assert results[1]["wrong"] == [], results[1]["wrong"]
    found = [OFFER_LINE.search(f.read_text()) for f in tmp_path.glob("log.*")]
    counts = [(int(m.group(1)), int(m.group(2))) for m in found if m]
    print(f"\n[ib offers ahead] HETCCL_IB_QPS={qps} HETCCL_IB_OFFER={offer}: landed on "
          f"offers, behind the head: {counts}")
    # Only rank 1 receives. Behind the head: messages 1 and 2 of each round
    # are offered before the sender starts (it waits 0.3 s), so they land on
    # offers made ahead; 4 to 7 do where the offer outran the sender's
    # request (message 3, into plain memory, is never offered ahead).
    assert len(counts) == 1, counts
    landed, ahead = counts[0]
    if offer == "1":
        assert ahead == 0 and landed >= ROUNDS, counts
    else:
        assert 2 * ROUNDS <= ahead <= 6 * ROUNDS and landed > ahead, counts


@pytest.mark.rdma
@pytest.mark.timeout(120)
def test_ib_qps_dead_peer_during_rendezvous() -> None:
    check_dead_peer("during-rdv", 2, {**IB_ENV, "HETCCL_IB_QPS": "2"})


@pytest.mark.rdma
@pytest.mark.timeout(90)
def test_ib_qps_mismatch_fails_init() -> None:
    env = {**IB_ENV, "HETCCL_RUNTIME_CONNECT": "0", "HETCCL_TIMEOUT": "10"}
    knobs = ({"HETCCL_IB_QPS": "1"}, {"HETCCL_IB_QPS": "2"})
    results = _ok_results(_run_ranks(rank_init_only, 2, knobs, env=env, timeout=60), range(2))
    for r, got in enumerate(results):
        print(f"\n[ib qps mismatch] rank {r}: {got}")
        assert got["kind"] == "error", (r, got)
        msg = got["message"]
        assert "HETCCL_IB_QPS" in msg, (r, msg)
        mine, theirs = (1, 2) if r == 0 else (2, 1)
        assert f"opens {theirs} queue pairs" in msg and f"rank {r} {mine}" in msg, (r, msg)

