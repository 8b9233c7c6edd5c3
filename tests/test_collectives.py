"""Every collective x every NCCL type x every operator on 1-4 real processes.

One launch per configuration (rank count, transport, chunk knobs); inside the
ranks a loop runs every (collective, type, operator, count, placement) and
checks it against a numpy reference that each rank computes alone from the
inputs of all ranks (the inputs are a deterministic function of rank and
case). The reference knows nothing of the library: bfloat16 and fp8 are
decoded here from their bit layouts, without ml_dtypes.

- integers: exact, with wrap-around (sum/max/min use the full range);
- floats: inputs are multiples of 1/4 in [-2, 2], exact in every type;
  max/min must be exact, sum/avg/premulsum within n*eps*sum|x| (each
  pairwise step may round once), prod within n*eps*|result|;
- data movement (broadcast, gathers, alltoall, send/recv): bit-exact on
  random bit patterns (NaN payloads included);
- every output buffer has guard elements after it that must stay untouched,
  and out-of-place send buffers must be left unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from rank_procs import become_another_host, can_unshare_ipc

pytestmark = pytest.mark.usefixtures("hetccl_library")

GUARD = 4            # elements after every output buffer
SENTINEL = 0xA5      # byte value of unwritten output
LARGE = 1000003      # a prime number of elements


# -- element types (independent of the library) ---------------------------------

def _minifloat_table(exp_bits: int, man_bits: int, ieee_specials: bool) -> np.ndarray:
    """Value of each of the 256 codes of an 8-bit float. e4m3 ("fn") has no
    infinities and one NaN per sign (all ones); e5m2 follows IEEE."""
    bias = (1 << (exp_bits - 1)) - 1
    top = (1 << exp_bits) - 1
    values = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> man_bits) & top, code & ((1 << man_bits) - 1)
        if ieee_specials and e == top:
            values[code] = sign * np.inf if m == 0 else np.nan
        elif not ieee_specials and e == top and m == (1 << man_bits) - 1:
            values[code] = np.nan
        elif e == 0:
            values[code] = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            values[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return values


E4M3 = _minifloat_table(4, 3, ieee_specials=False)
E5M2 = _minifloat_table(5, 2, ieee_specials=True)


def _quarter_codes(table: np.ndarray) -> np.ndarray:
    """Code of k/4 for k = -8..8 (the first code with that value; +0 for 0)."""
    codes = [0 if k == 0 else int(np.flatnonzero(table == k / 4)[0]) for k in range(-8, 9)]
    return np.array(codes, dtype=np.uint8)


FP8_QUARTERS = {"float8e4m3": _quarter_codes(E4M3), "float8e5m2": _quarter_codes(E5M2)}


@dataclass(frozen=True)
class DType:
    code: int
    name: str
    storage: str        # numpy dtype of the bits
    eps: float = 0.0    # unit roundoff * 2 (machine epsilon); 0 for integers

    @property
    def is_int(self) -> bool:
        return self.eps == 0.0

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.storage)

    def decode(self, a: np.ndarray) -> np.ndarray:
        """Float64 values of stored floats."""
        if self.name == "bfloat16":
            return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if self.name == "float8e4m3":
            return E4M3[a]
        if self.name == "float8e5m2":
            return E5M2[a]
        return a.astype(np.float64)

    def quarters(self, k: np.ndarray) -> np.ndarray:
        """The exact encoding of k/4 (|k| <= 8)."""
        v = np.asarray(k, dtype=np.float64) / 4
        if self.name == "bfloat16":
            return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        if self.name in ("float8e4m3", "float8e5m2"):
            return FP8_QUARTERS[self.name][np.asarray(k) + 8]
        return v.astype(self.np)


DTYPES = [
    DType(nccl.NCCL_INT8, "int8", "int8"),
    DType(nccl.NCCL_UINT8, "uint8", "uint8"),
    DType(nccl.NCCL_INT32, "int32", "int32"),
    DType(nccl.NCCL_UINT32, "uint32", "uint32"),
    DType(nccl.NCCL_INT64, "int64", "int64"),
    DType(nccl.NCCL_UINT64, "uint64", "uint64"),
    DType(nccl.NCCL_FLOAT16, "float16", "float16", 2.0**-10),
    DType(nccl.NCCL_FLOAT32, "float32", "float32", 2.0**-23),
    DType(nccl.NCCL_FLOAT64, "float64", "float64", 2.0**-52),
    DType(nccl.NCCL_BFLOAT16, "bfloat16", "uint16", 2.0**-7),
    DType(nccl.NCCL_FLOAT8E4M3, "float8e4m3", "uint8", 2.0**-3),
    DType(nccl.NCCL_FLOAT8E5M2, "float8e5m2", "uint8", 2.0**-2),
]
BY_NAME = {d.name: d for d in DTYPES}

# Operators: the five built-ins, PREMUL (ncclRedOpCreatePreMulSum with a
# per-rank host scalar), and MOVE for collectives that only move data.
SUM, PROD, MAX, MIN, AVG, PREMUL, MOVE = range(7)
OP_NAMES = ["sum", "prod", "max", "min", "avg", "premulsum", "-"]
REDUCE_OPS = [SUM, PROD, MAX, MIN, AVG, PREMUL]


# -- inputs and references ----------------------------------------------------

def inputs(dt: DType, op: int, rank: int, count: int, salt: int) -> np.ndarray:
    """Rank `rank`'s input for a case: the same on every process."""
    rng = np.random.default_rng([salt, dt.code, op, rank, count])
    if op == MOVE:
        raw = rng.integers(0, 256, size=count * dt.np.itemsize, dtype=np.uint8)
        return raw.view(dt.np)
    if not dt.is_int:
        return dt.quarters(rng.integers(-8, 9, size=count))
    info = np.iinfo(dt.np)
    signed = info.min < 0
    lo, hi = {PROD: (-2, 2) if signed else (0, 3),
              AVG: (-30, 30) if signed else (0, 60),
              PREMUL: (-20, 20) if signed else (0, 40)}.get(op, (info.min, info.max))
    return rng.integers(lo, hi, size=count, dtype=dt.np, endpoint=True)


