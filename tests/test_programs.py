"""Random programs of collectives and point-to-point messages on real
processes, checked against numpy.

test_collectives.py runs each (collective, type, operator, count) alone, one
after the other. Here a seed that every rank shares draws a program: steps,
each a single call or a group (ncclGroupStart/End) of up to GROUP_MAX calls,
collectives and messages between random pairs (a rank to itself included)
mixed. A call runs on the world communicator or on the half a rank shares
with the ranks of its parity (ncclCommSplit; now and then a step destroys
the halves and splits the world again, by parity or into a lower and an
upper block), and within a group each rank merges the two communicators'
calls in an order of its own (each communicator's calls keep the
program's order, which is all that NCCL asks).
Each call draws its collective, type, operator, count (from empty to past
the pieces and slots of the configuration), placement and root, and each
rank draws on its own where its buffers of that call live: numpy's memory,
or an arena from ncclMemAlloc (which a transport may register: on ib, the
rendezvous path). So a receiver in registered memory meets a sender in
plain memory, messages queue behind each other in one direction, PreMulSum
operators are destroyed as soon as the call that used them returns (which
NCCL allows, inside a group too), and the pieces, slots and sequence
numbers of every channel wrap many times.

The checks are test_collectives.py's (numpy references, guard elements
after every output, send buffers unchanged), made once the step's group has
ended. A failure names the seed and the step; HETCCL_PROGRAM_SEED replays a
seed, HETCCL_PROGRAM_STEPS sets the length of every program, and
HETCCL_PROGRAM_WATCH=S has every rank that is still in its program after S
seconds (and every S after) print the step it is on and its Python stack
(where a program hangs, that names the call and the rank).
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from hetccl.errors import NcclError
from rank_procs import become_another_host, can_unshare_ipc
from test_collectives import (DTYPES, KINDS, MAX, MIN, MOVE, OP_NAMES, PLANE, PLANE_HOSTS,
                              PLANE_SMALL, PROD, RAILS, REDUCE_OPS, ROOTED, SHM, SMALL_CHUNKS,
                              SOCKET, SUM, Case, Check, DType, Rank, holding, inputs,
                              numpy_bytes, output_buffer, ptr)

pytestmark = pytest.mark.usefixtures("hetccl_library")

SEED = os.environ.get("HETCCL_PROGRAM_SEED")
STEPS = os.environ.get("HETCCL_PROGRAM_STEPS")
WATCH = float(os.environ.get("HETCCL_PROGRAM_WATCH", "0"))
GROUP_MAX = 6
ARENA_BYTES = 48 << 20
MAX_SHOWN = 40


# -- the program: the same on every rank ------------------------------------------------

# Communicators a call may run on: the world, or the half a rank shares with
# the ranks of its parity (ncclCommSplit, color rank % 2).
WORLD, HALF = 0, 1


@dataclass(frozen=True)
class Coll:
    """A collective, issued by every rank of its communicator."""
    comm: int
    kind: str
    dtype: int      # index in DTYPES
    op: int
    count: int
    inplace: bool
    root: int       # modulo the communicator's size, as src and dst below
    salt: int


@dataclass(frozen=True)
class Msg:
    """A message from src to dst: a send on src, a receive on dst."""
    comm: int
    src: int
    dst: int
    dtype: int
    count: int
    salt: int


Call = Union[Coll, Msg]


@dataclass(frozen=True)
class Step:
    grouped: bool
    calls: Tuple[Call, ...]
    # >= 0: no calls; every rank destroys its half and splits the world
    # again, by SPLITS[resplit].
    resplit: int = -1


# How the world splits into halves: by parity, or into a lower and an upper
# block. Programs start with the first.
SPLITS = (lambda rank, n: rank % 2, lambda rank, n: int(rank >= (n + 1) // 2))


def draw_count(rng: random.Random, largest: int) -> int:
    """Empty, tiny, around a few pieces, or (rarely) up to `largest`."""
    pick = rng.random()
    if pick < 0.06:
        return 0
    for chance, top in ((0.3, 16), (0.75, 5000), (0.93, largest // 4)):
        if pick < chance:
            return rng.randint(1, max(1, min(top, largest)))
    return rng.randint(1, largest)


def draw_program(seed: int, n: int, steps: int, largest: int,
                 plain_reductions_on_half: bool = False) -> List[Step]:
    """Ranks and roots are drawn below 12 (a multiple of every size up to
    4) and taken modulo the size of the call's communicator.
    plain_reductions_on_half: the half's reductions draw sum, prod, max and
    min of types other than fp8 alone (GPU_CONFIGS says why)."""
    rng = random.Random(seed)
    salt = 1000
    program = []
    for _ in range(steps):
        if rng.random() < 0.04:
            program.append(Step(False, (), resplit=rng.randrange(len(SPLITS))))
            continue
        grouped = rng.random() < 0.6
        calls: List[Call] = []
        for _ in range(rng.randint(2, GROUP_MAX) if grouped else 1):
            salt += 1
            dtype = rng.randrange(len(DTYPES))
            comm = HALF if rng.random() < 0.3 else WORLD
            if grouped and rng.random() < 0.45:
                calls.append(Msg(comm, rng.randrange(12), rng.randrange(12), dtype,
                                 draw_count(rng, largest), salt))
                continue
            kind = rng.choice(list(KINDS))
            _fn, reduces, placements = KINDS[kind]
            ops = REDUCE_OPS
            if reduces and comm == HALF and plain_reductions_on_half:
                ops = [SUM, PROD, MAX, MIN]
                while DTYPES[dtype].name.startswith("float8"):
                    dtype = rng.randrange(len(DTYPES))
            # Collectives whose buffers are n counts long draw a smaller count.
            count = draw_count(rng, largest)
            if kind in ("reducescatter", "alltoall", "scatter", "allgather", "gather"):
                count //= n
            calls.append(Coll(comm, kind, dtype, rng.choice(ops) if reduces else MOVE,
                              count, rng.choice(placements), rng.randrange(12), salt))
        program.append(Step(grouped, tuple(calls)))
    return program


def describe(call: Call, n: int) -> str:
    where = "half" if call.comm == HALF else "world"
    if isinstance(call, Msg):
        return (f"{where} message {call.src % n}->{call.dst % n} {DTYPES[call.dtype].name} "
                f"count={call.count}")
    return (f"{where} {call.kind} {DTYPES[call.dtype].name} {OP_NAMES[call.op]} "
            f"count={call.count}")


# -- where a rank's buffers live ------------------------------------------------------------

class Arena:
    """An ncclMemAlloc block handed out front to back and emptied after
    each step. Offsets are 64-byte aligned, some shifted by 8 bytes."""

    def __init__(self, nbytes: int) -> None:
        from hetccl import _lib
        self.L = ctypes.CDLL(str(_lib.loaded_path()))
        p = ctypes.c_void_p()
        assert self.L.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        self.base, self.size, self.used = int(p.value), nbytes, 0

    def take(self, nbytes: int, shift: bool) -> Optional[np.ndarray]:
        at = (self.used + 63) // 64 * 64 + (8 if shift else 0)
        if at + nbytes > self.size:
            return None
        self.used = at + nbytes
        if nbytes == 0:
            return np.empty(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.base + at))

    def empty(self) -> None:
        self.used = 0

    def free(self) -> None:
        assert self.L.ncclMemFree(ctypes.c_void_p(self.base)) == 0


def memory_of(arena: Optional[Arena], rng: random.Random) -> Callable[[int], np.ndarray]:
    """A call's allocator on this rank: the arena for about half the calls."""
    if arena is None or rng.random() < 0.5:
        return numpy_bytes
    shift = rng.random() < 0.3

    def take(nbytes: int) -> np.ndarray:
        got = arena.take(nbytes, shift)
        return numpy_bytes(nbytes) if got is None else got
    return take


