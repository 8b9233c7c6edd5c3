"""PyTorch process-group backend "hetccl": torch.distributed over libhetccl.

Contract:

- **Registration.** `import hetccl.torch_backend` registers the backend
  name "hetccl" for the devices "cpu" and "cuda"
  (`torch.distributed.Backend.register_backend`); so does torch itself
  through the package's `torch.distributed.backends` entry point when the
  package is installed, on torch versions that read that group (2.14 does,
  2.11 does not: there the import is needed). Importing `hetccl` alone
  never imports torch.
- **Base class.** Where torch's C++ `Backend` can be subclassed in Python
  (a constructor, and C++ callers reaching the Python methods: torch 2.14),
  HetcclBackend is a `Backend` that torch's own ProcessGroup holds for
  "cpu" and "cuda". Where it cannot (torch 2.11's Backend has no Python
  constructor), HetcclBackend is a `ProcessGroup` subclass, which torch
  takes as the group itself, as it does for any Python process group; it
  answers `_get_backend(device)` with itself. A probe at import decides
  (SUBCLASSES_BACKEND); the collectives are the same code either way.
- **Rendezvous.** The backend is created by `init_process_group("hetccl")`
  and `new_group(backend="hetccl")` with the store torch hands it: the
  group's rank 0 calls ncclGetUniqueId and sets the id in that store, the
  others get it from there, and every rank calls ncclCommInitRank at once,
  under the group's bound device (`device_id=`) or the current CUDA device.
  Call `torch.cuda.set_device` before `init_process_group` on GPU ranks, as
  with NCCL's eager init: torch versions that do not hand the group to the
  creator (2.11) do not tell the backend the `device_id`, and a
  `device_id=` other than the current device is then a ValueError. Which
  kind of rank a process is (host or CUDA) is the library's rule
  (docs/islands.md): a process that uses CUDA is a CUDA rank;
  `HETCCL_DEVICE=host` makes a CPU rank of a process on a GPU machine that
  has torch's CUDA runtime loaded.
- **Tensors.** Each operation takes tensors of one device: CPU tensors are
  host buffers, CUDA tensors device buffers on the rank's device. On a
  communicator the library forwards to NCCL (every rank a GPU of one
  island) CPU tensors are staged through the GPU, since NCCL takes device
  memory only. Non-contiguous tensors go through contiguous copies.
- **Types.** Reductions map float16, bfloat16, float32, float64, int8,
  uint8, int32, int64, uint32, uint64 and the two float8 types to the NCCL
  type of the same name; complex64/128 reduce as pairs of reals (SUM, AVG);
  bool reduces as uint8 with SUM as MAX (or) and PRODUCT as MIN (and).
  Anything else is a TypeError naming the type and op. Operations that only
  move data (broadcast, gathers, all-to-all, send/recv, scatter) move the
  bytes of any dtype.
- **Operators.** SUM, PRODUCT, MIN, MAX, AVG (floating types), PREMUL_SUM
  (`dist._make_nccl_premul_sum(factor)`; a tensor factor is read on the
  host). BAND, BOR and BXOR have no NCCL operator: ValueError.
- **Work objects and streams.** CUDA operations are enqueued on the current
  stream of the tensors' device (`torch.cuda.current_stream().cuda_stream`
  is the cudaStream_t); the returned work's `wait()` makes the stream that
  is current at that time wait for them (a CUDA-aware torch Future), without
  blocking the host, and `is_completed()` is true once they are enqueued,
  as for torch's CUDA futures. Operations on CPU tensors complete before
  the call returns (the library blocks on host buffers), so their work is
  complete at once. `get_future()` gives the output tensors (DDP's
  communication hooks use it). barrier blocks the host until every rank
  has reached it.
- **Send/recv.** Each send and recv is a separate library call; on CPU
  tensors it blocks until the peer has taken (or, for small messages, the
  transport has buffered) the data, so two ranks that both send a large
  message to each other before receiving wait for each other: order such
  exchanges (one side receives first); batch_isend_irecv issues its
  operations one by one too. Tags are ignored, as NCCL's are;
  receiving from any source is not supported.
- **Failures.** A library error raises NcclError (the ncclResult_t and the
  library's message); bad arguments raise ValueError or TypeError before
  the library is called.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import _lib
from . import nccl as _nccl
from .nccl import NcclCommunicator, get_unique_id, groupEnd, groupStart

__all__ = ["BACKEND_NAME", "HetcclBackend", "nccl_dtype", "register"]

BACKEND_NAME = "hetccl"
STORE_KEY = "hetccl/unique_id"

_NCCL_DTYPE = {
    torch.int8: _nccl.NCCL_INT8, torch.uint8: _nccl.NCCL_UINT8,
    torch.int32: _nccl.NCCL_INT32, torch.int64: _nccl.NCCL_INT64,
    torch.float16: _nccl.NCCL_FLOAT16, torch.bfloat16: _nccl.NCCL_BFLOAT16,
    torch.float32: _nccl.NCCL_FLOAT32, torch.float64: _nccl.NCCL_FLOAT64,
    torch.bool: _nccl.NCCL_UINT8,
}
for _name, _code in (("uint32", _nccl.NCCL_UINT32), ("uint64", _nccl.NCCL_UINT64),
                     ("float8_e4m3fn", _nccl.NCCL_FLOAT8E4M3),
                     ("float8_e5m2", _nccl.NCCL_FLOAT8E5M2)):
    if hasattr(torch, _name):  # these dtypes are newer than some torch 2.x
        _NCCL_DTYPE[getattr(torch, _name)] = _code

_RedOp = dist.ReduceOp.RedOpType
_NCCL_OP = {_RedOp.SUM: _nccl.NCCL_SUM, _RedOp.PRODUCT: _nccl.NCCL_PROD,
            _RedOp.MIN: _nccl.NCCL_MIN, _RedOp.MAX: _nccl.NCCL_MAX,
            _RedOp.AVG: _nccl.NCCL_AVG}
_BOOL_OP = {_RedOp.SUM: _nccl.NCCL_MAX, _RedOp.PRODUCT: _nccl.NCCL_MIN,
            _RedOp.MIN: _nccl.NCCL_MIN, _RedOp.MAX: _nccl.NCCL_MAX}


def nccl_dtype(dtype: torch.dtype) -> int:
    """The ncclDataType_t a reduction of `dtype` runs in; TypeError if none."""
    if dtype not in _NCCL_DTYPE:
        names = ", ".join(str(d).replace("torch.", "") for d in _NCCL_DTYPE)
        raise TypeError(f"hetccl backend: no NCCL data type for {dtype} in a reduction "
                        f"(reductions take {names}; complex64/128 for SUM and AVG)")
    return _NCCL_DTYPE[dtype]


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None or t.numel() == 0 else int(t.data_ptr())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 tensor."""
    return t.reshape(-1).view(torch.uint8)