def premul_scalar(dt: DType, rank: int) -> np.ndarray:
    """Rank r's PreMulSum scalar: r + 2 for integers, (r % 4 + 1) / 2 for
    floats (at most 2, which fp8 holds exactly)."""
    if dt.is_int:
        return np.array([rank + 2], dtype=dt.np)
    return dt.quarters(np.array([2 * (rank % 4 + 1)]))


def reference(dt: DType, op: int, xs: Sequence[np.ndarray]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(expected result, per-element tolerance or None for exact)."""
    n = len(xs)
    if dt.is_int:
        with np.errstate(over="ignore"):
            if op == PREMUL:
                xs = [x * premul_scalar(dt, r)[0] for r, x in enumerate(xs)]
            if op in (SUM, PREMUL):
                return reduce(np.add, xs), None
            if op == PROD:
                return reduce(np.multiply, xs), None
            if op == MAX:
                return reduce(np.maximum, xs), None
            if op == MIN:
                return reduce(np.minimum, xs), None
        total = reduce(np.add, [x.astype(np.int64) for x in xs])   # AVG: no overflow here
        return (np.sign(total) * (np.abs(total) // n)).astype(dt.np), None
    fs = [dt.decode(x) for x in xs]
    if op == PREMUL:
        fs = [f * dt.decode(premul_scalar(dt, r))[0] for r, f in enumerate(fs)]
    magnitude = reduce(np.add, [np.abs(f) for f in fs])
    if op in (SUM, PREMUL):
        return reduce(np.add, fs), n * dt.eps * magnitude
    if op == AVG:
        return reduce(np.add, fs) / n, (n + 1) * dt.eps * magnitude / n
    if op == PROD:
        want = reduce(np.multiply, fs)
        return want, n * dt.eps * np.abs(want)
    return reduce(np.maximum if op == MAX else np.minimum, fs), np.zeros(len(fs[0]))


# -- one rank's checks -----------------------------------------------------------

@dataclass
class Rank:
    comm: nccl.NcclCommunicator
    rank: int
    n: int
    config: str
    checks: int = 0
    case: int = 0
    failures: List[str] = field(default_factory=list)

    def fail(self, label: str, text: str) -> None:
        self.failures.append(f"[{self.config}] rank {self.rank}/{self.n} {label}: {text}")

    def compare(self, label: str, dt: DType, got: np.ndarray, want: np.ndarray,
                tol: Optional[np.ndarray]) -> None:
        self.checks += 1
        if tol is None:  # bit-exact
            bad = got.view(f"u{dt.np.itemsize}") != want.view(f"u{dt.np.itemsize}")
            shown_got, shown_want = got, want
        else:
            shown_got = dt.decode(got)
            shown_want = want
            bad = ~(np.abs(shown_got - want) <= tol)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(label, f"{int(bad.sum())}/{len(bad)} elements wrong, first at [{i}]: "
                      f"got {shown_got[i].item()!r} want {shown_want[i].item()!r}"
                      + ("" if tol is None else f" (tolerance {tol[i]:.3g})"))

    def guard(self, label: str, buf: np.ndarray, used: int) -> None:
        tail = buf[used:].view(np.uint8)
        if (tail != SENTINEL).any():
            self.fail(label, f"wrote past the end of the output ({used} elements)")

    def unchanged(self, label: str, buf: np.ndarray, original: np.ndarray) -> None:
        if buf.tobytes() != original.tobytes():
            self.fail(label, "out-of-place send buffer was modified")


def numpy_bytes(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def ptr(a: np.ndarray, offset: int = 0) -> int:
    return int(a.ctypes.data) + offset * a.itemsize


Check = Callable[[], None]


def output_buffer(mem: Callable[[int], np.ndarray], dt: DType, count: int) -> np.ndarray:
    """An output buffer from `mem`: `count` elements plus the guard, all SENTINEL."""
    buf = mem((count + GUARD) * dt.np.itemsize)
    buf[:] = SENTINEL
    return buf.view(dt.np)


def holding(mem: Callable[[int], np.ndarray], x: np.ndarray) -> np.ndarray:
    """A send buffer from `mem` holding a copy of x."""
    buf = mem(x.nbytes).view(x.dtype)
    buf[:] = x
    return buf


@dataclass
class Case:
    r: Rank
    kind: str
    dt: DType
    op: int
    count: int
    inplace: bool
    salt: int       # with the rank, type, operator and count: the inputs
    root: int
    # Where the case's buffers live: n bytes, anywhere (numpy by default; a
    # registered arena in tests/test_programs.py).
    mem: Callable[[int], np.ndarray] = numpy_bytes

    @property
    def label(self) -> str:
        place = "in-place" if self.inplace else "out-of-place"
        root = f" root={self.root}" if self.kind in ROOTED else ""
        return f"{self.kind} {self.dt.name} {OP_NAMES[self.op]} count={self.count} {place}{root}"

    def inputs(self, count: int) -> List[np.ndarray]:
        return [inputs(self.dt, self.op, j, count, self.salt) for j in range(self.r.n)]

    def output(self, count: int) -> np.ndarray:
        return output_buffer(self.mem, self.dt, count)

    def holding(self, x: np.ndarray) -> np.ndarray:
        return holding(self.mem, x)

    def opcode(self) -> int:
        if self.op == PREMUL:
            scalar = premul_scalar(self.dt, self.r.rank).tobytes()
            return self.r.comm.createPreMulSum(scalar, self.dt.code)
        return self.op

    def release(self, opcode: int) -> None:
        """Right after the call that used it: NCCL lets an operator go as
        soon as the last call given it has returned, inside a group too."""
        if self.op == PREMUL:
            self.r.comm.destroyRedOp(opcode)


# Each runner issues its case's call and returns the check of its result,
# to be run once the call is complete (at once, or after the group's end).

def reduce_to(c: Case, root: Optional[int]) -> Check:
    """AllReduce (root None) or Reduce to `root`: the result on every rank,
    or on the root alone."""
    r, count = c.r, c.count
    xs = c.inputs(count)
    out = c.output(count)
    if c.inplace:
        out[:count] = xs[r.rank]
    send = out if c.inplace else c.holding(xs[r.rank])
    op = c.opcode()
    if root is None:
        r.comm.allReduce(ptr(send), ptr(out), count, c.dt.code, op)
    else:
        r.comm.reduce(ptr(send), ptr(out), count, c.dt.code, op, root)
    c.release(op)

    def check() -> None:
        if root is None or r.rank == root:
            want, tol = reference(c.dt, c.op, xs)
            r.compare(c.label, c.dt, out[:count], want, tol)
        r.guard(c.label, out, count)
        if not c.inplace:
            r.unchanged(c.label, send, xs[r.rank])
    return check


def run_allreduce(c: Case) -> Check:
    return reduce_to(c, None)


def run_reduce(c: Case) -> Check:
    return reduce_to(c, c.root)


def run_reducescatter(c: Case) -> Check:
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(n * count)
    mine = slice(r.rank * count, (r.rank + 1) * count)
    op = c.opcode()
    if c.inplace:
        buf = c.output(n * count)
        buf[:n * count] = xs[r.rank]
        r.comm.reduceScatter(ptr(buf), ptr(buf, r.rank * count), count, c.dt.code, op)
        got, guarded, used, send = buf[mine], buf, n * count, None
    else:
        send = c.holding(xs[r.rank])
        out = c.output(count)
        r.comm.reduceScatter(ptr(send), ptr(out), count, c.dt.code, op)
        got, guarded, used = out[:count], out, count
    c.release(op)

    def check() -> None:
        want, tol = reference(c.dt, c.op, xs)
        if send is not None:
            r.unchanged(c.label, send, xs[r.rank])
        r.compare(c.label, c.dt, got, want[mine], None if tol is None else tol[mine])
        r.guard(c.label, guarded, used)
    return check


def run_allgather(c: Case) -> Check:
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(count)
    out = c.output(n * count)
    send = None
    if c.inplace:
        out[r.rank * count:(r.rank + 1) * count] = xs[r.rank]
        r.comm.allGather(ptr(out, r.rank * count), ptr(out), count, c.dt.code)
    else:
        send = c.holding(xs[r.rank])
        r.comm.allGather(ptr(send), ptr(out), count, c.dt.code)

    def check() -> None:
        if send is not None:
            r.unchanged(c.label, send, xs[r.rank])
        r.compare(c.label, c.dt, out[:n * count], np.concatenate(xs), None)
        r.guard(c.label, out, n * count)
    return check


def run_broadcast(c: Case) -> Check:
    r, count = c.r, c.count
    xs = c.inputs(count)
    out = c.output(count)
    send = None
    if c.inplace:
        if r.rank == c.root:
            out[:count] = xs[r.rank]
        r.comm.broadcast(ptr(out), ptr(out), count, c.dt.code, c.root)
    else:
        send = c.holding(xs[r.rank])
        r.comm.broadcast(ptr(send), ptr(out), count, c.dt.code, c.root)

    def check() -> None:
        if send is not None:
            r.unchanged(c.label, send, xs[r.rank])
        r.compare(c.label, c.dt, out[:count], xs[c.root], None)
        r.guard(c.label, out, count)
    return check


def run_bcast(c: Case) -> Check:
    r, count = c.r, c.count
    xs = c.inputs(count)
    out = c.output(count)
    if r.rank == c.root:
        out[:count] = xs[r.rank]
    r.comm.bcast(ptr(out), count, c.dt.code, c.root)

    def check() -> None:
        r.compare(c.label, c.dt, out[:count], xs[c.root], None)
        r.guard(c.label, out, count)
    return check


def run_alltoall(c: Case) -> Check:
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(n * count)
    send = c.holding(xs[r.rank])
    out = c.output(n * count)
    r.comm.alltoall(ptr(send), ptr(out), count, c.dt.code)

    def check() -> None:
        mine = slice(r.rank * count, (r.rank + 1) * count)
        r.compare(c.label, c.dt, out[:n * count], np.concatenate([x[mine] for x in xs]), None)
        r.guard(c.label, out, n * count)
        r.unchanged(c.label, send, xs[r.rank])
    return check


def run_gather(c: Case) -> Check:
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(count)
    out = c.output(n * count)
    send = None
    if c.inplace and r.rank == c.root:
        out[r.rank * count:(r.rank + 1) * count] = xs[r.rank]
        r.comm.gather(ptr(out, r.rank * count), ptr(out), count, c.dt.code, c.root)
    else:
        send = c.holding(xs[r.rank])
        r.comm.gather(ptr(send), ptr(out), count, c.dt.code, c.root)

    def check() -> None:
        if send is not None:
            r.unchanged(c.label, send, xs[r.rank])
        if r.rank == c.root:
            r.compare(c.label, c.dt, out[:n * count], np.concatenate(xs), None)
        r.guard(c.label, out, n * count)
    return check


def run_scatter(c: Case) -> Check:
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(n * count)
    mine = slice(r.rank * count, (r.rank + 1) * count)
    send = c.holding(xs[r.rank])
    if c.inplace and r.rank == c.root:
        r.comm.scatter(ptr(send), ptr(send, r.rank * count), count, c.dt.code, c.root)
        return lambda: r.compare(c.label, c.dt, send[mine], xs[c.root][mine], None)
    out = c.output(count)
    r.comm.scatter(ptr(send), ptr(out), count, c.dt.code, c.root)

    def check() -> None:
        r.compare(c.label, c.dt, out[:count], xs[c.root][mine], None)
        r.guard(c.label, out, count)
        r.unchanged(c.label, send, xs[r.rank])
    return check


def run_sendrecv(c: Case) -> Check:
    """A ring: send to rank+1, receive from rank-1, in one group (nested
    in the caller's, if any)."""
    r, n, count = c.r, c.r.n, c.count
    xs = c.inputs(count)
    send = c.holding(xs[r.rank])
    out = c.output(count)
    nccl.groupStart()
    r.comm.send(ptr(send), count, c.dt.code, (r.rank + 1) % n)
    r.comm.recv(ptr(out), count, c.dt.code, (r.rank - 1) % n)
    nccl.groupEnd()

    def check() -> None:
        r.compare(c.label, c.dt, out[:count], xs[(r.rank - 1) % n], None)
        r.guard(c.label, out, count)
        r.unchanged(c.label, send, xs[r.rank])
    return check


# name -> (runner, reduces?, placements)
KINDS: Dict[str, Tuple[Callable[[Case], Check], bool, Tuple[bool, ...]]] = {
    "allreduce": (run_allreduce, True, (False, True)),
    "reduce": (run_reduce, True, (False, True)),
    "reducescatter": (run_reducescatter, True, (False, True)),
    "allgather": (run_allgather, False, (False, True)),
    "broadcast": (run_broadcast, False, (False, True)),
    "bcast": (run_bcast, False, (True,)),
    "alltoall": (run_alltoall, False, (False,)),   # in-place alltoall is undefined in NCCL
    "gather": (run_gather, False, (False, True)),
    "scatter": (run_scatter, False, (False, True)),
    "sendrecv": (run_sendrecv, False, (False,)),
}
KIND_NAMES = list(KINDS)
ROOTED = {"reduce", "broadcast", "bcast", "gather", "scatter"}


# -- the sweep a rank runs ---------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    name: str
    nranks: int
    env: Tuple[Tuple[str, str], ...] = ()
    counts: Tuple[int, ...] = (0, 1, 7, 1031)
    kinds: Tuple[str, ...] = tuple(KINDS)
    large: Tuple[Tuple[str, str, int], ...] = ()  # (kind, dtype, op) at LARGE elements
    # The inputs of avg and prod stay in range for up to 4 ranks.
    ops: Tuple[int, ...] = tuple(REDUCE_OPS)
    # Ranks that run as a host of their own: an IPC namespace of their own
    # makes hetccl's host identity differ, as between machines.
    own_host: Tuple[int, ...] = ()


LARGE_SET = (("allreduce", "float32", SUM), ("allreduce", "bfloat16", SUM),
             ("allreduce", "int64", MAX), ("reducescatter", "float32", SUM),
             ("allgather", "uint8", MOVE), ("broadcast", "float64", MOVE),
             ("alltoall", "int32", MOVE))


def run_case(r: Rank, kind: str, dt: DType, op: int, count: int, inplace: bool) -> None:
    r.case += 1
    check = KINDS[kind][0](Case(r, kind, dt, op, count, inplace, KIND_NAMES.index(kind),
                                r.case % r.n))
    check()


def rank_sweep(spec: Sweep) -> Tuple[int, List[str]]:
    """Runs in every rank; returns (checks done, failure lines)."""
    info = hetccl.launcher.launch_info()
    if info is not None and info.rank in spec.own_host:
        become_another_host()
    comm = hetccl.communicator()
    r = Rank(comm, comm.rank_id(), comm.size(), spec.name)
    try:
        for count in spec.counts:
            for dt in DTYPES:
                for kind in spec.kinds:
                    _fn, reduces, placements = KINDS[kind]
                    for op in (spec.ops if reduces else [MOVE]):
                        for inplace in placements:
                            run_case(r, kind, dt, op, count, inplace)
        for kind, dtname, op in spec.large:
            for inplace in KINDS[kind][2]:
                run_case(r, kind, BY_NAME[dtname], op, LARGE, inplace)
    finally:
        comm.destroy()
    return r.checks, r.failures


SMALL_CHUNKS = (("HETCCL_PIPELINE_CHUNK", "64"), ("HETCCL_SMALL_BYTES", "0"),
                ("HETCCL_SHM_CHUNK", "64"), ("HETCCL_SHM_SLOTS", "2"),
                ("HETCCL_SOCKET_CHUNK", "512"))
SHM = (("HETCCL_TRANSPORT", "shm"),)
PULL_ALL = (("HETCCL_SHM_CMA", "1"), ("HETCCL_SHM_CMA_MIN", "0"), ("HETCCL_ALGO", "pull"))
RAILS = (("HETCCL_HIER_RAILS_MIN", "0"), ("HETCCL_HIER_RAILS_MIN_GATHER", "0"))
SOCKET = (("HETCCL_TRANSPORT", "socket"),)

PLANE = (("HETCCL_PLANE", "on"),)
PLANE_SMALL = (("HETCCL_PLANE_PIECE", "4096"), ("HETCCL_PLANE_SLOTS", "2"))
# Wide pieces (two slots each) from 8 KiB per channel: counts of 1031 and
# 6000 give messages under it, wide ones ending in a narrow piece, and
# ones ending in a wide piece cut short; pieces start at every slot, so
# some run on past the last slot.
PLANE_WIDE = (("HETCCL_PLANE_PIECE", "4096"), ("HETCCL_PLANE_SLOTS", "4"),
              ("HETCCL_PLANE_WIDE_MIN", "8192"))
PLANE_HOSTS = PLANE + (("HETCCL_PLANE_HOSTS", "all"),)
RHD = (("HETCCL_ALGO", "rhd"),)


def pieces(size: str) -> Tuple[Tuple[str, str], ...]:
    """Elementwise collectives cut into pieces, as on a communicator that
    stages device buffers (HETCCL_STAGE_PIECE)."""
    return (("HETCCL_STAGE_PIECE_HOST", "1"), ("HETCCL_STAGE_PIECE", size))


SWEEPS = [
    Sweep("n1", 1),
    Sweep("n2-shm", 2, SHM, large=LARGE_SET),
    Sweep("n3-shm", 3, SHM),
    Sweep("n4-shm", 4, SHM, large=LARGE_SET),
    Sweep("n2-socket", 2, SOCKET),
    Sweep("n3-socket", 3, SOCKET, large=LARGE_SET),
    Sweep("n4-socket", 4, SOCKET, counts=(0, 7, 1031)),
    Sweep("n2-shm-small-chunks", 2, SHM + SMALL_CHUNKS),
    Sweep("n3-shm-small-chunks", 3, SHM + SMALL_CHUNKS),
    Sweep("n3-socket-small-chunks", 3, SOCKET + SMALL_CHUNKS, counts=(1, 1031)),
    Sweep("n4-socket-small-chunks", 4, SOCKET + SMALL_CHUNKS, counts=(1, 1031)),
    Sweep("n3-shm-ring", 3, SHM + SMALL_CHUNKS + (("HETCCL_ALGO", "ring"),), counts=(7, 1031)),
    Sweep("n4-shm-ring", 4, SHM + (("HETCCL_ALGO", "ring"),), counts=(7, 1031)),
    Sweep("n3-shm-rd", 3, SHM + (("HETCCL_ALGO", "rd"),), counts=(7, 1031)),
    Sweep("n4-shm-rd", 4, SHM + (("HETCCL_ALGO", "rd"),), counts=(7, 1031)),
    Sweep("n3-socket-direct", 3, SOCKET + (("HETCCL_ALGO", "direct"),), counts=(7, 1031)),
    Sweep("n4-shm-direct", 4, SHM + (("HETCCL_ALGO", "direct"),), counts=(7, 1031)),
    # Receivers pull large messages (process_vm_readv), as on a host with
    # more ranks than CPUs; large allgathers then run direct.
    Sweep("n3-shm-pieces", 3, SHM + pieces("256"), counts=(7, 1031)),
    Sweep("n2-socket-pieces", 2, SOCKET + pieces("64K"), counts=(1031,),
          large=(("allreduce", "float32", SUM), ("broadcast", "float64", MOVE))),
    Sweep("n3-shm-pull", 3, SHM + (("HETCCL_SHM_CMA", "1"),), counts=(7,), large=LARGE_SET),
    # Every rank reads its share from its peers' buffers (algo/pull_*.c,
    # docs/host-engine.md): forced at every size, single copy from the first
    # byte, so that small counts reach the reads too; odd and even rank
    # counts, in and out of place (the sweep's placements), every type and
    # operator (PreMulSum falls back to the ring). With the default
    # threshold only the large cases read; with reads off the same
    # algorithms run over the ring.
    Sweep("n3-shm-pull-all", 3, SHM + PULL_ALL, counts=(0, 1, 7, 1031), large=LARGE_SET),
    Sweep("n4-shm-pull-all", 4, SHM + PULL_ALL, counts=(1, 13, 1031)),
    Sweep("n5-shm-pull-all", 5, SHM + PULL_ALL, counts=(0, 2, 7, 1031), large=LARGE_SET,
          ops=(SUM, MAX, MIN, PREMUL)),
    Sweep("n2-shm-pull-all", 2, SHM + PULL_ALL, counts=(1, 1031), large=LARGE_SET),
    Sweep("n5-shm-pull-threshold", 5, SHM + (("HETCCL_SHM_CMA", "1"),
                                             ("HETCCL_SHM_CMA_MIN", "4096")),
          counts=(7, 1031, 6007), ops=(SUM, MAX, MIN, PREMUL)),
    # Pulled messages of 1 MiB or more land by streaming stores through a
    # cache-sized buffer (HETCCL_SHM_CMA_STREAM): the large cases.
    Sweep("n3-shm-pull-stream", 3, SHM + PULL_ALL + (("HETCCL_SHM_CMA_STREAM", "1"),),
          counts=(1031,), large=LARGE_SET),
    Sweep("n3-shm-pull-ring", 3, SHM + SMALL_CHUNKS + (("HETCCL_SHM_CMA", "0"),
                                                       ("HETCCL_ALGO", "pull")),
          counts=(7, 1031), large=LARGE_SET),
    Sweep("n5-socket-pull", 5, SOCKET + (("HETCCL_ALGO", "pull"),), counts=(1, 1031),
          ops=(SUM, MAX, MIN, PREMUL)),
    # Forced islands holding several ranks: AllReduce, Broadcast, Reduce,
    # AllGather and ReduceScatter run hierarchically (inside each island,
    # across the leaders, back; hier/hier_ops.c) where their form applies,
    # the rest over all ranks: contiguous equal islands, interleaved ones
    # (AllGather and ReduceScatter flat), unequal ones (the leaders' phase
    # as one Broadcast or Reduce per island). Equal islands have rails:
    # AllReduce, AllGather and ReduceScatter cross on every rank at once
    # (RAILS: at every size; interleaved islands too), an AllReduce count
    # that the island size does not divide sending its last elements
    # through the leaders (1031 on islands of 2 and 3, 1 below the island
    # size: all of it); with the default thresholds only the large int64
    # AllReduce (8 MB) takes the rails, the rest the leaders.
    Sweep("n4-islands-hier", 4, SHM + RAILS + (("HETCCL_ISLANDS", "0,0,1,1"),),
          counts=(0, 1, 7, 1031), large=LARGE_SET),
    Sweep("n4-islands-hier-threshold", 4, SHM + (("HETCCL_ISLANDS", "0,0,1,1"),),
          counts=(7, 1031), large=LARGE_SET),
    Sweep("n6-islands-hier-rails3", 6, SHM + RAILS + (("HETCCL_ISLANDS", "0,0,0,1,1,1"),),
          counts=(1, 1031), ops=(SUM, MAX, MIN, PREMUL)),
    Sweep("n6-islands-hier-3x2", 6, SOCKET + RAILS + (("HETCCL_ISLANDS", "2,0,1,0,1,2"),),
          counts=(1031,), ops=(SUM, MAX, MIN, PREMUL)),
    Sweep("n4-islands-hier-socket", 4, SOCKET + (("HETCCL_ISLANDS", "1,0,1,0"),),
          counts=(7, 1031)),
    Sweep("n3-islands-hier", 3, SHM + (("HETCCL_ISLANDS", "0,1,1"),), counts=(7,)),
    Sweep("n4-islands-hier-unequal", 4, SHM + (("HETCCL_ISLANDS", "0,0,0,1"),), counts=(7, 1031)),
    # The cross-island data plane (plane/plane.h) with host ranks: the same
    # channels, pieces and programs a GPU rank's streams run, moved by CPUs.
    # Small slots send every message through many pieces and wrap the slots.
    Sweep("n2-plane", 2, PLANE, large=LARGE_SET),
    Sweep("n2-plane-small", 2, PLANE + PLANE_SMALL, counts=(1, 7, 1031, 4099)),
    Sweep("n3-plane-small", 3, PLANE + PLANE_SMALL, counts=(0, 7, 1031), large=LARGE_SET),
    Sweep("n4-plane-small", 4, PLANE + PLANE_SMALL, counts=(7, 1031)),
    Sweep("n4-plane", 4, PLANE, counts=(7, 1031), large=LARGE_SET),
    Sweep("n2-plane-wide", 2, PLANE + PLANE_WIDE, counts=(7, 1031, 6000), large=LARGE_SET),
    Sweep("n3-plane-wide", 3, PLANE + PLANE_WIDE, counts=(1031, 6000), large=LARGE_SET),
    Sweep("n4-plane-wide", 4, PLANE + PLANE_WIDE, counts=(6000,)),
    Sweep("n4-plane-islands-hier", 4, PLANE + (("HETCCL_ISLANDS", "0,0,1,1"),),
          counts=(7, 1031)),
    # The host engine's halving-doubling AllReduce (algo/rhd.c) lowered onto
    # the plane (plane/program.c): whole messages cut into pieces, each
    # round's send and receive taking them in turn (two slots, many pieces);
    # 3, 5 and 7 ranks fold, wide pieces end short (avg and prod only up
    # to 4 ranks, as above).
    Sweep("n3-plane-rhd", 3, PLANE + PLANE_SMALL + RHD, counts=(1, 7, 1031, 6000),
          large=LARGE_SET),
    Sweep("n4-plane-rhd-wide", 4, PLANE + PLANE_WIDE + RHD, counts=(7, 6000), large=LARGE_SET),
    Sweep("n5-plane-rhd", 5, PLANE + PLANE_SMALL + RHD, counts=(1, 1031, 6000),
          ops=(SUM, MAX, MIN, PREMUL)),
    Sweep("n7-plane-rhd", 7, PLANE + PLANE_SMALL + RHD, counts=(1031,), ops=(SUM, MIN, PREMUL)),
    # The plane across hosts (plane/bridge.c): a channel to a rank of
    # another host is a segment on each side, its pieces carried by the
    # pair's transport (socket here; ib in tests/test_ib_hosts.py).
    Sweep("n2-plane-hosts", 2, PLANE_HOSTS, own_host=(1,), large=LARGE_SET),
    Sweep("n2-plane-hosts-small", 2, PLANE_HOSTS + PLANE_SMALL, own_host=(1,),
          counts=(1, 7, 1031, 4099)),
    Sweep("n3-plane-hosts-small", 3, PLANE_HOSTS + PLANE_SMALL, own_host=(2,),
          counts=(0, 7, 1031), large=LARGE_SET),
    Sweep("n4-plane-hosts", 4, PLANE_HOSTS, own_host=(1, 3), counts=(7, 1031)),
    # An island of two ranks on host 0 and one on another host: the forms
    # run hierarchically, the leaders' channel bridged.
    Sweep("n3-plane-hosts-hier", 3, PLANE_HOSTS + (("HETCCL_ISLANDS", "0,0,1"),),
          own_host=(2,), counts=(7, 1031), large=LARGE_SET),
]

MAX_SHOWN = 40


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", SWEEPS, ids=[s.name for s in SWEEPS])
def test_sweep(spec: Sweep) -> None:
    if spec.own_host and not can_unshare_ipc():
        pytest.skip("a rank of another host needs root (unshare of an IPC namespace)")
    results = hetccl.launch(rank_sweep, spec.nranks, spec, env=dict(spec.env), timeout=540)
    failures = [line for _checks, lines in results for line in lines]
    checks = sum(c for c, _lines in results)
    assert checks > 0
    shown = "\n".join(failures[:MAX_SHOWN])
    more = f"\n... and {len(failures) - MAX_SHOWN} more" if len(failures) > MAX_SHOWN else ""
    assert not failures, f"{len(failures)} of {checks} checks failed:\n{shown}{more}"


def rank_plane_copies(nbytes: int) -> Dict[str, int]:
    comm = hetccl.communicator()
    try:
        me, peer = comm.rank_id(), 1 - comm.rank_id()
        x = np.full(nbytes, me + 1, np.uint8)
        y = np.zeros(nbytes, np.uint8)
        nccl.groupStart()
        comm.send(int(x.ctypes.data), nbytes, nccl.NCCL_UINT8, peer)
        comm.recv(int(y.ctypes.data), nbytes, nccl.NCCL_UINT8, peer)
        nccl.groupEnd()
        assert (y == peer + 1).all()
        return comm.copied_bytes()
    finally:
        comm.destroy()


def test_plane_host_copies_are_counted() -> None:
    """A host rank on the data plane copies each byte it sends into a slot
    and each byte it receives out of one: 2 per payload byte, counted as
    "plane" (hetcclCommCopiedBytes' last entry), none by a transport."""
    nbytes = 3 << 20
    for copied in hetccl.launch(rank_plane_copies, 2, nbytes, env=dict(PLANE)):
        assert copied["plane"] == 2 * nbytes, copied
        assert copied["shm"] == copied["socket"] == copied["ib"] == 0, copied


def test_reference_is_independent() -> None:
    """The test's own decoders agree with known encodings."""
    bf16 = BY_NAME["bfloat16"]
    assert bf16.decode(np.array([0x3F80, 0xC000], dtype=np.uint16)).tolist() == [1.0, -2.0]
    assert E4M3[0x38] == 1.0 and E4M3[0x7E] == 448.0 and np.isnan(E4M3[0x7F])
    assert E5M2[0x3C] == 1.0 and E5M2[0x7B] == 57344.0 and np.isinf(E5M2[0x7C])
    for dt in DTYPES:
        if not dt.is_int:
            k = np.arange(-8, 9)
            assert (dt.decode(dt.quarters(k)) == k / 4).all(), dt.name
