"""The source tree keeps its layers (tools/deps.py, docs/architecture.md).

- The folder graph of libhetccl/ (include arrows between folders) has no
  cycle, and no folder has an include circle among its modules: deps.py
  exits 0 and says so.
- What the layering promises in words holds in the includes: the
  communicator's folder (comm/) includes nothing of the folders that run
  operations above it, nothing outside transport/ib/ includes ib's private
  header, and the entry points ask a communicator's backend table, never
  its vendor fields.
- deps.py itself finds a cycle where there is one (a tree made for it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from libpath import REPO_ROOT

DEPS = REPO_ROOT / "tools" / "deps.py"
LIB = REPO_ROOT / "libhetccl"


def deps(*args: str, root: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPS), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_include_graph_has_no_cycle() -> None:
    proc = deps()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "folder cycles: none" in proc.stdout, proc.stdout
    assert "include cycles inside a folder: none" in proc.stdout, proc.stdout
    graph = json.loads(deps("--json").stdout)
    assert not graph["folder_cycles"] and not graph["module_cycles"], graph
    assert "core" not in graph["folders"], "libhetccl/core/ was split by job (docs/architecture.md)"


def test_layers_point_down() -> None:
    graph = json.loads(deps("--json").stdout)
    arrows = {(a["from"], a["to"]) for a in graph["arrows"]}
    above_comm = {"exec", "hier", "backend", "entry", "api"}
    assert not {(f, t) for f, t in arrows if f == "comm" and t in above_comm}, arrows
    assert not {(f, t) for f, t in arrows if f == "exec" and t in {"hier", "backend", "entry"}}
    assert not {(f, t) for f, t in arrows if f == "hier" and t in {"backend", "entry"}}
    for src in LIB.rglob("*.[ch]"):
        rel = src.relative_to(LIB).as_posix()
        text = src.read_text(encoding="utf-8", errors="replace")
        if not rel.startswith("transport/ib/"):
            assert '#include "transport/ib/' not in text, rel
        if rel.startswith("entry/"):
            assert not re.search(r"\bcomm->forward\b", text), rel


def test_deps_finds_a_cycle(tmp_path: Path) -> None:
    lib = tmp_path / "libhetccl"
    (lib / "a").mkdir(parents=True)
    (lib / "b").mkdir()
    (lib / "a" / "x.h").write_text('#include "b/y.h"\n')
    (lib / "b" / "y.h").write_text("/* y */\n")
    (lib / "b" / "y.c").write_text('#include "b/y.h"\n#include "a/x.h"\n')
    (lib / "b" / "z.h").write_text('#include "b/w.h"\n')
    (lib / "b" / "w.c").write_text('#include "b/z.h"\n')
    (lib / "b" / "w_impl.h").write_text('#include "b/w.h"\n')  # w's own: no circle
    (lib / "b" / "w.h").write_text("/* w */\n")
    proc = deps(root=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "folder cycle of 2: a -> b -> a" in proc.stdout, proc.stdout
    assert "include cycle in b/ of 2 modules: w, z" in proc.stdout, proc.stdout
    graph = json.loads(deps("--json", root=tmp_path).stdout)
    assert {(a["from"], a["to"], a["includes"]) for a in graph["arrows"]} == \
        {("a", "b", 1), ("b", "a", 1)}
