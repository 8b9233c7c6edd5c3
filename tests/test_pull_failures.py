"""A peer killed while its buffers are being read (algo/pull_*.c over the
shm transport's single copy, process_vm_readv): every survivor gets
ncclRemoteError naming the dead rank within the dead-peer bound, never a
hang and never data, and the communicator stays failed. The harness is
failing_ranks.py's, as tests/test_failures.py uses it.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from failing_ranks import (DEAD_PEER_BOUND_S, F32, Outcome, REMOTE, SUM, _arrays, _die_after,
                           _ptr, _run_ranks, survivor_outcome, survivors_wrong)
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator

pytestmark = pytest.mark.usefixtures("hetccl_library")

PER = 4 << 20  # float32 elements per rank: 16 MiB, read in 2 MiB pieces
# Every collective reads from the peers at every size, from the first byte.
PULL = {"HETCCL_TRANSPORT": "shm", "HETCCL_SHM_CMA": "1", "HETCCL_SHM_CMA_MIN": "0",
        "HETCCL_ALGO": "pull"}


def rank_dies_while_read(rank: int, n: int, uid: str, barrier: Any, what: str,
                         victim: int) -> Outcome:
    comm = NcclCommunicator(n, uid, rank)
    x = _arrays(PER * n, float(rank + 1))[0]
    y = _arrays(PER * n, 0.0)[0]

    def call() -> None:
        if what == "allgather":
            comm.allGather(_ptr(x), _ptr(y), PER, F32)
        elif what == "broadcast":
            comm.broadcast(_ptr(x), _ptr(y), PER * n, F32, victim)
        elif what == "reducescatter":
            comm.reduceScatter(_ptr(x), _ptr(y), PER, F32, SUM)
        elif what == "allreduce":
            comm.allReduce(_ptr(x), _ptr(y), PER * n, F32, SUM)
        else:
            comm.alltoall(_ptr(x), _ptr(y), PER, F32)

    call()  # connections up, every pair read once
    got = None
    t0 = time.monotonic()
    try:
        if rank == victim:
            _die_after(0.05)
        for _ in range(400):  # the victim dies inside one of them
            call()
    except NcclError as e:
        got = e
    return survivor_outcome(comm, got, time.monotonic() - t0, barrier, DEAD_PEER_BOUND_S + 0.5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["allgather", "broadcast", "reducescatter", "allreduce",
                                  "alltoall"])
@pytest.mark.parametrize("n", [2, 3])
def test_peer_killed_while_read(what: str, n: int) -> None:
    victim = n - 1 if n == 2 else 1
    results = _run_ranks(rank_dies_while_read, n, what, victim, env=PULL, survivors=n - 1)
    assert results[victim][0] == "died" and results[victim][1] == -signal.SIGKILL, \
        results[victim]
    survivors = [r for r in range(n) if r != victim]
    wrong = survivors_wrong(results, survivors, victim, f"[read from a dead peer] {what} n={n}",
                            again=True)
    for r in survivors:
        kind, got = results[r]
        if kind == "ok" and got.get("kind") == "error" and got["name"] != REMOTE:
            wrong.append(f"rank {r}: {got['name']}, want {REMOTE}: {got['message']!r}")
    assert not wrong, "\n".join(wrong)
