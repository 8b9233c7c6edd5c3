"""A cupy.cuda.nccl-style API over libhetccl.so.

Names and argument orders follow CuPy's module (`NcclCommunicator(ndev,
commId, rank)`, `allReduce(sendbuf, recvbuf, count, datatype, op, stream)`,
`get_unique_id()`, `groupStart()`, the NCCL_* constants), so code written
for CuPy runs here by changing the import. Buffers and streams are raw
addresses (int), as in CuPy; an array passed there is refused with a
TypeError naming the argument: `hetccl.buffers` turns numpy / CuPy / torch
arrays into (ptr, count, dtype), and `hetccl.Communicator` (hetccl.arrays)
takes the arrays themselves. Host buffers take stream 0.

A communicator the program drops without destroy() is destroyed when it
is collected (or at interpreter exit), as CuPy's is; one made with
`blocking=False` is returned while its init runs on: `poll()` says
whether it is done, `wait()` waits for it, and every call on the object
waits for it first (raising the init's error, if it failed).

`available` is True when libhetccl.so can be found (as
cupy.cuda.nccl.available says whether NCCL can be used).

hetccl extensions, not in CuPy: alltoall, gather, scatter, commGrow, commSplit,
createPreMulSum / destroyRedOp, finalize, backend, poll, wait.
"""

from __future__ import annotations

import operator
import os
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import IN_PROGRESS, NcclError, check, last_error

__all__ = [
    "NcclCommunicator", "NcclError", "available", "get_build_version", "get_version",
    "get_unique_id", "groupStart", "groupEnd", "unique_id_to_hex", "unique_id_from_hex",
]

# ncclDataType_t
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
NCCL_FLOAT8E4M3 = 10
NCCL_FLOAT8E5M2 = 11
NCCL_NUM_TYPES = 12

# ncclRedOp_t
NCCL_SUM = 0
NCCL_PROD = 1
NCCL_MAX = 2
NCCL_MIN = 3
NCCL_AVG = 4
NCCL_NUM_OPS = 5

# ncclResult_t
NCCL_SUCCESS = 0
NCCL_UNHANDLED_CUDA_ERROR = 1
NCCL_SYSTEM_ERROR = 2
NCCL_INTERNAL_ERROR = 3
NCCL_INVALID_ARGUMENT = 4
NCCL_INVALID_USAGE = 5
NCCL_REMOTE_ERROR = 6
NCCL_IN_PROGRESS = 7
NCCL_TIMEOUT = 8

NCCL_SPLIT_NOCOLOR = -1
NCCL_SHRINK_DEFAULT = 0x00
NCCL_SHRINK_ABORT = 0x01
NCCL_UNIQUE_ID_BYTES = 128

UniqueId = Union[Sequence[int], bytes, bytearray, str]

_ffi = _lib.ffi


def _available() -> bool:
    try:
        return _lib.library_path().is_file()
    except OSError:
        return False


available: bool = _available()


def _address(value: Any, what: str, method: str) -> int:
    """An address argument of the pointer API as an int. An array here is
    the common slip: name the argument and the array API that takes it."""
    if isinstance(value, _ffi.CData):  # a cffi pointer, as the library's own calls give
        return int(_ffi.cast("uintptr_t", value))
    try:
        return operator.index(value)
    except TypeError:
        pass
    cls = type(value)
    kind = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"
    if hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__") \
            or hasattr(value, "__dlpack__"):
        raise TypeError(
            f"NcclCommunicator.{method}: {what} is a {kind}, not an address: this API takes "
            f"pointers (int), as CuPy's does; pass hetccl.as_buffer(array).ptr, or use the "
            f"array API, hetccl.Communicator (e.g. comm.all_reduce(send, recv))") from None
    raise TypeError(f"NcclCommunicator.{method}: {what} must be an address (int), "
                    f"not {kind}") from None


def _void(ptr: Any, what: str, method: str) -> Any:
    return _ffi.cast("void *", _address(ptr, what, method))


def _stream(stream: Any, method: str) -> Any:
    return _ffi.cast("cudaStream_t", _address(stream, "stream", method))


def get_build_version() -> int:
    """The NCCL API version the package's declarations describe (23203)."""
    return _lib.BUILD_VERSION


def get_version() -> int:
    """ncclGetVersion: the version the running library can honour."""
    out = _ffi.new("int *")
    check(_lib.lib().ncclGetVersion(out), "ncclGetVersion")
    return int(out[0])