@dataclass
class Twin:
    """A host buffer of a GPU rank and its copy in device memory."""
    host: np.ndarray
    device: Any         # a torch tensor of at least one byte
    up: bool = False    # the host bytes have been copied up

    @property
    def base(self) -> int:
        return ptr(self.host)

    @property
    def nbytes(self) -> int:
        return self.host.nbytes


class DeviceTwins:
    """A GPU rank's buffers. Every host buffer a call is given has a twin in
    device memory of the same size: the call gets the twin's address (at
    the same offset), the host bytes are copied up on the rank's stream just
    before the first call that names the buffer, and all twins are copied
    back once the step's calls are complete, where the checks read them. So
    the runners of test_collectives.py drive a GPU rank unchanged."""

    def __init__(self, device: int) -> None:
        import torch
        self.torch = torch
        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream()
        self.twins: List[Twin] = []

    def wrap(self, mem: Callable[[int], np.ndarray]) -> Callable[[int], np.ndarray]:
        def take(nbytes: int) -> np.ndarray:
            host = mem(nbytes)
            device = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, device=self.device)
            self.twins.append(Twin(host, device))
            return host
        return take

    def address(self, at: int) -> int:
        for t in reversed(self.twins):
            if t.base <= at <= t.base + t.nbytes:
                if not t.up and t.nbytes:
                    with self.torch.cuda.stream(self.stream):
                        t.device[:t.nbytes].copy_(self.torch.from_numpy(t.host.view(np.uint8)))
                t.up = True
                return t.device.data_ptr() + (at - t.base)
        raise AssertionError(f"address {at:#x} is not a buffer of this step")

    def bring_back(self) -> None:
        self.stream.synchronize()
        for t in self.twins:
            if t.nbytes:
                t.host.view(np.uint8)[:] = t.device[:t.nbytes].cpu().numpy()
        self.twins.clear()


