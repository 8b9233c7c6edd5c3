"""The Python layer's own pieces: buffer conversion, unique ids, the
launcher API (the cffi declarations against the headers: test_cdef.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from libpath import REPO_ROOT

from hetccl import _lib, buffers, nccl


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


def test_one_dtype_table_for_numpy_and_torch() -> None:
    """hetccl.dtypes serves buffers, arrays and the torch backend (each had
    its own map): a torch dtype and the numpy dtype of the same name have
    one NCCL type and one size."""
    torch = pytest.importorskip("torch")
    from hetccl import dtypes, torch_backend

    for code, name in dtypes.NAME.items():
        if not hasattr(torch, name):
            continue
        t = torch.zeros(3, dtype=getattr(torch, name))
        assert torch_backend.nccl_dtype(t.dtype) == buffers.as_buffer(t).dtype == code, name
        assert t.element_size() == dtypes.ITEMSIZE[code], name
        if name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            assert dtypes.numpy_dtype(code).itemsize == dtypes.ITEMSIZE[code], name
            assert buffers.nccl_dtype(np.dtype(name)) == code, name
    assert torch_backend.nccl_dtype(torch.bool) == nccl.NCCL_UINT8
    with pytest.raises(TypeError, match="int16 in a reduction .*reductions take int8"):
        torch_backend.nccl_dtype(torch.int16)
    with pytest.raises(TypeError, match="no NCCL data type for .*int16"):
        buffers.nccl_dtype(np.int16)


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


# -- CuPy's shape: errors, availability, pointers, ownership, nonblocking init ----------------

@pytest.mark.usefixtures("hetccl_library")
def test_errors_name_the_function_once() -> None:
    """The library's text names the function (ncclGetLastError), and
    NcclError names it once: before, the exception read "ncclAllReduce:
    ncclInvalidArgument: ncclAllReduce: invalid datatype 99", and a bad
    operator's text named no function."""
    from hetccl.errors import NcclError, last_error

    comms = nccl.NcclCommunicator.initAll(2)
    x = np.zeros(4, np.float32)
    p = x.ctypes.data
    cases = [
        ("ncclAllReduce", lambda: comms[0].allReduce(p, p, 4, 99, nccl.NCCL_SUM),
         "invalid datatype 99"),
        ("ncclAllReduce", lambda: comms[0].allReduce(p, p, 4, nccl.NCCL_FLOAT32, 99),
         "invalid reduction operator 99"),
        ("ncclBroadcast", lambda: comms[0].broadcast(p, p, 4, nccl.NCCL_FLOAT32, 5),
         "root 5 out of range"),
        ("ncclSend", lambda: comms[0].send(p, 4, nccl.NCCL_FLOAT32, 5), "peer 5 out of range"),
        ("ncclCommInitRank", lambda: nccl.NcclCommunicator(2, nccl.get_unique_id(), 5),
         "rank 5 out of range"),
    ]
    try:
        for fn, call, cause in cases:
            with pytest.raises(NcclError) as err:
                call()
            text = str(err.value)
            assert text.startswith(f"{fn}: ncclInvalidArgument: {cause}"), text
            assert text.count(fn) == 1, text
            assert err.value.message.startswith(f"{fn}: {cause}"), err.value.message
            assert last_error().count(fn) == 1, last_error()
        # a C caller's view: ncclCommCount with no place for the answer
        assert _lib.lib().ncclCommCount(comms[0]._comm, _lib.ffi.NULL) == 4
        assert last_error() == "ncclCommCount: count is NULL"
    finally:
        for c in comms:
            c.destroy()


def test_cupy_names() -> None:
    from hetccl.errors import NcclError

    e = NcclError(nccl.NCCL_INVALID_USAGE, "ncclGroupEnd: no group", "ncclGroupEnd")
    assert e.status == e.result == nccl.NCCL_INVALID_USAGE
    assert str(e) == "ncclGroupEnd: ncclInvalidUsage: no group"
    assert nccl.available is (_lib.library_path().is_file())


