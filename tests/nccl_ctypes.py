"""The NCCL C API through ctypes, for the rank scripts that drive the
library without the Python package (tests/cuda_engine_rank.py,
tests/cuda_pair_rank.py): `load(path)` opens the library and declares the
functions they call; `check` turns a result into an exception naming the
library's last error; `async_error`, `report` and `run_main` are the
ends every rank script shares."""
from __future__ import annotations

import ctypes
import json
import sys
from typing import Any, Callable, Dict

P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


SIGNATURES = {
    "ncclAllReduce": [P, P, S, I, I, P, P],
    "ncclBroadcast": [P, P, S, I, I, P, P],
    "ncclReduce": [P, P, S, I, I, I, P, P],
    "ncclAllGather": [P, P, S, I, P, P],
    "ncclReduceScatter": [P, P, S, I, I, P, P],
    "ncclAlltoAll": [P, P, S, I, P, P],
    "ncclGather": [P, P, S, I, I, P, P],
    "ncclScatter": [P, P, S, I, I, P, P],
    "ncclSend": [P, S, I, I, P, P],
    "ncclRecv": [P, S, I, I, P, P],
    "ncclCommInitRank": [ctypes.POINTER(P), I, UniqueId, I],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommDestroy": [P],
    "ncclCommGetAsyncError": [P, ctypes.POINTER(I)],
    "ncclGetLastError": [P],
    "hetcclCommBackend": [P],
}


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    for name, args in SIGNATURES.items():
        getattr(lib, name).argtypes = args
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.hetcclCommBackend.restype = ctypes.c_char_p
    return lib


def checker(lib: ctypes.CDLL):
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}: "
                               f"{(lib.ncclGetLastError(None) or b'').decode()}")
    return check


def async_error(lib: ctypes.CDLL, comm: Any) -> int:
    """ncclCommGetAsyncError's answer for comm (raises if the call fails)."""
    err = I(-1)
    checker(lib)(lib.ncclCommGetAsyncError(comm, ctypes.byref(err)), "GetAsyncError")
    return err.value


def report(results: Dict[str, Any]) -> None:
    """The one line the tests read back (rank_procs.run_ranks)."""
    print("RESULT " + json.dumps(results), flush=True)


def run_main(main: Callable[[], None], who: str) -> None:
    """main(), and on an exception one line naming `who` and exit status 1
    (the test prints the whole output)."""
    try:
        main()
    except Exception as e:
        print(f"{who}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
