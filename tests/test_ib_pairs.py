"""Which transport each pair of ranks takes when the ranks sit on several
"hosts", and what a rank killed on another host costs the ones waiting for
it, on a real kernel verbs stack.

Ranks run as hosts of their own through `unshare --ipc` (hetccl's host
identity includes the IPC namespace, so /proc liveness checks do not
apply and shm is not chosen across them), in one Soft-RoCE VM
(tools/rdma/run_vm.sh; marked `rdma`, except the two checks that need no
device):

- auto chooses per pair: shm inside a host, ib between ranks that both
  have an active port, socket for every pair of a rank without one
  (HETCCL_IB_HCA naming none, or excluding the one there is in
  NCCL_IB_HCA's syntax), and rank 0 says so; NCCL_IB_DISABLE=1
  gives socket for all; without any device, shm and socket only;
- the CPU's payload copies per transport (hetcclCommCopiedBytes);
- connections on first use over ib: a lower rank SIGKILLed on another host
  before it said hello is named by the ranks waiting for it within a few
  seconds (they probe its handshake listener, transport/base/probe.h),
  far below HETCCL_TIMEOUT.

Split from tests/test_ib.py (the transport's own cases stay there).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from conftest import active_verbs_device
from libpath import REPO_ROOT
from rank_procs import run_ranks

pytestmark = pytest.mark.usefixtures("hetccl_library")

# -- the transport of each pair ----------------------------------------------------------

PAIRS_RANK_PY = REPO_ROOT / "tests" / "pairs_rank.py"
PAIRS_LINE = re.compile(r"pairs by transport: shm (\d+), socket (\d+), ib (\d+)")
PEERS_LINE = re.compile(r"rank (\d+) of \d+: engine ready \(peers by transport: "
                        r"shm (\d+), socket (\d+), ib (\d+)")


PAIR_COUNT = 1 << 16                   # float32 elements per message of pairs_rank.py
PAIR_BYTES = 4 * PAIR_COUNT


HIDE_IB = {"HETCCL_IB_HCA": "no_such_hca"}


def run_pairs(tmp_path: Path, extra: Dict[str, str], hide_ib_on: int = -1,
              count: int = PAIR_COUNT, hide: Dict[str, str] = HIDE_IB) -> Dict[str, Any]:
    """Four ranks as three hosts: ranks 0 and 1 share this process's IPC
    namespace (one host: shm), ranks 2 and 3 each run in one of their own
    (`unshare --ipc`: hetccl's host identity differs, as between machines).
    Rank hide_ib_on gets `hide` (HETCCL_IB_HCA naming no device). Returns the
    ranks' results, rank 0's pairs line and every rank's peers line."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for an IPC namespace per rank")
    envs = []
    for rank in range(4):
        env = {**os.environ, "T_RANK": str(rank), "T_NRANKS": "4", "T_COUNT": str(count),
               "T_ID_FILE": str(tmp_path / "id"), "HETCCL_CONNECT_TIMEOUT": "60",
               "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT,NET",
               "HETCCL_DEBUG_FILE": str(tmp_path / f"log.{rank}"), **extra}
        env.pop("HETCCL_TRANSPORT", None)
        env.pop("NCCL_IB_DISABLE", None)
        env.update(extra)
        if rank == hide_ib_on:
            env.update(hide)
        envs.append(env)
    prefixes = [[], [], ["unshare", "--ipc"], ["unshare", "--ipc"]]
    results = run_ranks(PAIRS_RANK_PY, envs, timeout=240, prefixes=prefixes)
    logs = {r: (tmp_path / f"log.{r}").read_text() for r in range(4)}
    pairs = PAIRS_LINE.findall(logs[0])
    peers = {}
    for r in range(4):
        for m in PEERS_LINE.finditer(logs[r]):
            peers[int(m.group(1))] = tuple(int(g) for g in m.groups()[1:])
    for r, got in enumerate(results):
        print(f"\n[pairs] rank {r}: {got} peers(shm, socket, ib)={peers.get(r)}")
    print(f"[pairs] rank 0: {[ln for ln in logs[0].splitlines() if 'pairs by' in ln]}")
    return {"results": results, "pairs": pairs, "peers": peers, "logs": logs}


def assert_pairs(got: Dict[str, Any], pairs: tuple, peers: Dict[int, tuple]) -> None:
    for r, res in enumerate(got["results"]):
        assert "error" not in res, f"rank {r}: {res}"
        assert res["wrong"] == [], f"rank {r}: wrong data {res['wrong']}"
    assert got["pairs"] == [tuple(str(k) for k in pairs)], got["logs"][0][-3000:]
    assert got["peers"] == peers, got["peers"]


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_chosen_per_pair(tmp_path: Path) -> None:
    """auto: ranks 2 and 3 are on hosts of their own, rank 3 has no device
    it may use. Pairs: (0,1) shm; (0,2), (1,2) ib; (0,3), (1,3), (2,3)
    socket. Every pair moves data; rank 0 names rank 3 as the one without."""
    got = run_pairs(tmp_path, {}, hide_ib_on=3)
    assert_pairs(got, (1, 3, 2),
                 {0: (1, 1, 1), 1: (1, 1, 1), 2: (0, 1, 2), 3: (0, 3, 0)})
    assert "no active ib port on ranks 3" in got["logs"][0], got["logs"][0][-3000:]
    assert "ib rank 2:" in got["logs"][2]          # its context was made
    assert "ib rank 3:" not in got["logs"][3]      # and rank 3 made none
    # ib still copies through its staging slots: rank 2 sent a message to
    # ranks 0 and 1 and took one from each, every byte copied once.
    copied = [res["copied"] for res in got["results"]]
    assert copied[2]["ib"] >= 4 * PAIR_BYTES and copied[2]["shm"] == 0, copied
    assert copied[3]["ib"] == 0 and copied[3]["socket"] >= 6 * PAIR_BYTES, copied


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_hca_in_nccl_syntax(tmp_path: Path) -> None:
    """The device list in NCCL_IB_HCA's syntax (transport/ib/ib_hca.c; every
    form is unit-tested in tests/c/transport/test_ib_hca.c): every rank has
    NCCL_IB_HCA=rxe, a prefix that allows rxe0; rank 3 also has
    HETCCL_IB_HCA=^=rxe0, which wins over it and excludes rxe0 by its whole
    name. The pairs come out as when rank 3 has no device at all."""
    got = run_pairs(tmp_path, {"NCCL_IB_HCA": "rxe"}, hide_ib_on=3,
                    hide={"HETCCL_IB_HCA": "^=rxe0"})
    assert_pairs(got, (1, 3, 2),
                 {0: (1, 1, 1), 1: (1, 1, 1), 2: (0, 1, 2), 3: (0, 3, 0)})
    assert "no active ib port on ranks 3" in got["logs"][0], got["logs"][0][-3000:]


@pytest.mark.rdma
@pytest.mark.timeout(300)
def test_ib_disable_gives_socket_between_hosts(tmp_path: Path) -> None:
    got = run_pairs(tmp_path, {"NCCL_IB_DISABLE": "1"})
    assert_pairs(got, (1, 5, 0),
                 {0: (1, 2, 0), 1: (1, 2, 0), 2: (0, 3, 0), 3: (0, 3, 0)})
    assert "NCCL_IB_DISABLE=1" in got["logs"][0]


@pytest.mark.timeout(300)
@pytest.mark.skipif(active_verbs_device() is not None, reason="a verbs device is active here")
def test_default_without_a_device_is_shm_and_socket(tmp_path: Path) -> None:
    """No verbs device: the default forms the four-rank, three-host
    communicator with no error, shm on one host and socket between them."""
    got = run_pairs(tmp_path, {})
    assert_pairs(got, (1, 5, 0),
                 {0: (1, 2, 0), 1: (1, 2, 0), 2: (0, 3, 0), 3: (0, 3, 0)})
    assert "no active ib port on ranks 0,1,2,3" in got["logs"][0]
    assert "WARN" not in "".join(got["logs"].values())


@pytest.mark.timeout(300)
def test_copied_bytes_per_transport(tmp_path: Path) -> None:
    """The CPU's payload copies, per transport (hetcclCommCopiedBytes), on
    the default four-rank, three-host communicator over shm and socket:
    the socket counts the kernel's copy of every byte sent and received,
    so rank 2 (socket to three peers) counts at least its six messages of
    the exchange; ranks 0 and 1 count shm for their pair and socket for
    the two others; no rank counts ib. The destroy line says the same."""
    got = run_pairs(tmp_path, {"NCCL_IB_DISABLE": "1"})
    copied = [res["copied"] for res in got["results"]]
    print(f"\n[copied] {copied}")
    assert all(set(c) == {"shm", "socket", "ib", "plane"} for c in copied), copied
    assert all(c["plane"] == 0 for c in copied), copied  # no device buffers: no data plane
    for r in (0, 1):
        assert copied[r]["shm"] >= PAIR_BYTES, copied     # at least the message it took
        assert copied[r]["socket"] >= 4 * PAIR_BYTES, copied
    for r in (2, 3):
        assert copied[r]["shm"] == 0 and copied[r]["socket"] >= 6 * PAIR_BYTES, copied
    assert all(c["ib"] == 0 for c in copied), copied
    line = re.search(r"payload bytes copied by the CPU: shm (\d+), socket (\d+), ib (\d+), "
                     r"plane (\d+)",
                     got["logs"][2])
    assert line and int(line.group(2)) == copied[2]["socket"], got["logs"][2][-2000:]


# -- a lower rank killed on another host, over ib ----------------------------------------

PROBE_TIMEOUT_S = 60  # HETCCL_TIMEOUT: the probe, not the timeout, must end the wait
DETECT_S = 3.0        # the survivors must name the killed rank this soon after the kill


@pytest.mark.rdma
@pytest.mark.timeout(240)
def test_ib_killed_lower_rank_on_another_host_is_named(tmp_path: Path) -> None:
    """Three ranks, each a host of its own, every pair on ib, connections on
    first use. Rank 0 SIGKILLs itself 1 s after init, before it said hello
    to anyone (no note); ranks 1 and 2 are already exchanging with every
    peer, waiting for rank 0's hello. Each fails with ncclRemoteError
    naming rank 0 within DETECT_S of the kill: its probe of rank 0's
    handshake listener was refused."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for an IPC namespace per rank")
    procs = []
    for rank in range(3):
        env = {**os.environ, "T_RANK": str(rank), "T_NRANKS": "3", "T_COUNT": "1024",
               "T_ID_FILE": str(tmp_path / "id"), "T_DIE_RANK": "0", "T_DIE_AFTER_S": "1",
               "HETCCL_TRANSPORT": "ib", "HETCCL_RUNTIME_CONNECT": "1",
               "HETCCL_TIMEOUT": str(PROBE_TIMEOUT_S), "HETCCL_CONNECT_TIMEOUT": "60",
               "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT,NET",
               "HETCCL_DEBUG_FILE": str(tmp_path / f"log.{rank}")}
        procs.append(subprocess.Popen(["unshare", "--ipc", sys.executable, str(PAIRS_RANK_PY)],
                                      env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=PROBE_TIMEOUT_S / 2)[0])
    finally:
        for p in procs:
            p.kill()
    killed_at = float((tmp_path / "id.killed").read_text())
    took = []
    for rank in (1, 2):
        line = [ln for ln in outs[rank].splitlines() if ln.startswith("RESULT ")]
        assert line, f"rank {rank} printed no result:\n{outs[rank][-3000:]}"
        res = json.loads(line[-1][7:])
        assert res.get("error") == "ncclRemoteError", res
        assert "rank 0 is gone" in res["message"], res
        took.append(res["failed_at"] - killed_at)
    print(f"\n[ib killed lower rank] ranks 1, 2 named rank 0 {took[0]:.2f} s, {took[1]:.2f} s "
          f"after the kill: {res['message']!r}")
    assert max(took) < DETECT_S, took
    log = (tmp_path / "log.1").read_text() + (tmp_path / "log.2").read_text()
    assert re.search(r"ib rank [12]: rank 0 is gone: its listener at \S+ refused a connection",
                     log), log[-3000:]
