"""Every collective across two hosts: ranks in both VMs of
`tools/rdma/run_vm.sh --hosts 2` (Soft-RoCE on each, joined by a virtual wire),
checked against numpy as tests/test_collectives.py checks them.

- 2 ranks, one per VM: every collective, type and operator at counts 0, 7
  and 1031, and large (1000003-element) cases, over ib across the wire;
- 3 ranks, 2 + 1: the same sweep, shm between the two ranks of host 0
  (HETCCL_TRANSPORT=auto) and ib across;
- the same two sweeps with the data plane spanning the hosts
  (HETCCL_PLANE=on, HETCCL_PLANE_HOSTS=all: plane/bridge.c);
- 4 ranks, 2 + 2, each host an island: the hierarchical forms, AllReduce
  on both rails at once across the wire;
- 256 MiB each way between the VMs in one send/recv, checked byte for byte.

Not in CI: across the emulated wire a round trip takes tens of
milliseconds, so each sweep takes minutes (CI's two-VM step runs
test_ib.py's two-host cases). By hand:

    tools/rdma/run_vm.sh --hosts 2 -- python3 -m pytest -q -s tests/test_ib_hosts.py
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import pytest

from hetccl import launcher, nccl
from test_collectives import LARGE_SET, Sweep, rank_sweep
from test_ib import _shared_uid

pytestmark = [pytest.mark.usefixtures("hetccl_library"), pytest.mark.rdma,
              pytest.mark.skipif(os.environ.get("RXE_VM_PEER") is None,
                                 reason="needs the two VMs of tools/rdma/run_vm.sh --hosts 2")]

BIG = 256 << 20


def _here(nranks: int) -> List[int]:
    """The ranks this VM runs: one each for 2 ranks; 0 and 1 on host 0 and
    2 (and 3) on host 1 for 3 (4)."""
    host = int(os.environ["RXE_VM_HOST"])
    if nranks == 2:
        return [host]
    return [0, 1] if host == 0 else list(range(2, nranks))


def _run_here(fn: Callable[..., Any], nranks: int, name: str, args: Sequence[Any],
              env: Dict[str, str], timeout: float) -> Dict[int, Any]:
    """fn(*args) in this VM's ranks of an nranks job whose unique id host 0
    made (test_ib._shared_uid), each a process with the HETCCL_LAUNCH_*
    environment as hetccl.launch gives it; {rank: result}."""
    uid = _shared_uid(name)
    ctx = launcher.start_context(preload=[fn.__module__])
    procs = []
    for rank in _here(nranks):
        reader, writer = ctx.Pipe(duplex=False)
        rank_env = launcher.rank_process_env({**env, **launcher.rank_env(rank, nranks, uid)})
        p = ctx.Process(target=launcher._rank_main, name=f"hosts-rank{rank}",
                        args=(fn, tuple(args), rank_env, writer))
        p.start()
        writer.close()
        procs.append((rank, p, reader))
    out: Dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for rank, p, reader in procs:
            if not reader.poll(max(1.0, deadline - time.monotonic())):
                pytest.fail(f"rank {rank}: no result in {timeout:g} s")
            try:
                ok, value = reader.recv()
            except EOFError:  # it died without a word (the VM's OOM killer, a signal)
                p.join(5)
                pytest.fail(f"rank {rank} ended without a result (exit code {p.exitcode})")
            assert ok, f"rank {rank} failed:\n{value}"
            out[rank] = value
    finally:
        for _, p, _ in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return out


PLANE_ACROSS = {"HETCCL_PLANE": "on", "HETCCL_PLANE_HOSTS": "all"}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("nranks,plane", [(2, False), (3, False), (2, True), (3, True)])
def test_ib_hosts_sweep(nranks: int, plane: bool) -> None:
    """plane: the data plane spans the two hosts (its bridges' pieces cross
    by ib, plane/bridge.c; with 3 ranks host 0's two share a segment)."""
    name = f"hosts-n{nranks}" + ("-plane" if plane else "")
    spec = Sweep(name, nranks, counts=(0, 7, 1031), large=LARGE_SET)
    t0 = time.monotonic()
    env = {"HETCCL_TRANSPORT": "auto", **(PLANE_ACROSS if plane else {})}
    got = _run_here(rank_sweep, nranks, spec.name, [spec], env, 1700)
    for rank, (checks, failures) in sorted(got.items()):
        print(f"\n[ib hosts] {spec.name}: host {os.environ['RXE_VM_HOST']} rank {rank}: "
              f"{checks} checks, {len(failures)} wrong, {time.monotonic() - t0:.0f} s")
        assert failures == [], "\n".join(failures[:20])
        assert checks > 0


@pytest.mark.timeout(1800)
def test_ib_hosts_rails() -> None:
    """4 ranks, 2 + 2, each host an island (HETCCL_ISLANDS=0,0,1,1): the
    hierarchical forms with shm inside each host and ib across, the
    rails' forms (AllReduce, Broadcast, Reduce, AllGather, ReduceScatter)
    on both rails at once (ranks 0 and 2, 1 and 3; hier/hier.h) at every
    size."""
    spec = Sweep("hosts-n4-rails", 4, counts=(7, 1031), large=LARGE_SET)
    t0 = time.monotonic()
    env = {"HETCCL_TRANSPORT": "auto", "HETCCL_ISLANDS": "0,0,1,1", "HETCCL_HIER_RAILS_MIN": "0",
           "HETCCL_HIER_RAILS_MIN_GATHER": "0"}
    got = _run_here(rank_sweep, 4, spec.name, [spec], env, 1700)
    for rank, (checks, failures) in sorted(got.items()):
        print(f"\n[ib hosts] {spec.name}: host {os.environ['RXE_VM_HOST']} rank {rank}: "
              f"{checks} checks, {len(failures)} wrong, {time.monotonic() - t0:.0f} s")
        assert failures == [], "\n".join(failures[:20])
        assert checks > 0


def pattern(rank: int) -> np.ndarray:
    """BIG bytes, distinct per rank, per 1 MiB row (the row's number is
    mixed in) and pseudo-random within a row, built a row at a time (the
    VM has 2 GiB)."""
    row = ((np.arange(1 << 20, dtype=np.uint32) * 2654435761) >> 13).astype(np.uint8)
    out = np.empty((BIG >> 20, 1 << 20), np.uint8)
    for i in range(out.shape[0]):
        np.bitwise_xor(row, np.uint8((i * 7 + rank * 101) & 0xFF), out=out[i])
    return out.reshape(-1)


def rank_big() -> Dict[str, Any]:
    comm = launcher.communicator()
    me, peer = comm.rank_id(), 1 - comm.rank_id()
    try:
        x = pattern(me)
        y = np.zeros(BIG, np.uint8)
        t0 = time.monotonic()
        nccl.groupStart()
        comm.send(int(x.ctypes.data), BIG, nccl.NCCL_UINT8, peer)
        comm.recv(int(y.ctypes.data), BIG, nccl.NCCL_UINT8, peer)
        nccl.groupEnd()
        seconds = time.monotonic() - t0
        del x
        wrong = int(np.count_nonzero(y != pattern(peer)))
        return {"wrong": wrong, "seconds": seconds, "copied": comm.copied_bytes()}
    finally:
        comm.destroy()


@pytest.mark.timeout(900)
def test_ib_hosts_256mib_byte_for_byte() -> None:
    got = _run_here(rank_big, 2, "big", [], {"HETCCL_TRANSPORT": "ib"}, 800)
    for rank, res in got.items():
        print(f"\n[ib hosts] 256 MiB each way: rank {rank}: {res['wrong']} bytes wrong in "
              f"{res['seconds']:.1f} s ({BIG / res['seconds'] / 1e6:.1f} MB/s each way), "
              f"copied {res['copied']}")
        assert res["wrong"] == 0
