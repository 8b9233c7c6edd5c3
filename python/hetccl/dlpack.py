"""Reading a DLPack capsule's tensor description (pointer, device, dtype,
shape, strides) without importing the library that made it.

Contract: `view(obj, stream)` calls obj.__dlpack__ (with `stream` for a
device array, so that its producer orders its pending work before the
consumer's stream, as the DLPack protocol says), reads the DLTensor the
capsule points at, and returns a DLView that holds the capsule: the memory
stays valid while the view lives (the capsule's destructor, not us, calls
the producer's deleter; the capsule is never renamed "used_dltensor").
Struct layouts are DLPack's ABI (dlpack.h, DLPACK_VERSION 0.x and 1.x
unversioned capsules named "dltensor").
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Tuple

KDLCPU, KDLCUDA, KDLCUDAHOST, KDLROCM, KDLCUDAMANAGED = 1, 2, 3, 10, 13

# DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat16, 6 bool, 7.. fp8 kinds (1.x)
_DTYPES = {(0, 8): "int8", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
           (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
           (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool",
           (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2"}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass
class DLView:
    ptr: int
    device_type: int
    device_id: int
    dtype: str            # numpy-style name, or "code:bits:lanes" when unknown
    shape: Tuple[int, ...]
    contiguous: bool
    capsule: Any          # keeps the producer's memory alive


def view(obj: Any, stream: Optional[int] = None) -> DLView:
    device_type = None
    if hasattr(obj, "__dlpack_device__"):
        device_type = int(obj.__dlpack_device__()[0])
    kwargs = {}
    if device_type in (KDLCUDA, KDLROCM, KDLCUDAMANAGED):
        kwargs["stream"] = 1 if stream in (None, 0) else int(stream)  # 1: the legacy stream
    capsule = obj.__dlpack__(**kwargs)
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{type(obj).__name__}.__dlpack__ gave no 'dltensor' capsule "
                        "(a versioned DLPack 1.x capsule is not read here)")
    t = _Tensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    contiguous = True
    if t.strides and 0 not in shape:  # an empty tensor is contiguous whatever its strides
        expect = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and int(t.strides[i]) != expect:
                contiguous = False
            expect *= shape[i]
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype = _DTYPES.get((code, bits), f"{code}:{bits}:{lanes}") if lanes == 1 else \
        f"{code}:{bits}:{lanes}"
    ptr = (t.data or 0) + int(t.byte_offset)
    return DLView(ptr, int(t.device.device_type), int(t.device.device_id), dtype, shape,
                  contiguous, capsule)
