"""The one exception type of the package: a failed ncclResult_t.

The message is the library's own (ncclGetLastError of the calling thread,
which the C side sets for every failure it reports), so Python adds no
wording of its own beyond the function name.
"""

from __future__ import annotations

from typing import Any

from . import _lib


def result_name(result: int) -> str:
    """"ncclInvalidArgument" for 4; the number for codes the header lacks."""
    if 0 <= result < 9:
        return str(_lib.ffi.string(_lib.ffi.cast("ncclResult_t", result)))
    return f"ncclResult({result})"


class NcclError(RuntimeError):
    """A library call returned a result other than ncclSuccess.

    Attributes: `result` (the ncclResult_t value), `name` (its enum name),
    `message` (ncclGetLastError at the time of the failure, may be empty),
    `function` (the C function that failed)."""

    def __init__(self, result: int, message: str = "", function: str = "") -> None:
        self.result = int(result)
        self.name = result_name(self.result)
        self.message = message
        self.function = function
        where = f"{function}: " if function else ""
        text = f"{where}{self.name}"
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self) -> Any:  # picklable across the launcher's processes
        return (NcclError, (self.result, self.message, self.function))


def last_error() -> str:
    """The calling thread's last error text (ncclGetLastError(NULL))."""
    text = _lib.lib().ncclGetLastError(_lib.ffi.NULL)
    return _lib.ffi.string(text).decode(errors="replace") if text != _lib.ffi.NULL else ""


def check(result: int, function: str = "") -> None:
    """Raise NcclError unless `result` is ncclSuccess.

    ncclInProgress is an error here too: callers of nonblocking
    communicators poll ncclCommGetAsyncError themselves."""
    if result != 0:
        raise NcclError(int(result), last_error(), function)
