"""The Python layer's own pieces: the cffi declarations against
include/nccl.h, buffer conversion, unique ids, the launcher API."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from libpath import REPO_ROOT

from hetccl import _lib, buffers, nccl

INCLUDE = REPO_ROOT / "include"


def test_config_layout_matches_the_header(tmp_path: Path) -> None:
    """sizeof(ncclConfig_t) and every field offset, as a C compiler sees
    include/nccl.h, equal the hand-written cdef."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not (INCLUDE / "nccl.h").is_file():
        pytest.skip("no C compiler or no include/nccl.h")
    fields = [name for name, _ in _lib.ffi.typeof("ncclConfig_t").fields]
    lines = [f'printf("{f} %zu\\n", offsetof(ncclConfig_t, {f}));' for f in fields]
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"nccl.h\"\n"
                   "int main(void) {\n"
                   'printf("sizeof %zu\\n", sizeof(ncclConfig_t));\n'
                   'printf("uid %zu\\n", sizeof(ncclUniqueId));\n'
                   'printf("redop %zu\\n", sizeof(ncclRedOp_t));\n'
                   'printf("api_magic %u version %d\\n", (unsigned)NCCL_API_MAGIC, NCCL_VERSION_CODE);\n'
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    out = dict(line.split(" ", 1) for line in
               subprocess.run([str(exe)], check=True, capture_output=True,
                              text=True).stdout.splitlines())
    ffi = _lib.ffi
    assert int(out["sizeof"]) == ffi.sizeof("ncclConfig_t")
    assert int(out["uid"]) == ffi.sizeof("ncclUniqueId") == nccl.NCCL_UNIQUE_ID_BYTES
    assert int(out["redop"]) == ffi.sizeof("ncclRedOp_t")
    assert out["api_magic"] == f"{_lib.CONFIG_MAGIC} version {_lib.CONFIG_VERSION}"
    for f in fields:
        assert int(out[f]) == ffi.offsetof("ncclConfig_t", f), f


def test_new_config_is_the_initializer() -> None:
    cfg = _lib.new_config()
    assert cfg.size == 120 and cfg.magic == 0xCAFEBEEF and cfg.version == 23203
    assert cfg.blocking == cfg.nvlsHostMode == _lib.CONFIG_UNDEF_INT
    assert cfg.netName == _lib.ffi.NULL
    assert _lib.new_config(blocking=False).blocking == 0


@pytest.mark.parametrize("name,code", [
    ("int8", nccl.NCCL_INT8), ("uint8", nccl.NCCL_UINT8), ("int32", nccl.NCCL_INT32),
    ("uint32", nccl.NCCL_UINT32), ("int64", nccl.NCCL_INT64), ("uint64", nccl.NCCL_UINT64),
    ("float16", nccl.NCCL_FLOAT16), ("float32", nccl.NCCL_FLOAT32),
    ("float64", nccl.NCCL_FLOAT64)])
def test_numpy_buffers(name: str, code: int) -> None:
    a = np.zeros((3, 5), dtype=name)
    assert buffers.as_buffer(a) == (a.ctypes.data, 15, code)
    assert buffers.numpy_dtype(code) == np.dtype(name)


def test_ml_dtypes_buffers() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for name, code in (("bfloat16", nccl.NCCL_BFLOAT16),
                       ("float8_e4m3fn", nccl.NCCL_FLOAT8E4M3),
                       ("float8_e5m2", nccl.NCCL_FLOAT8E5M2)):
        a = np.zeros(4, dtype=getattr(ml_dtypes, name))
        assert buffers.as_buffer(a).dtype == code
        assert buffers.scalar_bytes(1.5, code) == np.array([1.5], a.dtype).tobytes()


def test_bad_buffers() -> None:
    with pytest.raises(ValueError):
        buffers.as_buffer(np.zeros((4, 4), dtype=np.float32)[:, 1])
    with pytest.raises(TypeError):
        buffers.as_buffer(np.zeros(3, dtype=np.complex64))
    with pytest.raises(TypeError):
        buffers.as_buffer([1, 2, 3])


