"""README.md stays short and its examples keep working.

- Every ```python block runs as a script of its own in a fresh interpreter,
  as a newcomer would run it (the package from python/, the library the
  suite uses, ranks started the default way), and must exit 0. A block
  whose first line says `hetccl run -n N -- python NAME.py` runs so, as
  NAME.py; a block that imports torch is skipped where torch does not
  import.
- The ```c block compiles against include/nccl.h and runs on two ranks
  under `hetccl run`.
- README.md's lines, status-table cells and words stay under the bounds
  below, so that it cannot regrow silently.
- docs/README.md and README.md index every page of docs/; every docs/*.md
  path and relative link that README.md and the pages write, and every
  #anchor of such a link, exists; no file of the tree names a page that
  was merged into another.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from libpath import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"

MAX_LINE = 160      # characters on any line of README.md
MAX_CELL = 150      # characters in one cell of a README table
MAX_WORDS = 1000    # README.md, split on whitespace, code included
BLOCK_TIMEOUT_S = 240

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
NEEDS_TORCH = re.compile(r"^\s*(import|from)\s+torch\b", re.M)
RUN_LINE = re.compile(r"hetccl run -n (\d+) -- python (\w+\.py)")


def blocks(lang: str) -> List[Tuple[int, str]]:
    """(line number, text) of each ```lang block of README.md."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == lang]


def child_env(library: Path) -> Dict[str, str]:
    """A newcomer's environment: this library, the package from python/,
    ranks started the default way (the suite's own forkserver choice left
    out)."""
    env = dict(os.environ)
    env.pop("HETCCL_LAUNCH_START", None)
    env["HETCCL_LIBRARY"] = str(library)
    env["PYTHONPATH"] = str(REPO_ROOT / "python")
    return env


@lru_cache(maxsize=None)
def torch_imports() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                          timeout=BLOCK_TIMEOUT_S).returncode == 0


def _block_id(block: Tuple[int, str]) -> str:
    return f"line{block[0]}"


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 30)
@pytest.mark.parametrize("block", blocks("python"), ids=_block_id)
def test_python_example_runs(block: Tuple[int, str], hetccl_library: Path,
                             tmp_path: Path) -> None:
    line, code = block
    if NEEDS_TORCH.search(code) and not torch_imports():
        pytest.skip(f"README.md line {line}: needs torch, which does not import here")
    run = RUN_LINE.search(code.split("\n", 1)[0])
    script = tmp_path / (run.group(2) if run else f"readme_line{line}.py")
    script.write_text(code, encoding="utf-8")
    cmd = [sys.executable, str(script)]
    if run:
        cmd = [sys.executable, "-m", "hetccl", "run", "-n", run.group(1), "--timeout",
               str(BLOCK_TIMEOUT_S - 10), "--"] + cmd
    proc = subprocess.run(cmd, cwd=tmp_path,
                          env=child_env(hetccl_library), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    print(f"\n[README.md line {line}] {' '.join(cmd[1:])}: exit {proc.returncode}\n"
          f"{proc.stdout[-2000:]}")
    assert proc.returncode == 0, \
        f"README.md line {line} exited {proc.returncode}:\n{proc.stderr[-4000:]}"


def test_readme_has_examples() -> None:
    python = blocks("python")
    assert len(python) >= 3 and len(blocks("c")) == 1
    assert any(RUN_LINE.search(code.split("\n", 1)[0]) for _, code in python)


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 30)
def test_c_example_builds_and_runs(hetccl_library: Path, tmp_path: Path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    [(line, code)] = blocks("c")
    src, exe = tmp_path / "allreduce.c", tmp_path / "allreduce"
    src.write_text(code, encoding="utf-8")
    subprocess.run([cc, "-Wall", "-Werror", "-I", str(REPO_ROOT / "include"), str(src), "-o",
                    str(exe), "-L", str(hetccl_library.parent), "-lhetccl"],
                   check=True, timeout=120)
    proc = subprocess.run([sys.executable, "-m", "hetccl", "run", "-n", "2", "--timeout", "120",
                           "--", str(exe)], cwd=tmp_path, env=child_env(hetccl_library),
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert proc.returncode == 0, f"README.md line {line}: {proc.stdout}{proc.stderr[-4000:]}"
    for rank in (0, 1):
        assert f"rank {rank}: 2 4 6 8" in proc.stdout, proc.stdout


# -- size --------------------------------------------------------------------------------

def test_readme_lines_are_short() -> None:
    long = [(n, len(l)) for n, l in enumerate(README.read_text().splitlines(), 1)
            if len(l) > MAX_LINE]
    assert not long, f"README.md lines over {MAX_LINE} characters (line, length): {long}"


def test_readme_table_cells_are_short() -> None:
    long = [(n, len(c.strip()), c.strip()[:40])
            for n, l in enumerate(README.read_text().splitlines(), 1) if l.startswith("|")
            for c in l.strip().strip("|").split(" | ") if len(c.strip()) > MAX_CELL]
    assert not long, f"README.md table cells over {MAX_CELL} characters: {long}"


def test_readme_word_count() -> None:
    words = len(README.read_text().split())
    print(f"\n[README.md] {words} words (bound {MAX_WORDS})")
    assert words <= MAX_WORDS, \
        f"README.md has {words} words, over {MAX_WORDS}: move detail to docs/"


# -- the docs' index and links ------------------------------------------------------------

def doc_pages() -> List[str]:
    return sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")


def test_every_page_is_indexed() -> None:
    index, readme = (DOCS / "README.md").read_text(), README.read_text()
    missing = [p for p in doc_pages() if f"]({p})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"
    missing = [p for p in doc_pages() if f"](docs/{p})" not in readme]
    assert not missing, f"README.md does not link {missing}"


RETIRED = ("launcher.md", "launchers.md", "dataplane-measured.md")  # now launching.md, measurements.md
TEXT_SUFFIXES = {".md", ".py", ".c", ".h", ".sh", ".txt", ".build", ".toml"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".peers"}


def tree_texts() -> Iterator[Path]:
    for top in ("README.md", ".ci", "docs", "include", "libhetccl", "python", "tests", "tools"):
        root = REPO_ROOT / top
        paths = [root] if root.is_file() else root.rglob("*")
        for p in paths:
            if (p.is_file() and (p.suffix in TEXT_SUFFIXES or p.parent.name == ".ci")
                    and not SKIP_DIRS.intersection(p.relative_to(REPO_ROOT).parts)
                    and p != Path(__file__)):
                yield p


def test_no_reference_to_a_retired_page() -> None:
    """Pages merged or folded into others leave no reference behind."""
    wrong = [f"{path.relative_to(REPO_ROOT)}: docs/{m.group(1)}"
             for path in tree_texts()
             for m in re.finditer(r"\bdocs/([\w.-]+\.md)\b",
                                  path.read_text(encoding="utf-8", errors="replace"))
             if m.group(1) in RETIRED]
    assert not wrong, "references to retired pages:\n" + "\n".join(sorted(set(wrong)))


def test_docs_paths_in_the_docs_exist() -> None:
    """Every docs/NAME.md that README.md and the pages mention is there."""
    wrong = [f"{page.name}: docs/{m.group(1)}"
             for page in [README, *sorted(DOCS.glob("*.md"))]
             for m in re.finditer(r"\bdocs/([\w.-]+\.md)\b", page.read_text())
             if not (DOCS / m.group(1)).is_file()]
    assert not wrong, "references to missing pages:\n" + "\n".join(sorted(set(wrong)))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", page.read_text(), re.M)}


def test_relative_links_and_anchors_exist() -> None:
    wrong = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text()):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                wrong.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                wrong.append(f"{page.name}: {target} (no such heading)")
    assert not wrong, "\n".join(wrong)
