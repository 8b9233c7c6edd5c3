"""Arrays to (ptr, count, dtype) for the NcclCommunicator methods.

Accepts numpy arrays, CuPy arrays (and anything with
__cuda_array_interface__) and torch tensors, without importing CuPy or
torch: an object is recognised by its interface. bfloat16 and the fp8 types
come from ml_dtypes for numpy (optional) and are native in torch.

`as_buffer` gives (ptr, count, dtype) for the pointer API; `describe` gives
an ArrayRef with what the array methods of hetccl.arrays also need: where
the memory is (host or a device), whether it may be written, and the
stream the array's producer orders its work on. Recognised, in this order:
torch tensors, __cuda_array_interface__, numpy arrays and
__array_interface__, the buffer protocol (bytearray, memoryview, ...),
DLPack (__dlpack__).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

# nccl_dtype and numpy_dtype stay importable from here, where they were first.
from .dtypes import ITEMSIZE, SUPPORTED, nccl_dtype, numpy_dtype  # noqa: F401


class Buffer(NamedTuple):
    ptr: int
    count: int
    dtype: int  # ncclDataType_t


def _contiguous_error(obj: Any) -> ValueError:
    kind = type(obj).__name__
    copy = ("t.contiguous()" if hasattr(obj, "is_contiguous")
            else "np.ascontiguousarray(a)" if kind == "ndarray" and type(obj).__module__ == "numpy"
            else "a contiguous copy (cupy.ascontiguousarray(a), ...)")
    return ValueError(f"{kind} buffer must be C-contiguous (a slice or transpose is not): "
                      f"pass {copy}, and copy the result back where the output was a view")


def _from_torch(t: Any) -> Buffer:
    if not t.is_contiguous():
        raise _contiguous_error(t)
    return Buffer(int(t.data_ptr()), int(t.numel()), nccl_dtype(t.dtype))


def _from_interface(obj: Any, iface: Dict[str, Any]) -> Buffer:
    if iface.get("strides") is not None:
        expected = np.empty(iface["shape"], dtype=np.dtype(iface["typestr"])).strides
        if tuple(iface["strides"]) != tuple(expected):
            raise _contiguous_error(obj)
    count = int(np.prod(iface["shape"], dtype=np.int64))
    ptr = int(iface["data"][0]) if count else int(iface["data"][0] or 0)
    return Buffer(ptr, count, nccl_dtype(np.dtype(iface["typestr"])))


def as_buffer(obj: Any) -> Buffer:
    """(ptr, count, dtype) of an array; raises TypeError / ValueError for
    objects it cannot describe (non-contiguous, unknown element type)."""
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise _contiguous_error(obj)
        return Buffer(int(obj.ctypes.data), int(obj.size), nccl_dtype(obj.dtype))
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is None:
        iface = getattr(obj, "__array_interface__", None)
    if iface is None:
        raise TypeError(f"cannot use a {type(obj).__name__} as a buffer")
    return _from_interface(obj, iface)


def scalar_bytes(value: Any, datatype: int) -> bytes:
    """One element of `datatype` holding `value`, as raw bytes (for
    NcclCommunicator.createPreMulSum)."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) != ITEMSIZE[int(datatype)]:
            raise ValueError("scalar bytes do not match the element size")
        return bytes(value)
    return np.array([value], dtype=numpy_dtype(datatype)).tobytes()


# -- arrays with their place and stream (for hetccl.arrays) --------------------------------

@dataclass
class ArrayRef:
    ptr: int
    count: int
    dtype: int            # ncclDataType_t
    device: str           # "host", "cuda:N" or "rocm:N"
    stream: int           # the stream to order the operation on (0: none / host)
    writable: bool
    keep: Any             # the object (or capsule) that owns the memory
    shape: Tuple[int, ...] = ()


def _dtype_or_error(obj: Any, dtype: Any) -> int:
    try:
        return nccl_dtype(dtype)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} of element type {dtype}: no NCCL data type "
                        f"(supported: {SUPPORTED})") from None


