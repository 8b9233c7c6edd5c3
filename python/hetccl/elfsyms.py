"""The names an ELF shared library exports (its defined .dynsym entries),
read with the standard library only, for `hetccl info`."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import List

SHT_DYNSYM = 11
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK = 1, 2

NCCL_API = re.compile(r"^p?nccl[A-Z]")


def exported_symbols(path: Path) -> List[str]:
    """Defined global/weak symbols of the dynamic symbol table, sorted."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        sh_fmt, sym_fmt = end + "IIQQQQIIQQ", end + "IBBHQQ"
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        sh_fmt, sym_fmt = end + "IIIIIIIIII", end + "IIIBBH"
    sections = [struct.unpack_from(sh_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    names: List[str] = []
    for sec in sections:
        if sec[1] != SHT_DYNSYM:
            continue
        offset, size, link, entsize = sec[4], sec[5], sec[6], sec[9]
        str_off = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):  # entry 0 is null
            fields = struct.unpack_from(sym_fmt, data, pos)
            if is64:
                st_name, st_info, st_shndx = fields[0], fields[1], fields[3]
            else:
                st_name, st_info, st_shndx = fields[0], fields[3], fields[5]
            if st_shndx == SHN_UNDEF or (st_info >> 4) not in (STB_GLOBAL, STB_WEAK):
                continue
            stop = data.index(b"\0", str_off + st_name)
            names.append(data[str_off + st_name:stop].decode())
    return sorted(set(names))


def nccl_api_symbols(path: Path) -> List[str]:
    """The exported nccl* / pnccl* entry points."""
    return [s for s in exported_symbols(path) if NCCL_API.match(s)]