class OnDevice:
    """A communicator as a GPU rank's runners see it: buffer arguments
    become their device twins, each call goes on the rank's stream."""

    BUFFERS = {"allReduce": 2, "reduce": 2, "broadcast": 2, "bcast": 1, "reduceScatter": 2,
               "allGather": 2, "alltoall": 2, "gather": 2, "scatter": 2, "send": 1, "recv": 1}

    def __init__(self, comm: nccl.NcclCommunicator, twins: DeviceTwins) -> None:
        self.comm, self.twins = comm, twins

    def __getattr__(self, name: str) -> object:
        fn = getattr(self.comm, name)
        k = self.BUFFERS.get(name)
        if k is None:
            return fn

        def call(*args: int) -> None:
            moved = [self.twins.address(a) if i < k else a for i, a in enumerate(args)]
            fn(*moved, stream=self.twins.stream.cuda_stream)
        return call


def comm_error(comm: Any) -> str:
    """ncclGetLastError of a communicator (a vendor's own, where forwarded)."""
    from hetccl import _lib
    inner = comm.comm if isinstance(comm, OnDevice) else comm
    text = _lib.lib().ncclGetLastError(_lib.ffi.cast("ncclComm_t", inner.comm))
    return _lib.ffi.string(text).decode(errors="replace") if text != _lib.ffi.NULL else ""


# -- one rank ------------------------------------------------------------------------------------

def issue_message(r: Rank, m: Msg, mem: Callable[[int], np.ndarray]) -> List[Check]:
    dt: DType = DTYPES[m.dtype]
    src, dst, label = m.src % r.n, m.dst % r.n, describe(m, r.n)
    data = inputs(dt, MOVE, src, m.count, m.salt)
    checks: List[Check] = []
    if r.rank == src:
        send = holding(mem, data)
        r.comm.send(ptr(send), m.count, dt.code, dst)
        checks.append(lambda: r.unchanged(label, send, data))
    if r.rank == dst:
        out = output_buffer(mem, dt, m.count)
        r.comm.recv(ptr(out), m.count, dt.code, src)

        def check() -> None:
            r.compare(label, dt, out[:m.count], data, None)
            r.guard(label, out, m.count)
        checks.append(check)
    return checks


def rank_order(step: Step, rng: random.Random) -> List[Call]:
    """This rank's order of a group's calls: each communicator's calls in
    the program's order (which NCCL asks of its collectives and of the
    messages between two ranks), the two communicators' merged at random,
    so that ranks interleave them differently."""
    if not step.grouped:
        return list(step.calls)
    queues = [[c for c in step.calls if c.comm == k] for k in (WORLD, HALF)]
    order: List[Call] = []
    while queues[0] or queues[1]:
        k = rng.randrange(2) if queues[0] and queues[1] else (0 if queues[0] else 1)
        order.append(queues[k].pop(0))
    return order


