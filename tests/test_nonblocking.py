"""Nonblocking communicators (ncclConfig_t.blocking = 0) on real processes:
init returns ncclInProgress and completes in the background; a collective
returns ncclInProgress and its data is there once ncclCommGetAsyncError says
ncclSuccess; blocking and nonblocking ranks agree on the results."""
from __future__ import annotations

import time
from typing import List

import numpy as np
import pytest

import hetccl
from hetccl import _lib
from hetccl.launcher import launch_info
from hetccl.nccl import NCCL_FLOAT32, NCCL_SUM

pytestmark = pytest.mark.usefixtures("hetccl_library")

IN_PROGRESS, SUCCESS = 7, 0


def _wait(L, ffi, comm, what: str, seen: List[str]) -> None:
    err = ffi.new("ncclResult_t *")
    deadline = time.monotonic() + 30
    while True:
        assert L.ncclCommGetAsyncError(comm, err) == SUCCESS
        if err[0] != IN_PROGRESS:
            break
        seen.append(what)
        assert time.monotonic() < deadline, f"{what} still in progress after 30 s"
        time.sleep(0.0005)
    assert err[0] == SUCCESS, f"{what}: async error {err[0]}: {ffi.string(L.ncclGetLastError(comm))}"


def rank_nonblocking() -> List[str]:
    L, ffi = _lib.lib(), _lib.ffi
    info = launch_info()
    uid = ffi.new("ncclUniqueId *")
    ffi.memmove(uid, bytes.fromhex(info.unique_id), 128)
    cfg = _lib.new_config(blocking=False)
    handle = ffi.new("ncclComm_t *")
    seen: List[str] = []
    rc = L.ncclCommInitRankConfig(handle, info.nranks, uid[0], info.rank, cfg)
    assert rc in (SUCCESS, IN_PROGRESS), rc
    comm = handle[0]
    _wait(L, ffi, comm, "init", seen)
    n, me = info.nranks, info.rank
    for count in (1, 1031, 1 << 20):
        x = np.full(count, me + 1, dtype=np.float32)
        y = np.zeros(count, dtype=np.float32)
        rc = L.ncclAllReduce(ffi.cast("void *", x.ctypes.data), ffi.cast("void *", y.ctypes.data),
                             count, NCCL_FLOAT32, NCCL_SUM, comm, ffi.NULL)
        assert rc in (SUCCESS, IN_PROGRESS), rc
        _wait(L, ffi, comm, f"allreduce {count}", seen)
        want = n * (n + 1) / 2
        assert np.all(y == want), f"count {count}: got {y[:4]} want {want}"
    assert L.ncclCommFinalize(comm) in (SUCCESS, IN_PROGRESS)
    _wait(L, ffi, comm, "finalize", seen)
    assert L.ncclCommDestroy(comm) == SUCCESS
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_nonblocking_init_and_collectives(n: int) -> None:
    results = hetccl.launch(rank_nonblocking, n, timeout=100)
    # The work ran in the background: at least one rank saw ncclInProgress.
    assert any("init" in seen for seen in results), results
