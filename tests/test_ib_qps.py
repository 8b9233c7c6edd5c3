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
- a peer killed while registered buffers go by RDMA WRITE over 2 queue
  pairs: the survivors name it;
- ranks that disagree on the count fail init with a message naming both.
"""

from __future__ import annotations

import time
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

