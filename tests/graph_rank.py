"""One rank of tests/test_graph_capture.py: collectives and send/recv on
the stand-in libamdhip64's device memory, captured into a graph on a
stream (hipStreamBeginCapture, global mode unless said; hipStreamEndCapture),
replayed with hipGraphLaunch and checked value for value; prints one line
"RESULT {json}".

Environment: T_RANK, T_NRANKS, T_ID_FILE, T_PRELOAD (the stand-in
libamdhip64 of the ROCm 6 build first; unset: a host rank, host buffers)
and T_GPU, as for tests/hip_rank.py, which loads them; T_COUNT (int32
elements per rank and call, default 1024); T_ITERS (replays, default 20);
T_GRAPH, the scenario:
  replay     one graph of an AllGather, a Broadcast from rank 0, a
             send/recv with the peer in a group (two ranks) and an
             AlltoAll, captured before the communicator ran anything (its
             lazy set-up happens inside the capture), then replayed T_ITERS
             times with new inputs; after every third replay the same calls
             run eagerly on the stream with other inputs;
  two        graph G1 (AllGather) and graph G2 (Broadcast, captured in
             thread-local mode), captured one after the other, replayed
             G2, G1, G1, G2, G1;
  ring       as replay, with an AllGather and a ring of send/recv (to
             rank + 1, from rank - 1) in a group;
  allreduce  an AllReduce of device buffers under capture (refused), the
             capture ended, then the AllReduce eagerly;
  host       with a host rank in the communicator, or a rank on another
             host: the HIP ranks' AllGather under capture (refused), the
             capture ended; then every rank's AllGather eagerly (a host
             rank does only that);
  abort      an AllGather captured and replayed once; then rank 1 aborts
             its communicator (ncclCommAbort) and exits, and rank 0 replays
             3 more times, each replay timed ("abort_replay_s"), and reads
             its communicator's async error ("async_error") and last error
             ("async_message").
Inputs depend on the call, the replay (or eager run) and the rank, and
every output is set to -1 before each run, so that a run that writes
nothing is seen. The rank says what it did, a line at a time, and after
T_DEADLINE seconds (default 60) prints where it is stuck and exits 1
(a replay that waits for a peer forever cannot be interrupted otherwise).

The result: "error"/"message" when init failed; else "kind" (hip or
host), "wrong" (a line per output that differed: run, call, first bad
index, value there and the one expected), "errors" (calls that failed:
where, the NcclError's name and message, and ncclGetLastError(comm)),
"refusals" (the refused captured call's error name, message and
ncclGetLastError(comm), scenarios allreduce and host), "replays"
(hipGraphLaunch calls made), and the stand-in's counters:
"fake_capture_refusals", "fake_graph_launches", "fake_graph_ops".
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
from typing import Callable, Dict, List, Optional

# first: hip_rank loads T_PRELOAD (RTLD_GLOBAL) and selects T_GPU as it is imported
from hip_rank import NRANKS, RANK, _device_kind, exchange_id

import numpy as np

from hetccl import _lib, nccl
from hetccl.errors import NcclError, last_error

I32 = nccl.NCCL_INT32
CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL = 0, 1  # hipStreamCaptureMode
PRELOAD = os.environ.get("T_PRELOAD", "")
COUNT = int(os.environ.get("T_COUNT", "1024"))
ITERS = int(os.environ.get("T_ITERS", "20"))
TAGS = {"allgather": 1, "broadcast": 2, "sendrecv": 3, "alltoall": 4, "allreduce": 5}


class Hip:
    """The stand-in libamdhip64's calls this script makes, through ctypes;
    each that fails raises AssertionError naming it."""

    def __init__(self, path: str) -> None:
        h = self.h = ctypes.CDLL(path)
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        h.hipMalloc.argtypes = [pvp, ctypes.c_size_t]
        h.hipStreamCreateWithPriority.argtypes = [pvp, ctypes.c_uint, ctypes.c_int]
        h.hipStreamBeginCapture.argtypes = [vp, ctypes.c_int]
        h.hipStreamEndCapture.argtypes = [vp, pvp]
        h.hipStreamIsCapturing.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
        h.hipGraphInstantiate.argtypes = [pvp, vp, vp, ctypes.c_char_p, ctypes.c_size_t]
        h.hipGraphInstantiateWithFlags.argtypes = [pvp, vp, ctypes.c_ulonglong]
        h.hipGraphLaunch.argtypes = [vp, vp]
        h.hipGraphExecDestroy.argtypes = [vp]
        h.hipGraphDestroy.argtypes = [vp]
        h.hipStreamSynchronize.argtypes = [vp]
        self.replays = 0

    def _ok(self, err: int, call: str) -> None:
        assert err == 0, f"{call} returned {err}"

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._ok(self.h.hipMalloc(ctypes.byref(p), nbytes), "hipMalloc")
        return p.value

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._ok(self.h.hipStreamCreateWithPriority(ctypes.byref(s), 0, 0),
                 "hipStreamCreateWithPriority")
        return s.value

    def begin(self, stream: int, mode: int = CAPTURE_GLOBAL) -> None:
        self._ok(self.h.hipStreamBeginCapture(stream, mode), "hipStreamBeginCapture")

    def capturing(self, stream: int) -> bool:
        st = ctypes.c_int(-1)
        self._ok(self.h.hipStreamIsCapturing(stream, ctypes.byref(st)), "hipStreamIsCapturing")
        return st.value == 1

    def end(self, stream: int) -> int:
        g = ctypes.c_void_p()
        self._ok(self.h.hipStreamEndCapture(stream, ctypes.byref(g)), "hipStreamEndCapture")
        return g.value

    def instantiate(self, graph: int, flags: Optional[int] = None) -> int:
        e = ctypes.c_void_p()
        if flags is None:
            log = ctypes.create_string_buffer(256)
            err = self.h.hipGraphInstantiate(ctypes.byref(e), graph, None, log, len(log))
        else:
            err = self.h.hipGraphInstantiateWithFlags(ctypes.byref(e), graph, flags)
        self._ok(err, "hipGraphInstantiate")
        return e.value

    def launch(self, exec_: int, stream: int) -> None:
        self.replays += 1
        self._ok(self.h.hipGraphLaunch(exec_, stream), "hipGraphLaunch")

    def sync(self, stream: int) -> None:
        self._ok(self.h.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def destroy(self, exec_: int, graph: int) -> None:
        self._ok(self.h.hipGraphExecDestroy(exec_), "hipGraphExecDestroy")
        self._ok(self.h.hipGraphDestroy(graph), "hipGraphDestroy")

    def counter(self, name: str) -> int:
        return ctypes.c_int.in_dll(self.h, name).value


class Buf:
    """count int32 of the stand-in's device memory (its arena is host
    memory, so the script reads and writes it directly), or of host memory
    on a host rank."""

    def __init__(self, hip: Optional[Hip], count: int, keep: List[np.ndarray]) -> None:
        self.count = count
        if hip is not None:
            self.ptr = hip.malloc(4 * count)
        else:
            host = np.empty(count, dtype=np.int32)
            keep.append(host)
            self.ptr = host.ctypes.data

    def put(self, values: np.ndarray) -> None:
        assert values.dtype == np.int32 and values.size == self.count
        ctypes.memmove(self.ptr, np.ascontiguousarray(values).ctypes.data, values.nbytes)

    def clear(self) -> None:
        ctypes.memset(self.ptr, 0xFF, 4 * self.count)  # -1 everywhere

    def get(self) -> np.ndarray:
        out = np.empty(self.count, dtype=np.int32)
        ctypes.memmove(out.ctypes.data, self.ptr, out.nbytes)
        return out


def inputs(call: str, run: int, rank: int, n: int) -> np.ndarray:
    """What `rank` sends in `run` of `call`: n int32, unlike any other
    run's, call's or rank's."""
    base = TAGS[call] * 10_000_000 + run * 100_000 + rank * 10_000
    return (base + (np.arange(n, dtype=np.int64) * 7) % 9973).astype(np.int32)