class Watch:
    """HETCCL_PROGRAM_WATCH: a thread that, every WATCH seconds until the
    program ends, prints where this rank is (the step and its Python
    stack) to stderr."""

    def __init__(self, rank: int, seed: int) -> None:
        self.where = "init"
        self.done = threading.Event()
        self.rank, self.seed, self.main = rank, seed, threading.get_ident()
        if WATCH > 0:
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        t0 = time.monotonic()
        while not self.done.wait(WATCH):
            frame = sys._current_frames().get(self.main)
            stack = "".join(traceback.format_stack(frame)[-6:]) if frame else ""
            print(f"[watch] rank {self.rank}, seed {self.seed}, after "
                  f"{time.monotonic() - t0:.0f} s: {self.where}\n{stack}", file=sys.stderr,
                  flush=True)


def rank_program(config: "Config", seed: int, steps: int) -> Tuple[int, int, List[str]]:
    """Runs in every rank; returns (calls issued, checks made, failure lines)."""
    info = hetccl.launcher.launch_info()
    assert info is not None
    if info.rank in config.own_host:
        become_another_host()
    # Ranks below config.gpus drive GPU `rank` (the device current at init),
    # the others are host ranks.
    twins = DeviceTwins(info.rank) if info.rank < config.gpus else None
    if config.gpus and twins is None:
        os.environ["HETCCL_DEVICE"] = "host"
    watch = Watch(info.rank, seed)
    world = hetccl.communicator()
    me = world.rank_id()
    failures: List[str] = []

    def facing(comm: nccl.NcclCommunicator) -> Any:
        return comm if twins is None else OnDevice(comm, twins)

    def split(how: int) -> Tuple[nccl.NcclCommunicator, Rank]:
        half = world.commSplit(SPLITS[how](me, world.size()), me)
        assert half is not None
        return half, Rank(facing(half), half.rank_id(), half.size(), f"{config.name} half",
                          failures=failures)
    half, half_rank = split(0)
    ranks = [Rank(facing(world), me, world.size(), config.name, failures=failures), half_rank]
    arena = Arena(ARENA_BYTES) if config.arena and twins is None else None
    mine = random.Random(seed * 64 + me)      # this rank's memory and order of calls
    issued = checks_made = 0
    try:
        program = draw_program(seed, ranks[WORLD].n, steps, config.largest,
                               plain_reductions_on_half=config.gpus > 0)
        for i, step in enumerate(program):
            watch.where = f"step {i}: " + (f"resplit {step.resplit}" if step.resplit >= 0 else
                                           "; ".join(describe(c, ranks[c.comm].n)
                                                     for c in step.calls))
            if step.resplit >= 0:
                checks_made += ranks[HALF].checks
                half.destroy()
                half, ranks[HALF] = split(step.resplit)
                continue
            checks: List[Check] = []
            if step.grouped:
                nccl.groupStart()
            for call in rank_order(step, mine):
                r, mem = ranks[call.comm], memory_of(arena, mine)
                if twins is not None:
                    mem = twins.wrap(mem)
                try:
                    if isinstance(call, Msg):
                        checks += issue_message(r, call, mem)
                        issued += r.rank in (call.src % r.n, call.dst % r.n)
                        continue
                    case = Case(r, call.kind, DTYPES[call.dtype], call.op, call.count,
                                call.inplace, call.salt, call.root % r.n, mem)
                    checks.append(KINDS[call.kind][0](case))
                    issued += 1
                except NcclError as e:
                    raise AssertionError(f"seed {seed} step {i}, rank {r.rank} of {r.n}: "
                                         f"{describe(call, r.n)}: {e}; the communicator's last "
                                         f"error: {comm_error(r.comm)!r}") from e
            if step.grouped:
                nccl.groupEnd()
            if twins is not None:
                twins.bring_back()
            before = len(failures)
            for check in checks:
                check()
            # The labels name the call, not the step: add it.
            where = f"seed {seed} step {i} ({'a group' if step.grouped else 'alone'})"
            failures[before:] = [f"{where}: {line}" for line in failures[before:]]
            if arena is not None:
                arena.empty()
    finally:
        watch.where = "destroying the communicators"
        half.destroy()
        world.destroy()
        watch.done.set()
        if arena is not None:
            arena.free()
    return issued, checks_made + sum(r.checks for r in ranks), failures


