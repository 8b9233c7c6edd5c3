"""hetccl: the NCCL API for clusters that mix GPU vendors and CPU ranks.

A thin cffi (ABI mode) layer over libhetccl.so, the library that also
replaces libnccl.so.2 under LD_PRELOAD:

- `hetccl.nccl`: a cupy.cuda.nccl-style API (NcclCommunicator, constants);
- `hetccl.arrays`: a Communicator whose collectives take numpy / CuPy /
  torch / DLPack arrays (dtype, count and stream read from them);
- `hetccl.buffers`: numpy / CuPy / torch arrays as (ptr, count, dtype);
- `hetccl.dtypes`: element types and their NCCL data types, one table for
  numpy, ml_dtypes and torch (by name: torch is not imported);
- `hetccl.discovery`: rank and unique id from torchrun, mpirun, srun or
  `hetccl run` (`init_from_env()`);
- `hetccl.launcher`: N local ranks of a function or of a command;
- the `hetccl` command (`hetccl info`, `hetccl run -n N -- CMD`,
  `hetccl run --launcher mpirun|srun|torchrun`, `hetccl perf`, `hetccl plot`,
  `hetccl demo`).
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
from .arrays import Communicator
from .discovery import LaunchEnvError, RankInfo, discover, init_from_env

__all__ = [
    "Buffer", "Communicator", "LaunchEnvError", "LaunchError", "NcclCommunicator", "NcclError",
    "RankInfo", "__version__", "as_buffer", "communicator", "discover", "get_build_version",
    "get_unique_id", "get_version", "groupEnd", "groupStart", "init_from_env", "launch",
    "launch_info", "nccl_dtype",
]