def _rows(t: torch.Tensor) -> int:
    """Bytes of one index of dim 0 (all_to_all_single splits count those)."""
    return t.numel() * t.element_size() // t.size(0) if t.dim() and t.size(0) else 0


def _one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"hetccl backend: {what} takes one tensor per rank, not {len(tensors)}")
    return tensors[0]


class _Stage:
    """One operation's tensors as the library takes them: contiguous, on the
    device the communicator serves, outputs copied back by finish().

    All tensors of an operation are on one device; `stream` is that
    device's current stream (0 for host buffers)."""

    def __init__(self, backend: "HetcclBackend", tensors: Sequence[torch.Tensor]) -> None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"hetccl backend: one operation's tensors must be on one device, "
                             f"not {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"hetccl backend: {self.device.type} tensors are not supported "
                             "(cpu and cuda are)")
        self.work_device = self.device
        if self.device.type == "cpu" and backend._forwarded:
            self.work_device = backend._device  # NCCL takes device memory only
        self.cuda = self.work_device.type == "cuda"
        self.stream = torch.cuda.current_stream(self.work_device).cuda_stream if self.cuda else 0
        self._back: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.work_device).contiguous()

    def output(self, t: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """Where the library writes t's result; `keep`: it starts as t's
        data (in-place operations)."""
        if t.device == self.work_device and t.is_contiguous():
            return t
        buf = (t.to(self.work_device).contiguous() if keep
               else torch.empty(t.shape, dtype=t.dtype, device=self.work_device))
        self._back.append((t, buf))
        return buf

    def scratch(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=like.dtype, device=self.work_device)

    def copy_out(self, t: torch.Tensor, src: torch.Tensor) -> None:
        """t gets src's elements (src: a flat piece of the same dtype)."""
        self._back.append((t, src.view(t.shape)))

    def finish(self) -> None:
        for dst, src in self._back:
            dst.copy_(src)  # stream-ordered on a GPU; a GPU -> CPU copy waits for it


def _python_backends() -> bool:
    """Whether this torch lets Python subclass its C++ Backend: a
    constructor, and C++ calls reach the subclass's methods (torch 2.14
    has both; torch 2.11's Backend has no Python constructor at all)."""
    try:
        class _Probe(_C10dBackend):  # type: ignore[misc,valid-type]
            def getBackendName(self) -> str:  # noqa: N802
                return "hetccl-probe"

        return _Probe(0, 1).name() == "hetccl-probe"
    except (TypeError, AttributeError, RuntimeError):
        return False


# The class torch builds a Python backend from. Where Backend can be
# subclassed, torch's own ProcessGroup holds the backend for "cpu" and
# "cuda"; elsewhere the backend is a ProcessGroup subclass, which the
# creator returns and torch uses as the group itself (its documented way
# for Python process groups, test/distributed/test_c10d_pypg.py).
SUBCLASSES_BACKEND = _python_backends()
_BASE: type = _C10dBackend if SUBCLASSES_BACKEND else dist.ProcessGroup


class HetcclBackend(_BASE):  # type: ignore[misc,valid-type]
    """One rank's torch backend over one hetccl communicator (a subclass of
    torch's Backend, or of ProcessGroup where Backend has no Python
    constructor: SUBCLASSES_BACKEND)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._comm = self._rendezvous(store, rank, size, device)
        # Forwarded to NCCL: every rank is a GPU and CPU tensors go through
        # this device (_Stage); on the engine, host memory is served as is.
        self._forwarded = self._comm.backend().startswith("vendor")
        self._device = (torch.device("cuda", self._comm.device_id()) if self._forwarded
                        else torch.device("cpu"))

    @staticmethod
    def _rendezvous(store: Any, rank: int, size: int,
                    device: Optional[torch.device]) -> NcclCommunicator:
        if rank == 0:
            uid = bytes(b & 0xFF for b in get_unique_id())
            store.set(STORE_KEY, uid)
        else:
            uid = bytes(store.get(STORE_KEY))
        ctx = (torch.cuda.device(device) if device is not None and device.type == "cuda"
               else contextlib.nullcontext())
        with ctx:
            return NcclCommunicator(size, uid, rank)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    @property
    def supports_coalescing(self) -> bool:
        """False: batch_isend_irecv then issues its operations one by one
        (torch's own property would look itself up here without end)."""
        return False

    if not SUBCLASSES_BACKEND:
        # The group is its own backend: torch asks a group for the backend
        # of a device (init_process_group(device_id=...) does, for one).
        def _get_backend(self, device: Any) -> "HetcclBackend":
            device = torch.device(device)
            if device.type not in ("cpu", "cuda"):
                raise RuntimeError(f"hetccl backend: no backend for {device.type} "
                                   "(cpu and cuda)")
            comm_dev = self._comm.device_id()
            if device.type == "cuda" and device.index is not None and comm_dev >= 0 \
                    and device.index != comm_dev:
                raise ValueError(
                    f"hetccl backend: the communicator is on cuda:{comm_dev}, not {device}: "
                    "this torch does not hand device_id to a Python backend, so call "
                    "torch.cuda.set_device(device_id) before init_process_group")
            return self

        @property
        def supports_splitting(self) -> bool:
            return False

    @property
    def communicator(self) -> NcclCommunicator:
        """The hetccl communicator this backend drives."""
        return self._comm

    def __del__(self) -> None:
        comm = getattr(self, "_comm", None)
        if comm is not None and comm.comm:
            try:
                comm.destroy()
            except Exception:  # interpreter shutdown: the library may be gone
                pass

    # -- plumbing --------------------------------------------------------------
    @contextlib.contextmanager
    def _op(self, tensors: Sequence[torch.Tensor]) -> Iterator[_Stage]:
        stage = _Stage(self, tensors)
        yield stage
        stage.finish()

    @staticmethod
    def _work(result: Any, tensors: Sequence[torch.Tensor]) -> Any:
        """A completed-at-enqueue work: CUDA-aware futures record an event
        on the current streams now and make wait() join them."""
        cuda = sorted({t.device for t in tensors if t.is_cuda}, key=str)
        fut = torch.futures.Future(devices=cuda) if cuda else torch.futures.Future()
        fut.set_result(result)
        return _future_work(fut)

    def _per_rank(self, tensors: List[torch.Tensor], what: str) -> List[torch.Tensor]:
        """tensors, checked to be one per rank."""
        if len(tensors) != self._size:
            raise ValueError(f"hetccl backend: {what} need one tensor per rank ({self._size}), "
                             f"not {len(tensors)}")
        return tensors

    @contextlib.contextmanager
    def _group(self) -> Iterator[None]:
        groupStart()
        try:
            yield
        finally:
            groupEnd()

    @staticmethod
    def _view(kind: Any, t: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """(flat view, datatype) in which t is reduced by `kind`; raises for
        a type or operator NCCL cannot reduce."""
        if kind in (_RedOp.BAND, _RedOp.BOR, _RedOp.BXOR):
            raise ValueError(f"hetccl backend: ReduceOp.{kind.name} has no NCCL operator "
                             "(SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM)")
        if t.is_complex():
            if kind not in (_RedOp.SUM, _RedOp.AVG, _RedOp.PREMUL_SUM):
                raise ValueError(f"hetccl backend: ReduceOp.{kind.name} is not defined on "
                                 "complex tensors")
            t = torch.view_as_real(t)
        datatype = nccl_dtype(t.dtype)
        if t.dtype == torch.bool:
            if kind not in _BOOL_OP:
                raise ValueError(f"hetccl backend: ReduceOp.{kind.name} is not defined on bool")
            return t.reshape(-1).view(torch.uint8), datatype
        if kind in (_RedOp.AVG, _RedOp.PREMUL_SUM) and not t.dtype.is_floating_point:
            raise TypeError(f"hetccl backend: ReduceOp.{kind.name} takes floating types, "
                            f"not {t.dtype}")
        return t.reshape(-1), datatype

    @contextlib.contextmanager
    def _redop(self, op: Any, t: torch.Tensor) -> Iterator[Tuple[torch.Tensor, int, int]]:
        """(flat view, datatype, ncclRedOp_t) for reducing t by op; a
        PREMUL_SUM operator lives as long as the block."""
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        view, datatype = self._view(kind, t)
        if kind != _RedOp.PREMUL_SUM:
            yield view, datatype, (_BOOL_OP if t.dtype == torch.bool else _NCCL_OP)[kind]
            return
        factor = _premul_factor(op)
        value = float(factor.item() if isinstance(factor, torch.Tensor) else factor)
        scalar = _bytes(torch.tensor([value], dtype=view.dtype)).numpy().tobytes()
        redop = self._comm.createPreMulSum(scalar, datatype)
        try:
            yield view, datatype, redop
        finally:
            self._comm.destroyRedOp(redop)

    def _allreduce_into(self, st: _Stage, t: torch.Tensor, op: Any) -> None:
        with self._redop(op, st.output(t, keep=True)) as (view, datatype, redop):
            self._comm.allReduce(_ptr(view), _ptr(view), view.numel(), datatype, redop,
                                 st.stream)

    # -- collectives (torch's Backend method names) ---------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "allreduce")
        with self._op(tensors) as st:
            self._allreduce_into(st, t, opts.reduceOp)
        return self._work(tensors, tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        with self._op(tensors) as st, self._group():
            for t in tensors:
                self._allreduce_into(st, t, opts.reduceOp)
        return self._work(tensors, tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "broadcast")
        with self._op(tensors) as st:
            buf = _bytes(st.output(t, keep=True))
            self._comm.broadcast(_ptr(buf), _ptr(buf), buf.numel(), _nccl.NCCL_UINT8,
                                 opts.rootRank, st.stream)
        return self._work(tensors, tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "reduce")
        with self._op(tensors) as st, \
                self._redop(opts.reduceOp, st.output(t, keep=True)) as (view, datatype, redop):
            self._comm.reduce(_ptr(view), _ptr(view), view.numel(), datatype, redop,
                              opts.rootRank, st.stream)
        return self._work(tensors, tensors)

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts: Any) -> Any:
        t = _one(inputs, "allgather")
        outs = self._per_rank(_one(output_lists, "allgather"), "allgather outputs")
        with self._op([t, *outs]) as st:
            src = _bytes(st.input(t))
            if all(o.numel() * o.element_size() == src.numel() for o in outs):
                flat = st.scratch(src, src.numel() * self._size)
                self._comm.allGather(_ptr(src), _ptr(flat), src.numel(), _nccl.NCCL_UINT8,
                                     st.stream)
                for r, o in enumerate(outs):
                    st.copy_out(o, flat[r * src.numel():(r + 1) * src.numel()].view(o.dtype))
            else:  # sizes differ by rank: each rank broadcasts its own
                bufs = [_bytes(st.output(o)) for o in outs]
                with self._group():
                    for r, buf in enumerate(bufs):
                        send = src if r == self._rank else buf
                        self._comm.broadcast(_ptr(send), _ptr(buf), buf.numel(),
                                             _nccl.NCCL_UINT8, r, st.stream)
        return self._work(output_lists, [t, *outs])

    def _gather_single(self, st: _Stage, out: torch.Tensor, t: torch.Tensor) -> None:
        src = _bytes(st.input(t))
        dst = _bytes(st.output(out))
        if dst.numel() != src.numel() * self._size:
            raise ValueError(f"hetccl backend: all_gather_into_tensor output has "
                             f"{dst.numel()} bytes, not {self._size} x {src.numel()}")
        self._comm.allGather(_ptr(src), _ptr(dst), src.numel(), _nccl.NCCL_UINT8, st.stream)

    def all_gather_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        with self._op([out, t]) as st:
            self._gather_single(st, out, t)
        return self._work([out], [out, t])

    def all_gather_single_coalesced(self, outs: List[torch.Tensor], ins: List[torch.Tensor],
                                    opts: Any = None) -> Any:
        """opts: torch's coalescing manager passes none."""
        with self._op([*outs, *ins]) as st, self._group():
            for out, t in zip(outs, ins):
                self._gather_single(st, out, t)
        return self._work(outs, [*outs, *ins])

    def _scatter_single(self, st: _Stage, out: torch.Tensor, t: torch.Tensor, op: Any) -> None:
        if t.numel() != out.numel() * self._size:
            raise ValueError(f"hetccl backend: reduce_scatter_tensor input has {t.numel()} "
                             f"elements, not {self._size} x {out.numel()}")
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        dst = self._view(kind, st.output(out))[0]
        with self._redop(op, st.input(t)) as (src, datatype, redop):
            self._comm.reduceScatter(_ptr(src), _ptr(dst), dst.numel(), datatype, redop,
                                     st.stream)

    def reduce_scatter_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        with self._op([out, t]) as st:
            self._scatter_single(st, out, t, opts.reduceOp)
        return self._work([out], [out, t])

    def reduce_scatter_single_coalesced(self, outs: List[torch.Tensor],
                                        ins: List[torch.Tensor], opts: Any) -> Any:
        with self._op([*outs, *ins]) as st, self._group():
            for out, t in zip(outs, ins):
                self._scatter_single(st, out, t, opts.reduceOp)
        return self._work(outs, [*outs, *ins])

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any) -> Any:
        out = _one(outputs, "reduce_scatter")
        ins = self._per_rank(_one(input_lists, "reduce_scatter"), "reduce_scatter inputs")
        with self._op([out, *ins]) as st:
            if all(i.numel() == out.numel() for i in ins):
                flat = torch.cat([st.input(i).reshape(-1) for i in ins])
                self._scatter_single(st, out, flat, opts.reduceOp)
            else:  # sizes differ by rank: a reduce to each rank
                op = opts.reduceOp
                kind = op.op if isinstance(op, dist.ReduceOp) else op
                with self._redop(op, st.output(out)) as (dst, datatype, redop), self._group():
                    for r, i in enumerate(ins):
                        src = self._view(kind, st.input(i))[0]
                        recv = dst if r == self._rank else torch.empty_like(src)
                        self._comm.reduce(_ptr(src), _ptr(recv), src.numel(), datatype,
                                          redop, r, st.stream)
        return self._work(outputs, [out, *ins])

    def _exchange(self, st: _Stage, sends: List[torch.Tensor], recvs: List[torch.Tensor]) -> None:
        """Rank r's piece of sends goes to rank r, recvs[r] comes from it
        (byte tensors); this rank's own piece is a local copy."""
        with self._group():
            for r in range(self._size):
                if r == self._rank:
                    continue
                if sends[r].numel():
                    self._comm.send(_ptr(sends[r]), sends[r].numel(), _nccl.NCCL_UINT8, r,
                                    st.stream)
                if recvs[r].numel():
                    self._comm.recv(_ptr(recvs[r]), recvs[r].numel(), _nccl.NCCL_UINT8, r,
                                    st.stream)
        recvs[self._rank].copy_(sends[self._rank])

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                 opts: Any) -> Any:
        self._per_rank(inputs, "all_to_all inputs")
        self._per_rank(outputs, "all_to_all outputs")
        with self._op([*outputs, *inputs]) as st:
            self._exchange(st, [_bytes(st.input(t)) for t in inputs],
                           [_bytes(st.output(t)) for t in outputs])
        return self._work(outputs, [*outputs, *inputs])

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor, out_splits: List[int],
                          in_splits: List[int], opts: Any) -> Any:
        with self._op([out, t]) as st:
            src, dst = _bytes(st.input(t)), _bytes(st.output(out))
            if not out_splits and not in_splits:
                if src.numel() % self._size or dst.numel() != src.numel():
                    raise ValueError("hetccl backend: all_to_all_single without splits needs "
                                     f"equal input and output sizes divisible by {self._size}")
                self._comm.alltoall(_ptr(src), _ptr(dst), src.numel() // self._size,
                                    _nccl.NCCL_UINT8, st.stream)
            else:
                self._exchange(st, self._split(src, t, in_splits, "input"),
                               self._split(dst, out, out_splits, "output"))
        return self._work([out], [out, t])

    def _split(self, flat: torch.Tensor, t: torch.Tensor, splits: List[int],
               what: str) -> List[torch.Tensor]:
        """flat's pieces by dim-0 splits (even when none are given)."""
        rows = t.size(0) if t.dim() else 1
        if not splits:
            if rows % self._size:
                raise ValueError(f"hetccl backend: all_to_all_single {what} of {rows} rows "
                                 f"does not split evenly over {self._size} ranks")
            splits = [rows // self._size] * self._size
        if len(splits) != self._size or sum(splits) != rows:
            raise ValueError(f"hetccl backend: all_to_all_single {what} splits {list(splits)} "
                             f"do not cover {rows} rows over {self._size} ranks")
        row = _rows(t)
        edges = [0]
        for s in splits:
            edges.append(edges[-1] + s * row)
        return [flat[a:b] for a, b in zip(edges, edges[1:])]

    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
               opts: Any) -> Any:
        t = _one(inputs, "gather")
        root = opts.rootRank
        outs = _one(output_lists, "gather") if self._rank == root else []
        with self._op([t, *outs]) as st:
            src = _bytes(st.input(t))
            if self._rank == root:
                bufs = [_bytes(st.output(o)) for o in outs]
                self._exchange(st, [src if r == root else src[:0] for r in range(self._size)],
                               bufs)
            else:
                self._comm.send(_ptr(src), src.numel(), _nccl.NCCL_UINT8, root, st.stream)
        return self._work(output_lists, [t, *outs])

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                opts: Any) -> Any:
        out = _one(outputs, "scatter")
        root = opts.rootRank
        ins = _one(input_lists, "scatter") if self._rank == root else []
        with self._op([out, *ins]) as st:
            dst = _bytes(st.output(out))
            if self._rank == root:
                self._exchange(st, [_bytes(st.input(i)) for i in ins],
                               [dst if r == root else dst[:0] for r in range(self._size)])
            else:
                self._comm.recv(_ptr(dst), dst.numel(), _nccl.NCCL_UINT8, root, st.stream)
        return self._work(outputs, [out, *ins])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> Any:
        t = _one(tensors, "send")
        with self._op(tensors) as st:
            buf = _bytes(st.input(t))
            self._comm.send(_ptr(buf), buf.numel(), _nccl.NCCL_UINT8, dst, st.stream)
        return self._work(tensors, tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> Any:
        t = _one(tensors, "recv")
        with self._op(tensors) as st:
            buf = _bytes(st.output(t))
            self._comm.recv(_ptr(buf), buf.numel(), _nccl.NCCL_UINT8, src, st.stream)
        return self._work(tensors, tensors)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> Any:
        raise ValueError("hetccl backend: recv from any source is not supported "
                         "(NCCL has no such receive); name the source rank")

    def barrier(self, opts: Any) -> Any:
        """Every rank has reached it when it returns (the host waits)."""
        device = self._device if self._forwarded else torch.device("cpu")
        token = torch.zeros(1, dtype=torch.int32, device=device)
        with self._op([token]) as st:
            self._comm.allReduce(_ptr(token), _ptr(token), 1, _nccl.NCCL_INT32,
                                 _nccl.NCCL_SUM, st.stream)
        if token.is_cuda:
            torch.cuda.current_stream(token.device).synchronize()
        return self._work([], [])

    # Names older torch 2.x releases call (before the *_single renames).
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single


def _premul_factor(op: Any) -> Any:
    """A PREMUL_SUM ReduceOp's factor (a number or a tensor): its `factor`
    attribute, or on torch without it (2.11) the second item of the state
    torch pickles it by, (op, factor)."""
    if hasattr(op, "factor"):
        return op.factor
    return op.__getstate__()[1]


def _future_work(fut: torch.futures.Future) -> Any:
    """A torch Work that is the future (is_completed, wait, get_future)."""
    make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
    if make is not None:
        return make(fut)
    return _FutureWork(fut)  # pragma: no cover (torch without the helper)


class _FutureWork(dist.Work):  # type: ignore[misc]
    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut


def _create(opts: Any, backend_options: Any = None) -> HetcclBackend:
    """torch's extended creator: the group's store, rank, size, timeout and
    the process group (whose bound device, if any, the communicator uses)."""
    pg = getattr(opts, "process_group", None)
    device = getattr(pg, "bound_device_id", None) if pg is not None else None
    return HetcclBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, device)


def register() -> None:
    """Register "hetccl" with torch.distributed (idempotent; also the
    `torch.distributed.backends` entry point's registrar)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    _lib.library_path()  # fail here, naming the cause, if the library is missing
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])


register()
