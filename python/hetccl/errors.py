"""The one exception type of the package: a failed ncclResult_t.

The message is the library's own (ncclGetLastError of the calling thread,
which the C side sets for every failure it reports, naming the function
that failed), so Python adds no wording of its own: the function is named
once, by the library's text where it names it, else in front of it.
"""

from __future__ import annotations

from typing import Any

from . import _lib

IN_PROGRESS = 7  # ncclInProgress


def result_name(result: int) -> str:
    """"ncclInvalidArgument" for 4; the number for codes the header lacks."""
    if 0 <= result < 9:
        return str(_lib.ffi.string(_lib.ffi.cast("ncclResult_t", result)))
    return f"ncclResult({result})"


def _text(result_text: str, message: str, function: str) -> str:
    """"ncclAllReduce: ncclInvalidArgument: invalid datatype 99" from the
    library's "ncclAllReduce: invalid datatype 99"."""
    cause = message
    if function and message.startswith(function + ": "):
        cause = message[len(function) + 2:]
    text = f"{function}: {result_text}" if function else result_text
    return f"{text}: {cause}" if cause else text


class NcclError(RuntimeError):
    """A library call returned a result other than ncclSuccess.

    Attributes: `result` and `status` (the ncclResult_t value; `status` is
    CuPy's name for it), `name` (its enum name), `message`
    (ncclGetLastError at the time of the failure, may be empty), `function`
    (the C function that failed)."""

    def __init__(self, result: int, message: str = "", function: str = "") -> None:
        self.result = int(result)
        self.name = result_name(self.result)
        self.message = message
        self.function = function
        super().__init__(_text(self.name, message, function))

    @property
    def status(self) -> int:
        """The ncclResult_t, as cupy.cuda.nccl.NcclError.status."""
        return self.result

    def __reduce__(self) -> Any:  # picklable across the launcher's processes
        return (NcclError, (self.result, self.message, self.function))


def last_error(comm: Any = None) -> str:
    """The last error text: the calling thread's (ncclGetLastError(NULL)),
    or that of `comm` (an ncclComm_t) when given."""
    handle = _lib.ffi.NULL if comm is None else comm
    text = _lib.lib().ncclGetLastError(handle)
    return _lib.ffi.string(text).decode(errors="replace") if text != _lib.ffi.NULL else ""


def check(result: int, function: str = "") -> None:
    """Raise NcclError unless `result` is ncclSuccess.

    ncclInProgress is an error here too: the communicator (nccl.py) accepts
    it from the calls of a nonblocking communicator, where it is the
    answer, and nowhere else."""
    if result != 0:
        raise NcclError(int(result), last_error(), function)
