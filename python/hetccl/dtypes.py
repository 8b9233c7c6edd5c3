"""Element types and their NCCL data types, in one table for every kind of
array the package takes.

A type is known by its name: numpy's and ml_dtypes' (`np.dtype(x).name`),
torch's without "torch." (`str(torch.float16)` is "torch.float16"), and
hetccl.dlpack's, which are numpy's. So torch is never imported here (nor by
`import hetccl`): hetccl.buffers and hetccl.torch_backend map through the
same table. bool is moved, and reduced by the torch backend, as uint8.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from . import nccl

# ncclDataType_t -> (numpy / torch name, bytes)
_TYPES: Dict[int, tuple] = {
    nccl.NCCL_INT8: ("int8", 1), nccl.NCCL_UINT8: ("uint8", 1),
    nccl.NCCL_INT32: ("int32", 4), nccl.NCCL_UINT32: ("uint32", 4),
    nccl.NCCL_INT64: ("int64", 8), nccl.NCCL_UINT64: ("uint64", 8),
    nccl.NCCL_FLOAT16: ("float16", 2), nccl.NCCL_FLOAT32: ("float32", 4),
    nccl.NCCL_FLOAT64: ("float64", 8), nccl.NCCL_BFLOAT16: ("bfloat16", 2),
    nccl.NCCL_FLOAT8E4M3: ("float8_e4m3fn", 1), nccl.NCCL_FLOAT8E5M2: ("float8_e5m2", 1),
}

NAME: Dict[int, str] = {code: name for code, (name, _) in _TYPES.items()}
ITEMSIZE: Dict[int, int] = {code: size for code, (_, size) in _TYPES.items()}
# name -> ncclDataType_t: the names above, bool, and C's names of the same types
BY_NAME: Dict[str, int] = {
    **{name: code for code, name in NAME.items()},
    "bool": nccl.NCCL_UINT8, "half": nccl.NCCL_FLOAT16, "float": nccl.NCCL_FLOAT32,
    "double": nccl.NCCL_FLOAT64,
}
# The element types a reduction takes, for messages.
SUPPORTED = ", ".join([*NAME.values(), "bool"])

_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def name_of(dtype: Any) -> str:
    """The name of a numpy / ml_dtypes / torch dtype (a str is a name)."""
    if not isinstance(dtype, str) and type(dtype).__module__ != "torch":
        try:
            return np.dtype(dtype).name
        except TypeError:
            pass
    return str(dtype).replace("torch.", "")


def nccl_dtype(dtype: Any) -> int:
    """ncclDataType_t of a numpy / ml_dtypes / torch dtype (or its name);
    TypeError if NCCL has none."""
    code = BY_NAME.get(name_of(dtype))
    if code is None:
        raise TypeError(f"no NCCL data type for {dtype!r}")
    return code


def numpy_dtype(datatype: int) -> np.dtype:
    """The numpy dtype of an ncclDataType_t (bfloat16 / fp8 need ml_dtypes)."""
    name = NAME[int(datatype)]
    if name in _ML_DTYPES:
        import ml_dtypes  # optional dependency, only for these three

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)
