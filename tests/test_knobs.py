"""ENUM knobs (libhetccl/util/knobs.h): a value outside the row's word list
fails comm init with ncclInvalidArgument and a message naming the variable,
the value and the allowed words; a listed word, in the case the row allows,
works.

The knobs and their words are read from knobs.h, so a knob that becomes an
ENUM is tested without touching this file. Ranks are real processes
(hetccl.launch): the library reads its knobs once per process.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from hetccl.errors import NcclError

from libpath import REPO_ROOT

pytestmark = pytest.mark.usefixtures("hetccl_library")

TIMEOUT = 120
KNOBS_H = REPO_ROOT / "libhetccl" / "util" / "knobs.h"

# (variable, words, case ignored): a row names its word list, ENUM(LIST), and
# the list is HETCCL_KNOB_WORDS_LIST(F, W): F(LIST, first) W(LIST, next)...
ENUM_ROW = re.compile(r'^\s*X\(\w+,\s*"(\w+)",\s*ENUM(_NOCASE)?\((\w+)\)', re.M)
WORD_LIST = re.compile(r'^#define HETCCL_KNOB_WORDS_(\w+)\(F, W\)((?:.*\\\n)*.*)$', re.M)
WORD = re.compile(r'\b[FW]\(\w+, (\w+)\)')


def enum_knobs() -> List[Tuple[str, List[str], bool]]:
    text = KNOBS_H.read_text()
    lists = {m.group(1): WORD.findall(m.group(2)) for m in WORD_LIST.finditer(text)}
    return [(m.group(1), lists[m.group(3)], bool(m.group(2))) for m in ENUM_ROW.finditer(text)]


def test_the_table_has_the_enum_knobs() -> None:
    found = {name: words for name, words, _ in enum_knobs()}
    assert found["HETCCL_TRANSPORT"] == ["auto", "shm", "socket", "ib"]
    assert found["HETCCL_ALGO"] == ["auto", "ring", "rd", "direct", "pull", "rhd", "wavefront"]
    assert found["HETCCL_DEVICE"] == ["auto", "host", "cuda", "hip"]
    assert {"NCCL_SOCKET_FAMILY", "NCCL_DEBUG", "HETCCL_DEBUG"} <= set(found)


def rank_init() -> Dict[str, str]:
    """Create the launcher's communicator and run one allreduce on it."""
    try:
        comm = hetccl.communicator()
    except NcclError as e:
        return {"kind": "error", "name": e.name, "message": e.message}
    n = comm.size()
    x = np.full(5, comm.rank_id() + 1, dtype=np.float32)
    comm.allReduce(x.ctypes.data, x.ctypes.data, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    comm.destroy()
    return {"kind": "ok", "sum": str(float(x[0])), "want": str(n * (n + 1) / 2)}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("var,words,nocase", enum_knobs(), ids=lambda v: str(v))
def test_bogus_value_fails_init(var: str, words: List[str], nocase: bool) -> None:
    # A case change that the row does not allow is as bad as any other word.
    bogus = ["bogus"] if nocase else ["bogus", words[1].swapcase()]
    for value in bogus:
        got = hetccl.launch(rank_init, 1, env={var: value, "NCCL_DEBUG_FILE": "/dev/null"},
                            timeout=TIMEOUT - 10)[0]
        assert got["kind"] == "error", (var, value, got)
        assert got["name"] == "ncclInvalidArgument", got
        assert f"{var}={value}" in got["message"], got
        assert "|".join(words) in got["message"], got


# A valid word for each knob that leaves a host job runnable here.
VALID = {"HETCCL_TRANSPORT": "socket", "HETCCL_ALGO": "rd", "HETCCL_DEVICE": "host",
         "NCCL_SOCKET_FAMILY": "AF_INET", "NCCL_DEBUG": "VERSION", "HETCCL_DEBUG": "version"}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("var,words,nocase", enum_knobs(), ids=lambda v: str(v))
def test_valid_value_works(var: str, words: List[str], nocase: bool) -> None:
    value = VALID.get(var, words[0])
    if nocase:
        value = value.swapcase()  # any case is the same word
    got = hetccl.launch(rank_init, 2, env={var: value, "NCCL_DEBUG_FILE": "/dev/null"},
                        timeout=TIMEOUT - 10)
    for rank, out in enumerate(got):
        assert out["kind"] == "ok", (var, value, rank, out)
        assert out["sum"] == out["want"], (var, value, rank, out)

