"""`hetccl trace`: the per-rank files that HETCCL_TRACE writes, merged into
one Chrome trace-event file (Perfetto, chrome://tracing), and a summary of
where each rank's time went (docs/trace.md).

Contract: `load(path)` reads one file and checks its shape (a JSON object
whose "traceEvents" is a list of events; each complete event, ph "X", has a
text name and cat, numeric ts and dur, integer pid and tid), raising
TraceError that names the file and the first problem. `merge(paths)` returns
one document holding every file's events, with each rank named in
process_name metadata ("rank 2 (host, pid 1234)"; an event's pid is its rank
+ 1, rank_of) and otherData listing the
files and the events the ranks dropped. `summary(doc)` adds up, per rank,
the calls and the time of each kind of event. `expand(args)` turns the
command's arguments (files, directories, globs) into files.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

# Summary columns: (heading, category, event name or None for any).
COLUMNS: List[Tuple[str, str, Any]] = [
    ("call_us", "call", None),
    ("island_us", "phase", "island"),
    ("leaders_us", "phase", "leaders"),
    ("rail_us", "phase", "rail"),
    ("engine_us", "engine", None),
    ("send_us", "piece", "send"),
    ("recv_us", "piece", "recv"),
    ("reduce_us", "reduce", None),
    ("stage_us", "stage", None),
]


def rank_of(pid: int) -> int:
    """The rank an event's pid stands for: the library writes rank + 1, as
    Perfetto takes pid 0 for the kernel's idle task."""
    return pid - 1


class TraceError(RuntimeError):
    """A file that is not a trace HETCCL_TRACE could have written."""


def _check_event(path: Path, i: int, ev: Any) -> None:
    def bad(what: str) -> TraceError:
        return TraceError(f"{path}: event {i}: {what}")

    if not isinstance(ev, dict):
        raise bad("not a JSON object")
    ph = ev.get("ph")
    if not isinstance(ph, str):
        raise bad("no 'ph' (event type)")
    for key in ("pid", "tid"):
        if not isinstance(ev.get(key), int) or isinstance(ev.get(key), bool):
            raise bad(f"'{key}' is not an integer")
    if ph != "X":
        return
    for key in ("name", "cat"):
        if not isinstance(ev.get(key), str):
            raise bad(f"'{key}' is not text")
    for key in ("ts", "dur"):
        v = ev.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise bad(f"'{key}' is not a non-negative number")


def load(path: Path) -> Dict[str, Any]:
    """One rank's file, checked."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not text ({e})") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: no \"traceEvents\" list: not a Chrome trace-event file")
    for i, ev in enumerate(doc["traceEvents"]):
        _check_event(path, i, ev)
    if not isinstance(doc.get("otherData", {}), dict):
        raise TraceError(f"{path}: \"otherData\" is not a JSON object")
    return doc


def expand(args: Iterable[str], exclude: Optional[Path] = None) -> List[Path]:
    """Files named by args: a directory stands for its *.json files, a
    pattern with * ? [ for its matches. Sorted, without `exclude`."""
    found: List[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            found += sorted(p.glob("*.json"))
        elif any(c in a for c in "*?["):
            matches = sorted(Path(m) for m in glob.glob(a))
            if not matches:
                raise TraceError(f"{a}: matches no file")
            found += matches
        elif p.is_file():
            found.append(p)
        else:
            raise TraceError(f"{a}: no such file or directory")
    skip = exclude.resolve() if exclude else None
    out: List[Path] = []
    for p in found:
        if p.resolve() != skip and p not in out:
            out.append(p)
    if not out:
        raise TraceError("no trace files given")
    return out


def merge(paths: Iterable[Path]) -> Dict[str, Any]:
    """One document from several ranks' files (see the module's contract)."""
    events: List[Dict[str, Any]] = []
    names: Dict[int, str] = {}
    seen_in: Dict[int, List[str]] = {}
    files: List[str] = []
    dropped: Dict[Tuple[str, Any], int] = {}  # per process: each of its files says the same
    skipped: List[str] = []
    for path in paths:
        doc = load(path)
        other = doc.get("otherData", {})
        if other.get("tool") == "hetccl trace":  # an earlier merge beside the rank files
            skipped.append(f"{path} is a merged file, left out")
            continue
        files.append(str(path))
        host, pid = str(other.get("host", "?")), other.get("pid", "?")
        if isinstance(other.get("dropped_events"), int):
            dropped[(host, pid)] = other["dropped_events"]
        for ev in doc["traceEvents"]:
            pid_ev = ev["pid"]
            if ev["ph"] == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue
            if str(path) not in seen_in.setdefault(pid_ev, []):
                seen_in[pid_ev].append(str(path))
            names.setdefault(pid_ev, f"rank {rank_of(pid_ev)} ({host}, pid {pid})")
            events.append(ev)
    meta = []
    for p in sorted(names):
        meta.append({"name": "process_name", "ph": "M", "pid": p, "tid": 0,
                     "args": {"name": names[p]}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0,
                     "args": {"sort_index": rank_of(p)}})
    warnings = [f"rank {rank_of(p)} appears in {len(f)} files ({', '.join(f)}); the merged view "
                "shows their events as one rank" for p, f in sorted(seen_in.items()) if len(f) > 1]
    warnings = skipped + warnings
    events.sort(key=lambda e: (e["ph"] != "M", e["pid"], e.get("ts", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ns",
            "otherData": {"tool": "hetccl trace", "files": files,
                          "ranks": [rank_of(p) for p in sorted(names)],
                          "dropped_events": sum(dropped.values()), "warnings": warnings}}


def summary(doc: Dict[str, Any]) -> Dict[int, Dict[str, float]]:
    """Per rank: "calls" (call events) and each COLUMNS heading's total time."""
    out: Dict[int, Dict[str, float]] = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        row = out.setdefault(rank_of(ev["pid"]), {"calls": 0, **{c[0]: 0.0 for c in COLUMNS}})
        if ev["cat"] == "call":
            row["calls"] += 1
        for heading, cat, name in COLUMNS:
            if ev["cat"] == cat and (name is None or ev["name"] == name):
                row[heading] += float(ev["dur"])
    return out


def summary_table(rows: Dict[int, Dict[str, float]]) -> str:
    """The summary as a table: a header line starting with '#', then one
    line per rank."""
    heads = ["rank", "calls"] + [c[0] for c in COLUMNS]
    lines = ["# " + " ".join(f"{h:>10}" for h in heads)]
    for rank in sorted(rows):
        r = rows[rank]
        cells = [f"{rank:>10}", f"{int(r['calls']):>10}"]
        cells += [f"{r[c[0]]:>10.1f}" for c in COLUMNS]
        lines.append("  " + " ".join(cells))
    return "\n".join(lines)
