"""The binding: cffi in ABI mode over libhetccl.so.

ABI mode means `ffi.dlopen` of the built library plus declarations (no C
compiler at install or import time). The object loaded here is the very
same libhetccl.so that `LD_PRELOAD` (and `hetccl run`) puts in front of
libnccl.so.2, so the Python API and an unmodified NCCL program in the same
process talk to one library.

The declarations are read from the headers themselves at import
(hetccl._cdef): hetccl/include/ of the installed package, include/ of a
source checkout.
Every function of nccl.h and hetccl.h is declared (the profiler aliases
pnccl* aside), and the constants the package needs (the config magic and
version, NCCL_CONFIG_UNDEF_INT) are the headers' macros, so the binding
cannot drift from the headers (tests/test_cdef.py checks it against
a C compiler's view of them).

Where the library is: $HETCCL_LIBRARY, else libhetccl.so inside this package
directory (where the wheel installs it), else, for a source checkout that was
never installed, the newest build*/libhetccl/libhetccl.so of the repository.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

import cffi

from . import _cdef

_PACKAGE_DIR = Path(__file__).resolve().parent


def include_dir() -> Path:
    """Where nccl.h and hetccl.h are: the package's include/ (installed),
    else the source checkout's."""
    inside = _PACKAGE_DIR / "include"
    return inside if (inside / "hetccl.h").is_file() else _PACKAGE_DIR.parent.parent / "include"


def _declarations() -> _cdef.Declarations:
    header = include_dir() / "hetccl.h"
    if not header.is_file():
        raise ImportError(f"hetccl: hetccl.h not found in {_PACKAGE_DIR / 'include'} (where the "
                          f"wheel installs it) nor in {header.parent} (a source checkout): the "
                          "package reads its C declarations from the headers")
    return _cdef.read(header)


DECLARATIONS = _declarations()
CONSTANTS = DECLARATIONS.constants
CONFIG_MAGIC = CONSTANTS["NCCL_API_MAGIC"]
CONFIG_VERSION = CONSTANTS["NCCL_VERSION_CODE"]  # the layout of the header's ncclConfig_t
CONFIG_UNDEF_INT = CONSTANTS["NCCL_CONFIG_UNDEF_INT"]
BUILD_VERSION = CONSTANTS["NCCL_VERSION_CODE"]  # the NCCL API version these declarations describe

ffi = cffi.FFI()
ffi.cdef(DECLARATIONS.cdef)

_lock = threading.Lock()
_lib: Optional[Any] = None
_path: Optional[Path] = None


def _from_source_checkout() -> Optional[Path]:
    """python/hetccl of a repository whose library was built with meson."""
    repo = _PACKAGE_DIR.parent.parent
    if not (repo / "meson.build").is_file():
        return None
    found = [p for p in repo.glob("build*/libhetccl/libhetccl.so") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def library_path() -> Path:
    """Where libhetccl.so is (it need not be loaded yet)."""
    env = os.environ.get("HETCCL_LIBRARY")
    if env:
        return Path(env).resolve()
    inside = _PACKAGE_DIR / "libhetccl.so"
    if inside.is_file():
        return inside
    built = _from_source_checkout()
    if built is not None:
        return built.resolve()
    raise OSError(f"libhetccl.so not found: not in {_PACKAGE_DIR} and HETCCL_LIBRARY is unset")


def lib() -> Any:
    """The loaded library (loaded on first use, so that a process can set
    HETCCL_* variables before the library reads them)."""
    global _lib, _path
    if _lib is None:
        with _lock:
            if _lib is None:
                path = library_path()
                _lib = ffi.dlopen(str(path))
                _path = path
    return _lib


def loaded_path() -> Path:
    lib()
    assert _path is not None
    return _path


def new_config(blocking: Optional[bool] = None) -> Any:
    """An ncclConfig_t as NCCL_CONFIG_INITIALIZER makes it (every int field
    NCCL_CONFIG_UNDEF_INT, pointers NULL), optionally with `blocking` set."""
    cfg = ffi.new("ncclConfig_t *")
    cfg.size = ffi.sizeof("ncclConfig_t")
    cfg.magic = CONFIG_MAGIC
    cfg.version = CONFIG_VERSION
    for field, ctype in ffi.typeof("ncclConfig_t").fields:
        if ctype.type.cname == "int":
            setattr(cfg, field, CONFIG_UNDEF_INT)
    if blocking is not None:
        cfg.blocking = int(blocking)
    return cfg
