"""`hetccl plot`: bus bandwidth against size for several benchmark result
files, as one PNG (matplotlib, the optional extra `hetccl[plot]`).

Contract: `read_results(path)` takes a hetccl-perf JSON file (-J) or a
saved text table of hetccl-perf or tools/peers/mpi_bench.py (the OpenMPI
peer prints the same columns), and returns its rows as
{"size", "count", "type", "redop", "root", "oop": {...}, "ip": {...}} with
"time_us", "algbw", "busbw", "wrong" in each placement (the JSON file's own
shape). `plot(...)` draws one line per file and (type, redop) found in it,
busbw of the chosen placement against size on log axes, and writes the PNG;
it imports matplotlib only there, with the Agg backend (no display).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple


class PlotError(RuntimeError):
    """A file that holds no results, or matplotlib missing."""


def parse_table(text: str) -> List[Dict[str, Any]]:
    """Rows of a hetccl-perf / mpi_bench text table (13 columns)."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) != 13 or not f[0].isdigit():
            continue

        def placement(i: int) -> Dict[str, Any]:
            return {"time_us": float(f[i]), "algbw": float(f[i + 1]),
                    "busbw": float(f[i + 2]), "wrong": None if f[i + 3] == "N/A" else int(f[i + 3])}
        rows.append({"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3],
                     "root": int(f[4]), "oop": placement(5), "ip": placement(9)})
    return rows


def read_results(path: Path) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(header, rows) of one result file; header has "collective" where known."""
    text = Path(path).read_text(errors="replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlotError(f"{path}: not a complete JSON document ({e}); an interrupted "
                            "run leaves its rows unterminated") from None
        rows = doc.get("rows")
        if not isinstance(rows, list):
            raise PlotError(f"{path}: no \"rows\" (not a hetccl-perf -J file)")
        return {k: v for k, v in doc.items() if k != "rows"}, rows
    header: Dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("# hetccl-perf ") or line.startswith("# mpi_bench "):
            header["collective"] = line.split()[2].rstrip(":")
            break
    rows = parse_table(text)
    if not rows:
        raise PlotError(f"{path}: no result rows (a hetccl-perf -J file or its text table)")
    return header, rows


def _size_label(b: float, _pos: Any = None) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g}{unit}"
    return f"{b:g}"


def plot(files: Sequence[Path], out: Path, labels: Optional[Sequence[str]] = None,
         placement: str = "oop", title: Optional[str] = None) -> int:
    """Write the PNG; returns the number of lines drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'hetccl[plot]' "
                        "(or pip install matplotlib)") from None
    if labels and len(labels) != len(files):
        raise PlotError(f"{len(labels)} labels for {len(files)} files")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    results = [read_results(Path(p)) for p in files]
    colls = {h["collective"] for h, _ in results if h.get("collective")}
    lines = 0
    for i, (path, (header, rows)) in enumerate(zip(files, results)):
        name = labels[i] if labels else Path(path).stem
        if len(colls) > 1 and header.get("collective"):
            name += f" ({header['collective']})"
        series: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
        for r in rows:
            if r["size"] > 0:
                series.setdefault((r["type"], r["redop"]), []).append(
                    (r["size"], r[placement]["busbw"]))
        for (dtype, redop), pts in series.items():
            pts.sort()
            label = name if len(series) == 1 else f"{name} {dtype} {redop}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
            lines += 1
    if not lines:
        raise PlotError("no rows with a size above 0 to draw")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(f"bus bandwidth (GB/s), {'out-of-place' if placement == 'oop' else 'in-place'}")
    ax.set_title(title or ", ".join(sorted(colls)) or "busbw")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
    return lines
