"""hetccl: the NCCL API for clusters that mix GPU vendors and CPU ranks.

A thin cffi (ABI mode) layer over libhetccl.so, the library that also
replaces libnccl.so.2 under LD_PRELOAD:

- `hetccl.nccl`: a cupy.cuda.nccl-style API (NcclCommunicator, constants);
- `hetccl.buffers`: numpy / CuPy / torch arrays as (ptr, count, dtype);
- `hetccl.launcher`: N local ranks of a function or of a command;
- the `hetccl` command (`hetccl info`, `hetccl run -n N -- CMD`, `hetccl demo`).
"""

__version__ = "0.1.0"

from .errors import NcclError  # noqa: E402 (after __version__, which cli reads)
from .launcher import LaunchError, communicator, launch, launch_info
from .nccl import (
    NcclCommunicator,
    get_build_version,
    get_unique_id,
    get_version,
    groupEnd,
    groupStart,
)
from .buffers import Buffer, as_buffer, nccl_dtype

__all__ = [
    "Buffer", "LaunchError", "NcclCommunicator", "NcclError", "__version__", "as_buffer",
    "communicator", "get_build_version", "get_unique_id", "get_version", "groupEnd",
    "groupStart", "launch", "launch_info", "nccl_dtype",
]
