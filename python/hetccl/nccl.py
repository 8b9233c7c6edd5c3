"""A cupy.cuda.nccl-style API over libhetccl.so.

Names and argument orders follow CuPy's module (`NcclCommunicator(ndev,
commId, rank)`, `allReduce(sendbuf, recvbuf, count, datatype, op, stream)`,
`get_unique_id()`, `groupStart()`, the NCCL_* constants), so code written
for CuPy runs here by changing the import. Buffers and streams are raw
addresses (int); `hetccl.buffers` turns numpy / CuPy / torch arrays into
(ptr, count, dtype). Host buffers take stream 0.

hetccl extensions, not in CuPy: alltoall, gather, scatter, commGrow, commSplit,
createPreMulSum / destroyRedOp, finalize, backend.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import NcclError, check

__all__ = [
    "NcclCommunicator", "NcclError", "get_build_version", "get_version", "get_unique_id",
    "groupStart", "groupEnd", "unique_id_to_hex", "unique_id_from_hex",
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


def _void(ptr: int) -> Any:
    return _ffi.cast("void *", int(ptr))


def _stream(stream: int) -> Any:
    return _ffi.cast("cudaStream_t", int(stream))


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
    """The 256 lowercase hex digits of HETCCL_LAUNCH_ID (docs/launcher.md)."""
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
    """One rank of a communicator (ncclComm_t)."""

    def __init__(self, ndev: int, commId: UniqueId, rank: int,
                 blocking: Optional[bool] = None) -> None:
        """ncclCommInitRank (ncclCommInitRankConfig when `blocking` is
        given). Between groupStart() and groupEnd() it only registers the
        rank; the group's end creates every rank together."""
        handle = _ffi.new("ncclComm_t *")
        uid = _uid_struct(commId)[0]
        L = _lib.lib()
        if blocking is None:
            check(L.ncclCommInitRank(handle, int(ndev), uid, int(rank)), "ncclCommInitRank")
        else:
            cfg = _lib.new_config(blocking=blocking)
            check(L.ncclCommInitRankConfig(handle, int(ndev), uid, int(rank), cfg),
                  "ncclCommInitRankConfig")
        self._comm = handle[0]

    @classmethod
    def from_handle(cls, handle: int) -> "NcclCommunicator":
        """Wrap an ncclComm_t given as an address (no check that it is live:
        the library checks every handle it is given)."""
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
        return [NcclCommunicator.from_handle(int(_ffi.cast("uintptr_t", comms[i])))
                for i in range(n)]

    # -- handle and queries --------------------------------------------------
    @property
    def comm(self) -> int:
        """The ncclComm_t as an address (0 once destroyed)."""
        return int(_ffi.cast("uintptr_t", self._comm))

    def _query(self, fn: str) -> int:
        out = _ffi.new("int *")
        check(getattr(_lib.lib(), fn)(self._comm, out), fn)
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
        return _ffi.string(_lib.lib().hetcclCommBackend(self._comm)).decode()

    def copied_bytes(self) -> Dict[str, int]:
        """Payload bytes this rank's CPU copied for the communicator, per
        transport, and by the data plane's host executor ({"shm": ..,
        "socket": .., "ib": .., "plane": ..}; hetcclCommCopiedBytes)."""
        lib = _lib.lib()
        name = _ffi.new("const char **")
        got = _ffi.new("unsigned long long *")
        out: Dict[str, int] = {}
        for i in range(lib.hetcclTransportCount() + 1):  # the last: "plane"
            check(lib.hetcclCommCopiedBytes(self._comm, i, name, got), "hetcclCommCopiedBytes")
            out[_ffi.string(name[0]).decode()] = int(got[0])
        return out

    def check_async_error(self) -> None:
        out = _ffi.new("ncclResult_t *")
        check(_lib.lib().ncclCommGetAsyncError(self._comm, out), "ncclCommGetAsyncError")
        check(int(out[0]), "ncclCommGetAsyncError")

    # -- lifetime ------------------------------------------------------------
    def _release(self, fn: str) -> None:
        comm, self._comm = self._comm, _ffi.NULL
        check(getattr(_lib.lib(), fn)(comm), fn)

    def finalize(self) -> None:
        check(_lib.lib().ncclCommFinalize(self._comm), "ncclCommFinalize")

    def destroy(self) -> None:
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
        check(_lib.lib().ncclCommSplit(self._comm, int(color), int(key), out, cfg),
              "ncclCommSplit")
        if out[0] == _ffi.NULL:
            return None
        return NcclCommunicator.from_handle(int(_ffi.cast("uintptr_t", out[0])))

    def commShrink(self, exclude: Sequence[int], abort: bool = False,
                   blocking: Optional[bool] = None) -> "NcclCommunicator":
        """ncclCommShrink: a communicator of the ranks not in `exclude`
        (called by those ranks only); `abort` is NCCL_SHRINK_ABORT, for
        a parent that failed or may hang."""
        ranks = _ffi.new("int[]", [int(r) for r in exclude] or [-1])
        out = _ffi.new("ncclComm_t *")
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        flags = NCCL_SHRINK_ABORT if abort else NCCL_SHRINK_DEFAULT
        check(_lib.lib().ncclCommShrink(self._comm, ranks, len(exclude), out, cfg, flags),
              "ncclCommShrink")
        return NcclCommunicator.from_handle(int(_ffi.cast("uintptr_t", out[0])))

    def commGetUniqueId(self) -> Tuple[int, ...]:
        """ncclCommGetUniqueId: the id for growing this communicator, in
        get_unique_id's form. This rank serves the grown communicator's
        bootstrap, so it must take part in the grow."""
        uid = _ffi.new("ncclUniqueId *")
        check(_lib.lib().ncclCommGetUniqueId(self._comm, uid), "ncclCommGetUniqueId")
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
        check(_lib.lib().ncclCommGrow(self._comm, int(nranks), uid, -1, out, cfg),
              "ncclCommGrow")
        return NcclCommunicator.from_handle(int(_ffi.cast("uintptr_t", out[0])))

    @staticmethod
    def joinGrow(nranks: int, commId: Optional[UniqueId], rank: int,
                 blocking: Optional[bool] = None) -> "NcclCommunicator":
        """ncclCommGrow for a joining rank: no communicator yet, the id from
        ncclCommGetUniqueId, and its rank in the new communicator (the
        members keep 0 .. n-1, joining ranks take n and up)."""
        out = _ffi.new("ncclComm_t *")
        cfg = _ffi.NULL if blocking is None else _lib.new_config(blocking=blocking)
        uid = _ffi.NULL if commId is None else _uid_struct(commId)
        check(_lib.lib().ncclCommGrow(_ffi.NULL, int(nranks), uid, int(rank), out, cfg),
              "ncclCommGrow")
        return NcclCommunicator.from_handle(int(_ffi.cast("uintptr_t", out[0])))

    # -- reduction operators -------------------------------------------------
    def createPreMulSum(self, scalar: bytes, datatype: int) -> int:
        """ncclRedOpCreatePreMulSum with a host scalar given as the raw bytes
        of one element of `datatype` (buffers.scalar_bytes makes them)."""
        op = _ffi.new("ncclRedOp_t *")
        buf = _ffi.new("char[]", bytes(scalar))
        check(_lib.lib().ncclRedOpCreatePreMulSum(op, buf, int(datatype), 1, self._comm),
              "ncclRedOpCreatePreMulSum")
        return int(op[0])

    def destroyRedOp(self, op: int) -> None:
        check(_lib.lib().ncclRedOpDestroy(int(op), self._comm), "ncclRedOpDestroy")

    # -- collectives (CuPy's argument order) ---------------------------------
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int = 0) -> None:
        check(_lib.lib().ncclAllReduce(_void(sendbuf), _void(recvbuf), count, datatype, op,
                                       self._comm, _stream(stream)), "ncclAllReduce")

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int = 0) -> None:
        check(_lib.lib().ncclReduce(_void(sendbuf), _void(recvbuf), count, datatype, op, root,
                                    self._comm, _stream(stream)), "ncclReduce")

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int = 0) -> None:
        check(_lib.lib().ncclBroadcast(_void(sendbuff), _void(recvbuff), count, datatype,
                                       root, self._comm, _stream(stream)), "ncclBroadcast")

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int = 0) -> None:
        check(_lib.lib().ncclBcast(_void(buff), count, datatype, root, self._comm,
                                   _stream(stream)), "ncclBcast")

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                      op: int, stream: int = 0) -> None:
        check(_lib.lib().ncclReduceScatter(_void(sendbuf), _void(recvbuf), recvcount, datatype,
                                           op, self._comm, _stream(stream)),
              "ncclReduceScatter")

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int = 0) -> None:
        check(_lib.lib().ncclAllGather(_void(sendbuf), _void(recvbuf), count, datatype,
                                       self._comm, _stream(stream)), "ncclAllGather")

    def alltoall(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                 stream: int = 0) -> None:
        """ncclAlltoAll: `count` elements to and from each rank."""
        check(_lib.lib().ncclAlltoAll(_void(sendbuf), _void(recvbuf), count, datatype,
                                      self._comm, _stream(stream)), "ncclAlltoAll")

    def gather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
               stream: int = 0) -> None:
        check(_lib.lib().ncclGather(_void(sendbuf), _void(recvbuf), count, datatype, root,
                                    self._comm, _stream(stream)), "ncclGather")

    def scatter(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
                stream: int = 0) -> None:
        check(_lib.lib().ncclScatter(_void(sendbuf), _void(recvbuf), count, datatype, root,
                                     self._comm, _stream(stream)), "ncclScatter")

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int = 0) -> None:
        check(_lib.lib().ncclSend(_void(sendbuf), count, datatype, peer, self._comm,
                                  _stream(stream)), "ncclSend")

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int = 0) -> None:
        check(_lib.lib().ncclRecv(_void(recvbuf), count, datatype, peer, self._comm,
                                  _stream(stream)), "ncclRecv")

