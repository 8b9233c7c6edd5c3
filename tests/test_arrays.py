"""hetccl.arrays.Communicator: collectives on arrays (numpy on host ranks
here; torch CPU tensors where torch imports; CuPy and torch CUDA arrays on
a GPU), beside the pointer form of NcclCommunicator, which is unchanged.
Ranks are real processes (hetccl.launch); the argument checks run on a
one-rank communicator in this process."""

from __future__ import annotations

import array
from typing import Any, List

import numpy as np
import pytest

import hetccl
from hetccl import nccl

pytestmark = [pytest.mark.usefixtures("hetccl_library"), pytest.mark.timeout(180)]


class DLPackOnly:
    """An array reachable only through DLPack (as a JAX or other array would be)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._a.__dlpack__()

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


def _every_collective(count: int) -> List[Any]:
    """One rank: every array method on numpy arrays, checked here."""
    comm, info = hetccl.init_from_env()
    r, n = info.rank, info.size
    rng = lambda j, k: (np.arange(k, dtype=np.float32) % 13) + j  # noqa: E731
    fails = []

    def check(name: str, got: Any, want: Any) -> None:
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            fails.append(f"rank {r} {name}: got {np.asarray(got)[:5]}, want {np.asarray(want)[:5]}")

    x = rng(r, count)
    check("all_reduce in place", comm.all_reduce(x.copy()), sum(rng(j, count) for j in range(n)))
    y = np.empty(count, np.float32)
    comm.all_reduce(rng(r, count), y, op="max")
    check("all_reduce max", y, rng(n - 1, count))
    b = rng(r, count) if r == 1 else np.zeros(count, np.float32)
    check("broadcast", comm.broadcast(b, root=1), rng(1, count))
    red = np.zeros(count, np.float32)
    comm.reduce(rng(r, count), red if r == 0 else None, root=0)
    if r == 0:
        check("reduce", red, sum(rng(j, count) for j in range(n)))
    g = np.zeros(n * count, np.float32)
    check("all_gather", comm.all_gather(rng(r, count), g),
          np.concatenate([rng(j, count) for j in range(n)]))
    rs = np.zeros(count, np.float32)
    full = [rng(j, n * count) for j in range(n)]
    check("reduce_scatter", comm.reduce_scatter(full[r], rs),
          sum(full)[r * count:(r + 1) * count])
    a2a = np.zeros(n * count, np.float32)
    comm.all_to_all(full[r], a2a)
    check("all_to_all", a2a, np.concatenate([full[j][r * count:(r + 1) * count]
                                             for j in range(n)]))
    gat = np.zeros(n * count, np.float32) if r == 0 else None
    comm.gather(rng(r, count), gat, root=0)
    if r == 0:
        check("gather", gat, np.concatenate([rng(j, count) for j in range(n)]))
    sc = np.zeros(count, np.float32)
    comm.scatter(full[0] if r == 0 else None, sc, root=0)
    check("scatter", sc, full[0][r * count:(r + 1) * count])
    ring = np.zeros(count, np.float32)
    out = rng(r, count)  # alive until groupEnd, when the send reads it
    hetccl.groupStart()
    comm.send(out, (r + 1) % n)
    comm.recv(ring, (r - 1) % n)
    hetccl.groupEnd()
    check("send/recv", ring, rng((r - 1) % n, count))
    # other array kinds: a buffer-protocol object, a 2-D int array, DLPack
    ints = array.array("i", [r + 1] * count)
    comm.all_reduce(ints, op="prod")
    check("array.array prod", list(ints), [int(np.prod(np.arange(1, n + 1)))] * count)
    m = np.full((2, count), r, np.int64)
    check("2-D int64 sum", comm.all_reduce(m), np.full((2, count), n * (n - 1) // 2))
    d = rng(r, count)
    comm.all_reduce(DLPackOnly(d))
    check("DLPack", d, sum(rng(j, count) for j in range(n)))
    # the pointer form on the same communicator, as cupy.cuda.nccl spells it
    p = rng(r, count)
    comm.nccl.allReduce(p.ctypes.data, p.ctypes.data, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    check("pointer form", p, sum(rng(j, count) for j in range(n)))
    comm.destroy()
    return fails


@pytest.mark.parametrize("n,count", [(2, 1031), (3, 1), (3, 0)])
def test_every_collective_on_numpy(n: int, count: int) -> None:
    results = hetccl.launch(_every_collective, n, count, timeout=170)
    assert results == [[]] * n, results


def _torch_cpu(count: int) -> List[Any]:
    import torch

    comm, info = hetccl.init_from_env()
    t = torch.arange(count, dtype=torch.bfloat16) + info.rank
    comm.all_reduce(t)
    g = torch.zeros(info.size * count, dtype=torch.int32)
    comm.all_gather(torch.full((count,), info.rank, dtype=torch.int32), g)
    comm.destroy()
    return [t.float().tolist(), g.tolist()]


def test_torch_cpu_tensors() -> None:
    pytest.importorskip("torch")
    res = hetccl.launch(_torch_cpu, 2, 5, timeout=170)
    for t, g in res:
        assert t == [2 * i + 1 for i in range(5)]
        assert g == [0] * 5 + [1] * 5


# -- argument checks, one rank in this process -------------------------------------------------

@pytest.fixture(scope="module")
def one() -> Any:
    comm = hetccl.Communicator(1, nccl.get_unique_id(), 0)
    yield comm
    comm.destroy()


def test_checks(one: Any) -> None:
    f32 = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="complex64.*no NCCL data type"):
        one.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(ValueError, match="C-contiguous"):
        one.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="all_reduce: the output has 5 elements, the "
                                         "collective needs 4"):
        one.all_reduce(f32, np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="element types differ \\(float32 and float64\\)"):
        one.all_reduce(f32, np.zeros(4, np.float64))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        one.all_reduce(ro)
    with pytest.raises(ValueError, match="read-only"):
        one.recv(bytes(4), 0)
    with pytest.raises(ValueError, match="reduce_scatter: the input has 3 elements, the "
                                         "collective needs 2"):
        one.reduce_scatter(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="op 'mean'"):
        one.all_reduce(f32, op="mean")
    with pytest.raises(TypeError, match="cannot use a list"):
        one.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="the root needs an output array"):
        one.gather(f32)


def test_one_rank_results(one: Any) -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert one.all_reduce(x, op="avg") is x and x[1, 2] == 5
    out = np.zeros(6, np.uint8)
    one.all_gather(np.arange(6, dtype=np.uint8), out)
    assert out.tolist() == list(range(6))
    assert one.rank == 0 and one.size == 1 and one.backend() == "engine"


def test_pointer_form_is_unchanged() -> None:
    """NcclCommunicator keeps CuPy's names and argument order; the array
    methods live on the wrapper only."""
    import inspect

    sig = inspect.signature(nccl.NcclCommunicator.allReduce)
    assert list(sig.parameters) == ["self", "sendbuf", "recvbuf", "count", "datatype", "op",
                                    "stream"]
    assert not hasattr(nccl.NcclCommunicator, "all_reduce")
    assert (nccl.NCCL_FLOAT32, nccl.NCCL_SUM, nccl.NCCL_AVG) == (7, 0, 4)


# -- device arrays (GPU machine) ------------------------------------------------------------

def _device_rank(library: str) -> List[Any]:
    comm, info = hetccl.init_from_env()
    if library == "torch":
        import torch

        x = torch.arange(1000, dtype=torch.float32, device="cuda") + info.rank
        want = (torch.arange(1000, dtype=torch.float32, device="cuda") * info.size
                + sum(range(info.size)))
        comm.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool(torch.equal(x, want))
    else:
        import cupy

        x = cupy.arange(1000, dtype=cupy.float32) + info.rank
        want = cupy.arange(1000, dtype=cupy.float32) * info.size + sum(range(info.size))
        comm.all_reduce(x)
        cupy.cuda.get_current_stream().synchronize()
        ok = bool((x == want).all())
    backend = comm.backend()
    comm.destroy()
    return [backend, ok]


@pytest.mark.cuda
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_device_arrays(library: str) -> None:
    pytest.importorskip(library)
    for backend, ok in hetccl.launch(_device_rank, 1, library, timeout=170):
        assert ok, backend