def get_unique_id() -> Tuple[int, ...]:
    """ncclGetUniqueId, as CuPy returns it: 128 signed byte values. This
    process serves the bootstrap of the communicator made from it, so it
    must stay alive until every rank has joined."""
    uid = _ffi.new("ncclUniqueId *")
    check(_lib.lib().ncclGetUniqueId(uid), "ncclGetUniqueId")
    raw = bytes(_ffi.buffer(uid.internal))
    return tuple(b - 256 if b > 127 else b for b in raw)


def _uid_bytes(commId: UniqueId) -> bytes:
    if isinstance(commId, str):
        return unique_id_from_hex_bytes(commId)
    if isinstance(commId, (bytes, bytearray)):
        raw = bytes(commId)
    else:
        raw = bytes(int(b) & 0xFF for b in commId)
    if len(raw) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"a unique id has {NCCL_UNIQUE_ID_BYTES} bytes, not {len(raw)}")
    return raw


def unique_id_to_hex(commId: UniqueId) -> str:
    """The 256 lowercase hex digits of HETCCL_LAUNCH_ID (docs/launching.md)."""
    return _uid_bytes(commId).hex()


def unique_id_from_hex_bytes(text: str) -> bytes:
    raw = bytes.fromhex(text.strip())
    if len(raw) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"a unique id is {2 * NCCL_UNIQUE_ID_BYTES} hex digits")
    return raw


def unique_id_from_hex(text: str) -> Tuple[int, ...]:
    """The CuPy-style tuple of a hex unique id."""
    return tuple(b - 256 if b > 127 else b for b in unique_id_from_hex_bytes(text))


def _uid_struct(commId: UniqueId) -> Any:
    uid = _ffi.new("ncclUniqueId *")
    _ffi.memmove(uid.internal, _uid_bytes(commId), NCCL_UNIQUE_ID_BYTES)
    return uid


def groupStart() -> None:
    check(_lib.lib().ncclGroupStart(), "ncclGroupStart")


def groupEnd() -> None:
    check(_lib.lib().ncclGroupEnd(), "ncclGroupEnd")