class Case:
    """The calls of one graph (or eager run): buffers, how to run them on
    a stream, what each output must hold after run `r`."""

    def __init__(self, comm: nccl.NcclCommunicator, hip: Optional[Hip], calls: List[str],
                 count: int, keep: List[np.ndarray]) -> None:
        self.comm, self.calls, self.count, n = comm, calls, count, NRANKS
        self.to, self.frm = (RANK + 1) % n, (RANK - 1) % n
        sizes = {"allgather": (count, count * n), "broadcast": (count, count),
                 "sendrecv": (count, count), "alltoall": (count * n, count * n),
                 "allreduce": (count, count)}
        self.bufs: Dict[str, tuple] = {c: (Buf(hip, sizes[c][0], keep), Buf(hip, sizes[c][1], keep))
                                       for c in calls}

    def prepare(self, run: int) -> None:
        for c, (src, dst) in self.bufs.items():
            src.put(inputs(c, run, RANK, src.count))
            dst.clear()

    def issue(self, stream: int) -> None:
        """Every call, as a program makes them, on `stream`."""
        cm, k = self.comm, self.count
        for c in self.calls:
            src, dst = self.bufs[c]
            if c == "allgather":
                cm.allGather(src.ptr, dst.ptr, k, I32, stream=stream)
            elif c == "broadcast":
                cm.broadcast(src.ptr, dst.ptr, k, I32, 0, stream=stream)
            elif c == "sendrecv":
                nccl.groupStart()
                try:
                    cm.send(src.ptr, k, I32, self.to, stream=stream)
                    cm.recv(dst.ptr, k, I32, self.frm, stream=stream)
                finally:
                    nccl.groupEnd()
            elif c == "alltoall":
                cm.alltoall(src.ptr, dst.ptr, k, I32, stream=stream)
            elif c == "allreduce":
                cm.allReduce(src.ptr, dst.ptr, k, I32, nccl.NCCL_SUM, stream=stream)

    def want(self, c: str, run: int) -> np.ndarray:
        k, n = self.count, NRANKS
        if c == "allgather":
            return np.concatenate([inputs(c, run, r, k) for r in range(n)])
        if c == "broadcast":
            return inputs(c, run, 0, k)
        if c == "sendrecv":
            return inputs(c, run, self.frm, k)
        if c == "alltoall":  # block r of every rank's input, in rank order
            return np.concatenate([inputs(c, run, r, k * n)[RANK * k:(RANK + 1) * k]
                                   for r in range(n)])
        return sum(inputs(c, run, r, k).astype(np.int64) for r in range(n)).astype(np.int32)

    def check(self, label: str, run: int, wrong: List[str]) -> None:
        for c in self.calls:
            got, want = self.bufs[c][1].get(), self.want(c, run)
            if not np.array_equal(got, want):
                i = int(np.flatnonzero(got != want)[0])
                bad = int(np.count_nonzero(got != want))
                wrong.append(f"{label} {c}: {bad} of {got.size} wrong, first [{i}] = "
                             f"{int(got[i])}, want {int(want[i])}")


