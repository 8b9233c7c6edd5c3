#!/usr/bin/env python3
"""The include structure of libhetccl/: the folder graph and its cycles.

Every `#include "path"` in libhetccl/**/*.{c,h} that names a file of
libhetccl/ (paths are written from libhetccl/, as the build's include
directories make them) is an arrow from the including file to the
included one. Two views:

  folders  a folder is a directory under libhetccl/ (transport/ib is not
           transport); an arrow A -> B counts the include lines in A's
           files that name a header of B. The graph must be acyclic: a
           folder is a layer, and layers point down.
  modules  inside one folder, x.c, x.h and x_impl.h are one module x (a
           header, its implementation and the private header its files
           share are one job); an arrow x -> y is a file of x including
           one of y. A cycle among the modules of one folder is an
           include circle: none may exist.

Prints the folder graph (arrows with their counts, each folder's files),
then every cycle it finds: the strongly connected components of each
graph, each with one concrete circle through it. Exits 1 when there is a
cycle, 0 otherwise; --json prints the same as one JSON object.

    python3 tools/deps.py [--root DIR] [--json] [--files]

--root: the tree to read (default: this script's repository), e.g. a
`git worktree` of an older commit.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ROOT_FOLDER = "."  # files directly in libhetccl/ (entries.h, exports.map)


def read_includes(lib: Path) -> Dict[str, List[str]]:
    """Each source file of lib (relative path) -> the lib files it includes."""
    files = sorted(p for p in lib.rglob("*") if p.suffix in (".c", ".h") and p.is_file())
    known = {p.relative_to(lib).as_posix() for p in files}
    out: Dict[str, List[str]] = {}
    for p in files:
        rel = p.relative_to(lib).as_posix()
        text = p.read_text(encoding="utf-8", errors="replace")
        # A path written from the file's own directory also resolves (C's
        # "" search starts there); the tree writes them from libhetccl/.
        targets = []
        for name in INCLUDE.findall(text):
            here = (Path(rel).parent / name).as_posix()
            if name in known:
                targets.append(name)
            elif here in known:
                targets.append(here)
        out[rel] = targets
    return out


def folder_of(rel: str) -> str:
    parent = Path(rel).parent.as_posix()
    return ROOT_FOLDER if parent in ("", ".") else parent


def module_of(rel: str) -> str:
    """x.c, x.h and x_impl.h (x's private header, shared by x's files) are
    module x."""
    stem = str(Path(rel).with_suffix(""))
    return stem[: -len("_impl")] if stem.endswith("_impl") else stem


def sccs(nodes: Iterable[str], edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[List[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work: List[Tuple[str, Iterable[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def one_circle(comp: List[str], edges: Dict[str, Set[str]]) -> List[str]:
    """A shortest circle through the component's first node (breadth first)."""
    members = set(comp)
    start = comp[0]
    prev: Dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(edges.get(node, ())):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    prev[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return comp + [start]


def analyse(lib: Path) -> dict:
    includes = read_includes(lib)
    folder_edges: Dict[Tuple[str, str], int] = defaultdict(int)
    folder_files: Dict[str, int] = defaultdict(int)
    module_edges: Dict[str, Set[str]] = defaultdict(set)
    for src, targets in includes.items():
        folder_files[folder_of(src)] += 1
        for dst in targets:
            a, b = folder_of(src), folder_of(dst)
            if a != b:
                folder_edges[(a, b)] += 1
            elif module_of(src) != module_of(dst):
                module_edges[module_of(src)].add(module_of(dst))
    fgraph: Dict[str, Set[str]] = defaultdict(set)
    for a, b in folder_edges:
        fgraph[a].add(b)
    folder_cycles = [{"members": c, "circle": one_circle(c, fgraph)}
                     for c in sccs(folder_files, fgraph)]
    modules = {module_of(f) for f in includes}
    module_cycles = []
    for comp in sccs(modules, module_edges):
        module_cycles.append({"folder": folder_of(comp[0] + ".c"), "members": comp,
                              "circle": one_circle(comp, module_edges)})
    return {
        "folders": {f: folder_files[f] for f in sorted(folder_files)},
        "arrows": [{"from": a, "to": b, "includes": n}
                   for (a, b), n in sorted(folder_edges.items())],
        "folder_cycles": folder_cycles,
        "module_cycles": module_cycles,
    }


def print_text(result: dict) -> None:
    print("folder graph of libhetccl/ (an arrow counts include lines; folder: files)")
    arrows: Dict[str, List[Tuple[str, int]]] = defaultdict(list)
    for a in result["arrows"]:
        arrows[a["from"]].append((a["to"], a["includes"]))
    for folder, nfiles in result["folders"].items():
        outs = ", ".join(f"{to} {n}" for to, n in arrows.get(folder, []))
        print(f"  {folder + ':':<20} {nfiles:>3} files  -> {outs or '(nothing of ours)'}")
    total = sum(a["includes"] for a in result["arrows"])
    print(f"  {len(result['arrows'])} arrows between {len(result['folders'])} folders, "
          f"{total} include lines")
    if not result["folder_cycles"]:
        print("folder cycles: none")
    for c in result["folder_cycles"]:
        print(f"folder cycle of {len(c['members'])}: {' -> '.join(c['circle'])}")
    if not result["module_cycles"]:
        print("include cycles inside a folder: none")
    for c in result["module_cycles"]:
        print(f"include cycle in {c['folder']}/ of {len(c['members'])} modules: "
              f"{', '.join(Path(m).name for m in c['members'])}")
        print(f"  e.g. {' -> '.join(Path(m).name for m in c['circle'])}")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="repository root to read (default: this one)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    lib = args.root / "libhetccl"
    if not lib.is_dir():
        print(f"deps.py: {lib} is not a directory", file=sys.stderr)
        return 2
    result = analyse(lib)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_text(result)
    return 1 if result["folder_cycles"] or result["module_cycles"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
