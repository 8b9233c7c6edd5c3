"""NCCL's windows on an engine communicator (libhetccl/comm/window.c).

There a window is a registration that gives no peer access: the calls that
map must answer as NCCL's do for the rank itself (the user pointer, the
rank's own address in its LSA team), the others must fail with
ncclInvalidUsage instead of reaching a vendor library, a handle must belong
to the communicator it is used with, and collectives on a window's buffer
must be right. Two host ranks, through the C ABI as a C program calls it.
(Over ib, tests/test_ib.py checks that a window's buffer goes by RDMA WRITE
with no byte copied.)
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict

import numpy as np
import pytest

import hetccl
from hetccl import nccl

pytestmark = pytest.mark.usefixtures("hetccl_library")

SUCCESS, INVALID_ARGUMENT, INVALID_USAGE = 0, 4, 5
COUNT = 1 << 16


def rank_windows() -> Dict[str, Any]:
    from hetccl import _lib

    L = ctypes.CDLL(str(_lib.loaded_path()))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    comm = hetccl.communicator()
    other = comm.commSplit(0, comm.rank_id())  # a second communicator over the same ranks
    rank, peer = comm.rank_id(), 1 - comm.rank_id()
    h, h2 = vp(comm.comm), vp(other.comm)
    buf = np.full(COUNT, rank + 1, dtype=np.float32)
    base = int(buf.ctypes.data)
    out: Dict[str, Any] = {}

    win = vp()
    out["register"] = L.ncclCommWindowRegister(h, vp(base), sz(buf.nbytes), ctypes.byref(win), 0)
    out["register NULL win"] = L.ncclCommWindowRegister(h, vp(base), sz(buf.nbytes), None, 0)
    got = vp()
    out["user ptr"] = (L.ncclWinGetUserPtr(h, win, ctypes.byref(got)), got.value == base)
    out["user ptr, other comm"] = L.ncclWinGetUserPtr(h2, win, ctypes.byref(got))
    got = vp()
    out["lsa 0"] = (L.ncclGetLsaDevicePointer(win, sz(64), 0, ctypes.byref(got)),
                    got.value == base + 64)
    out["lsa 1"] = L.ncclGetLsaDevicePointer(win, sz(0), 1, ctypes.byref(got))
    got = vp()
    out["peer self"] = (L.ncclGetPeerDevicePointer(win, sz(0), rank, ctypes.byref(got)),
                        got.value == base)
    out["peer other"] = L.ncclGetPeerDevicePointer(win, sz(0), peer, ctypes.byref(got))
    out["offset past end"] = L.ncclGetLsaDevicePointer(win, sz(buf.nbytes), 0, ctypes.byref(got))
    out["lsa multimem"] = L.ncclGetLsaMultimemDevicePointer(win, sz(0), ctypes.byref(got))
    out["not a window"] = L.ncclWinGetUserPtr(h, vp(base), ctypes.byref(got))

    # A collective on the window's buffer, in place.
    comm.allReduce(base, base, COUNT, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out["allreduce right"] = bool(np.all(buf == 3.0))

    out["deregister, other comm"] = L.ncclCommWindowDeregister(h2, win)
    out["deregister"] = L.ncclCommWindowDeregister(h, win)
    out["deregister again"] = L.ncclCommWindowDeregister(h, win)
    out["user ptr after"] = L.ncclWinGetUserPtr(h, win, ctypes.byref(got))

    # A window left registered goes with its communicator; its handle is
    # then nobody's, and a query on it is refused, not read through.
    left = vp()
    out["register left"] = L.ncclCommWindowRegister(h2, vp(base), sz(buf.nbytes),
                                                    ctypes.byref(left), 0)
    other.destroy()
    out["lsa after destroy"] = L.ncclGetLsaDevicePointer(left, sz(0), 0, ctypes.byref(got))
    comm.allReduce(base, base, COUNT, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out["allreduce after"] = bool(np.all(buf == 6.0))
    comm.destroy()
    return out


@pytest.mark.timeout(120)
def test_engine_windows_are_registrations() -> None:
    for rank, got in enumerate(hetccl.launch(rank_windows, 2, timeout=100)):
        want = {
            "register": SUCCESS, "register NULL win": INVALID_ARGUMENT,
            "user ptr": (SUCCESS, True), "user ptr, other comm": INVALID_ARGUMENT,
            "lsa 0": (SUCCESS, True), "lsa 1": INVALID_USAGE,
            "peer self": (SUCCESS, True), "peer other": INVALID_USAGE,
            "offset past end": INVALID_ARGUMENT, "lsa multimem": INVALID_USAGE,
            "not a window": INVALID_ARGUMENT, "allreduce right": True,
            "deregister, other comm": INVALID_ARGUMENT, "deregister": SUCCESS,
            "deregister again": INVALID_ARGUMENT, "user ptr after": INVALID_ARGUMENT,
            "register left": SUCCESS, "lsa after destroy": INVALID_USAGE,
            "allreduce after": True,
        }
        assert got == want, (rank, {k: (got.get(k), v) for k, v in want.items()
                                    if got.get(k) != v})