# -- configurations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    name: str
    nranks: int
    env: Tuple[Tuple[str, str], ...] = ()
    steps: int = 150
    largest: int = 250000       # elements of the largest count drawn
    arena: bool = True
    own_host: Tuple[int, ...] = ()
    seeds: int = 2
    gpus: int = 0               # ranks 0..gpus-1 drive GPUs 0..gpus-1


CONFIGS = [
    Config("n3-shm", 3, SHM),
    Config("n4-shm-ring", 4, SHM + (("HETCCL_ALGO", "ring"),)),
    Config("n3-shm-pull", 3, SHM + (("HETCCL_SHM_CMA", "1"),)),
    Config("n4-socket-small-chunks", 4, SOCKET + SMALL_CHUNKS, largest=20000),
    Config("n3-socket-direct", 3, SOCKET + (("HETCCL_ALGO", "direct"),
                                            ("HETCCL_SOCKET_NSTREAMS", "3"))),
    Config("n2-plane-small", 2, PLANE + PLANE_SMALL),
    Config("n3-plane-small", 3, PLANE + PLANE_SMALL, largest=60000),
    Config("n3-plane-hosts-small", 3, PLANE_HOSTS + PLANE_SMALL, own_host=(2,), largest=60000),
    Config("n4-islands-hier", 4, SHM + RAILS + (("HETCCL_ISLANDS", "0,0,1,1"),)),
    Config("n4-plane-islands", 4, PLANE + PLANE_SMALL + (("HETCCL_ISLANDS", "0,1,1,0"),),
           largest=60000),
]

# ib (in the Soft-RoCE VM: tools/rdma/run_vm.sh): a low zero-copy threshold
# and small pieces, so that most messages from the arena go by rendezvous
# (offered ahead of the head where receives queue), the rest eager.
IB_PROGRAMS = (("HETCCL_TRANSPORT", "ib"), ("HETCCL_IB_ZCOPY_THRESHOLD", "4096"),
               ("HETCCL_IB_CHUNK", "16384"))
IB_CONFIGS = [
    Config("n3-ib", 3, IB_PROGRAMS, steps=40, largest=60000),
    Config("n2-ib-qps3", 2, IB_PROGRAMS + (("HETCCL_IB_QPS", "3"),), steps=40, largest=60000),
    # The data plane across hosts over ib: rank 2 a host of its own, its
    # channels bridged, each bridge keeping a receive per slot posted.
    Config("n3-ib-plane-hosts", 3, IB_PROGRAMS + PLANE_HOSTS + PLANE_SMALL, own_host=(2,),
           steps=40, largest=60000),
]


# GPU ranks (tests marked cuda; tools/device/x2_accept.sh, stage pytest, runs
# them on two GPUs): islands forced apart, so that the data plane carries
# every call of the world communicator (GPU copy engines, reductions on the
# GPUs) and a one-rank half goes to NCCL itself, in the same groups.
# hetccl hands a forwarded call to NCCL as it is, and NCCL 2.28.9 (the
# 2 x H200 machine's) fails two kinds of reduction on a one-GPU
# communicator, which it runs as one scaling kernel: e4m3 AllReduce and
# Reduce were refused (ncclInvalidArgument, no message), and a uint64
# PreMulSum AllReduce of 37022 elements left the last 10 unwritten
# (consistent with blocks that each take an equal share rounded to the
# kernel's 16-byte packs and leave the remainder: 19 or 38 such shares
# cover 37012). So there the halves reduce by sum, prod, max and min, on
# types other than fp8.
CUDA_ISLANDS = (("HETCCL_ISLANDS", "0,1,2"), ("HETCCL_PLANE", "on"))
CUDA_CONFIGS = [
    Config("cuda2", 2, (("HETCCL_ISLANDS", "0,1"), ("HETCCL_PLANE", "on")), gpus=2),
    Config("cuda2-small-pieces", 2, (("HETCCL_ISLANDS", "0,1"),) + PLANE + PLANE_SMALL,
           gpus=2, largest=60000),
    Config("cuda2-host1", 3, CUDA_ISLANDS, gpus=2),
    # Two GPUs and two host ranks: halves by parity are a GPU and a host
    # rank each, by blocks the two GPUs and the two host ranks, so that both
    # halves of a step can be plane communicators with a GPU in them.
    Config("cuda2-host2", 4, (("HETCCL_ISLANDS", "0,1,2,3"), ("HETCCL_PLANE", "on")), gpus=2),
    Config("cuda2-hosts", 2, PLANE_HOSTS + (("HETCCL_ISLANDS", "0,1"),), gpus=2, own_host=(1,)),
]


