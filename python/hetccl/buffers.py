"""Arrays to (ptr, count, dtype) for the NcclCommunicator methods.

Accepts numpy arrays, CuPy arrays (and anything with
__cuda_array_interface__) and torch tensors, without importing CuPy or
torch: an object is recognised by its interface. bfloat16 and the fp8 types
come from ml_dtypes for numpy (optional) and are native in torch.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple

import numpy as np

from . import nccl

# dtype name (numpy / ml_dtypes names, and torch's without "torch.") -> ncclDataType_t
_BY_NAME: Dict[str, int] = {
    "int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8,
    "int32": nccl.NCCL_INT32, "uint32": nccl.NCCL_UINT32,
    "int64": nccl.NCCL_INT64, "uint64": nccl.NCCL_UINT64,
    "float16": nccl.NCCL_FLOAT16, "half": nccl.NCCL_FLOAT16,
    "float32": nccl.NCCL_FLOAT32, "float": nccl.NCCL_FLOAT32,
    "float64": nccl.NCCL_FLOAT64, "double": nccl.NCCL_FLOAT64,
    "bfloat16": nccl.NCCL_BFLOAT16,
    "float8_e4m3fn": nccl.NCCL_FLOAT8E4M3, "float8_e5m2": nccl.NCCL_FLOAT8E5M2,
    "bool": nccl.NCCL_UINT8,
}

_NUMPY_NAME: Dict[int, str] = {
    nccl.NCCL_INT8: "int8", nccl.NCCL_UINT8: "uint8", nccl.NCCL_INT32: "int32",
    nccl.NCCL_UINT32: "uint32", nccl.NCCL_INT64: "int64", nccl.NCCL_UINT64: "uint64",
    nccl.NCCL_FLOAT16: "float16", nccl.NCCL_FLOAT32: "float32", nccl.NCCL_FLOAT64: "float64",
    nccl.NCCL_BFLOAT16: "bfloat16", nccl.NCCL_FLOAT8E4M3: "float8_e4m3fn",
    nccl.NCCL_FLOAT8E5M2: "float8_e5m2",
}

ITEMSIZE: Dict[int, int] = {
    nccl.NCCL_INT8: 1, nccl.NCCL_UINT8: 1, nccl.NCCL_INT32: 4, nccl.NCCL_UINT32: 4,
    nccl.NCCL_INT64: 8, nccl.NCCL_UINT64: 8, nccl.NCCL_FLOAT16: 2, nccl.NCCL_FLOAT32: 4,
    nccl.NCCL_FLOAT64: 8, nccl.NCCL_BFLOAT16: 2, nccl.NCCL_FLOAT8E4M3: 1,
    nccl.NCCL_FLOAT8E5M2: 1,
}


class Buffer(NamedTuple):
    ptr: int
    count: int
    dtype: int  # ncclDataType_t


def nccl_dtype(dtype: Any) -> int:
    """ncclDataType_t of a numpy / ml_dtypes / torch dtype (or its name)."""
    name = str(dtype).replace("torch.", "")
    if not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _BY_NAME:
        raise TypeError(f"no NCCL data type for {dtype!r}")
    return _BY_NAME[name]


def numpy_dtype(datatype: int) -> np.dtype:
    """The numpy dtype of an ncclDataType_t (bfloat16 / fp8 need ml_dtypes)."""
    name = _NUMPY_NAME[int(datatype)]
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes  # optional dependency, only for these three

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _contiguous_error(obj: Any) -> ValueError:
    return ValueError(f"{type(obj).__name__} buffer must be C-contiguous")


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
