"""Scale (docs/scale.md): 64 host ranks on this machine, each a process.

A pair of ranks connects when an operation first needs it: after init a
rank holds only its bootstrap ring links and listeners; after a ring
AllReduce, its two ring neighbours' connections; after an AlltoAll, one
connection per peer. Counted from each rank's /proc/self/fd (sockets,
socket transport: HETCCL_SOCKET_NSTREAMS + 1 per peer) and /proc/self/maps
(shared-memory rings, shm transport: 2 per peer). The collectives' results
are checked on every rank. HETCCL_RUNTIME_CONNECT=0 connects every pair at
init again. ncclCommInitRankScalable with several ids spreads the ranks
over the ids' roots.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Dict, List

import pytest

from rank_procs import run_ranks

pytestmark = pytest.mark.usefixtures("hetccl_library")

RANK = Path(__file__).with_name("scale_rank.py")
NSTREAMS = 1
PER_PEER = NSTREAMS + 1   # data streams + the note line
AT_INIT = 4               # bootstrap links to rank +-1, spare port, transport listener
SLACK = 2                 # "a small constant": nothing else should appear


def run(n: int, env: Dict[str, str], nids: int = 1, timeout: float = 120) -> List[dict]:
    with tempfile.TemporaryDirectory(prefix="hetccl-scale-") as d:
        full = dict(os.environ)
        full.update({"HETCCL_SOCKET_NSTREAMS": str(NSTREAMS), "HETCCL_CONNECT_TIMEOUT": "60",
                     "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "BOOTSTRAP",
                     "HETCCL_DEBUG_FILE": d + "/log.%p"})
        full.update(env)
        # Fresh interpreters: a rank counts its own descriptors, and one
        # forked from the fork server would hold some of the server's.
        results = run_ranks(RANK, [full] * n, timeout,
                            args=[[str(r), str(n), d, str(nids)] for r in range(n)],
                            forked=False)
        logs = "".join(open(os.path.join(d, f)).read() for f in os.listdir(d)
                       if f.startswith("log."))
    results.append({"logs": logs})
    return results


def grown(res: dict, what: str, key: str) -> int:
    return res[what][key] - res["before"][key]


@pytest.mark.timeout(240)
def test_64_ranks_socket_connect_on_first_use() -> None:
    n = 64
    results = run(n, {"HETCCL_TRANSPORT": "socket"})[:-1]
    wrong = []
    for r in results:
        init = grown(r, "init", "sockets")
        ring = grown(r, "allreduce", "sockets")
        a2a = grown(r, "alltoall", "sockets")
        # A rank's transport listener closes once every lower rank has
        # connected to it and it has connected to every higher rank (a
        # higher rank that waits for it probes the listener: it stays open
        # while one may): after the AlltoAll, not after the ring.
        if init > AT_INIT:
            wrong.append(f"rank {r['rank']}: {init} sockets after init, want <= {AT_INIT}")
        want_ring = init + 2 * PER_PEER
        if not want_ring <= ring <= want_ring + SLACK:
            wrong.append(f"rank {r['rank']}: {ring} sockets after a ring AllReduce, want "
                         f"{want_ring} (2 neighbours x {PER_PEER}, init's {init})")
        want_a2a = init + (n - 1) * PER_PEER - 1
        if a2a != want_a2a:
            wrong.append(f"rank {r['rank']}: {a2a} sockets after AlltoAll, want {want_a2a} "
                         f"((n-1) x {PER_PEER} and init's {init})")
    assert not wrong, "\n".join(wrong[:20])
    slowest = max(r["init_s"] for r in results)
    print(f"\n[scale] socket n={n}: init max {slowest:.3f} s; sockets per rank: init "
          f"{grown(results[0], 'init', 'sockets')}, ring {grown(results[0], 'allreduce', 'sockets')}, "
          f"alltoall {grown(results[0], 'alltoall', 'sockets')}")


@pytest.mark.timeout(240)
def test_64_ranks_shm_connect_on_first_use() -> None:
    n = 64
    results = run(n, {"HETCCL_TRANSPORT": "shm"})[:-1]
    wrong = []
    for r in results:
        init, ring = grown(r, "init", "shm_maps"), grown(r, "allreduce", "shm_maps")
        a2a = grown(r, "alltoall", "shm_maps")
        if init != 0:
            wrong.append(f"rank {r['rank']}: {init} ring mappings after init, want 0")
        if ring != 2 * 2:
            wrong.append(f"rank {r['rank']}: {ring} ring mappings after a ring AllReduce, "
                         f"want 2 neighbours x 2")
        if a2a != 2 * (n - 1):
            wrong.append(f"rank {r['rank']}: {a2a} ring mappings after AlltoAll, want "
                         f"2 x (n-1) = {2 * (n - 1)}")
        if grown(r, "alltoall", "sockets") > AT_INIT:
            wrong.append(f"rank {r['rank']}: shm holds sockets per peer?")
    assert not wrong, "\n".join(wrong[:20])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("knob", ["HETCCL_RUNTIME_CONNECT", "NCCL_RUNTIME_CONNECT"])
def test_runtime_connect_off_connects_every_pair_at_init(knob: str) -> None:
    n = 5
    results = run(n, {"HETCCL_TRANSPORT": "socket", knob: "0"})[:-1]
    for r in results:
        init = grown(r, "init", "sockets")
        # at init: every peer, plus the bootstrap ring and spare port (the
        # listener closes once every pair is connected)
        assert init >= (n - 1) * PER_PEER, (r["rank"], init)
        assert grown(r, "alltoall", "sockets") == init, (r["rank"], r)


@pytest.mark.timeout(120)
def test_scalable_init_spreads_the_roots() -> None:
    """8 ranks, 3 ids: NCCL's split is ranks 0-2, 3-5 and 6-7, and each id's
    root (made by that group's first rank) serves its own group only."""
    results = run(8, {"HETCCL_TRANSPORT": "socket"}, nids=3)
    logs = results[-1]["logs"]
    served = sorted(re.findall(r"ranks (\d+)-(\d+) of 8 joined", logs))
    assert served == [("0", "2"), ("3", "5"), ("6", "7")], served
    roots = re.findall(r"bootstrap root stats: (\d+) messages", logs)
    # members' hellos and replies, plus the next group's first rank's
    assert sorted(int(m) for m in roots) == [6, 8, 8], roots