def gpus_here() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def seeds_of(config: Config) -> Sequence[int]:
    if SEED is not None:
        return [int(SEED)]
    return [random.SystemRandom().getrandbits(31) for _ in range(config.seeds)]


def run_config(config: Config, timeout: float) -> str:
    """Every seed of a configuration; returns a line of what ran."""
    if config.own_host and not can_unshare_ipc():
        pytest.skip("a rank of another host needs root (unshare of an IPC namespace)")
    steps = int(STEPS) if STEPS else config.steps
    said = []
    for seed in seeds_of(config):
        t0 = time.monotonic()
        results = hetccl.launch(rank_program, config.nranks, config, seed, steps,
                                env=dict(config.env), timeout=timeout)
        failures = [line for _issued, _checks, lines in results for line in lines]
        checks = sum(c for _issued, c, _lines in results)
        assert checks > 0
        shown = "\n".join(failures[:MAX_SHOWN])
        more = f"\n... and {len(failures) - MAX_SHOWN} more" if len(failures) > MAX_SHOWN else ""
        assert not failures, (f"{config.name}, HETCCL_PROGRAM_SEED={seed}: {len(failures)} of "
                              f"{checks} checks failed:\n{shown}{more}")
        said.append(f"seed {seed}: {sum(i for i, _c, _l in results)} calls, {checks} checks "
                    f"in {time.monotonic() - t0:.1f} s")
    return f"[programs] {config.name}, {steps} steps: " + "; ".join(said)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_program(config: Config) -> None:
    print("\n" + run_config(config, timeout=270))


@pytest.mark.cuda
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CUDA_CONFIGS, ids=[c.name for c in CUDA_CONFIGS])
def test_program_cuda(config: Config) -> None:
    if gpus_here() < config.gpus:
        pytest.skip(f"needs {config.gpus} GPUs and torch")
    print("\n" + run_config(config, timeout=420))


@pytest.mark.rdma
@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", IB_CONFIGS, ids=[c.name for c in IB_CONFIGS])
def test_program_ib(config: Config) -> None:
    print("\n" + run_config(config, timeout=420))


def test_programs_agree_across_ranks() -> None:
    """Every rank draws the same program from a seed, and the drawing uses
    the whole of it: collectives of every kind, groups, messages to self."""
    a = draw_program(7, 3, 200, 250000)
    assert a == draw_program(7, 3, 200, 250000)
    assert a != draw_program(8, 3, 200, 250000)
    calls = [c for s in a for c in s.calls]
    assert {c.kind for c in calls if isinstance(c, Coll)} == set(KINDS)
    assert any(isinstance(c, Msg) and c.src % 3 == c.dst % 3 for c in calls)
    assert any(s.grouped for s in a) and any(not s.grouped for s in a)
    assert {c.root % 3 for c in calls if isinstance(c, Coll) and c.kind in ROOTED} == {0, 1, 2}
    assert any(s.grouped and {c.comm for c in s.calls} == {WORLD, HALF} for s in a)
    assert {s.resplit for s in a} == {-1, 0, 1}
    # A rank's order keeps each communicator's calls in the program's order.
    rng = random.Random(1)
    for step in a:
        order = rank_order(step, rng)
        assert sorted(order, key=step.calls.index) == list(step.calls)
        for k in (WORLD, HALF):
            assert [c for c in order if c.comm == k] == [c for c in step.calls if c.comm == k]