def test_torch_buffers() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(6, dtype=torch.bfloat16)
    assert buffers.as_buffer(t) == (t.data_ptr(), 6, nccl.NCCL_BFLOAT16)


def test_scalar_bytes() -> None:
    assert buffers.scalar_bytes(3, nccl.NCCL_INT32) == (3).to_bytes(4, "little")
    assert buffers.scalar_bytes(0.5, nccl.NCCL_FLOAT16) == np.float16(0.5).tobytes()
    assert buffers.scalar_bytes(b"\1\2", nccl.NCCL_FLOAT16) == b"\1\2"
    with pytest.raises(ValueError):
        buffers.scalar_bytes(b"\1", nccl.NCCL_FLOAT32)


def test_unique_id_forms() -> None:
    raw = bytes(range(128))
    text = nccl.unique_id_to_hex(raw)
    assert len(text) == 256 and text == raw.hex()
    as_tuple = nccl.unique_id_from_hex(text)
    assert len(as_tuple) == 128 and min(as_tuple) >= -128 and max(as_tuple) <= 127
    assert nccl.unique_id_to_hex(as_tuple) == text
    with pytest.raises(ValueError):
        nccl.unique_id_to_hex(b"short")


def test_constants_follow_the_header() -> None:
    ffi = _lib.ffi
    for const, enum in (("NCCL_BFLOAT16", "ncclBfloat16"), ("NCCL_FLOAT8E5M2", "ncclFloat8e5m2"),
                        ("NCCL_AVG", "ncclAvg"), ("NCCL_FLOAT64", "ncclFloat64")):
        ctype = "ncclRedOp_t" if enum == "ncclAvg" else "ncclDataType_t"
        assert ffi.string(ffi.cast(ctype, getattr(nccl, const))) == enum
    assert nccl.get_build_version() == 23203


@pytest.mark.usefixtures("hetccl_library")
def test_unique_id_and_version() -> None:
    uid = nccl.get_unique_id()
    assert len(uid) == 128 and nccl.get_unique_id() != uid
    assert nccl.get_version() >= 22000


def _cuda_rank(library: str) -> list:
    """One rank: allreduce of a device array on the library's current stream."""
    import hetccl

    if library == "torch":
        import torch

        x = torch.arange(1000, dtype=torch.float32, device="cuda")
        y = torch.zeros_like(x)
        stream = torch.cuda.current_stream().cuda_stream
        sync, same = torch.cuda.synchronize, lambda: bool(torch.equal(x, y))
    else:
        import cupy

        x = cupy.arange(1000, dtype=cupy.float32)
        y = cupy.zeros_like(x)
        stream = cupy.cuda.get_current_stream().ptr
        sync, same = cupy.cuda.Device().synchronize, lambda: bool((x == y).all())
    comm = hetccl.communicator()
    s, r = hetccl.as_buffer(x), hetccl.as_buffer(y)
    comm.allReduce(s.ptr, r.ptr, s.count, s.dtype, nccl.NCCL_SUM, stream)
    sync()
    backend = comm.backend()
    comm.destroy()
    return [backend, same()]


@pytest.mark.cuda
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("hetccl_library")
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_device_array_allreduce(library: str) -> None:
    """A torch / CuPy device array through as_buffer and NcclCommunicator on
    one rank, on that library's current stream."""
    pytest.importorskip(library)
    import hetccl

    backend, equal = hetccl.launch(_cuda_rank, 1, library, timeout=170)[0]
    assert equal, backend


def test_every_module_is_installed() -> None:
    """python/meson.build lists every module of the package: a module it
    leaves out works from the checkout (PYTHONPATH) and is missing from the
    installed wheel, where `import hetccl` then fails."""
    listed = set(re.findall(r"'hetccl/([\w.]+\.py)'", (REPO_ROOT / "python" / "meson.build")
                            .read_text()))
    present = {p.name for p in (REPO_ROOT / "python" / "hetccl").glob("*.py")}
    assert present - listed == set(), f"not installed: {sorted(present - listed)}"
    assert listed - present == set(), f"listed but absent: {sorted(listed - present)}"
