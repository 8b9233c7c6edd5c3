"""Bad arguments give an NcclError with the right ncclResult_t and a message,
never a crash or a hang.

The calls run inside launched ranks, so that a crash shows up as a rank
killed by a signal instead of taking pytest down; every case is caught in
the rank and sent back as (case, result name, message). After the errors,
the same communicator must still run a correct allreduce: a rejected
argument does not break it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pytest

import hetccl
from hetccl import nccl
from hetccl.errors import NcclError
from hetccl.nccl import NcclCommunicator

pytestmark = pytest.mark.usefixtures("hetccl_library")

TIMEOUT = 120
SIZE_MAX = 2**64 - 1
F32 = nccl.NCCL_FLOAT32
INVALID_ARGUMENT = "ncclInvalidArgument"
INVALID_USAGE = "ncclInvalidUsage"

Outcome = Tuple[str, str]  # (result name or "ok", message)


def _outcome(call: Callable[[], object]) -> Outcome:
    try:
        call()
    except NcclError as e:
        return e.name, e.message
    return "ok", ""


def rank_bad_arguments() -> Dict[str, Outcome]:
    """Run every bad call on a 2-rank communicator; both ranks make the same
    calls in the same order."""
    comm = hetccl.communicator()
    n = comm.size()
    buf = np.zeros(16, dtype=np.float32)
    big = np.zeros(16 * n, dtype=np.float32)
    b, g = int(buf.ctypes.data), int(big.ctypes.data)
    cases: Dict[str, Callable[[], object]] = {
        "allreduce null send": lambda: comm.allReduce(0, b, 4, F32, nccl.NCCL_SUM),
        "allreduce null recv": lambda: comm.allReduce(b, 0, 4, F32, nccl.NCCL_SUM),
        "broadcast null recv": lambda: comm.broadcast(b, 0, 4, F32, 0),
        "allgather null recv": lambda: comm.allGather(b, 0, 4, F32),
        "allreduce count SIZE_MAX": lambda: comm.allReduce(b, b, SIZE_MAX, F32, nccl.NCCL_SUM),
        "allreduce bytes overflow": lambda: comm.allReduce(b, b, 2**62, nccl.NCCL_FLOAT64,
                                                           nccl.NCCL_SUM),
        "allreduce dtype 12": lambda: comm.allReduce(b, b, 4, 12, nccl.NCCL_SUM),
        "allreduce dtype 1000": lambda: comm.allReduce(b, b, 4, 1000, nccl.NCCL_SUM),
        "broadcast dtype 12": lambda: comm.broadcast(b, b, 4, 12, 0),
        "send dtype 77": lambda: comm.send(b, 4, 77, 0),
        "allreduce op 5": lambda: comm.allReduce(b, b, 4, F32, 5),
        "allreduce op 99": lambda: comm.allReduce(b, b, 4, F32, 99),
        "reduce op 1000000": lambda: comm.reduce(b, b, 4, F32, 1000000, 0),
        "reduce root n": lambda: comm.reduce(b, b, 4, F32, nccl.NCCL_SUM, n),
        "reduce root -1": lambda: comm.reduce(b, b, 4, F32, nccl.NCCL_SUM, -1),
        "broadcast root n": lambda: comm.broadcast(b, b, 4, F32, n),
        "bcast root 100": lambda: comm.bcast(b, 4, F32, 100),
        "gather root n": lambda: comm.gather(b, g, 4, F32, n),
        "scatter root -5": lambda: comm.scatter(g, b, 4, F32, -5),
        "send peer n": lambda: comm.send(b, 4, F32, n),
        "send peer -1": lambda: comm.send(b, 4, F32, -1),
        "recv peer n+3": lambda: comm.recv(b, 4, F32, n + 3),
        "premulsum dtype 12": lambda: comm.createPreMulSum(b"\0" * 4, 12),
        "destroy builtin op": lambda: comm.destroyRedOp(nccl.NCCL_SUM),
        "destroy unknown op": lambda: comm.destroyRedOp(12345),
        "count 0 null buffers": lambda: comm.allReduce(0, 0, 0, F32, nccl.NCCL_SUM),
    }
    if n > 1:  # count * nranks overflows size_t only when nranks > 1
        per_rank = SIZE_MAX // n + 1
        cases["allgather count*nranks overflow"] = lambda: comm.allGather(
            b, g, per_rank, nccl.NCCL_INT8)
        cases["reducescatter count*nranks overflow"] = lambda: comm.reduceScatter(
            g, b, per_rank, nccl.NCCL_INT8, nccl.NCCL_SUM)
    # last: if the null buffer were not caught, the send would wait for a receive
    cases["send null"] = lambda: comm.send(0, 4, F32, (comm.rank_id() + 1) % n)
    out = {name: _outcome(call) for name, call in cases.items()}

    # A PreMulSum op is gone once destroyed.
    op = comm.createPreMulSum(np.float32(2).tobytes(), F32)
    comm.destroyRedOp(op)
    out["allreduce with destroyed premulsum op"] = _outcome(
        lambda: comm.allReduce(b, b, 4, F32, op))

    # An error inside a group: at the call or at groupEnd, and no hang.
    def bad_group() -> None:
        nccl.groupStart()
        try:
            comm.allReduce(0, b, 4, F32, nccl.NCCL_SUM)
        finally:
            nccl.groupEnd()
    out["null buffer inside a group"] = _outcome(bad_group)

    # The communicator still works.
    x = np.full(5, comm.rank_id() + 1, dtype=np.float32)
    y = np.zeros(5, dtype=np.float32)
    out["valid allreduce afterwards"] = _outcome(
        lambda: comm.allReduce(int(x.ctypes.data), int(y.ctypes.data), 5, F32, nccl.NCCL_SUM))
    if out["valid allreduce afterwards"][0] == "ok" and not (y == n * (n + 1) / 2).all():
        out["valid allreduce afterwards"] = ("wrong result", str(y))
    comm.destroy()
    return out


EXPECTED: Dict[str, str] = {
    "allreduce null send": INVALID_ARGUMENT,
    "allreduce null recv": INVALID_ARGUMENT,
    "broadcast null recv": INVALID_ARGUMENT,
    "allgather null recv": INVALID_ARGUMENT,
    "send null": INVALID_ARGUMENT,
    "allreduce count SIZE_MAX": INVALID_ARGUMENT,
    "allreduce bytes overflow": INVALID_ARGUMENT,
    "allgather count*nranks overflow": INVALID_ARGUMENT,
    "reducescatter count*nranks overflow": INVALID_ARGUMENT,
    "allreduce dtype 12": INVALID_ARGUMENT,
    "allreduce dtype 1000": INVALID_ARGUMENT,
    "broadcast dtype 12": INVALID_ARGUMENT,
    "send dtype 77": INVALID_ARGUMENT,
    "allreduce op 5": INVALID_ARGUMENT,
    "allreduce op 99": INVALID_ARGUMENT,
    "reduce op 1000000": INVALID_ARGUMENT,
    "reduce root n": INVALID_ARGUMENT,
    "reduce root -1": INVALID_ARGUMENT,
    "broadcast root n": INVALID_ARGUMENT,
    "bcast root 100": INVALID_ARGUMENT,
    "gather root n": INVALID_ARGUMENT,
    "scatter root -5": INVALID_ARGUMENT,
    "send peer n": INVALID_ARGUMENT,
    "send peer -1": INVALID_ARGUMENT,
    "recv peer n+3": INVALID_ARGUMENT,
    "premulsum dtype 12": INVALID_ARGUMENT,
    "destroy builtin op": INVALID_ARGUMENT,
    "destroy unknown op": INVALID_ARGUMENT,
    "count 0 null buffers": "ok",
    "allreduce with destroyed premulsum op": INVALID_ARGUMENT,
    "null buffer inside a group": INVALID_ARGUMENT,
    "valid allreduce afterwards": "ok",
}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("n", [1, 2])
def test_bad_arguments(n: int) -> None:
    results = hetccl.launch(rank_bad_arguments, n, timeout=TIMEOUT - 10)
    wrong = []
    for rank, got in enumerate(results):
        assert set(got) <= set(EXPECTED)
        for case, (name, message) in got.items():
            want = EXPECTED[case]
            if name != want:
                wrong.append(f"rank {rank}: {case}: got {name} ({message!r}), want {want}")
            elif want != "ok" and not message.strip():
                wrong.append(f"rank {rank}: {case}: {name} without a message")
    assert not wrong, "\n".join(wrong)


def rank_lifetime_errors() -> Dict[str, Outcome]:
    """Use after destroy and after abort, through the Python object (a NULL
    handle) and through the stale C handle."""
    out: Dict[str, Outcome] = {}
    buf = np.zeros(4, dtype=np.float32)
    b = int(buf.ctypes.data)
    for how in ("destroy", "abort"):
        comm = NcclCommunicator(1, nccl.get_unique_id(), 0)
        stale = comm.comm
        getattr(comm, how)()
        out[f"allreduce after {how} (NULL handle)"] = _outcome(
            lambda: comm.allReduce(b, b, 4, F32, nccl.NCCL_SUM))
        out[f"rank_id after {how} (NULL handle)"] = _outcome(comm.rank_id)
        old = NcclCommunicator.from_handle(stale)
        out[f"allreduce after {how} (stale handle)"] = _outcome(
            lambda: old.allReduce(b, b, 4, F32, nccl.NCCL_SUM))
        out[f"count after {how} (stale handle)"] = _outcome(old.size)
        out[f"destroy twice after {how} (stale handle)"] = _outcome(old.destroy)
    out["foreign handle"] = _outcome(
        lambda: NcclCommunicator.from_handle(b).allReduce(b, b, 4, F32, nccl.NCCL_SUM))
    return out


@pytest.mark.timeout(TIMEOUT)
def test_use_after_destroy_and_abort() -> None:
    got = hetccl.launch(rank_lifetime_errors, 1, timeout=TIMEOUT - 10)[0]
    wrong = [f"{case}: {name} ({message!r})" for case, (name, message) in got.items()
             if name != INVALID_ARGUMENT or not message.strip()]
    assert not wrong, "want ncclInvalidArgument with a message:\n" + "\n".join(wrong)


def rank_bad_init() -> Dict[str, Outcome]:
    good = nccl.get_unique_id()
    rng = np.random.default_rng(7)
    garbage = rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
    flipped = bytes(b ^ 0xFF for b in bytes.fromhex(nccl.unique_id_to_hex(good)))
    cases: Dict[str, Callable[[], object]] = {
        "zero unique id": lambda: NcclCommunicator(1, bytes(128), 0),
        "random unique id": lambda: NcclCommunicator(1, garbage, 0),
        "inverted unique id": lambda: NcclCommunicator(1, flipped, 0),
        "nranks 0": lambda: NcclCommunicator(0, good, 0),
        "nranks -3": lambda: NcclCommunicator(-3, good, 0),
        "rank == nranks": lambda: NcclCommunicator(2, good, 2),
        "rank -1": lambda: NcclCommunicator(2, good, -1),
        "initAll 0": lambda: NcclCommunicator.initAll(0),
    }
    return {name: _outcome(call) for name, call in cases.items()}


@pytest.mark.timeout(TIMEOUT)
def test_bad_init() -> None:
    env = {"HETCCL_CONNECT_TIMEOUT": "5", "HETCCL_TIMEOUT": "5"}
    got = hetccl.launch(rank_bad_init, 1, env=env, timeout=TIMEOUT - 10)[0]
    wrong = [f"{case}: {name} ({message!r})" for case, (name, message) in got.items()
             if name != INVALID_ARGUMENT or not message.strip()]
    assert not wrong, "want ncclInvalidArgument with a message:\n" + "\n".join(wrong)


def test_error_strings_and_the_exception(hetccl_library: object) -> None:
    from hetccl import _lib

    L, ffi = _lib.lib(), _lib.ffi
    for code in range(9):
        assert ffi.string(L.ncclGetErrorString(code)), code
    e = NcclError(4, "root 7 out of range", "ncclReduce")
    assert (e.result, e.name, e.message) == (4, INVALID_ARGUMENT, "root 7 out of range")
    assert isinstance(e, RuntimeError) and "ncclReduce" in str(e)
    again = pickle.loads(pickle.dumps(e))
    assert (again.result, again.name, again.message, again.function) == (4, e.name, e.message,
                                                                          "ncclReduce")
    assert NcclError(42).name == "ncclResult(42)"


def _failing_rank(bad: Optional[int]) -> int:
    info = hetccl.launch_info()
    assert info is not None
    if info.rank == bad:
        raise ValueError(f"rank {info.rank} fails on purpose")
    return info.rank


@pytest.mark.timeout(TIMEOUT)
def test_launcher_reports_the_failing_rank() -> None:
    assert hetccl.launch(_failing_rank, 3, None, timeout=60) == [0, 1, 2]
    with pytest.raises(hetccl.LaunchError) as err:
        hetccl.launch(_failing_rank, 3, 1, timeout=60)
    assert err.value.rank == 1
    assert "fails on purpose" in str(err.value) and "ValueError" in str(err.value)


def _rank_sees(names: Tuple[str, ...]) -> Tuple[Dict[str, Optional[str]], str]:
    """A launched rank's view: the variables `names` and the pipeline-chunk
    knob as its library read it."""
    from hetccl.cli import knobs

    value = {k[0]: k[3] for k in knobs()}["HETCCL_PIPELINE_CHUNK"]
    return {n: os.environ.get(n) for n in names}, value


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_launch_gives_each_rank_the_environment_of_the_launch(
        method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Either start method gives a rank this process's environment as it is
    at the launch (a forkserver's own is from when it started, at the first
    launch here or earlier) and a library of its own that reads its knobs
    from it."""
    names = ("T_GONE", "T_LATE")
    monkeypatch.setenv("T_GONE", "1")
    assert hetccl.launch(_rank_sees, 1, names, start_method=method, timeout=60) == [
        ({"T_GONE": "1", "T_LATE": None}, str(1 << 20))]  # the knob's default
    monkeypatch.delenv("T_GONE")
    monkeypatch.setenv("T_LATE", "yes")
    got = hetccl.launch(_rank_sees, 2, names, start_method=method, timeout=60,
                        env={"HETCCL_PIPELINE_CHUNK": "2M"})
    assert got == [({"T_GONE": None, "T_LATE": "yes"}, str(2 << 20))] * 2
    assert hetccl.launch(_rank_sees, 1, (), start_method=method, timeout=60) == [
        ({}, str(1 << 20))]
    with pytest.raises(ValueError, match="'fork'.*spawn, forkserver"):
        hetccl.launch(_rank_sees, 1, (), start_method="fork")