def test_available_is_false_without_the_library(tmp_path: Path) -> None:
    code = "from hetccl import nccl; print(nccl.available)"
    env = {**os.environ, "HETCCL_LIBRARY": str(tmp_path / "absent.so")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_pointer_api_names_an_array_argument() -> None:
    """An array where the CuPy-style API takes an address: a TypeError that
    names the argument and the array API (not numpy's "only 0-dimensional
    arrays can be converted to Python scalars")."""
    comm = nccl.NcclCommunicator.from_handle(0)
    a = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match=r"allReduce: sendbuf is a numpy.ndarray, not an "
                                        r"address.*as_buffer.*Communicator.*all_reduce"):
        comm.allReduce(a, a.ctypes.data, 3, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    with pytest.raises(TypeError, match="recv: recvbuf"):
        comm.recv(a, 3, nccl.NCCL_FLOAT32, 0)
    with pytest.raises(TypeError, match="stream must be an address"):
        comm.send(a.ctypes.data, 3, nccl.NCCL_FLOAT32, 0, stream="s")


def test_array_api_names_the_collective_of_a_strided_array() -> None:
    import hetccl

    comm = hetccl.Communicator.wrap(nccl.NcclCommunicator.from_handle(0))
    strided = np.zeros((4, 4), np.float32)[:, 1]
    with pytest.raises(ValueError, match=r"all_reduce: send: ndarray buffer must be "
                                         r"C-contiguous.*np\.ascontiguousarray"):
        comm.all_reduce(strided)
    with pytest.raises(ValueError, match=r"all_gather: recv: .*C-contiguous"):
        comm.all_gather(np.zeros(2, np.float32), np.zeros((4, 4), np.float32)[:, 0])
    with pytest.raises(ValueError, match=r"send: array: .*C-contiguous"):
        comm.send(strided, 1)


def _dropped_communicators(rounds: int) -> list:
    """Descriptors and threads after 2 rounds and after `rounds` of an
    initAll(2) the program drops without destroy()."""
    import gc

    from hetccl import nccl as n

    def counts() -> tuple:
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

    seen = []
    for i in range(rounds):
        if i in (2, rounds - 1):
            seen.append(counts())
        n.NcclCommunicator.initAll(2)
        gc.collect()
    return seen


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hetccl_library")
def test_dropped_communicators_are_destroyed() -> None:
    """Each initAll(2) took 8 descriptors and 2 threads for good when its
    communicators were dropped; now the collector destroys them."""
    import hetccl

    (after_two, after_all), = hetccl.launch(_dropped_communicators, 1, 20, timeout=100)
    assert after_all[0] <= after_two[0] + 2, (after_two, after_all)
    assert after_all[1] <= after_two[1] + 1, (after_two, after_all)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hetccl_library")
def test_exit_with_live_communicators() -> None:
    """Communicators still referenced at exit are destroyed then, quietly."""
    code = ("from hetccl import nccl\nkeep = nccl.NcclCommunicator.initAll(3)\n"
            "print(keep[2].size())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0 and out.stdout == "3\n", out.stderr
    assert out.stderr == ""


def _nonblocking_rank() -> list:
    import hetccl
    from hetccl import nccl as n
    from hetccl.launcher import launch_info

    info = launch_info()
    first, _ = hetccl.init_from_env(blocking=False)   # HETCCL_LAUNCH_ID's communicator
    pending = first.nccl.in_progress
    x = np.full(5, info.rank + 1.0, np.float32)
    first.all_reduce(x)                                # waits for init, then for the sum
    first.wait()
    second, _ = hetccl.init_from_env(blocking=False)  # an id from rank 0's server
    second.wait(timeout=60)
    done = second.poll()
    y = np.full(3, 2.0 * (info.rank + 1), np.float64)
    second.nccl.allReduce(y.ctypes.data, y.ctypes.data, 3, n.NCCL_FLOAT64, n.NCCL_SUM)
    second.wait()
    first.destroy()
    second.destroy()
    return [pending, x.tolist(), done, y.tolist()]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hetccl_library")
def test_nonblocking_communicators_are_returned() -> None:
    """blocking=False gave `NcclError: ncclCommInitRankConfig: ncclInProgress`
    and lost the handle; now the object comes back, init runs on, and the
    object's calls wait for it."""
    import hetccl

    results = hetccl.launch(_nonblocking_rank, 2, timeout=100)
    for pending, x, done, y in results:
        assert pending in ("ncclCommInitRankConfig", None)
        assert x == [3.0] * 5 and done is True and y == [6.0] * 3
    assert any(r[0] == "ncclCommInitRankConfig" for r in results), results


def _forked_child_drops_a_copy() -> list:
    """A child forked after init drops its copy of the communicators; the
    parent's stay usable."""
    import gc
    import time

    from hetccl import nccl as n

    comms = n.NcclCommunicator.initAll(2)
    pid = os.fork()
    if pid == 0:
        del comms
        gc.collect()
        os._exit(0)
    deadline, status = time.monotonic() + 30, None
    while status is None and time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        status = code if done else None
        time.sleep(0.01)
    if status is None:
        os.kill(pid, 9)
    sizes = [c.size() for c in comms]
    for c in comms:
        c.destroy()
    return [status, sizes]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hetccl_library")
def test_a_forked_copy_is_not_destroyed() -> None:
    """The finalizer runs ncclCommDestroy only in the process that made the
    communicator: in a fork its threads are absent and destroy would wait."""
    import hetccl

    status, sizes = hetccl.launch(_forked_child_drops_a_copy, 1, timeout=100)[0]
    assert status == 0 and sizes == [2, 2]
