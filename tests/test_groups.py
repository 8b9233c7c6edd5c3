"""Groups, several ranks per process, and communicator splits, on real
processes (hetccl.launch) with host buffers.

- a group of sends and receives to and from every peer (self included);
- different collectives and point-to-point calls in one group;
- ncclCommInitAll and group-wrapped ncclCommInitRank driving every rank of a
  communicator from one thread, and from one thread per rank;
- several processes each holding several ranks of one communicator (the
  launcher's numbering: process p holds ranks p*g .. p*g+g-1);
- ncclCommSplit with uneven colors, keys that reverse the order, and
  NCCL_SPLIT_NOCOLOR;
- ncclCommGrow: members keep their ranks, joining processes take the next
  ones, the id reaching members that pass NULL; disagreeing members fail
  alike.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from hetccl.nccl import NcclCommunicator

pytestmark = pytest.mark.usefixtures("hetccl_library")

F32, I32, I64 = nccl.NCCL_FLOAT32, nccl.NCCL_INT32, nccl.NCCL_INT64
TIMEOUT = 120
COUNTS = (0, 1, 7, 4099)


def p(a: np.ndarray, offset: int = 0) -> int:
    return int(a.ctypes.data) + offset * a.itemsize


def block(src: int, dst: int, count: int) -> np.ndarray:
    """What rank `src` sends to rank `dst`: distinct for every pair."""
    return (np.arange(count, dtype=np.int64) * 1000 + src * 10 + dst).astype(np.int64)


# -- one process per rank ------------------------------------------------------------

def rank_all_to_all_p2p() -> List[str]:
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    errors = []
    for count in COUNTS:
        sends = [block(me, peer, count) for peer in range(n)]
        recvs = [np.full(count, -1, dtype=np.int64) for _ in range(n)]
        nccl.groupStart()
        for peer in range(n):
            comm.send(p(sends[peer]), count, I64, peer)
            comm.recv(p(recvs[peer]), count, I64, peer)
        nccl.groupEnd()
        for peer in range(n):
            if not np.array_equal(recvs[peer], block(peer, me, count)):
                errors.append(f"rank {me}: count {count}: wrong data from {peer}")
    comm.destroy()
    return errors


def rank_mixed_group() -> List[str]:
    """allreduce + allgather + broadcast + reducescatter + a send/recv ring,
    all in one group, each on its own buffers."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    errors = []
    for count in COUNTS:
        ar_in = np.arange(count, dtype=np.float32) + me
        ar_out = np.zeros(count, dtype=np.float32)
        ag_in = np.full(count, me, dtype=np.int32)
        ag_out = np.full(n * count, -1, dtype=np.int32)
        bc = np.arange(count, dtype=np.int32) * 3 if me == 0 else np.zeros(count, np.int32)
        rs_in = np.arange(n * count, dtype=np.float32) * (me + 1)
        rs_out = np.zeros(count, dtype=np.float32)
        ring_in = block(me, (me + 1) % n, count)
        ring_out = np.zeros(count, dtype=np.int64)
        nccl.groupStart()
        comm.allReduce(p(ar_in), p(ar_out), count, F32, nccl.NCCL_SUM)
        comm.allGather(p(ag_in), p(ag_out), count, I32)
        comm.bcast(p(bc), count, I32, 0)
        comm.reduceScatter(p(rs_in), p(rs_out), count, F32, nccl.NCCL_SUM)
        comm.send(p(ring_in), count, I64, (me + 1) % n)
        comm.recv(p(ring_out), count, I64, (me - 1) % n)
        nccl.groupEnd()
        tri = n * (n + 1) // 2
        want = {
            "allreduce": (ar_out, np.arange(count, dtype=np.float32) * n + n * (n - 1) // 2),
            "allgather": (ag_out, np.repeat(np.arange(n, dtype=np.int32), count)),
            "bcast": (bc, np.arange(count, dtype=np.int32) * 3),
            "reducescatter": (rs_out, (np.arange(count, dtype=np.float32) + me * count) * tri),
            "sendrecv": (ring_out, block((me - 1) % n, me, count)),
        }
        for name, (got, expected) in want.items():
            if not np.array_equal(got, expected):
                errors.append(f"rank {me}: count {count}: {name} in a mixed group is wrong")
    comm.destroy()
    return errors


def rank_split(colors: Sequence[int]) -> Tuple[int, int, int, float]:
    """Split by colors[rank] with key -rank (reverse order); returns (color,
    new rank, new size, allreduce of old ranks + 1 over the new communicator)."""
    comm = hetccl.communicator()
    me = comm.rank_id()
    color = colors[me]
    sub = comm.commSplit(color, -me)
    if sub is None:
        comm.destroy()
        return color, -1, 0, 0.0
    value = np.array([me + 1], dtype=np.float64)
    out = np.zeros(1, dtype=np.float64)
    sub.allReduce(p(value), p(out), 1, nccl.NCCL_FLOAT64, nccl.NCCL_SUM)
    result = (color, sub.rank_id(), sub.size(), float(out[0]))
    sub.destroy()
    comm.destroy()
    return result


def rank_split_twice() -> Tuple[int, int]:
    """Split into halves, then split each half again into singletons; the
    parent communicator keeps working between the splits."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    half = comm.commSplit(me % 2, me)
    single = half.commSplit(half.rank_id(), 0)
    x = np.array([me], dtype=np.int32)
    y = np.zeros(1, dtype=np.int32)
    comm.allReduce(p(x), p(y), 1, I32, nccl.NCCL_MAX)
    sizes = (half.size(), single.size())
    for c in (single, half, comm):
        c.destroy()
    assert int(y[0]) == n - 1
    return sizes


# -- several ranks per process -------------------------------------------------------

def drive_group(comms: Sequence[NcclCommunicator], count: int) -> List[str]:
    """allreduce, allgather and a send/recv ring over every rank of `comms`
    (ranks of one communicator held by this thread), in groups."""
    ranks = [c.rank_id() for c in comms]
    n = comms[0].size()
    ins = {r: np.arange(count, dtype=np.float32) * (r + 1) for r in ranks}
    outs = {r: np.zeros(count, dtype=np.float32) for r in ranks}
    gathered = {r: np.zeros(n * count, dtype=np.float32) for r in ranks}
    ring = {r: np.zeros(count, dtype=np.int64) for r in ranks}
    sends = {r: block(r, (r + 1) % n, count) for r in ranks}
    nccl.groupStart()
    for c, r in zip(comms, ranks):
        c.allReduce(p(ins[r]), p(outs[r]), count, F32, nccl.NCCL_SUM)
    nccl.groupEnd()
    nccl.groupStart()
    for c, r in zip(comms, ranks):
        c.allGather(p(ins[r]), p(gathered[r]), count, F32)
    nccl.groupEnd()
    nccl.groupStart()
    for c, r in zip(comms, ranks):
        c.send(p(sends[r]), count, I64, (r + 1) % n)
        c.recv(p(ring[r]), count, I64, (r - 1) % n)
    nccl.groupEnd()
    errors = []
    want_sum = np.arange(count, dtype=np.float32) * (n * (n + 1) // 2)
    want_all = np.concatenate([np.arange(count, dtype=np.float32) * (r + 1) for r in range(n)])
    for r in ranks:
        if not np.array_equal(outs[r], want_sum):
            errors.append(f"rank {r}/{n} count {count}: allreduce wrong")
        if not np.array_equal(gathered[r], want_all):
            errors.append(f"rank {r}/{n} count {count}: allgather wrong")
        if not np.array_equal(ring[r], block((r - 1) % n, r, count)):
            errors.append(f"rank {r}/{n} count {count}: send/recv ring wrong")
    return errors


def drive_and_destroy(comms: Sequence[NcclCommunicator]) -> List[str]:
    """drive_group at every count, then destroy the communicators."""
    errors = [f"rank {c.rank_id()} of {c.size()} is held as number {i}"
              for i, c in enumerate(comms) if c.rank_id() != comms[0].rank_id() + i]
    for count in COUNTS:
        errors += drive_group(comms, count)
    for c in comms:
        c.destroy()
    return errors


def in_process_init_all(n: int) -> List[str]:
    comms = NcclCommunicator.initAll(n)
    if len(comms) != n:
        return [f"initAll gave {len(comms)} ranks, not {n}"]
    return drive_and_destroy(comms)


def in_process_grouped_init(n: int) -> List[str]:
    uid = nccl.get_unique_id()
    nccl.groupStart()
    comms = [NcclCommunicator(n, uid, r) for r in range(n)]
    nccl.groupEnd()
    return drive_and_destroy(comms)


def in_process_threads(n: int) -> List[str]:
    """initAll, then one thread per rank making blocking calls."""
    comms = NcclCommunicator.initAll(n)
    errors: List[str] = []
    lock = threading.Lock()

    def work(c: NcclCommunicator) -> None:
        for count in COUNTS:
            found = drive_group([c], count)
            with lock:
                errors.extend(found)

    threads = [threading.Thread(target=work, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.destroy()
    return errors


def rank_several_per_process(per_process: int, backend: Optional[str] = None) -> List[str]:
    """Process p of P holds ranks p*g .. p*g+g-1 of a communicator of P*g
    (each of which says it is served as `backend`, where given)."""
    info = hetccl.launch_info()
    assert info is not None
    n = info.nranks * per_process
    nccl.groupStart()
    comms = [NcclCommunicator(n, info.unique_id, info.rank * per_process + i)
             for i in range(per_process)]
    nccl.groupEnd()
    errors = [f"rank {c.rank_id()}: {c.backend()}, not {backend}"
              for c in comms if backend and c.backend() != backend]
    return errors + drive_and_destroy(comms)


# -- tests ---------------------------------------------------------------------------

def _flat(results: Sequence[List[str]]) -> List[str]:
    return [e for errs in results for e in errs]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_p2p_with_every_peer(n: int) -> None:
    assert not _flat(hetccl.launch(rank_all_to_all_p2p, n, timeout=TIMEOUT - 10))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("transport", ["shm", "socket"])
def test_p2p_with_every_peer_small_chunks(transport: str) -> None:
    env = {"HETCCL_TRANSPORT": transport, "HETCCL_PIPELINE_CHUNK": "64",
           "HETCCL_SHM_CHUNK": "64", "HETCCL_SOCKET_CHUNK": "512"}
    assert not _flat(hetccl.launch(rank_all_to_all_p2p, 3, env=env, timeout=TIMEOUT - 10))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_mixed_collectives_in_one_group(n: int) -> None:
    assert not _flat(hetccl.launch(rank_mixed_group, n, timeout=TIMEOUT - 10))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_init_all(n: int) -> None:
    assert not hetccl.launch(in_process_init_all, 1, n, timeout=TIMEOUT - 10)[0]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [2, 3])
def test_grouped_init_rank_one_thread(n: int) -> None:
    assert not hetccl.launch(in_process_grouped_init, 1, n, timeout=TIMEOUT - 10)[0]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [2, 4])
def test_thread_per_rank(n: int) -> None:
    assert not hetccl.launch(in_process_threads, 1, n, timeout=TIMEOUT - 10)[0]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("procs,per_process", [(2, 2), (3, 2), (2, 3)])
def test_several_ranks_per_process(procs: int, per_process: int) -> None:
    assert not _flat(hetccl.launch(rank_several_per_process, procs, per_process,
                                   timeout=TIMEOUT - 10))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("procs,per_process,islands", [(2, 2, "0,0,1,1"), (2, 3, "0,0,0,1,1,1")])
def test_several_ranks_per_process_in_islands(procs: int, per_process: int, islands: str) -> None:
    """The same with each process's ranks one island: hierarchical
    communicators (hier/hier.h) whose island phases one thread issues for
    several ranks. The group's AllReduce and AllGather forms run in step,
    slot by slot (hier/hier_ops.c); one after the other, the first rank's
    blocking island phase would wait for a rank the thread has not reached."""
    assert not _flat(hetccl.launch(rank_several_per_process, procs, per_process,
                                   "hierarchical:engine", env={"HETCCL_ISLANDS": islands},
                                   timeout=TIMEOUT - 10))


SPLITS: Dict[str, List[int]] = {
    "uneven": [0, 1, 0, 0, 1],
    "nocolor": [2, nccl.NCCL_SPLIT_NOCOLOR, 2, 7],
    "all-nocolor-but-one": [nccl.NCCL_SPLIT_NOCOLOR, nccl.NCCL_SPLIT_NOCOLOR, 5],
    "one-each": [3, 2, 1],
    "same": [0, 0, 0, 0],
}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("name", list(SPLITS))
def test_comm_split(name: str) -> None:
    colors = SPLITS[name]
    n = len(colors)
    results = hetccl.launch(rank_split, n, colors, timeout=TIMEOUT - 10)
    for me, (color, sub_rank, sub_size, total) in enumerate(results):
        if color == nccl.NCCL_SPLIT_NOCOLOR:
            assert (sub_rank, sub_size) == (-1, 0), f"rank {me} got a communicator"
            continue
        members = [r for r in range(n) if colors[r] == color]
        # key = -rank: the new order is the old order reversed
        assert sub_size == len(members), (me, results)
        assert sub_rank == sorted(members, reverse=True).index(me), (me, results)
        assert total == sum(r + 1 for r in members), (me, results)


@pytest.mark.timeout(TIMEOUT)
def test_split_of_a_split() -> None:
    sizes = hetccl.launch(rank_split_twice, 4, timeout=TIMEOUT - 10)
    assert sizes == [(2, 1)] * 4


# -- growing -------------------------------------------------------------------------

def _share_id(world: NcclCommunicator, uid: Sequence[int], root: int) -> Tuple[int, ...]:
    """Broadcast a unique id over `world` (host memory), as a program would
    hand it to joining processes out of band."""
    buf = np.array([b & 0xFF for b in uid] if uid else [0] * nccl.NCCL_UNIQUE_ID_BYTES,
                   dtype=np.uint8)
    world.bcast(p(buf), buf.size, nccl.NCCL_UINT8, root)
    return tuple(int(b) - 256 if b > 127 else int(b) for b in buf)


def rank_grow(members: int, id_holder: int, all_pass_id: bool) -> Tuple[int, int, List[int]]:
    """World ranks < members form a communicator (in reverse order), then
    grow it by the other launched processes. Returns (rank, size, the world
    rank of every rank of the grown communicator)."""
    world = hetccl.communicator()
    me, n = world.rank_id(), world.size()
    member = me < members
    sub = world.commSplit(0 if member else nccl.NCCL_SPLIT_NOCOLOR, -me)
    uid: Sequence[int] = ()
    if member and sub.rank_id() == id_holder:
        uid = sub.commGetUniqueId()
    holder_world = members - 1 - id_holder  # key -me: sub rank k is world rank members-1-k
    uid = _share_id(world, uid, holder_world)
    if member:
        mine = uid if (all_pass_id or sub.rank_id() == id_holder) else None
        grown = sub.commGrow(n, mine)
    else:
        grown = NcclCommunicator.joinGrow(n, uid, me)
    x = np.array([me], dtype=np.int32)
    who = np.zeros(n, dtype=np.int32)
    grown.allGather(p(x), p(who), 1, I32)
    result = (grown.rank_id(), grown.size(), who.tolist())
    grown.destroy()
    if sub is not None:
        sub.destroy()
    world.destroy()
    return result


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("members,joining,id_holder,all_pass_id", [
    (2, 1, 0, False), (3, 2, 1, False), (2, 2, 1, True), (1, 1, 0, False)])
def test_comm_grow(members: int, joining: int, id_holder: int, all_pass_id: bool) -> None:
    n = members + joining
    results = hetccl.launch(rank_grow, n, members, id_holder, all_pass_id, timeout=TIMEOUT - 10)
    # members keep their ranks (world rank w is member rank members-1-w),
    # joining world rank w asked for rank w
    expect_world = list(range(members - 1, -1, -1)) + list(range(members, n))
    for me, (rank, size, who) in enumerate(results):
        want = members - 1 - me if me < members else me
        assert (rank, size) == (want, n), (me, results)
        assert who == expect_world, (me, results)


def rank_grow_bad(case: str) -> Tuple[str, str]:
    """Two members, no joining rank: every member must fail alike, before
    anyone waits on the new communicator."""
    comm = hetccl.communicator()
    me, n = comm.rank_id(), comm.size()
    uid = comm.commGetUniqueId() if me == 0 else None
    nranks = {"sizes-differ": n + 1 + me, "not-larger": n, "no-id": n + 1}[case]
    if case == "no-id":
        uid = None
    try:
        comm.commGrow(nranks, uid)
        outcome = ("ok", "")
    except nccl.NcclError as e:
        outcome = (e.name, e.message)
    comm.destroy()
    return outcome


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("case,message", [
    ("sizes-differ", "rank 0 asked to grow to 3 ranks and rank 1 to 4"),
    ("not-larger", "asked to grow to 2 ranks, not more than the 2 there are"),
    ("no-id", "no member passed the unique id"),
])
def test_comm_grow_bad_arguments(case: str, message: str) -> None:
    for name, text in hetccl.launch(rank_grow_bad, 2, case, timeout=TIMEOUT - 10):
        assert name == "ncclInvalidArgument" and message in text, (name, text)


def test_comm_grow_joining_rank_needs_an_id() -> None:
    with pytest.raises(nccl.NcclError) as e:
        nccl.NcclCommunicator.joinGrow(2, None, 1)
    assert e.value.name == "ncclInvalidArgument"