def rank_last_error() -> Dict[str, str]:
    """ncclGetLastError(comm) follows the communicator's last call: the
    message of the last failure, "" once a call succeeds. Through the C ABI
    as a C program makes the calls."""
    import ctypes

    from hetccl import _lib

    L = ctypes.CDLL(str(_lib.loaded_path()))
    L.ncclGetLastError.restype = ctypes.c_char_p
    L.ncclGetLastError.argtypes = [ctypes.c_void_p]
    for fn in ("ncclAllReduce", "ncclCommRegister", "ncclCommCount"):
        getattr(L, fn).restype = ctypes.c_int
    comm = NcclCommunicator(1, nccl.get_unique_id(), 0)
    h = ctypes.c_void_p(comm.comm)
    buf = np.zeros(4, dtype=np.float32)
    b = ctypes.c_void_p(buf.ctypes.data)
    last = lambda: L.ncclGetLastError(h).decode()  # noqa: E731
    out = {"allreduce": str(L.ncclAllReduce(b, b, ctypes.c_size_t(4), 99, 0, h, None))}
    out["after allreduce"] = last()
    handle = ctypes.c_void_p()
    out["register"] = str(L.ncclCommRegister(h, None, ctypes.c_size_t(10), ctypes.byref(handle)))
    out["after register"] = last()
    count = ctypes.c_int()
    out["count"] = str(L.ncclCommCount(h, ctypes.byref(count)))
    out["after count"] = last()
    comm.destroy()
    return out


