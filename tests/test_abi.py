"""libhetccl.so exports every symbol of libnccl.so.2 2.32.3 and nothing else.

A program that calls a symbol we lack would resolve it in the real library
and hand it a hetccl handle, so the list must be complete; and an internal
symbol that leaks could be interposed by the application, so nothing else
may be exported.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Set

import pytest

from libpath import SHARED_DIR, find_library

SYMBOL_LIST = SHARED_DIR / "abi" / "nccl-2.32.3-symbols.txt"
ALLOWED = re.compile(r"^(p?nccl|hetccl)[A-Z]")


def _reference_symbols() -> Set[str]:
    lines = SYMBOL_LIST.read_text().splitlines()
    return {s.strip() for s in lines if s.strip() and not s.startswith("#")}


def _exported(lib: Path) -> Set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            names.add(fields[2].split("@")[0])  # drop any symbol version
    return names


@pytest.fixture(scope="module")
def exported() -> Set[str]:
    lib = find_library()
    if lib is None:
        pytest.skip("libhetccl.so not built (set HETCCL_LIBRARY or build into build*/)")
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    return _exported(lib)


def test_every_nccl_symbol_is_exported(exported: Set[str]) -> None:
    if not SYMBOL_LIST.is_file():
        pytest.skip(f"reference list {SYMBOL_LIST} absent (no ../shared checkout)")
    missing = sorted(_reference_symbols() - exported)
    assert not missing, f"{len(missing)} NCCL symbols not exported: {missing}"


def test_nothing_else_is_exported(exported: Set[str]) -> None:
    leaked = sorted(s for s in exported if not ALLOWED.match(s))
    assert not leaked, f"symbols outside nccl*/pnccl*/hetccl*: {leaked}"
