"""Collectives on arrays: numpy, CuPy, torch tensors, anything with
__cuda_array_interface__, __array_interface__, the buffer protocol or
DLPack (hetccl.buffers.describe reads them).

Contract:

- `Communicator` wraps one NcclCommunicator (`.nccl`, the cupy.cuda.nccl
  form with pointers, untouched) and adds methods in torch.distributed's
  spelling: all_reduce, reduce, broadcast, all_gather, reduce_scatter,
  all_to_all, gather, scatter, send, recv. Each takes arrays and reads the
  pointer, element count, data type and stream from them; `stream=` overrides
  the array's stream (see describe), `op=` takes "sum", "prod", "max",
  "min", "avg" or an ncclRedOp_t (a PreMulSum op included).
- Checked before the library is called, with the offending argument named:
  an element type NCCL has not (TypeError), send and receive types that
  differ (TypeError), non-contiguous arrays, read-only outputs, send and
  receive memory of different devices, and sizes that do not fit the
  collective (ValueError).
- An array the buffers layer cannot take (not C-contiguous, an element
  type NCCL has not) is refused with the collective and the argument named
  ("all_reduce: send: ndarray buffer must be C-contiguous ...: pass
  np.ascontiguousarray(a) ...").
- Host arrays run with no stream: the call returns when the operation is
  complete, on a nonblocking communicator too (it waits for the library's
  ncclInProgress to clear). Device arrays are enqueued on their stream and
  the call returns at once, as NCCL does.
- Inside groupStart() / groupEnd() the library reads and writes the
  arrays at groupEnd, as NCCL does: keep every array alive until then (a
  temporary passed to send is freed before groupEnd reads it).
- Each method returns its output array (the input for in-place forms), so
  that `y = comm.all_reduce(x)` reads naturally.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from . import nccl
from .buffers import ArrayRef, describe
from .dtypes import NAME
from .nccl import NcclCommunicator, UniqueId

OPS = {"sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD, "max": nccl.NCCL_MAX,
       "min": nccl.NCCL_MIN, "avg": nccl.NCCL_AVG}

Op = Union[str, int]


def _op(op: Op) -> int:
    if isinstance(op, str):
        if op.lower() not in OPS:
            raise ValueError(f"op {op!r}: one of {', '.join(OPS)} or an ncclRedOp_t")
        return OPS[op.lower()]
    return int(op)


class Communicator:
    """Array collectives over one communicator. Make it like
    NcclCommunicator (`Communicator(nranks, unique_id, rank)`) or wrap one
    (`Communicator.wrap(nccl_comm)`); `hetccl.init_from_env()` returns one."""

    def __init__(self, ndev: int, commId: UniqueId, rank: int,
                 blocking: Optional[bool] = None) -> None:
        self.nccl = NcclCommunicator(ndev, commId, rank, blocking=blocking)

    @classmethod
    def wrap(cls, comm: NcclCommunicator) -> "Communicator":
        self = cls.__new__(cls)
        self.nccl = comm
        return self

    # -- the communicator itself ---------------------------------------------------
    @property
    def rank(self) -> int:
        return self.nccl.rank_id()

    @property
    def size(self) -> int:
        return self.nccl.size()

    def backend(self) -> str:
        return self.nccl.backend()

    def poll(self) -> bool:
        """False while a nonblocking init (or call) is in progress; raises
        its error if it failed (NcclCommunicator.poll)."""
        return self.nccl.poll()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for a nonblocking init (or call) to finish (NcclCommunicator.wait)."""
        self.nccl.wait(timeout)

    def destroy(self) -> None:
        self.nccl.destroy()

    def abort(self) -> None:
        self.nccl.abort()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.nccl.comm:
            self.nccl.destroy()

    # -- checks -------------------------------------------------------------------
    @staticmethod
    def _describe(name: str, what: str, obj: Any, stream: Optional[int]) -> ArrayRef:
        try:
            return describe(obj, stream)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name}: {what}: {e}") from None

    def _pair(self, name: str, send: Any, recv: Any, stream: Optional[int]
              ) -> "tuple[ArrayRef, ArrayRef]":
        s = self._describe(name, "send", send, stream)
        r = s if recv is None or recv is send else self._describe(name, "recv", recv, stream)
        if not r.writable:
            raise ValueError(f"{name}: the output array is read-only")
        if r is not s:
            if r.dtype != s.dtype:
                raise TypeError(f"{name}: send and receive element types differ "
                                f"({_tname(s)} and {_tname(r)})")
            if r.device != s.device:
                raise ValueError(f"{name}: send memory is on {s.device}, receive memory "
                                 f"on {r.device}")
        return s, r

    def _one(self, name: str, buf: Any, stream: Optional[int], write: bool) -> ArrayRef:
        b = self._describe(name, "array", buf, stream)
        if write and not b.writable:
            raise ValueError(f"{name}: the output array is read-only")
        return b

    def _done(self, ref: ArrayRef, result: Any) -> Any:
        """`result`, once a host operation is complete (a nonblocking
        communicator answers ncclInProgress; device work stays enqueued)."""
        if ref.device == "host" and self.nccl.in_progress is not None:
            self.nccl.wait()
        return result

    @staticmethod
    def _sizes(name: str, what: str, got: int, want: int) -> None:
        if got != want:
            raise ValueError(f"{name}: {what} has {got} elements, the collective needs {want}")

    # -- collectives --------------------------------------------------------------
    def all_reduce(self, send: Any, recv: Any = None, op: Op = "sum",
                   stream: Optional[int] = None) -> Any:
        """recv = op over ranks of send (in place when recv is None)."""
        s, r = self._pair("all_reduce", send, recv, stream)
        self._sizes("all_reduce", "the output", r.count, s.count)
        self.nccl.allReduce(s.ptr, r.ptr, s.count, s.dtype, _op(op), s.stream)
        return self._done(s, send if recv is None else recv)

    def reduce(self, send: Any, recv: Any = None, op: Op = "sum", root: int = 0,
               stream: Optional[int] = None) -> Any:
        """recv on `root` = op over ranks of send; other ranks may pass no recv."""
        s, r = self._pair("reduce", send, recv, stream)
        self._sizes("reduce", "the output", r.count, s.count)
        self.nccl.reduce(s.ptr, r.ptr, s.count, s.dtype, _op(op), root, s.stream)
        return self._done(s, send if recv is None else recv)

    def broadcast(self, send: Any, recv: Any = None, root: int = 0,
                  stream: Optional[int] = None) -> Any:
        """root's send into every rank's recv (in place when recv is None;
        send is read on the root only, but every rank passes an array of the
        count)."""
        s, r = self._pair("broadcast", send, recv, stream)
        self._sizes("broadcast", "the output", r.count, s.count)
        self.nccl.broadcast(s.ptr, r.ptr, s.count, s.dtype, root, s.stream)
        return self._done(s, send if recv is None else recv)

    def all_gather(self, send: Any, recv: Any, stream: Optional[int] = None) -> Any:
        """recv = every rank's send, in rank order (recv has size x send's count)."""
        s, r = self._pair("all_gather", send, recv, stream)
        self._sizes("all_gather", "the output", r.count, s.count * self.size)
        self.nccl.allGather(s.ptr, r.ptr, s.count, s.dtype, s.stream)
        return self._done(s, recv)

    def reduce_scatter(self, send: Any, recv: Any, op: Op = "sum",
                       stream: Optional[int] = None) -> Any:
        """recv = this rank's block of op over ranks of send (send has size x
        recv's count)."""
        s, r = self._pair("reduce_scatter", send, recv, stream)
        self._sizes("reduce_scatter", "the input", s.count, r.count * self.size)
        self.nccl.reduceScatter(s.ptr, r.ptr, r.count, s.dtype, _op(op), s.stream)
        return self._done(s, recv)

    def all_to_all(self, send: Any, recv: Any, stream: Optional[int] = None) -> Any:
        """Block j of send to rank j; block i of recv from rank i (equal blocks)."""
        s, r = self._pair("all_to_all", send, recv, stream)
        n = self.size
        self._sizes("all_to_all", "the output", r.count, s.count)
        if s.count % n:
            raise ValueError(f"all_to_all: {s.count} elements do not split into {n} blocks")
        self.nccl.alltoall(s.ptr, r.ptr, s.count // n, s.dtype, s.stream)
        return self._done(s, recv)

    def gather(self, send: Any, recv: Any = None, root: int = 0,
               stream: Optional[int] = None) -> Any:
        """recv on `root` = every rank's send in rank order; others pass no recv."""
        s = self._describe("gather", "send", send, stream)
        if recv is not None:
            _, r = self._pair("gather", send, recv, stream)
            self._sizes("gather", "the output", r.count, s.count * self.size)
            ptr = r.ptr
        elif self.rank == root:
            raise ValueError("gather: the root needs an output array")
        else:
            ptr = 0
        self.nccl.gather(s.ptr, ptr, s.count, s.dtype, root, s.stream)
        return self._done(s, recv)

    def scatter(self, send: Any, recv: Any, root: int = 0,
                stream: Optional[int] = None) -> Any:
        """Block i of root's send into rank i's recv; others pass send=None."""
        r = self._one("scatter", recv, stream, write=True)
        if send is not None:
            s, _ = self._pair("scatter", send, recv, stream)
            self._sizes("scatter", "the input", s.count, r.count * self.size)
            ptr = s.ptr
        elif self.rank == root:
            raise ValueError("scatter: the root needs an input array")
        else:
            ptr = 0
        self.nccl.scatter(ptr, r.ptr, r.count, r.dtype, root, r.stream)
        return self._done(r, recv)

    def send(self, array: Any, peer: int, stream: Optional[int] = None) -> Any:
        """ncclSend of the whole array to `peer` (pair with recv; group
        several with hetccl.groupStart/groupEnd)."""
        b = self._one("send", array, stream, write=False)
        self.nccl.send(b.ptr, b.count, b.dtype, peer, b.stream)
        return self._done(b, array)

    def recv(self, array: Any, peer: int, stream: Optional[int] = None) -> Any:
        """ncclRecv into the whole array from `peer`."""
        b = self._one("recv", array, stream, write=True)
        self.nccl.recv(b.ptr, b.count, b.dtype, peer, b.stream)
        return self._done(b, array)


def _tname(ref: ArrayRef) -> str:
    return NAME.get(ref.dtype, str(ref.dtype))
