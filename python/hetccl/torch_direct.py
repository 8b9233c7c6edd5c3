"""The torch backend's direct path (hetccl.torch_backend): one library call
on the tensors' own memory, for the common case of a host rank.

Contract: `direct_call` answers an operation whose tensors are all
contiguous CPU tensors, on a communicator the library's engine runs (host
memory served as it is, not forwarded to NCCL), with a zero-argument
callable that makes the operation's one library call; or None, and the
operation takes the general path (torch_work.Stage: staging, recorded
calls, the checks that raise on bad arguments). The direct path raises
nothing of its own: whatever it does not take, the general path answers,
errors included. Its result is the same library call the general path
would make, on the same bytes.

Why: the general path costs about 13 us of Python a call (a Stage, its
recorded steps, a context manager per operator), where the library takes
1-3 us for 1 KiB between two ranks and torch's own dispatch to a Python
backend 3 us (2-core machine; docs/torch.md, "How an operation runs"). What is
left here is a dictionary lookup per argument and one cffi call.

Threads: built on the caller's thread; the callable runs on the caller's
thread or on the backend's worker (torch_work.Worker), never on two at
once."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from . import _lib
from . import dtypes as _dtypes
from . import nccl as _nccl
from .errors import check

Call = Callable[[], None]

_RedOp = dist.ReduceOp.RedOpType
# torch's operator kind -> ncclRedOp_t, for the backend's paths both (AVG:
# floating types only; PREMUL_SUM and the bitwise ones are not here).
NCCL_OP = {_RedOp.SUM: _nccl.NCCL_SUM, _RedOp.PRODUCT: _nccl.NCCL_PROD,
           _RedOp.MIN: _nccl.NCCL_MIN, _RedOp.MAX: _nccl.NCCL_MAX, _RedOp.AVG: _nccl.NCCL_AVG}

# torch dtype -> ncclDataType_t of the types reduced as they are, from the
# package's one table (bool and complex take the general path).
_TYPES = {getattr(torch, name): code for code, name in _dtypes.NAME.items()
          if isinstance(getattr(torch, name, None), torch.dtype)}


def _host(tensors: List[torch.Tensor]) -> bool:
    return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


class DirectCalls:
    """The direct calls of one communicator (its ncclComm_t handle)."""

    def __init__(self, handle: Any, size: int) -> None:
        self._lib = _lib.lib()
        self._ffi = _lib.ffi
        self._comm = handle
        self._size = size
        self._null = self._ffi.NULL

    def _call(self, name: str, keep: tuple, *args: Any) -> Call:
        """name(*args, comm, stream NULL) as a callable that keeps the
        tensors in `keep` alive until it has run (the worker may run it
        after the caller dropped them)."""
        fn, comm, null = getattr(self._lib, name), self._comm, self._null

        def call() -> None:
            check(fn(*args, comm, null), name)
            del keep_alive[:]  # ran: the tensors may go
        keep_alive = list(keep)
        return call

    def _ptr(self, t: torch.Tensor) -> Any:
        return self._ffi.cast("void *", t.data_ptr() if t.numel() else 0)

    def _redop(self, op: Any, t: torch.Tensor) -> Optional[tuple]:
        """(ncclDataType_t, ncclRedOp_t) of reducing t by op on this path."""
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        redop, datatype = NCCL_OP.get(kind), _TYPES.get(t.dtype)
        if redop is None or datatype is None:
            return None
        if kind == _RedOp.AVG and not t.dtype.is_floating_point:
            return None
        return datatype, redop

    def allreduce(self, t: torch.Tensor, op: Any) -> Optional[Call]:
        how = self._redop(op, t) if _host([t]) else None
        if how is None:
            return None
        p = self._ptr(t)
        return self._call("ncclAllReduce", (t,), p, p, t.numel(), how[0], how[1])

    def broadcast(self, t: torch.Tensor, root: int) -> Optional[Call]:
        if not _host([t]):
            return None
        p = self._ptr(t)
        return self._call("ncclBroadcast", (t,), p, p, t.numel() * t.element_size(),
                          _nccl.NCCL_UINT8, root)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> Optional[Call]:
        n = t.numel() * t.element_size()
        if not _host([out, t]) or out.numel() * out.element_size() != n * self._size:
            return None
        return self._call("ncclAllGather", (out, t), self._ptr(t), self._ptr(out), n,
                          _nccl.NCCL_UINT8)

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: Any) -> Optional[Call]:
        if not _host([out, t]) or t.dtype != out.dtype or t.numel() != out.numel() * self._size:
            return None
        how = self._redop(op, t)
        if how is None:
            return None
        return self._call("ncclReduceScatter", (out, t), self._ptr(t), self._ptr(out),
                          out.numel(), how[0], how[1])

    def all_to_all(self, out: torch.Tensor, t: torch.Tensor) -> Optional[Call]:
        """Even splits only (no split lists): one ncclAlltoAll."""
        n = t.numel() * t.element_size()
        if not _host([out, t]) or n % self._size or out.numel() * out.element_size() != n:
            return None
        return self._call("ncclAlltoAll", (out, t), self._ptr(t), self._ptr(out),
                          n // self._size, _nccl.NCCL_UINT8)

    def p2p(self, t: torch.Tensor, peer: int, sending: bool) -> Optional[Call]:
        if not _host([t]):
            return None
        return self._call("ncclSend" if sending else "ncclRecv", (t,), self._ptr(t),
                          t.numel() * t.element_size(), _nccl.NCCL_UINT8, peer)