def say(what: str) -> None:
    print(f"rank {RANK}: {what}", flush=True)


def _failed(out: dict, where: str, comm: nccl.NcclCommunicator, e: NcclError) -> None:
    out["errors"].append({"where": where, "error": e.name, "message": e.message,
                          "comm_last_error": _comm_error(comm)})


def _comm_error(comm: nccl.NcclCommunicator) -> str:
    return last_error(_lib.ffi.cast("ncclComm_t", comm.comm))


def capture(hip: Hip, stream: int, issue: Callable[[], None],
            mode: int = CAPTURE_GLOBAL) -> int:
    """The graph of what issue() enqueues on stream; the capture is ended
    even when a call fails (the error then propagates)."""
    hip.begin(stream, mode)
    try:
        assert hip.capturing(stream), "hipStreamIsCapturing says no inside the capture"
        issue()
    finally:
        graph = hip.end(stream)
    return graph


def replay(comm, hip: Hip, out: dict, calls: List[str]) -> None:
    keep: List[np.ndarray] = []
    case, s = Case(comm, hip, calls, COUNT, keep), hip.stream()
    try:
        graph = capture(hip, s, lambda: case.issue(s))
    except NcclError as e:
        return _failed(out, "capture", comm, e)
    exec_ = hip.instantiate(graph)
    say(f"captured {calls}")
    run = 0
    for it in range(ITERS):
        run += 1
        case.prepare(run)
        hip.launch(exec_, s)
        case.check(f"replay {it}", run, out["wrong"])
        say(f"replay {it} done")
        if it % 3 == 2:
            run += 1
            case.prepare(run)
            try:
                case.issue(s)
            except NcclError as e:
                return _failed(out, f"eager after replay {it}", comm, e)
            hip.sync(s)
            case.check(f"eager after replay {it}", run, out["wrong"])
            say(f"eager after replay {it} done")
    hip.destroy(exec_, graph)