def _torch_ref(t: Any, stream: Optional[int]) -> ArrayRef:
    if not t.is_contiguous():
        raise _contiguous_error(t)
    dtype = _dtype_or_error(t, t.dtype)
    if t.device.type == "cpu":
        return ArrayRef(int(t.data_ptr()), int(t.numel()), dtype, "host", 0, True, t,
                        tuple(t.shape))
    if t.device.type != "cuda":
        raise ValueError(f"torch tensor on {t.device}: only cpu and cuda tensors")
    if stream is None:
        import torch  # only reached with a torch tensor in hand

        stream = int(torch.cuda.current_stream(t.device).cuda_stream)
    return ArrayRef(int(t.data_ptr()), int(t.numel()), dtype, f"cuda:{t.device.index}",
                    int(stream), True, t, tuple(t.shape))


def _interface_ref(obj: Any, iface: Dict[str, Any], device: str,
                   stream: Optional[int]) -> ArrayRef:
    _dtype_or_error(obj, np.dtype(iface["typestr"]))
    buf = _from_interface(obj, iface)
    if device == "host":
        stream = 0
    elif stream is None:
        stream = iface.get("stream") or 0  # CAI v3: the producer's stream, None: in order
    return ArrayRef(buf.ptr, buf.count, buf.dtype, device, int(stream),
                    not bool(iface["data"][1]), obj, tuple(iface["shape"]))


def _dlpack_ref(obj: Any, stream: Optional[int]) -> ArrayRef:
    from . import dlpack

    v = dlpack.view(obj, stream)
    if not v.contiguous:
        raise _contiguous_error(obj)
    count = int(np.prod(v.shape, dtype=np.int64))
    dtype = _dtype_or_error(obj, v.dtype)
    if v.device_type in (dlpack.KDLCPU, dlpack.KDLCUDAHOST):
        return ArrayRef(v.ptr, count, dtype, "host", 0, True, v.capsule, v.shape)
    kind = {dlpack.KDLCUDA: "cuda", dlpack.KDLCUDAMANAGED: "cuda", dlpack.KDLROCM: "rocm"}
    if v.device_type not in kind:
        raise ValueError(f"{type(obj).__name__} on DLPack device type {v.device_type}: "
                         "only host, CUDA and ROCm memory")
    s = 1 if stream in (None, 0) else int(stream)
    return ArrayRef(v.ptr, count, dtype, f"{kind[v.device_type]}:{v.device_id}", s, True,
                    v.capsule, v.shape)


def describe(obj: Any, stream: Optional[int] = None) -> ArrayRef:
    """An ArrayRef of a numpy / CuPy / torch / buffer-protocol / DLPack
    array. `stream` overrides the array's own; without it a device array
    uses its producer's stream (CuPy's interface "stream", torch's current
    stream, the legacy default stream for DLPack) and host memory none.
    TypeError: no known interface or element type; ValueError: not
    C-contiguous, or memory of a kind hetccl does not take."""
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        return _torch_ref(obj, stream)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        return _interface_ref(obj, iface, "cuda", stream)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise _contiguous_error(obj)
        return ArrayRef(int(obj.ctypes.data), int(obj.size), _dtype_or_error(obj, obj.dtype),
                        "host", 0, bool(obj.flags.writeable), obj, obj.shape)
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _interface_ref(obj, iface, "host", 0)
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    if mv is not None:
        if not mv.c_contiguous:
            raise _contiguous_error(obj)
        arr = np.asarray(mv)  # shares the memory (no copy for a contiguous buffer)
        return ArrayRef(int(arr.ctypes.data) if arr.size else 0, int(arr.size),
                        _dtype_or_error(obj, arr.dtype), "host", 0, not mv.readonly, mv,
                        arr.shape)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_ref(obj, stream)
    raise TypeError(f"cannot use a {type(obj).__name__} as an array (no "
                    "__cuda_array_interface__, __array_interface__, buffer or __dlpack__)")