@pytest.mark.timeout(TIMEOUT)
def test_last_error_follows_the_last_call() -> None:
    got = hetccl.launch(rank_last_error, 1, timeout=TIMEOUT - 10)[0]
    assert got["allreduce"] == "4" and "ncclAllReduce" in got["after allreduce"], got
    assert "99" in got["after allreduce"], got
    assert got["register"] == "4" and "ncclCommRegister" in got["after register"], got
    assert "ncclAllReduce" not in got["after register"], got
    assert got["count"] == "0" and got["after count"] == "", got


CUDA_INIT_SCRIPT = """
from hetccl import nccl
from hetccl.errors import NcclError, last_error
from hetccl.nccl import NcclCommunicator
try:
    NcclCommunicator(1, nccl.get_unique_id(), 0).destroy()
    print("RESULT ok")
except NcclError as e:
    print("RESULT", e.name)
    print("LAST", last_error())
"""


@pytest.mark.timeout(TIMEOUT)
def test_one_warn_per_failure(tmp_path: Path) -> None:
    """HETCCL_DEVICE=cuda where CUDA cannot run: the failure is WARNed once,
    by the runtime that met it; comm init adds where it happened to the
    message (ncclGetLastError), not a second WARN line."""
    from hetccl.cli import runtimes

    if any(name == "cuda" and ok for name, ok, _ in runtimes()):
        pytest.skip("CUDA works here")
    log = tmp_path / "warn.log"
    env = {**os.environ, "HETCCL_DEVICE": "cuda", "NCCL_DEBUG": "WARN",
           "NCCL_DEBUG_FILE": str(log)}
    env.pop("HETCCL_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", CUDA_INIT_SCRIPT], capture_output=True,
                          text=True, timeout=TIMEOUT - 10, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert out.get("RESULT") == "ncclUnhandledCudaError", proc.stdout
    warns = [ln for ln in log.read_text().splitlines() if " WARN " in ln]
    assert len(warns) == 1, warns
    # The one line names the CUDA call or library that failed ...
    assert "cuda: " in warns[0] and ("cudaGetDevice" in warns[0] or "libcudart" in warns[0]), warns
    # ... and the message the program reads has the context in front of it.
    cause = warns[0].split(" WARN ", 1)[1]
    last = out.get("LAST", "")
    assert "ncclCommInitRank: cannot read the current cuda device: " + cause in last, (last, cause)
