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
- **Rendezvous and the rank's kind.** The backend is created by
  `init_process_group("hetccl")` and `new_group(backend="hetccl")` with the
  store torch hands it. Its communicator is made at the group's first
  operation (at creation when the group is bound to a CUDA device,
  `device_id=`): the group's rank 0 calls ncclGetUniqueId and sets the id
  in that store, the others get it from there, and every rank calls
  hetcclCommInitRankAs, its kind following that operation's tensors: CPU
  tensors make a host rank, CUDA tensors a CUDA rank on their device,
  whatever libraries the process has loaded (a GPU build of torch loads
  CUDA in every process). So no variable is needed for a CPU job on a GPU
  machine, or for a job that mixes CPU and GPU ranks; ranks that share a
  GPU are never handed to NCCL as one island (the library's rule,
  docs/islands.md). A barrier before the first operation meets through the
  store. torch versions that do not hand the group to the creator (2.11)
  do not tell the backend the `device_id`: call `torch.cuda.set_device`
  first there.
- **Tensors.** Each operation takes tensors of one device: CPU tensors are
  host buffers, CUDA tensors device buffers. A rank may pass both kinds
  over its life: CUDA tensors on a host rank are staged through host
  memory here (a host rank's communicator reads host memory only, and the
  call runs at once: the copies back make the work complete); CPU tensors
  on a communicator the library forwards to NCCL (every rank a GPU of one
  island) are staged through the GPU here, since NCCL takes device memory
  only.
  Non-contiguous tensors go through contiguous copies.
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
- **Work objects, streams and threads** (how an operation runs:
  hetccl/torch_work.py). CUDA operations are enqueued on the current
  stream of the tensors' device (`torch.cuda.current_stream().cuda_stream`
  is the cudaStream_t) from the calling thread; the returned work's
  `wait()` makes the stream that is current at that time wait for them (a
  CUDA-aware torch Future), without blocking the host, and
  `is_completed()` is true once they are enqueued, as for torch's CUDA
  futures. Operations on CPU tensors are asynchronous as gloo's are: the
  call returns at once, a worker thread of the backend makes the library
  call (which blocks on host buffers), and the work completes when it has
  run (contiguous CPU tensors on a host rank: one library call on their
  own memory, hetccl/torch_direct.py); `wait()` blocks until then and
  raises the operation's error. DDP's
  gradient all-reduces thus overlap its backward pass. Calls reach the
  library in the order they were made. `get_future()` gives the output
  tensors (DDP's communication hooks use it). barrier blocks the host
  until every rank has reached it.
- **Send/recv.** Each send and recv is a separate library call, run in
  call order; on CPU tensors a large send completes when the peer has
  taken it, so two ranks that both send a large message to each other
  before receiving wait for each other: order such exchanges (one side
  receives first); batch_isend_irecv issues its operations one by one
  too. Tags are ignored, as NCCL's are; receiving from any source is not
  supported.
- **Failures.** A library error raises NcclError (the ncclResult_t and the
  library's message), from the call or, for CPU work, from `wait()`; bad
  arguments raise ValueError or TypeError in the call, before the library
  is called.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import _lib
from . import dtypes as _dtypes
from . import nccl as _nccl
from .errors import check
from .nccl import NcclCommunicator, _uid_struct, get_unique_id
from .torch_direct import NCCL_OP, DirectCalls
from .torch_work import Stage, Worker, future_work, operation_device

__all__ = ["BACKEND_NAME", "HetcclBackend", "nccl_dtype", "register"]

BACKEND_NAME = "hetccl"
STORE_KEY = "hetccl/unique_id"
DEVICE_HOST, DEVICE_CUDA = 1, 2  # hetcclDevice_t (include/hetccl.h)
_WAITED = SimpleNamespace(asyncOp=False)  # options of an operation the backend waits for

_RedOp = dist.ReduceOp.RedOpType
_BOOL_OP = {_RedOp.SUM: _nccl.NCCL_MAX, _RedOp.PRODUCT: _nccl.NCCL_MIN,
            _RedOp.MIN: _nccl.NCCL_MIN, _RedOp.MAX: _nccl.NCCL_MAX}


def nccl_dtype(dtype: torch.dtype) -> int:
    """The ncclDataType_t a reduction of `dtype` runs in; TypeError if none."""
    try:
        return _dtypes.nccl_dtype(dtype)
    except TypeError:
        raise TypeError(f"hetccl backend: no NCCL data type for {dtype} in a reduction "
                        f"(reductions take {_dtypes.SUPPORTED}; complex64/128 for SUM and "
                        "AVG)") from None


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
        self._store, self._timeout = store, timeout
        self._comm: Optional[NcclCommunicator] = None
        # Forwarded to NCCL: every rank is a GPU of one island, and CPU
        # tensors go through this GPU (torch_work.Stage); on the engine,
        # host memory is served as it is.
        self._forwarded = False
        # The direct path (torch_direct.py): contiguous CPU tensors on an
        # engine communicator, one library call on their own memory.
        self._direct: Optional[DirectCalls] = None
        self._device = torch.device("cpu")
        self._barriers = 0
        self._lock = threading.Lock()
        self._worker = Worker("hetccl-worker")
        if device is not None and torch.device(device).type == "cuda":
            self._join(torch.device(device))  # a bound device: eager, as NCCL's

    def _join(self, device: torch.device) -> None:
        """Make the communicator, this rank's kind following `device`: a
        host rank for CPU tensors, a CUDA rank on that GPU for CUDA ones
        (hetcclCommInitRankAs), whatever else the process has loaded."""
        if self._rank == 0:
            uid = bytes(b & 0xFF for b in get_unique_id())
            self._store.set(STORE_KEY, uid)
        else:
            uid = bytes(self._store.get(STORE_KEY))
        if device.type == "cuda":
            with torch.cuda.device(device):
                comm = _init_as(self._size, uid, self._rank, DEVICE_CUDA)
        else:
            comm = _init_as(self._size, uid, self._rank, DEVICE_HOST)
        self._comm = comm
        self._forwarded = comm.backend().startswith("vendor")
        if not self._forwarded:
            self._direct = DirectCalls(comm._comm, self._size)
        self._device = (torch.device("cuda", comm.device_id()) if device.type == "cuda"
                        else torch.device("cpu"))

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
            comm_dev = self._device.index if self._device.type == "cuda" else None
            if device.type == "cuda" and device.index is not None and comm_dev is not None \
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
    def communicator(self) -> Optional[NcclCommunicator]:
        """The hetccl communicator this backend drives (None until its
        first operation, unless the group was bound to a device)."""
        return self._comm

    def shutdown(self) -> None:
        """Run what is queued, stop the worker, destroy the communicator."""
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.drain()
            worker.stop()
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None and comm.comm:
            comm.destroy()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    # -- plumbing --------------------------------------------------------------
    @contextlib.contextmanager
    def _prepare(self, tensors: Sequence[torch.Tensor]) -> Iterator[Stage]:
        """An operation on `tensors`: the communicator (made at the first
        operation, the rank's kind following its tensors), and a Stage
        recording its calls (torch_work.py); _launch runs them."""
        device = operation_device(tensors)
        with self._lock:
            if self._comm is None:
                self._join(device)
        # Staged where the communicator cannot take the tensors' memory: a
        # forwarded one takes its GPU's, a host rank's host memory.
        staged = self._forwarded or self._device.type == "cpu"
        st = Stage(self._comm, device, self._device if staged else None)
        try:
            yield st
        except BaseException:
            st.cleanup()
            raise

    def _launch(self, st: Stage, result: Any, tensors: Sequence[torch.Tensor],
                opts: Any = None) -> Any:
        """Run a prepared operation: device work at once on the caller's
        stream (the returned work is complete when enqueued: a CUDA-aware
        future records events on the current streams and wait() joins
        them); host work as _run_host runs it."""
        cuda = sorted({t.device for t in tensors if t.is_cuda}, key=str)
        if not (st.cuda or cuda):
            return self._run_host(st.steps, result, opts)
        # (CUDA tensors staged through host memory too: their future must
        # be CUDA-aware, and a synchronous copy makes them ready)
        self._worker.drain()  # the library takes the calls in call order
        st.steps()
        fut = torch.futures.Future(devices=cuda)
        fut.set_result(result)
        return future_work(fut)

    def _run_host(self, run: Any, result: Any, opts: Any) -> Any:
        """Host work (a Stage's steps, or a direct call: torch_direct.py):
        on the worker, the work complete when it has run; or at once when
        the caller waits for it anyway (torch's asyncOp False: a
        synchronous collective pays no handoff)."""
        if not getattr(opts, "asyncOp", True):
            self._worker.drain()  # the library takes the calls in call order
            run()
            return future_work(_done(result))
        fut = torch.futures.Future()
        self._worker.submit(lambda: (run(), result)[1], fut)
        return future_work(fut)

    def _per_rank(self, tensors: List[torch.Tensor], what: str) -> List[torch.Tensor]:
        """tensors, checked to be one per rank."""
        if len(tensors) != self._size:
            raise ValueError(f"hetccl backend: {what} need one tensor per rank ({self._size}), "
                             f"not {len(tensors)}")
        return tensors

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
    def _redop(self, st: Stage, op: Any, t: torch.Tensor) -> Iterator[Tuple[torch.Tensor, int, int]]:
        """(flat view, datatype, ncclRedOp_t) for reducing t by op; a
        PREMUL_SUM operator lives as long as the block."""
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        view, datatype = self._view(kind, t)
        if kind != _RedOp.PREMUL_SUM:
            yield view, datatype, (_BOOL_OP if t.dtype == torch.bool else NCCL_OP)[kind]
            return
        factor = _premul_factor(op)
        value = float(factor.item() if isinstance(factor, torch.Tensor) else factor)
        scalar = _bytes(torch.tensor([value], dtype=view.dtype)).numpy().tobytes()
        redop = self._comm.createPreMulSum(scalar, datatype)
        st.after(self._comm.destroyRedOp, redop)  # once the calls have run
        yield view, datatype, redop

    def _allreduce_into(self, st: Stage, t: torch.Tensor, op: Any) -> None:
        with self._redop(st, op, st.output(t, keep=True)) as (view, datatype, redop):
            st.lib.allReduce(view, view, view.numel(), datatype, redop, st.stream)

    # -- collectives (torch's Backend method names) ---------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "allreduce")
        call = self._direct and self._direct.allreduce(t, opts.reduceOp)
        if call:
            return self._run_host(call, tensors, opts)
        with self._prepare(tensors) as st:
            self._allreduce_into(st, t, opts.reduceOp)
        return self._launch(st, tensors, tensors, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        with self._prepare(tensors) as st, st.group():
            for t in tensors:
                self._allreduce_into(st, t, opts.reduceOp)
        return self._launch(st, tensors, tensors, opts)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "broadcast")
        call = self._direct and self._direct.broadcast(t, opts.rootRank)
        if call:
            return self._run_host(call, tensors, opts)
        with self._prepare(tensors) as st:
            buf = _bytes(st.output(t, keep=True))
            st.lib.broadcast(buf, buf, buf.numel(), _nccl.NCCL_UINT8, opts.rootRank, st.stream)
        return self._launch(st, tensors, tensors, opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        t = _one(tensors, "reduce")
        with self._prepare(tensors) as st, \
                self._redop(st, opts.reduceOp, st.output(t, keep=True)) as (view, datatype, redop):
            st.lib.reduce(view, view, view.numel(), datatype, redop, opts.rootRank, st.stream)
        return self._launch(st, tensors, tensors, opts)

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts: Any) -> Any:
        t = _one(inputs, "allgather")
        outs = self._per_rank(_one(output_lists, "allgather"), "allgather outputs")
        with self._prepare([t, *outs]) as st:
            src = _bytes(st.input(t))
            if all(o.numel() * o.element_size() == src.numel() for o in outs):
                flat = st.scratch(src, src.numel() * self._size)
                st.lib.allGather(src, flat, src.numel(), _nccl.NCCL_UINT8, st.stream)
                for r, o in enumerate(outs):
                    st.copy_out(o, flat[r * src.numel():(r + 1) * src.numel()].view(o.dtype))
            else:  # sizes differ by rank: each rank broadcasts its own
                bufs = [_bytes(st.output(o)) for o in outs]
                with st.group():
                    for r, buf in enumerate(bufs):
                        send = src if r == self._rank else buf
                        st.lib.broadcast(send, buf, buf.numel(), _nccl.NCCL_UINT8, r, st.stream)
        return self._launch(st, output_lists, [t, *outs], opts)

    def _gather_single(self, st: Stage, out: torch.Tensor, t: torch.Tensor) -> None:
        src = _bytes(st.input(t))
        dst = _bytes(st.output(out))
        if dst.numel() != src.numel() * self._size:
            raise ValueError(f"hetccl backend: all_gather_into_tensor output has "
                             f"{dst.numel()} bytes, not {self._size} x {src.numel()}")
        st.lib.allGather(src, dst, src.numel(), _nccl.NCCL_UINT8, st.stream)

    def all_gather_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        call = self._direct and self._direct.all_gather(out, t)
        if call:
            return self._run_host(call, [out], opts)
        with self._prepare([out, t]) as st:
            self._gather_single(st, out, t)
        return self._launch(st, [out], [out, t], opts)

    def all_gather_single_coalesced(self, outs: List[torch.Tensor], ins: List[torch.Tensor],
                                    opts: Any = None) -> Any:
        """opts: torch's coalescing manager passes none."""
        with self._prepare([*outs, *ins]) as st, st.group():
            for out, t in zip(outs, ins):
                self._gather_single(st, out, t)
        return self._launch(st, outs, [*outs, *ins], opts)

    def _scatter_single(self, st: Stage, out: torch.Tensor, t: torch.Tensor, op: Any) -> None:
        if t.numel() != out.numel() * self._size:
            raise ValueError(f"hetccl backend: reduce_scatter_tensor input has {t.numel()} "
                             f"elements, not {self._size} x {out.numel()}")
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        dst = self._view(kind, st.output(out))[0]
        with self._redop(st, op, st.input(t)) as (src, datatype, redop):
            st.lib.reduceScatter(src, dst, dst.numel(), datatype, redop, st.stream)

    def reduce_scatter_single(self, out: torch.Tensor, t: torch.Tensor, opts: Any) -> Any:
        call = self._direct and self._direct.reduce_scatter(out, t, opts.reduceOp)
        if call:
            return self._run_host(call, [out], opts)
        with self._prepare([out, t]) as st:
            self._scatter_single(st, out, t, opts.reduceOp)
        return self._launch(st, [out], [out, t], opts)

    def reduce_scatter_single_coalesced(self, outs: List[torch.Tensor],
                                        ins: List[torch.Tensor], opts: Any) -> Any:
        with self._prepare([*outs, *ins]) as st, st.group():
            for out, t in zip(outs, ins):
                self._scatter_single(st, out, t, opts.reduceOp)
        return self._launch(st, outs, [*outs, *ins], opts)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any) -> Any:
        out = _one(outputs, "reduce_scatter")
        ins = self._per_rank(_one(input_lists, "reduce_scatter"), "reduce_scatter inputs")
        with self._prepare([out, *ins]) as st:
            if all(i.numel() == out.numel() for i in ins):
                flat = torch.cat([st.input(i).reshape(-1) for i in ins])
                self._scatter_single(st, out, flat, opts.reduceOp)
            else:  # sizes differ by rank: a reduce to each rank
                op = opts.reduceOp
                kind = op.op if isinstance(op, dist.ReduceOp) else op
                with self._redop(st, op, st.output(out)) as (dst, datatype, redop), st.group():
                    for r, i in enumerate(ins):
                        src = self._view(kind, st.input(i))[0]
                        recv = dst if r == self._rank else torch.empty_like(src)
                        st.lib.reduce(src, recv, src.numel(), datatype, redop, r, st.stream)
        return self._launch(st, outputs, [out, *ins], opts)

    def _exchange(self, st: Stage, sends: List[torch.Tensor], recvs: List[torch.Tensor]) -> None:
        """Rank r's piece of sends goes to rank r, recvs[r] comes from it
        (byte tensors); this rank's own piece is a local copy."""
        with st.group():
            for r in range(self._size):
                if r == self._rank:
                    continue
                if sends[r].numel():
                    st.lib.send(sends[r], sends[r].numel(), _nccl.NCCL_UINT8, r, st.stream)
                if recvs[r].numel():
                    st.lib.recv(recvs[r], recvs[r].numel(), _nccl.NCCL_UINT8, r, st.stream)
        recvs[self._rank].copy_(sends[self._rank])

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                 opts: Any) -> Any:
        self._per_rank(inputs, "all_to_all inputs")
        self._per_rank(outputs, "all_to_all outputs")
        with self._prepare([*outputs, *inputs]) as st:
            self._exchange(st, [_bytes(st.input(t)) for t in inputs],
                           [_bytes(st.output(t)) for t in outputs])
        return self._launch(st, outputs, [*outputs, *inputs], opts)

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor, out_splits: List[int],
                          in_splits: List[int], opts: Any) -> Any:
        call = (self._direct and not out_splits and not in_splits
                and self._direct.all_to_all(out, t))
        if call:
            return self._run_host(call, [out], opts)
        with self._prepare([out, t]) as st:
            src, dst = _bytes(st.input(t)), _bytes(st.output(out))
            if not out_splits and not in_splits:
                if src.numel() % self._size or dst.numel() != src.numel():
                    raise ValueError("hetccl backend: all_to_all_single without splits needs "
                                     f"equal input and output sizes divisible by {self._size}")
                st.lib.alltoall(src, dst, src.numel() // self._size, _nccl.NCCL_UINT8, st.stream)
            else:
                self._exchange(st, self._split(src, t, in_splits, "input"),
                               self._split(dst, out, out_splits, "output"))
        return self._launch(st, [out], [out, t], opts)

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
        with self._prepare([t, *outs]) as st:
            src = _bytes(st.input(t))
            if self._rank == root:
                bufs = [_bytes(st.output(o)) for o in outs]
                self._exchange(st, [src if r == root else src[:0] for r in range(self._size)],
                               bufs)
            else:
                st.lib.send(src, src.numel(), _nccl.NCCL_UINT8, root, st.stream)
        return self._launch(st, output_lists, [t, *outs], opts)

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                opts: Any) -> Any:
        out = _one(outputs, "scatter")
        root = opts.rootRank
        ins = _one(input_lists, "scatter") if self._rank == root else []
        with self._prepare([out, *ins]) as st:
            dst = _bytes(st.output(out))
            if self._rank == root:
                self._exchange(st, [_bytes(st.input(i)) for i in ins],
                               [dst if r == root else dst[:0] for r in range(self._size)])
            else:
                st.lib.recv(dst, dst.numel(), _nccl.NCCL_UINT8, root, st.stream)
        return self._launch(st, outputs, [out, *ins], opts)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p(_one(tensors, "send"), dst, sending=True)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p(_one(tensors, "recv"), src, sending=False)

    def _p2p(self, t: torch.Tensor, peer: int, sending: bool) -> Any:
        """One send or receive of t's bytes: on the calling thread when
        torch's blocking dist.send / dist.recv made it, else on the worker
        (a blocking dist.send of 1 KiB is mostly this path's overhead: the
        direct path where it applies)."""
        waited = _WAITED if _caller_waits() else None
        call = self._direct and self._direct.p2p(t, peer, sending)
        if call:
            return self._run_host(call, [t], waited)
        with self._prepare([t]) as st:
            buf = _bytes(st.input(t) if sending else st.output(t))
            (st.lib.send if sending else st.lib.recv)(buf, buf.numel(), _nccl.NCCL_UINT8, peer,
                                                      st.stream)
        return self._launch(st, [t], [t], waited)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> Any:
        raise ValueError("hetccl backend: recv from any source is not supported "
                         "(NCCL has no such receive); name the source rank")

    def barrier(self, opts: Any) -> Any:
        """Every rank has reached it when it returns (the host waits).
        Before the group's first operation it meets through the store, so
        that the communicator's kind is still the first operation's."""
        if self._comm is None:
            self._store_barrier()
            return future_work(_done([]))
        device = self._device if self._forwarded else torch.device("cpu")
        token = torch.zeros(1, dtype=torch.int32, device=device)
        with self._prepare([token]) as st:
            st.lib.allReduce(token, token, 1, _nccl.NCCL_INT32, _nccl.NCCL_SUM, st.stream)
        work = self._launch(st, [], [], _WAITED)
        work.wait()
        if token.is_cuda:
            torch.cuda.current_stream(token.device).synchronize()
        return work

    def _store_barrier(self) -> None:
        self._barriers += 1
        key = f"hetccl/barrier/{self._barriers}"
        if self._store.add(key, 1) == self._size:
            self._store.set(key + "/done", b"1")
        self._store.wait([key + "/done"], self._timeout)

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


def _caller_waits() -> bool:
    """Whether torch's blocking dist.send / dist.recv made this call (they
    wait on the work at once, as isend / irecv's callers may not): the
    frames between here and the user's code, which torch's Python API
    adds (send -> isend -> ProcessGroup.send -> here)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:  # this backend's own
        frame = frame.f_back
    for _ in range(6):
        if frame is None or not frame.f_code.co_filename.endswith("distributed_c10d.py"):
            return False
        if frame.f_code.co_name in ("send", "recv"):
            return True
        frame = frame.f_back
    return False


def _done(result: Any) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


def _init_as(size: int, uid: bytes, rank: int, device: int) -> NcclCommunicator:
    """hetcclCommInitRankAs: rank of size, of the given hetcclDevice_t."""
    ffi = _lib.ffi
    handle = ffi.new("ncclComm_t *")
    check(_lib.lib().hetcclCommInitRankAs(handle, size, _uid_struct(uid)[0], rank, ffi.NULL,
                                          device), "hetcclCommInitRankAs")
    return NcclCommunicator.from_handle(int(ffi.cast("uintptr_t", handle[0])))


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
