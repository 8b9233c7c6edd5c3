"""Where the built libhetccl.so is, for tests that load or inspect it.

Order: $HETCCL_LIBRARY; the installed Python package's hetccl/libhetccl.so;
the newest build*/libhetccl/libhetccl.so in the repository.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"


def _from_package() -> Optional[Path]:
    try:
        spec = importlib.util.find_spec("hetccl")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        candidate = Path(location) / "libhetccl.so"
        if candidate.is_file():
            return candidate
    return None


def _from_build_dirs() -> Optional[Path]:
    found = [p for p in REPO_ROOT.glob("build*/libhetccl/libhetccl.so") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_library() -> Optional[Path]:
    """Path of libhetccl.so, or None when it has not been built."""
    env = os.environ.get("HETCCL_LIBRARY")
    if env:
        return Path(env) if Path(env).is_file() else None
    return _from_package() or _from_build_dirs()