class NcclCommunicator:
    """One rank of a communicator (ncclComm_t).

    Ownership: a communicator this class made (init, initAll, commSplit,
    commShrink, commGrow, joinGrow) is destroyed when the object is
    collected or the interpreter exits, unless destroy() or abort() came
    first; one wrapped with from_handle belongs to whoever made it.

    Nonblocking (`blocking=False`): the library returns ncclInProgress and
    goes on in the background. The object records what is in progress;
    `poll()` asks, `wait()` waits, and any later call on the object waits
    first, so a collective issued right after init runs once init is done,
    or raises init's error."""

    _comm: Any = _ffi.NULL
    _nonblocking = False
    _in_progress: Optional[str] = None  # the call whose ncclInProgress is outstanding
    _finalizer: Optional[weakref.finalize] = None

    def __init__(self, ndev: int, commId: UniqueId, rank: int,
                 blocking: Optional[bool] = None) -> None:
        """ncclCommInitRank (ncclCommInitRankConfig when `blocking` is
        given). Between groupStart() and groupEnd() it only registers the
        rank; the group's end creates every rank together."""
        handle = _ffi.new("ncclComm_t *")
        uid = _uid_struct(commId)[0]
        L = _lib.lib()
        if blocking is None:
            fn = "ncclCommInitRank"
            res = L.ncclCommInitRank(handle, int(ndev), uid, int(rank))
        else:
            fn = "ncclCommInitRankConfig"
            cfg = _lib.new_config(blocking=blocking)
            res = L.ncclCommInitRankConfig(handle, int(ndev), uid, int(rank), cfg)
        self._adopt(handle[0], res, fn, blocking is False)

    def _adopt(self, handle: Any, res: int, fn: str, nonblocking: bool) -> None:
        """Own `handle`, which `fn` returned with `res`."""
        self._nonblocking = nonblocking
        if not (nonblocking and res == IN_PROGRESS and handle != _ffi.NULL):
            check(res, fn)
        self._comm = handle
        self._in_progress = fn if res == IN_PROGRESS else None
        if handle != _ffi.NULL:
            self._finalizer = weakref.finalize(self, _drop, int(_ffi.cast("uintptr_t", handle)),
                                               os.getpid())

    @classmethod
    def _made(cls, handle: Any, res: int, fn: str, nonblocking: bool
              ) -> "NcclCommunicator":
        self = cls.__new__(cls)
        self._adopt(handle, res, fn, nonblocking)
        return self

    @classmethod
    def from_handle(cls, handle: int) -> "NcclCommunicator":
        """Wrap an ncclComm_t given as an address (no check that it is live:
        the library checks every handle it is given). The object does not
        own it: collecting the object leaves the communicator alone."""
        self = cls.__new__(cls)
        self._comm = _ffi.cast("ncclComm_t", int(handle))
        return self

    @staticmethod
    def initAll(devices: Union[int, Sequence[int]]) -> List["NcclCommunicator"]:
        """ncclCommInitAll: every rank of a communicator in this process.
        `devices` is a count or a list of device ids (host ranks ignore it)."""
        if isinstance(devices, int):
            n, devlist = devices, _ffi.NULL
        else:
            n, devlist = len(devices), _ffi.new("int[]", [int(d) for d in devices])
        comms = _ffi.new("ncclComm_t[]", max(n, 1))
        check(_lib.lib().ncclCommInitAll(comms, n, devlist), "ncclCommInitAll")
        return [NcclCommunicator._made(comms[i], 0, "ncclCommInitAll", False) for i in range(n)]

    # -- nonblocking ---------------------------------------------------------
    def poll(self) -> bool:
        """True once nothing is in progress (init, or a call that returned
        ncclInProgress); False while it is; NcclError if it failed
        (ncclCommGetAsyncError). Always True for a blocking communicator."""
        if self._comm == _ffi.NULL:
            return True
        out = _ffi.new("ncclResult_t *")
        check(_lib.lib().ncclCommGetAsyncError(self._comm, out), "ncclCommGetAsyncError")
        if out[0] == IN_PROGRESS:
            return False
        what, self._in_progress = self._in_progress, None
        if out[0] != 0:
            raise NcclError(int(out[0]), last_error(self._comm),
                            what or "ncclCommGetAsyncError")
        return True

    @property
    def in_progress(self) -> Optional[str]:
        """The function whose ncclInProgress is outstanding, else None (as
        this object last saw it: poll() asks the library)."""
        return self._in_progress

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait until poll() is True (TimeoutError after `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0001
        while not self.poll():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self._in_progress or 'communicator'}: still in progress "
                                   f"after {timeout:g} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _ready(self) -> Any:
        """The handle, once what was in progress is done."""
        if self._in_progress is not None:
            self.wait()
        return self._comm

    def _call(self, fn: str, *args: Any) -> None:
        """fn(*args) with this communicator's handle among args (placed by
        the caller through _ready); ncclInProgress is an answer on a
        nonblocking communicator."""
        res = getattr(_lib.lib(), fn)(*args)
        if res == IN_PROGRESS and self._nonblocking:
            self._in_progress = fn
            return
        check(res, fn)

    def _made_by(self, fn: str, res: int, out: Any, blocking: Optional[bool]
                 ) -> "NcclCommunicator":
        return NcclCommunicator._made(out[0], res, fn, blocking is False)

    # -- handle and queries --------------------------------------------------
    @property
    def comm(self) -> int:
        """The ncclComm_t as an address (0 once destroyed)."""
        return int(_ffi.cast("uintptr_t", self._comm))

    def _query(self, fn: str) -> int:
        out = _ffi.new("int *")
        check(getattr(_lib.lib(), fn)(self._ready(), out), fn)
        return int(out[0])

    def rank_id(self) -> int:
        return self._query("ncclCommUserRank")

    rankId = rank_id

    def size(self) -> int:
        return self._query("ncclCommCount")

    def device_id(self) -> int:
        return self._query("ncclCommCuDevice")

    def backend(self) -> str:
        """How the library serves this communicator ("engine", "vendor:nccl")."""
        return _ffi.string(_lib.lib().hetcclCommBackend(self._ready())).decode()

    def copied_bytes(self) -> Dict[str, int]:
        """Payload bytes this rank's CPU copied for the communicator, per
        transport, and by the data plane's host executor ({"shm": ..,
        "socket": .., "ib": .., "plane": ..}; hetcclCommCopiedBytes)."""
        lib = _lib.lib()
        name = _ffi.new("const char **")
        got = _ffi.new("unsigned long long *")
        out: Dict[str, int] = {}
        comm = self._ready()
        for i in range(lib.hetcclTransportCount() + 1):  # the last: "plane"
            check(lib.hetcclCommCopiedBytes(comm, i, name, got), "hetcclCommCopiedBytes")
            out[_ffi.string(name[0]).decode()] = int(got[0])
        return out

    def check_async_error(self) -> None:
        out = _ffi.new("ncclResult_t *")
        check(_lib.lib().ncclCommGetAsyncError(self._comm, out), "ncclCommGetAsyncError")
        check(int(out[0]), "ncclCommGetAsyncError")

    # -- lifetime ------------------------------------------------------------
    def _release(self, fn: str) -> None:
        comm, self._comm = self._comm, _ffi.NULL
        self._in_progress = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        res = getattr(_lib.lib(), fn)(comm)
        if res != IN_PROGRESS:  # a nonblocking destroy goes on by itself
            check(res, fn)

    def finalize(self) -> None:
        self._call("ncclCommFinalize", self._ready())

    def destroy(self) -> None:
        """ncclCommDestroy, after what is in progress; if that failed, the
        communicator is aborted instead and the failure raised."""
        if self._in_progress is not None and self._comm != _ffi.NULL:
            try:
                self.wait()
            except NcclError:
                self._release("ncclCommAbort")
                raise
        self._release("ncclCommDestroy")

    def abort(self) -> None:
        self._release("ncclCommAbort")

    def __enter__(self) -> "NcclCommunicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._comm != _ffi.NULL:
            self.destroy()

    def commSplit(self, color: int, key: int,
                  blocking: Optional[bool] = None) -> Optional["NcclCommunicator"]:
        """ncclCommSplit; None for the ranks that pass NCCL_SPLIT_NOCOLOR."""
        out = _ffi.new("ncclComm_t *")
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        res = _lib.lib().ncclCommSplit(self._ready(), int(color), int(key), out, cfg)
        answered = res == 0 or (res == IN_PROGRESS and blocking is False)
        if answered and out[0] == _ffi.NULL:
            return None
        return self._made_by("ncclCommSplit", res, out, blocking)

    def commShrink(self, exclude: Sequence[int], abort: bool = False,
                   blocking: Optional[bool] = None) -> "NcclCommunicator":
        """ncclCommShrink: a communicator of the ranks not in `exclude`
        (called by those ranks only); `abort` is NCCL_SHRINK_ABORT, for
        a parent that failed or may hang."""
        ranks = _ffi.new("int[]", [int(r) for r in exclude] or [-1])
        out = _ffi.new("ncclComm_t *")
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        flags = NCCL_SHRINK_ABORT if abort else NCCL_SHRINK_DEFAULT
        # A shrink with abort is for a parent that may hang: do not wait on it.
        comm = self._comm if abort else self._ready()
        res = _lib.lib().ncclCommShrink(comm, ranks, len(exclude), out, cfg, flags)
        return self._made_by("ncclCommShrink", res, out, blocking)

    def commGetUniqueId(self) -> Tuple[int, ...]:
        """ncclCommGetUniqueId: the id for growing this communicator, in
        get_unique_id's form. This rank serves the grown communicator's
        bootstrap, so it must take part in the grow."""
        uid = _ffi.new("ncclUniqueId *")
        check(_lib.lib().ncclCommGetUniqueId(self._ready(), uid), "ncclCommGetUniqueId")
        raw = bytes(_ffi.buffer(uid.internal))
        return tuple(b - 256 if b > 127 else b for b in raw)

    def commGrow(self, nranks: int, commId: Optional[UniqueId] = None,
                 blocking: Optional[bool] = None) -> "NcclCommunicator":
        """ncclCommGrow for a member of this communicator: every member
        calls it (the one that made the id passes it, the others may pass
        None) and keeps its rank in the new communicator of `nranks`."""
        out = _ffi.new("ncclComm_t *")
        uid = _ffi.NULL if commId is None else _uid_struct(commId)
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        res = _lib.lib().ncclCommGrow(self._ready(), int(nranks), uid, -1, out, cfg)
        return self._made_by("ncclCommGrow", res, out, blocking)

    @staticmethod
    def joinGrow(nranks: int, commId: Optional[UniqueId], rank: int,
                 blocking: Optional[bool] = None) -> "NcclCommunicator":
        """ncclCommGrow for a joining rank: no communicator yet, the id from
        ncclCommGetUniqueId, and its rank in the new communicator (the
        members keep 0 .. n-1, joining ranks take n and up)."""
        out = _ffi.new("ncclComm_t *")
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        uid = _ffi.NULL if commId is None else _uid_struct(commId)
        res = _lib.lib().ncclCommGrow(_ffi.NULL, int(nranks), uid, int(rank), out, cfg)
        return NcclCommunicator._made(out[0], res, "ncclCommGrow", blocking is False)

    # -- reduction operators -------------------------------------------------
    def createPreMulSum(self, scalar: bytes, datatype: int) -> int:
        """ncclRedOpCreatePreMulSum with a host scalar given as the raw bytes
        of one element of `datatype` (buffers.scalar_bytes makes them)."""
        op = _ffi.new("ncclRedOp_t *")
        buf = _ffi.new("char[]", bytes(scalar))
        check(_lib.lib().ncclRedOpCreatePreMulSum(op, buf, int(datatype), 1, self._ready()),
              "ncclRedOpCreatePreMulSum")
        return int(op[0])

    def destroyRedOp(self, op: int) -> None:
        check(_lib.lib().ncclRedOpDestroy(int(op), self._ready()), "ncclRedOpDestroy")

    # -- collectives (CuPy's argument order) ---------------------------------
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int = 0) -> None:
        m = "allReduce"
        self._call("ncclAllReduce", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, op, self._ready(), _stream(stream, m))

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int = 0) -> None:
        m = "reduce"
        self._call("ncclReduce", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, op, root, self._ready(), _stream(stream, m))

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int = 0) -> None:
        m = "broadcast"
        self._call("ncclBroadcast", _void(sendbuff, "sendbuff", m),
                   _void(recvbuff, "recvbuff", m), count, datatype, root, self._ready(),
                   _stream(stream, m))

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int = 0) -> None:
        m = "bcast"
        self._call("ncclBcast", _void(buff, "buff", m), count, datatype, root, self._ready(),
                   _stream(stream, m))

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                      op: int, stream: int = 0) -> None:
        m = "reduceScatter"
        self._call("ncclReduceScatter", _void(sendbuf, "sendbuf", m),
                   _void(recvbuf, "recvbuf", m), recvcount, datatype, op, self._ready(),
                   _stream(stream, m))

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int = 0) -> None:
        m = "allGather"
        self._call("ncclAllGather", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, self._ready(), _stream(stream, m))

    def alltoall(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                 stream: int = 0) -> None:
        """ncclAlltoAll: `count` elements to and from each rank."""
        m = "alltoall"
        self._call("ncclAlltoAll", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, self._ready(), _stream(stream, m))

    def gather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
               stream: int = 0) -> None:
        m = "gather"
        self._call("ncclGather", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, root, self._ready(), _stream(stream, m))

    def scatter(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
                stream: int = 0) -> None:
        m = "scatter"
        self._call("ncclScatter", _void(sendbuf, "sendbuf", m), _void(recvbuf, "recvbuf", m),
                   count, datatype, root, self._ready(), _stream(stream, m))

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int = 0) -> None:
        m = "send"
        self._call("ncclSend", _void(sendbuf, "sendbuf", m), count, datatype, peer,
                   self._ready(), _stream(stream, m))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int = 0) -> None:
        m = "recv"
        self._call("ncclRecv", _void(recvbuf, "recvbuf", m), count, datatype, peer,
                   self._ready(), _stream(stream, m))


def _drop(handle: int, owner: int) -> None:
    """The finalizer of an owned communicator the program never destroyed:
    ncclCommDestroy, or ncclCommAbort where something is still in progress
    or failed (destroy would wait on peers that may be gone). Never raises:
    it runs from the garbage collector or at exit. A forked child's copy of
    the object is not the communicator (its threads stayed in the parent):
    only the process that made it destroys it."""
    if os.getpid() != owner:
        return
    try:
        L = _lib.lib()
        comm = _ffi.cast("ncclComm_t", handle)
        state = _ffi.new("ncclResult_t *")
        healthy = L.ncclCommGetAsyncError(comm, state) == 0 and state[0] == 0
        (L.ncclCommDestroy if healthy else L.ncclCommAbort)(comm)
    except Exception:  # noqa: BLE001 - interpreter shutdown may have torn things down
        pass