def two_graphs(comm, hip: Hip, out: dict) -> None:
    keep: List[np.ndarray] = []
    s = hip.stream()
    g1c, g2c = Case(comm, hip, ["allgather"], COUNT, keep), Case(comm, hip, ["broadcast"], COUNT,
                                                                  keep)
    try:
        g1 = capture(hip, s, lambda: g1c.issue(s))
        g2 = capture(hip, s, lambda: g2c.issue(s), CAPTURE_THREAD_LOCAL)
    except NcclError as e:
        return _failed(out, "capture", comm, e)
    e1, e2 = hip.instantiate(g1), hip.instantiate(g2, flags=0)
    say("captured G1, G2")
    for run, (name, exec_, case) in enumerate([("G2", e2, g2c), ("G1", e1, g1c), ("G1", e1, g1c),
                                              ("G2", e2, g2c), ("G1", e1, g1c)], start=1):
        case.prepare(run)
        hip.launch(exec_, s)
        case.check(f"replay {run} ({name})", run, out["wrong"])
        say(f"replay {run} ({name}) done")
    hip.destroy(e1, g1)
    hip.destroy(e2, g2)


def refused(comm, hip: Optional[Hip], out: dict, call: str) -> None:
    """The captured `call` is refused on a HIP rank (the capture is ended
    and the graph dropped); then every rank runs it eagerly."""
    keep: List[np.ndarray] = []
    case = Case(comm, hip, [call], COUNT, keep)
    s = hip.stream() if hip else 0
    if hip is not None:
        case.prepare(1)
        hip.begin(s)
        try:
            case.issue(s)
            out["refusals"].append({"error": None})
        except NcclError as e:
            out["refusals"].append({"error": e.name, "message": e.message,
                                    "comm_last_error": _comm_error(comm)})
        finally:
            hip.h.hipGraphDestroy(hip.end(s))
        say(f"captured {call}: {out['refusals'][0]['error']}")
    case.prepare(2)
    try:
        case.issue(s)
    except NcclError as e:
        return _failed(out, "eager after the refusal", comm, e)
    if hip is not None:
        hip.sync(s)
    case.check("eager after the refusal", 2, out["wrong"])


def after_abort(comm, hip: Hip, out: dict) -> None:
    """A replay after the peer aborted must end (undefined outputs), and
    the communicator must say why."""
    import time
    keep: List[np.ndarray] = []
    case, s = Case(comm, hip, ["allgather"], COUNT, keep), hip.stream()
    try:
        graph = capture(hip, s, lambda: case.issue(s))
    except NcclError as e:
        return _failed(out, "capture", comm, e)
    exec_ = hip.instantiate(graph)
    case.prepare(1)
    hip.launch(exec_, s)
    case.check("replay before the abort", 1, out["wrong"])
    say("replay before the abort done")
    if RANK == 1:
        comm.abort()
        print("RESULT " + json.dumps({**out, "aborted": True}), flush=True)
        os._exit(0)
    time.sleep(0.5)
    out["abort_replay_s"] = []
    for it in range(3):
        t0 = time.monotonic()
        hip.launch(exec_, s)
        out["abort_replay_s"].append(round(time.monotonic() - t0, 3))
        say(f"replay {it} after the abort done")
    try:
        comm.check_async_error()
        out["async_error"] = 0
    except NcclError as e:
        out["async_error"] = e.name
    out["async_message"] = _comm_error(comm)
    hip.destroy(exec_, graph)


def main() -> dict:
    hip = Hip(PRELOAD.split(":")[0]) if PRELOAD else None
    try:
        comm = nccl.NcclCommunicator(NRANKS, nccl.unique_id_from_hex(exchange_id()), RANK)
    except NcclError as e:
        return {"error": e.name, "message": e.message}
    out: dict = {"kind": _device_kind(), "wrong": [], "errors": [], "refusals": []}
    scenario = os.environ["T_GRAPH"]
    if scenario == "replay":
        replay(comm, hip, out, ["allgather", "broadcast", "sendrecv", "alltoall"])
    elif scenario == "ring":
        replay(comm, hip, out, ["allgather", "sendrecv"])
    elif scenario == "two":
        two_graphs(comm, hip, out)
    elif scenario == "allreduce":
        refused(comm, hip, out, "allreduce")
    elif scenario == "host":
        refused(comm, hip, out, "allgather")
    elif scenario == "abort":
        after_abort(comm, hip, out)
    else:
        raise ValueError(f"T_GRAPH={scenario!r}")
    if hip is not None:
        out["replays"] = hip.replays
        for name in ("fake_capture_refusals", "fake_graph_launches", "fake_graph_ops"):
            out[name] = hip.counter(name)
    comm.destroy()
    return out


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(os.environ.get("T_DEADLINE", "60")), exit=True)
    _lib.lib()
    print("RESULT " + json.dumps(main()), flush=True)
