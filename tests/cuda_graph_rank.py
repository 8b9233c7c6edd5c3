"""One rank of tests/test_cuda_graph.py: collectives and send/recv between
islands (two processes on one GPU, three in mode three, which hetccl serves
on its data plane, never NCCL) captured into CUDA graphs and replayed.

The library is driven as vLLM's pynccl wrapper drives NCCL: libhetccl.so
opened with ctypes, each function's argtypes declared, ncclUniqueId (128
bytes) passed by value, torch.cuda.set_device(0), and the stream argument
torch.cuda.current_stream().cuda_stream at the time of the call (inside
`torch.cuda.graph`, the capture stream). Every value is an integer held in
float32, so every result is checked exactly (torch.equal).

Environment:
  T_LIB           path of libhetccl.so (mode dist: what LD_PRELOAD names; the
                  rank checks that torch's calls are bound to it)
  T_RANK, T_NRANKS  this rank, the number of ranks (the test runs 2; 3 for
                  mode three)
  T_ID_FILE       rank 0 writes the 128-byte unique id there, others read it;
                  mode refuse also passes rank 0's capture outcome beside it
                  (T_ID_FILE + ".capture")
  T_MODE          capture     scenario 1: all_reduce 4 MiB, all_reduce
                              1 MiB in place, all_gather, reduce_scatter,
                              broadcast (root 0), AlltoAll in place (blocks
                              of just over one 4 MiB piece) and a send/recv
                              pair in a group, captured in one graph;
                              T_REPLAYS replays with new inputs, every
                              output checked; every 10th iteration the same
                              calls eagerly on other tensors, before or after
                              the replay, with no synchronisation between
                  two_graphs  scenario 2: that graph and a second one (a 1 KiB
                              in-place all_reduce and a 64 MiB all_gather),
                              replayed alternately, T_ROUNDS rounds
                  timing      scenario 3: a 4 MiB all_reduce alone in a graph,
                              mean time per replay (cuda events, 200 replays)
                              beside the eager call's (200 calls)
                  dist        scenario 4: torch.distributed's "nccl" backend
                              with libhetccl.so in LD_PRELOAD: dist.all_reduce
                              captured, 20 replays; first reports which
                              library torch's NCCL calls are bound to, and
                              "skip" when LD_PRELOAD cannot replace it
                  refuse      scenario 5: rank 1 a host rank (the test sets
                              HETCCL_DEVICE=host for it, CPU tensors here):
                              rank 0's captured all_reduce must be refused
                              (ncclInvalidUsage, "captured into a graph" in
                              ncclGetLastError(comm)); rank 1 makes no call
                              for it; both then make one eager all_reduce
                  three       scenario 6, T_NRANKS=3 (three processes on
                              cuda:0): all_reduce 1 MiB, all_reduce 64 KiB in
                              place, reduce (root 1), all_gather,
                              reduce_scatter, broadcast (root 2), AlltoAll
                              out of place and in place, Gather (root 0),
                              Scatter (root 1) and a ring of send/recv in a
                              group, odd counts for most, captured in one
                              graph; T_REPLAYS replays with new inputs, every
                              output checked on every rank (a rooted call's
                              where it is defined: Reduce's and Gather's on
                              their root); every 5th iteration the same calls
                              eagerly on other tensors, before or after the
                              replay, with no synchronisation between
                  cpu         scenario 1's calls (and mode three's when
                              T_NRANKS >= 3) eagerly on CPU tensors (host
                              ranks, no GPU): how the script itself is checked
                              on a machine without one; not used by the test
  T_REPLAYS       mode capture's replays (default 100), mode three's
                  (default 30)
  T_ROUNDS        mode two_graphs' rounds (default 30)
  T_CAPTURE_MODE  torch.cuda.graph's capture_error_mode (default "global",
                  torch's default; "thread_local" is NCCL's advice for
                  multi-threaded programs, "relaxed")
  T_DEADLINE      seconds after which the rank prints every thread's Python
                  stack and exits 1 (default 100): nothing waits forever
  mode dist also reads torch's env://: MASTER_ADDR, MASTER_PORT, RANK,
  WORLD_SIZE (and LOCAL_RANK), and needs LD_PRELOAD set at exec.
No HETCCL_* variable is needed or set here; those the rank inherited are
listed in its result ("hetccl_env").

Prints "TIMING all_reduce 4MiB eager_us=... replay_us=..." (mode timing),
"PRELOAD ..." lines (mode dist) and one line "RESULT {json}": what every
check found; lists named *_bad hold the first mismatches (iteration, what,
index, got, want), empty when all is well. On an exception the RESULT line
carries "error" (and the traceback is printed) and the exit status is 1.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import mmap
import os
import re
import struct
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from rank_procs import publish, wait_for

RANK = int(os.environ.get("T_RANK", os.environ.get("RANK", "0")))
N = int(os.environ.get("T_NRANKS", os.environ.get("WORLD_SIZE", "2")))
MODE = os.environ.get("T_MODE", "capture")
CAPTURE_MODE = os.environ.get("T_CAPTURE_MODE", "global")
DEADLINE_S = float(os.environ.get("T_DEADLINE", "100"))
LIB_PATH = os.environ.get("T_LIB", "")
MAX_BAD = 10  # mismatches kept per list

faulthandler.dump_traceback_later(DEADLINE_S, exit=True)

import torch  # noqa: E402  (after the deadline: the import itself can stall)

# --- the NCCL API through ctypes, declared as vLLM's pynccl_wrapper does -----------

ncclResult_t = ctypes.c_int
ncclComm_t = ctypes.c_void_p
ncclDataType_t = ctypes.c_int
ncclRedOp_t = ctypes.c_int
cudaStream_t = ctypes.c_void_p
buffer_type = ctypes.c_void_p

NCCL_SUCCESS, NCCL_INVALID_USAGE = 0, 5
NCCL_FLOAT32, NCCL_SUM = 7, 0


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


@dataclass
class Function:
    name: str
    restype: Any
    argtypes: List[Any]


EXPORTED = [
    Function("ncclGetErrorString", ctypes.c_char_p, [ncclResult_t]),
    Function("ncclGetVersion", ncclResult_t, [ctypes.POINTER(ctypes.c_int)]),
    Function("ncclGetUniqueId", ncclResult_t, [ctypes.POINTER(ncclUniqueId)]),
    Function("ncclCommInitRank", ncclResult_t,
             [ctypes.POINTER(ncclComm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int]),
    Function("ncclAllReduce", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ncclRedOp_t,
              ncclComm_t, cudaStream_t]),
    Function("ncclAllGather", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ncclComm_t,
              cudaStream_t]),
    Function("ncclReduceScatter", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ncclRedOp_t,
              ncclComm_t, cudaStream_t]),
    Function("ncclBroadcast", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ctypes.c_int,
              ncclComm_t, cudaStream_t]),
    Function("ncclReduce", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ncclRedOp_t,
              ctypes.c_int, ncclComm_t, cudaStream_t]),
    Function("ncclAlltoAll", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ncclComm_t,
              cudaStream_t]),
    Function("ncclGather", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ctypes.c_int,
              ncclComm_t, cudaStream_t]),
    Function("ncclScatter", ncclResult_t,
             [buffer_type, buffer_type, ctypes.c_size_t, ncclDataType_t, ctypes.c_int,
              ncclComm_t, cudaStream_t]),
    Function("ncclSend", ncclResult_t,
             [buffer_type, ctypes.c_size_t, ncclDataType_t, ctypes.c_int, ncclComm_t,
              cudaStream_t]),
    Function("ncclRecv", ncclResult_t,
             [buffer_type, ctypes.c_size_t, ncclDataType_t, ctypes.c_int, ncclComm_t,
              cudaStream_t]),
    Function("ncclGroupStart", ncclResult_t, []),
    Function("ncclGroupEnd", ncclResult_t, []),
    Function("ncclCommDestroy", ncclResult_t, [ncclComm_t]),
    Function("ncclGetLastError", ctypes.c_char_p, [ncclComm_t]),
    Function("ncclCommGetAsyncError", ncclResult_t, [ncclComm_t, ctypes.POINTER(ncclResult_t)]),
]


class NcclError(RuntimeError):
    pass


class NCCLLibrary:
    """The functions above, looked up once in `path`."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.fn: Dict[str, Any] = {}
        for f in EXPORTED:
            fn = getattr(self.lib, f.name)
            fn.restype, fn.argtypes = f.restype, f.argtypes
            self.fn[f.name] = fn

    def last_error(self, comm: Optional[ncclComm_t]) -> str:
        return (self.fn["ncclGetLastError"](comm) or b"").decode(errors="replace")

    def check(self, rc: int, what: str, comm: Optional[ncclComm_t] = None) -> None:
        if rc != NCCL_SUCCESS:
            text = (self.fn["ncclGetErrorString"](rc) or b"").decode()
            raise NcclError(f"{what} returned {rc} ({text}): {self.last_error(comm)}")

    def unique_id(self) -> ncclUniqueId:
        uid = ncclUniqueId()
        self.check(self.fn["ncclGetUniqueId"](ctypes.byref(uid)), "ncclGetUniqueId")
        return uid

    def version(self) -> int:
        v = ctypes.c_int()
        self.check(self.fn["ncclGetVersion"](ctypes.byref(v)), "ncclGetVersion")
        return v.value


def ptr(t: torch.Tensor) -> buffer_type:
    return buffer_type(t.data_ptr())


class Communicator:
    """One communicator; each call returns NCCL's result (call it through
    `ok` to raise instead). The stream is the current one of torch at the
    time of the call, or NULL for CPU tensors (a host rank)."""

    def __init__(self, nccl: NCCLLibrary, nranks: int, uid: ncclUniqueId, rank: int):
        self.nccl, self.fn = nccl, nccl.fn
        self.comm = ncclComm_t()
        nccl.check(self.fn["ncclCommInitRank"](ctypes.byref(self.comm), nranks, uid, rank),
                   "ncclCommInitRank")

    @staticmethod
    def stream(t: torch.Tensor) -> cudaStream_t:
        if t.device.type != "cuda":
            return cudaStream_t(None)
        return cudaStream_t(torch.cuda.current_stream(t.device).cuda_stream)

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor) -> int:
        return self.fn["ncclAllReduce"](ptr(send), ptr(recv), send.numel(), NCCL_FLOAT32,
                                        NCCL_SUM, self.comm, self.stream(send))

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> int:
        return self.fn["ncclAllGather"](ptr(send), ptr(recv), send.numel(), NCCL_FLOAT32,
                                        self.comm, self.stream(send))

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor) -> int:
        return self.fn["ncclReduceScatter"](ptr(send), ptr(recv), recv.numel(), NCCL_FLOAT32,
                                            NCCL_SUM, self.comm, self.stream(send))

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> int:
        return self.fn["ncclBroadcast"](ptr(send), ptr(recv), recv.numel(), NCCL_FLOAT32, root,
                                        self.comm, self.stream(recv))

    def reduce(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> int:
        return self.fn["ncclReduce"](ptr(send), ptr(recv), send.numel(), NCCL_FLOAT32, NCCL_SUM,
                                     root, self.comm, self.stream(send))

    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor) -> int:
        """ncclAlltoAll: count is what goes to each rank (recv holds N blocks)."""
        return self.fn["ncclAlltoAll"](ptr(send), ptr(recv), recv.numel() // N, NCCL_FLOAT32,
                                       self.comm, self.stream(send))

    def gather(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> int:
        return self.fn["ncclGather"](ptr(send), ptr(recv), send.numel(), NCCL_FLOAT32, root,
                                     self.comm, self.stream(send))

    def scatter(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> int:
        return self.fn["ncclScatter"](ptr(send), ptr(recv), recv.numel(), NCCL_FLOAT32, root,
                                      self.comm, self.stream(recv))

    def send(self, t: torch.Tensor, peer: int) -> int:
        return self.fn["ncclSend"](ptr(t), t.numel(), NCCL_FLOAT32, peer, self.comm,
                                   self.stream(t))

    def recv(self, t: torch.Tensor, peer: int) -> int:
        return self.fn["ncclRecv"](ptr(t), t.numel(), NCCL_FLOAT32, peer, self.comm,
                                   self.stream(t))

    def group_start(self) -> int:
        return self.fn["ncclGroupStart"]()

    def group_end(self) -> int:
        return self.fn["ncclGroupEnd"]()

    def last_error(self) -> str:
        return self.nccl.last_error(self.comm)

    def ok(self, rc: int, what: str) -> None:
        self.nccl.check(rc, what, self.comm)

    def async_error(self) -> int:
        err = ncclResult_t(-1)
        self.ok(self.fn["ncclCommGetAsyncError"](self.comm, ctypes.byref(err)),
                "ncclCommGetAsyncError")
        return err.value

    def destroy(self) -> None:
        self.ok(self.fn["ncclCommDestroy"](self.comm), "ncclCommDestroy")


def exchange_id(nccl: NCCLLibrary) -> ncclUniqueId:
    path = os.environ["T_ID_FILE"]
    uid = ncclUniqueId()
    if RANK == 0:
        uid = nccl.unique_id()
        publish(path, bytes(uid))  # the raw 128 bytes
    else:
        ctypes.memmove(ctypes.byref(uid), wait_for(path, 60), 128)
    return uid


# --- values and checks -------------------------------------------------------------------


def pattern(count: int, rank: int, it: int, salt: int, dev: torch.device) -> torch.Tensor:
    """Integers below 2**12 in float32, different for every rank, iteration
    and salt (it < 300), so that sums over ranks are exact and a stale result
    shows."""
    i = torch.arange(count, device=dev, dtype=torch.int64)
    return ((i * 7 + salt * 131 + it * 3) % 1021 + 1 + 1000 * rank).to(torch.float32)


def mismatch(what: str, it: int, got: torch.Tensor, want: torch.Tensor) -> Optional[dict]:
    if torch.equal(got, want):
        return None
    if got.shape != want.shape:
        return {"it": it, "what": what, "shape": [list(got.shape), list(want.shape)]}
    wrong = (got != want).nonzero().flatten()
    i = int(wrong[0])
    return {"it": it, "what": what, "index": i, "got": float(got[i]), "want": float(want[i]),
            "wrong": int(wrong.numel()), "of": int(got.numel())}


def keep(bad: List[dict], found: List[Optional[dict]]) -> None:
    for b in found:
        if b is not None and len(bad) < MAX_BAD:
            bad.append(b)


def failure_log(comm: "Communicator") -> tuple:
    """call(what, rc), which keeps each failed call's name, code and
    message, and the list it keeps them in."""
    failed: List[dict] = []

    def call(what: str, rc: int) -> None:
        if rc != NCCL_SUCCESS:
            failed.append({"call": what, "rc": rc, "error": comm.last_error()})
    return call, failed


class CollSet:
    """Scenario 1's calls over buffers of their own: 4 MiB all_reduce, 1 MiB
    all_reduce in place, all_gather, reduce_scatter (sum), broadcast from
    rank 0, AlltoAll in place, and a send to the next rank with a receive
    from the previous one in one group. The counts other than the
    all_reduces' are odd on purpose; the AlltoAll's blocks are just over
    one data-plane piece (4 MiB by default), so each block's receive waits
    until both pieces of its send have left (the in-place waits)."""

    AR, AG, RS, BC, SR = 1 << 20, (1 << 18) + 5, (1 << 18) + 3, (1 << 18) + 1, (1 << 18) + 7
    ARI, A2A = 1 << 18, (1 << 20) + 5  # in place; A2A: elements per rank

    def __init__(self, comm: Communicator, dev: torch.device, salt: int):
        self.comm, self.dev, self.salt = comm, dev, salt
        e = lambda n: torch.empty(n, dtype=torch.float32, device=dev)  # noqa: E731
        self.ar_in, self.ar_out = e(self.AR), e(self.AR)
        self.ari = e(self.ARI)
        self.ag_in, self.ag_out = e(self.AG), e(self.AG * N)
        self.rs_in, self.rs_out = e(self.RS * N), e(self.RS)
        self.bc_in, self.bc_out = e(self.BC), e(self.BC)
        self.a2a = e(self.A2A * N)
        self.sr_in, self.sr_out = e(self.SR), e(self.SR)

    def _p(self, count: int, rank: int, it: int, k: int) -> torch.Tensor:
        return pattern(count, rank, it, self.salt + k, self.dev)

    def fill(self, it: int) -> None:
        """New inputs for iteration `it`, outputs set to -1 (stream order)."""
        self.ar_in.copy_(self._p(self.AR, RANK, it, 0))
        self.ag_in.copy_(self._p(self.AG, RANK, it, 1))
        self.rs_in.copy_(self._p(self.RS * N, RANK, it, 2))
        self.bc_in.copy_(self._p(self.BC, RANK, it, 3))
        self.sr_in.copy_(self._p(self.SR, RANK, it, 4))
        self.ari.copy_(self._p(self.ARI, RANK, it, 5))
        self.a2a.copy_(self._p(self.A2A * N, RANK, it, 6))
        for t in (self.ar_out, self.ag_out, self.rs_out, self.bc_out, self.sr_out):
            t.fill_(-1)

    def issue(self) -> List[dict]:
        """The calls on the current stream; the failed ones (none when all is
        well), not raised, so that a capture is always ended."""
        c = self.comm
        call, failed = failure_log(c)

        call("ncclAllReduce", c.all_reduce(self.ar_in, self.ar_out))
        call("ncclAllReduce(in place)", c.all_reduce(self.ari, self.ari))
        call("ncclAllGather", c.all_gather(self.ag_in, self.ag_out))
        call("ncclReduceScatter", c.reduce_scatter(self.rs_in, self.rs_out))
        call("ncclBroadcast", c.broadcast(self.bc_in, self.bc_out, 0))
        call("ncclAlltoAll(in place)", c.all_to_all(self.a2a, self.a2a))
        call("ncclGroupStart", c.group_start())
        call("ncclSend", c.send(self.sr_in, (RANK + 1) % N))
        call("ncclRecv", c.recv(self.sr_out, (RANK - 1) % N))
        call("ncclGroupEnd", c.group_end())
        return failed

    def check(self, it: int, tag: str) -> List[Optional[dict]]:
        """Every output against what the ranks' inputs of `it` give (call
        after the work is done; the in-place calls' from the patterns that
        fill() put in their buffers before the call, never from the buffers)."""
        p = self._p
        ar = sum(p(self.AR, r, it, 0) for r in range(N))
        ari = sum(p(self.ARI, r, it, 5) for r in range(N))
        ag = torch.cat([p(self.AG, r, it, 1) for r in range(N)])
        rs = sum(p(self.RS * N, r, it, 2) for r in range(N))[RANK * self.RS:(RANK + 1) * self.RS]
        a2a = torch.cat([p(self.A2A * N, r, it, 6)[RANK * self.A2A:(RANK + 1) * self.A2A]
                         for r in range(N)])
        return [mismatch(f"{tag}/all_reduce", it, self.ar_out, ar),
                mismatch(f"{tag}/all_reduce_inplace", it, self.ari, ari),
                mismatch(f"{tag}/all_gather", it, self.ag_out, ag),
                mismatch(f"{tag}/reduce_scatter", it, self.rs_out, rs),
                mismatch(f"{tag}/broadcast", it, self.bc_out, p(self.BC, 0, it, 3)),
                mismatch(f"{tag}/alltoall_inplace", it, self.a2a, a2a),
                mismatch(f"{tag}/recv", it, self.sr_out, p(self.SR, (RANK - 1) % N, it, 4))]


class SecondSet:
    """Scenario 2's calls: a 1 KiB all_reduce in place and a 64 MiB
    all_gather (its output: 64 MiB / N from each rank)."""

    AR = 256
    AG = (64 << 20) // 4 // N

    def __init__(self, comm: Communicator, dev: torch.device, salt: int):
        self.comm, self.dev, self.salt = comm, dev, salt
        self.ar = torch.empty(self.AR, dtype=torch.float32, device=dev)
        self.ag_in = torch.empty(self.AG, dtype=torch.float32, device=dev)
        self.ag_out = torch.empty(self.AG * N, dtype=torch.float32, device=dev)

    def fill(self, it: int) -> None:
        self.ar.copy_(pattern(self.AR, RANK, it, self.salt, self.dev))
        self.ag_in.copy_(pattern(self.AG, RANK, it, self.salt + 1, self.dev))
        self.ag_out.fill_(-1)

    def issue(self) -> List[dict]:
        c, failed = self.comm, []
        for what, rc in (("ncclAllReduce(in place)", c.all_reduce(self.ar, self.ar)),
                         ("ncclAllGather", c.all_gather(self.ag_in, self.ag_out))):
            if rc != NCCL_SUCCESS:
                failed.append({"call": what, "rc": rc, "error": c.last_error()})
        return failed

    def check(self, it: int, tag: str) -> List[Optional[dict]]:
        ar = sum(pattern(self.AR, r, it, self.salt, self.dev) for r in range(N))
        ag = torch.cat([pattern(self.AG, r, it, self.salt + 1, self.dev) for r in range(N)])
        return [mismatch(f"{tag}/all_reduce_inplace_1KiB", it, self.ar, ar),
                mismatch(f"{tag}/all_gather_64MiB", it, self.ag_out, ag)]


class ThreeSet:
    """Mode three's calls (written for any N >= 3; the roots are ranks 0, 1
    and 2) over buffers of their own: all_reduce 1 MiB out of place and
    64 KiB in place, reduce (sum) to rank 1, all_gather, reduce_scatter
    (sum), broadcast from rank 2, AlltoAll out of place and in place, Gather
    to rank 0, Scatter from rank 1, and a send to the next rank with a
    receive from the previous one in one group. Most counts are odd, so that
    the rings' chunks are uneven; the in-place AlltoAll's blocks are just
    over one data-plane piece (4 MiB by default), so each block's receive
    waits for both pieces of its send. Every rank has every buffer; a rooted
    call's buffers that only the root uses are filled on every rank all the
    same, and only the outputs that are defined are checked."""

    AR, ARI = 1 << 18, 1 << 14             # all_reduce; in place
    RD, RD_ROOT = (1 << 16) + 3, 1         # reduce
    AG = 4099                              # all_gather, per rank
    RS = (1 << 15) + 1                     # reduce_scatter, per rank
    BC, BC_ROOT = (1 << 16) + 5, 2         # broadcast
    A2A, A2AI = 4099, (1 << 20) + 3        # AlltoAll per rank; in place
    GA, GA_ROOT = 4101, 0                  # Gather, per rank
    SC, SC_ROOT = (1 << 14) + 3, 1         # Scatter, per rank
    SR = (1 << 16) + 7                     # send/recv ring

    def __init__(self, comm: Communicator, dev: torch.device, salt: int):
        if N < 3:
            raise RuntimeError(f"mode three's calls need 3 ranks or more, not {N}")
        self.comm, self.dev, self.salt = comm, dev, salt
        e = lambda n: torch.empty(n, dtype=torch.float32, device=dev)  # noqa: E731
        self.ar_in, self.ar_out = e(self.AR), e(self.AR)
        self.ari = e(self.ARI)
        self.rd_in, self.rd_out = e(self.RD), e(self.RD)
        self.ag_in, self.ag_out = e(self.AG), e(self.AG * N)
        self.rs_in, self.rs_out = e(self.RS * N), e(self.RS)
        self.bc_in, self.bc_out = e(self.BC), e(self.BC)
        self.a2a_in, self.a2a_out = e(self.A2A * N), e(self.A2A * N)
        self.a2ai = e(self.A2AI * N)
        self.ga_in, self.ga_out = e(self.GA), e(self.GA * N)
        self.sc_in, self.sc_out = e(self.SC * N), e(self.SC)
        self.sr_in, self.sr_out = e(self.SR), e(self.SR)

    def _p(self, count: int, rank: int, it: int, k: int) -> torch.Tensor:
        return pattern(count, rank, it, self.salt + k, self.dev)

    def fill(self, it: int) -> None:
        """New inputs for iteration `it` (the in-place calls' buffers
        included), outputs set to -1 (stream order)."""
        for t, k in ((self.ar_in, 0), (self.ari, 1), (self.rd_in, 2), (self.ag_in, 3),
                     (self.rs_in, 4), (self.bc_in, 5), (self.a2a_in, 6), (self.a2ai, 7),
                     (self.ga_in, 8), (self.sc_in, 9), (self.sr_in, 10)):
            t.copy_(self._p(t.numel(), RANK, it, k))
        for t in (self.ar_out, self.rd_out, self.ag_out, self.rs_out, self.bc_out,
                  self.a2a_out, self.ga_out, self.sc_out, self.sr_out):
            t.fill_(-1)

    def issue(self) -> List[dict]:
        """The calls on the current stream; the failed ones (none when all is
        well), not raised, so that a capture is always ended."""
        c = self.comm
        call, failed = failure_log(c)

        call("ncclAllReduce", c.all_reduce(self.ar_in, self.ar_out))
        call("ncclAllReduce(in place)", c.all_reduce(self.ari, self.ari))
        call("ncclReduce", c.reduce(self.rd_in, self.rd_out, self.RD_ROOT))
        call("ncclAllGather", c.all_gather(self.ag_in, self.ag_out))
        call("ncclReduceScatter", c.reduce_scatter(self.rs_in, self.rs_out))
        call("ncclBroadcast", c.broadcast(self.bc_in, self.bc_out, self.BC_ROOT))
        call("ncclAlltoAll", c.all_to_all(self.a2a_in, self.a2a_out))
        call("ncclAlltoAll(in place)", c.all_to_all(self.a2ai, self.a2ai))
        call("ncclGather", c.gather(self.ga_in, self.ga_out, self.GA_ROOT))
        call("ncclScatter", c.scatter(self.sc_in, self.sc_out, self.SC_ROOT))
        call("ncclGroupStart", c.group_start())
        call("ncclSend", c.send(self.sr_in, (RANK + 1) % N))
        call("ncclRecv", c.recv(self.sr_out, (RANK - 1) % N))
        call("ncclGroupEnd", c.group_end())
        return failed

    def outputs(self) -> List[str]:
        """The names of the outputs check() compares on this rank."""
        names = ["all_reduce", "all_reduce_inplace", "all_gather", "reduce_scatter",
                 "broadcast", "alltoall", "alltoall_inplace", "scatter", "recv"]
        if RANK == self.RD_ROOT:
            names.append("reduce")
        if RANK == self.GA_ROOT:
            names.append("gather")
        return names

    def check(self, it: int, tag: str) -> List[Optional[dict]]:
        """Every output defined on this rank against what the ranks' inputs
        of `it` give (call after the work is done; the in-place calls' from
        the patterns that fill() put in their buffers before the call, never
        from the buffers)."""
        p, ranks = self._p, range(N)

        def mine(t: torch.Tensor, per: int) -> torch.Tensor:  # this rank's block of N
            return t[RANK * per:(RANK + 1) * per]

        want = {
            "all_reduce": sum(p(self.AR, r, it, 0) for r in ranks),
            "all_reduce_inplace": sum(p(self.ARI, r, it, 1) for r in ranks),
            "all_gather": torch.cat([p(self.AG, r, it, 3) for r in ranks]),
            "reduce_scatter": mine(sum(p(self.RS * N, r, it, 4) for r in ranks), self.RS),
            "broadcast": p(self.BC, self.BC_ROOT, it, 5),
            "alltoall": torch.cat([mine(p(self.A2A * N, r, it, 6), self.A2A) for r in ranks]),
            "alltoall_inplace": torch.cat([mine(p(self.A2AI * N, r, it, 7), self.A2AI)
                                           for r in ranks]),
            "scatter": mine(p(self.SC * N, self.SC_ROOT, it, 9), self.SC),
            "recv": p(self.SR, (RANK - 1) % N, it, 10),
        }
        got = {"all_reduce": self.ar_out, "all_reduce_inplace": self.ari,
               "all_gather": self.ag_out, "reduce_scatter": self.rs_out,
               "broadcast": self.bc_out, "alltoall": self.a2a_out,
               "alltoall_inplace": self.a2ai, "scatter": self.sc_out, "recv": self.sr_out}
        if RANK == self.RD_ROOT:
            want["reduce"], got["reduce"] = sum(p(self.RD, r, it, 2) for r in ranks), self.rd_out
        if RANK == self.GA_ROOT:
            want["gather"] = torch.cat([p(self.GA, r, it, 8) for r in ranks])
            got["gather"] = self.ga_out
        return [mismatch(f"{tag}/{name}", it, got[name], want[name]) for name in self.outputs()]


# --- capture -------------------------------------------------------------------------------


def warm_up(issue: Callable[[], List[dict]], stream: "torch.cuda.Stream") -> List[dict]:
    """torch's pattern: the eager calls once on a side stream that waits for
    the current one, which then waits for it."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        failed = issue()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return failed


def capture(issue: Callable[[], Any], stream: Optional["torch.cuda.Stream"] = None):
    """`issue` inside `with torch.cuda.graph(g)` (on `stream`, else torch's
    own capture stream). Returns the graph and what happened: issue's
    answer, an exception of the capture (torch raises at its end when the
    capture was invalidated), torch's warnings, and whether the stream is
    still capturing afterwards."""
    g = torch.cuda.CUDAGraph()
    info: Dict[str, Any] = {"issued": None, "exception": None}
    kwargs: Dict[str, Any] = {"capture_error_mode": CAPTURE_MODE}
    if stream is not None:
        kwargs["stream"] = stream
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.cuda.graph(g, **kwargs):
                info["issued"] = issue()
        except Exception as e:  # reported, not raised: the caller decides
            info["exception"] = f"{type(e).__name__}: {e}"[:1000]
    info["warnings"] = [str(w.message)[:300] for w in caught]
    info["capturing_after"] = bool(torch.cuda.is_current_stream_capturing())
    return g, info


def captured_or_raise(info: Dict[str, Any], what: str) -> None:
    if info["exception"] or info["issued"]:
        raise RuntimeError(f"capture of {what} failed: {json.dumps(info)}")


# --- modes ---------------------------------------------------------------------------------


def setup_ctypes(dev_kind: str = "cuda"):
    nccl = NCCLLibrary(LIB_PATH)
    dev = torch.device("cpu")
    if dev_kind == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    comm = Communicator(nccl, N, exchange_id(nccl), RANK)
    return nccl, comm, dev


def replay_loop(res: Dict[str, Any], comm: "Communicator", static: Any, eager: Any,
                replays: int, every: int, what: str) -> None:
    """Scenario 1's loop over a call set (CollSet, ThreeSet): an eager
    warm-up, the capture, then `replays` replays with new inputs, every
    output checked; every `every`-th iteration the same calls eagerly on
    `eager`'s tensors, queued before the replay or after it in turn."""
    side = torch.cuda.Stream()
    static.fill(200)
    failed = warm_up(static.issue, side)
    if failed:
        raise RuntimeError(f"eager warm-up failed: {failed}")
    res["warmup_bad"] = []
    keep(res["warmup_bad"], static.check(200, "warmup"))

    g, info = capture(static.issue, side)
    res["capture"] = info
    captured_or_raise(info, what)

    res["replay_bad"], res["eager_bad"] = [], []
    res["replays"] = res["eager_rounds"] = 0
    t0 = time.perf_counter()
    for it in range(replays):
        static.fill(it)
        with_eager = it % every == 0
        if with_eager and (it // every) % 2 == 1:  # eager calls queued before the replay
            eager.fill(it)
            failed = eager.issue()
        g.replay()
        if with_eager and (it // every) % 2 == 0:  # ... or after it
            eager.fill(it)
            failed = eager.issue()
        if with_eager and failed:
            raise RuntimeError(f"iteration {it}: eager calls failed: {failed}")
        torch.cuda.synchronize()
        keep(res["replay_bad"], static.check(it, "replay"))
        res["replays"] += 1
        if with_eager:
            keep(res["eager_bad"], eager.check(it, "eager"))
            res["eager_rounds"] += 1
    res["replay_loop_s"] = round(time.perf_counter() - t0, 3)
    res["async_error"] = comm.async_error()
    del g
    comm.destroy()


def mode_capture(res: Dict[str, Any]) -> None:
    replays = int(os.environ.get("T_REPLAYS", "100"))
    _, comm, dev = setup_ctypes()
    replay_loop(res, comm, CollSet(comm, dev, salt=11), CollSet(comm, dev, salt=23), replays,
                10, "scenario 1's calls")


def mode_two_graphs(res: Dict[str, Any]) -> None:
    rounds = int(os.environ.get("T_ROUNDS", "30"))
    _, comm, dev = setup_ctypes()
    side = torch.cuda.Stream()
    first, second = CollSet(comm, dev, salt=11), SecondSet(comm, dev, salt=37)

    res["warmup_bad"] = []
    for s in (first, second):
        s.fill(200)
        failed = warm_up(s.issue, side)
        if failed:
            raise RuntimeError(f"eager warm-up failed: {failed}")
        keep(res["warmup_bad"], s.check(200, "warmup"))

    g1, info1 = capture(first.issue, side)
    res["capture_first"] = info1
    captured_or_raise(info1, "the first graph")
    # the second on torch's own capture stream, warmed up on another one
    g2, info2 = capture(second.issue)
    res["capture_second"] = info2
    captured_or_raise(info2, "the second graph")

    res["bad"], res["rounds"] = [], 0
    for it in range(rounds):
        first.fill(it)
        second.fill(it)
        order = (g1, g2) if it % 2 == 0 else (g2, g1)
        for g in order:  # back to back, no synchronisation between them
            g.replay()
        torch.cuda.synchronize()
        keep(res["bad"], first.check(it, "first") + second.check(it, "second"))
        res["rounds"] += 1
    res["async_error"] = comm.async_error()
    del g1, g2
    comm.destroy()


def mode_timing(res: Dict[str, Any]) -> None:
    reps = 200
    _, comm, dev = setup_ctypes()
    side = torch.cuda.Stream()
    count = 1 << 20  # 4 MiB of float32
    x = pattern(count, RANK, 0, 5, dev)
    y = torch.empty(count, dtype=torch.float32, device=dev)
    want = sum(pattern(count, r, 0, 5, dev) for r in range(N))
    res["bad"] = []

    def call() -> List[dict]:
        rc = comm.all_reduce(x, y)
        return [] if rc == NCCL_SUCCESS else [{"rc": rc, "error": comm.last_error()}]

    failed = warm_up(call, side) + warm_up(call, side)
    if failed:
        raise RuntimeError(f"eager warm-up failed: {failed}")
    keep(res["bad"], [mismatch("warmup", 0, y, want)])
    g, info = capture(call, side)
    res["capture"] = info
    captured_or_raise(info, "the 4 MiB all_reduce")
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    keep(res["bad"], [mismatch("replay warm-up", 0, y, want)])

    def timed(step: Callable[[], None], what: str) -> tuple:
        y.fill_(-1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(reps):
            step()
        end.record()
        host = time.perf_counter() - t0
        end.synchronize()
        keep(res["bad"], [mismatch(what, 0, y, want)])
        return start.elapsed_time(end) * 1e3 / reps, host * 1e6 / reps

    def eager_step() -> None:
        comm.ok(comm.all_reduce(x, y), "ncclAllReduce")

    eager_us, eager_host_us = timed(eager_step, "eager")
    replay_us, replay_host_us = timed(g.replay, "replay")
    res.update(eager_us=round(eager_us, 2), replay_us=round(replay_us, 2),
               eager_host_us=round(eager_host_us, 2), replay_host_us=round(replay_host_us, 2),
               reps=reps)
    print(f"TIMING all_reduce 4MiB eager_us={eager_us:.1f} replay_us={replay_us:.1f} "
          f"rank={RANK} eager_host_us={eager_host_us:.1f} replay_host_us={replay_host_us:.1f}",
          flush=True)
    res["async_error"] = comm.async_error()
    del g
    comm.destroy()


def mode_refuse(res: Dict[str, Any]) -> None:
    """Rank 0 (CUDA) tries to capture an all_reduce on a communicator with a
    host rank; rank 1 (the host rank) makes no call for it. Rank 0 tells rank
    1 through a file whether the call was refused; only then do both make
    one more, eager, all_reduce (were it accepted, rank 0's graph would hold
    a collective rank 1 never joins: both stop there instead)."""
    host = RANK != 0
    _, comm, dev = setup_ctypes("cpu" if host else "cuda")
    res["device"] = str(dev)
    outcome_path = os.environ["T_ID_FILE"] + ".capture"
    count = 4096

    def eager(it: int, tag: str) -> None:
        x = pattern(count, RANK, it, 9, dev)
        comm.ok(comm.all_reduce(x, x), f"{tag} ncclAllReduce")
        if not host:
            torch.cuda.synchronize()
        res[f"{tag}_bad"] = []
        keep(res[f"{tag}_bad"], [mismatch(tag, it, x, sum(pattern(count, r, it, 9, dev)
                                                         for r in range(N)))])

    eager(0, "eager_before")
    if host:
        deadline = time.monotonic() + DEADLINE_S - 20
        while not os.path.exists(outcome_path):
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank 0 never said whether its capture was refused "
                                   f"({outcome_path})")
            time.sleep(0.01)
        outcome = Path(outcome_path).read_text()
    else:
        y = pattern(count, RANK, 1, 9, dev)
        torch.cuda.synchronize()
        got: Dict[str, Any] = {}

        def refused_call() -> None:
            got["rc"] = comm.all_reduce(y, y)
            got["error_comm"] = comm.last_error()
            got["error_thread"] = comm.nccl.last_error(None)
            got["capturing_inside"] = bool(torch.cuda.is_current_stream_capturing())

        outcome = "unknown"
        try:
            _, info = capture(refused_call)
            res["capture"] = info
            res.update(got)
            try:
                torch.cuda.synchronize()
                res["synchronize_after"] = "ok"
            except Exception as e:
                res["synchronize_after"] = f"{type(e).__name__}: {e}"[:500]
            outcome = "refused" if got.get("rc") not in (None, NCCL_SUCCESS) else "accepted"
        finally:
            publish(outcome_path, outcome.encode())
    res["outcome"] = outcome
    if outcome != "refused":  # rank 0's graph holds what rank 1 never joins: stop
        res["async_error"] = None
        return
    eager(2, "eager_after")
    res["async_error"] = comm.async_error()
    comm.destroy()


def mode_three(res: Dict[str, Any]) -> None:
    """Scenario 6: scenario 1's loop with ThreeSet's calls on three ranks
    (the data plane's rings and chains of three, not the two-rank
    exchange), the eager calls every 5th iteration."""
    replays = int(os.environ.get("T_REPLAYS", "30"))
    _, comm, dev = setup_ctypes()
    static, eager = ThreeSet(comm, dev, salt=41), ThreeSet(comm, dev, salt=53)
    res["checked"] = static.outputs()
    replay_loop(res, comm, static, eager, replays, 5, "mode three's calls")


def mode_cpu(res: Dict[str, Any]) -> None:
    """Scenario 1's calls, and with three ranks or more mode three's, eagerly
    on CPU tensors (host ranks)."""
    _, comm, dev = setup_ctypes("cpu")
    sets: List[Any] = [CollSet(comm, dev, salt=11)]
    if N >= 3:
        sets.append(ThreeSet(comm, dev, salt=41))
        res["checked"] = sets[1].outputs()
    res["bad"], res["rounds"] = [], 0
    for it in range(3):
        for s in sets:
            s.fill(it)
            failed = s.issue()
            if failed:
                raise RuntimeError(f"iteration {it}: {failed}")
            keep(res["bad"], s.check(it, "cpu"))
        res["rounds"] += 1
    res["async_error"] = comm.async_error()
    comm.destroy()


# --- mode dist: which library torch's NCCL calls reach -------------------------------------

SHT_RELA, SHT_DYNAMIC, SHT_DYNSYM, DT_NEEDED = 4, 6, 11, 1


def elf_dyn_refs(path: str, names: List[str]) -> Optional[Dict[str, Any]]:
    """From a 64-bit little-endian ELF file's dynamic section and symbols:
    its DT_NEEDED entries and, for each of `names`, whether it is imported
    (undefined here: bound at run time, where LD_PRELOAD comes first),
    defined here (linked in) or absent, with the file offsets of the
    relocations (GOT slots) that refer to it. None when the file is not
    such an ELF object."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            return None
        (shoff,) = struct.unpack_from("<Q", m, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        secs = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)]
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
        syms: Dict[str, Dict[str, Any]] = {n: {"status": "absent", "slots": []} for n in names}
        dynsym = next((i for i, s in enumerate(secs) if s[1] == SHT_DYNSYM), None)
        if dynsym is None:
            return {"needed": [], "symbols": syms}
        strtab = secs[secs[dynsym][6]]

        def string(tab, off: int) -> str:
            start = tab[4] + off
            return m[start:m.find(b"\0", start)].decode(errors="replace")

        needed = []
        for s in secs:
            if s[1] != SHT_DYNAMIC:
                continue
            for tag, val in struct.iter_unpack("<qQ", m[s[4]:s[4] + s[5]]):
                if tag == 0:
                    break
                if tag == DT_NEEDED:
                    needed.append(string(secs[s[6]], val))
        # every place in the string table where a name + NUL starts (tails of
        # longer names included: a symbol whose name starts there has it)
        table = m[strtab[4]:strtab[4] + strtab[5]]
        at: Dict[int, str] = {}
        for n in names:
            for mt in re.finditer(re.escape(n.encode()) + b"\0", table):
                at[mt.start()] = n
        index: Dict[int, str] = {}
        sym = secs[dynsym]
        for i, (st_name, _info, _other, shndx, _v, _s) in enumerate(
                struct.iter_unpack("<IBBHQQ", m[sym[4]:sym[4] + sym[5]])):
            n = at.get(st_name) if st_name else None
            if n is not None and syms[n]["status"] == "absent":
                syms[n]["status"] = "import" if shndx == 0 else "defined"
                index[i] = n
        if index:
            for s in secs:
                if s[1] == SHT_RELA and s[6] == dynsym:
                    for r_offset, r_info, _add in struct.iter_unpack("<QQq", m[s[4]:s[4] + s[5]]):
                        n = index.get(r_info >> 32)
                        if n is not None:
                            syms[n]["slots"].append(r_offset)
        return {"needed": needed, "symbols": syms}


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _libc_fn(name: str):
    for lib in (None, "libdl.so.2"):
        try:
            return getattr(ctypes.CDLL(lib), name)
        except (OSError, AttributeError):
            continue
    return None


def object_of(addr: Optional[int]) -> Optional[str]:
    """The file of the loaded object that holds address `addr` (dladdr)."""
    dladdr = _libc_fn("dladdr")
    if not addr or dladdr is None:
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    info = DlInfo()
    if not dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


def mappings() -> List[tuple]:
    """(start, end, perms, offset, path) of every file mapping of this process."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, parts[1], int(parts[2], 16), parts[5].strip()))
    return out


def load_base(path: str) -> Optional[int]:
    """l_addr of the loaded object `path` (dlinfo's link map), else the
    start of its mapping at file offset 0."""
    dlinfo = _libc_fn("dlinfo")
    if dlinfo is not None:
        for name in (os.path.basename(path), path):
            try:
                handle = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)._handle
            except OSError:
                continue
            lm = ctypes.c_void_p()
            dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
            if dlinfo(ctypes.c_void_p(handle), 2, ctypes.byref(lm)) == 0 and lm.value:  # RTLD_DI_LINKMAP
                return ctypes.c_size_t.from_address(lm.value).value
    real = os.path.realpath(path)
    starts = [lo for lo, _hi, _p, off, p in mappings() if off == 0 and os.path.realpath(p) == real]
    return min(starts) if starts else None


def bound_to(path: str, slots: List[int]) -> List[Optional[str]]:
    """Where the GOT slots (file offsets of relocations) of the loaded
    object `path` point now: the file of each target, `path` itself while a
    lazily bound slot has not been used yet."""
    base = load_base(path)
    if base is None:
        return []
    real = os.path.realpath(path)
    readable = [(lo, hi) for lo, hi, perms, _off, p in mappings()
                if perms.startswith("r") and os.path.realpath(p) == real]
    out = []
    for off in slots:
        addr = base + off
        if not any(lo <= addr and addr + 8 <= hi for lo, hi in readable):
            out.append(None)  # not where this reading of the file says: do not touch it
            continue
        out.append(object_of(ctypes.c_uint64.from_address(addr).value))
    return out


# torch's NCCL entry points whose binding is read: the first decides how
# torch calls NCCL; the others are used by the init, before any collective
NCCL_NAMES = ["ncclAllReduce", "ncclCommInitRankConfig", "ncclCommInitRank", "ncclGetVersion"]


def preload_probe() -> Dict[str, Any]:
    """How torch reaches NCCL in this process (import torch done): the
    libraries mapped, what ncclAllReduce and ncclGetVersion resolve to in
    the global scope, and which of torch's libraries calls NCCL and how
    (imported, or linked in)."""
    maps = sorted({p for *_rest, p in mappings()})
    probe: Dict[str, Any] = {
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "hetccl_mapped": [p for p in maps if "libhetccl" in os.path.basename(p)],
        "nccl_mapped": [p for p in maps if os.path.basename(p).startswith("libnccl")],
    }
    for name in ("ncclAllReduce", "ncclGetVersion"):
        try:
            addr = ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
            probe[f"global_{name}"] = object_of(addr)
        except AttributeError:
            probe[f"global_{name}"] = None
    libdir = Path(torch.__file__).resolve().parent / "lib"
    cands = [libdir / "libtorch_cuda.so"] + sorted(p for p in libdir.glob("*.so*")
                                                   if p.name != "libtorch_cuda.so")
    probe["torch_lib"] = None
    for cand in cands:
        if not cand.is_file() or cand.name.startswith("libnccl"):
            continue
        try:
            refs = elf_dyn_refs(str(cand), NCCL_NAMES)
        except (OSError, ValueError, struct.error) as e:
            probe.setdefault("elf_errors", []).append(f"{cand.name}: {e}")
            continue
        if refs and refs["symbols"]["ncclAllReduce"]["status"] != "absent":
            probe["torch_lib"] = str(cand)
            probe["torch_needs"] = [n for n in refs["needed"] if "nccl" in n]
            probe["torch_symbols"] = {n: v["status"] for n, v in refs["symbols"].items()}
            probe["_slots"] = {n: v["slots"] for n, v in refs["symbols"].items()}
            break
    return probe


def preload_skip(probe: Dict[str, Any]) -> Optional[str]:
    """Why LD_PRELOAD cannot replace torch's NCCL here, or None."""
    if probe["torch_lib"] is None:
        return ("no library of torch's refers to ncclAllReduce dynamically: NCCL is linked in "
                "with hidden symbols (or this torch has no NCCL); LD_PRELOAD cannot replace it")
    if probe["torch_symbols"]["ncclAllReduce"] == "defined":
        return (f"{probe['torch_lib']} defines ncclAllReduce itself (NCCL linked in statically; "
                f"its NEEDED nccl entries: {probe['torch_needs'] or 'none'}): LD_PRELOAD cannot "
                f"replace it")
    return None


def served_by(probe: Dict[str, Any], lib: str) -> Dict[str, Any]:
    """Where torch's GOT slots for NCCL_NAMES point now, and the verdict:
    "hetccl" when every bound slot points into `lib` (at least one bound),
    "other" when one points elsewhere, "unbound" when none is bound yet."""
    out: Dict[str, Any] = {}
    if probe.get("torch_lib") is None:
        return {"verdict": "unknown"}
    own, real_lib = os.path.realpath(probe["torch_lib"]), os.path.realpath(lib)
    bound: List[Optional[str]] = []
    for name, slots in probe.get("_slots", {}).items():
        if not slots:
            continue
        targets = bound_to(probe["torch_lib"], slots)
        out[name] = sorted({"(not bound yet)" if t == own else (t or "?") for t in targets})
        bound += [t for t in targets if t != own]
    if not bound:
        out["verdict"] = "unbound"
    elif all(t == real_lib for t in bound):
        out["verdict"] = "hetccl"
    else:
        out["verdict"] = "other"
    return out


def mode_dist(res: Dict[str, Any]) -> None:
    import datetime

    import torch.distributed as dist

    probe = preload_probe()
    res["probe"] = {k: v for k, v in probe.items() if not k.startswith("_")}
    for k, v in res["probe"].items():
        print(f"PRELOAD rank {RANK} {k}: {v}", flush=True)
    if not probe["hetccl_mapped"]:
        raise RuntimeError(f"libhetccl.so is not mapped in this process: LD_PRELOAD="
                           f"{probe['ld_preload']!r} did not reach it (an exec is needed)")
    reason = preload_skip(probe)
    if reason:
        res["skip"] = reason
        return
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    count = (1 << 20) + 3
    res["bad"] = []
    try:
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
        side = torch.cuda.Stream()
        x = torch.empty(count, dtype=torch.float32, device=dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream (torch's CUDA graph notes)
            for i in range(3):
                x.copy_(pattern(count, RANK, 200 + i, 3, dev))
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        keep(res["bad"], [mismatch("warmup", 202, x,
                                   sum(pattern(count, r, 202, 3, dev) for r in range(N)))])
    except Exception as e:
        res["error"] = f"init or warm-up: {type(e).__name__}: {e}"[:1500]
    res["served_by"] = served_by(probe, LIB_PATH)
    print(f"PRELOAD rank {RANK} served_by: {res['served_by']}", flush=True)
    try:
        res["torch_nccl_version"] = list(torch.cuda.nccl.version())
    except Exception as e:  # informative only
        res["torch_nccl_version"] = f"{type(e).__name__}: {e}"
    if "error" in res:
        return

    g, info = capture(lambda: dist.all_reduce(x))
    res["capture"] = info
    if info["exception"]:
        res["error"] = f"capture: {info['exception']}"
        return
    res["replays"] = 0
    for it in range(20):
        x.copy_(pattern(count, RANK, it, 3, dev))
        g.replay()
        torch.cuda.synchronize()
        keep(res["bad"], [mismatch("replay", it, x,
                                   sum(pattern(count, r, it, 3, dev) for r in range(N)))])
        res["replays"] += 1
    # eager after the replays, on the same group
    x.copy_(pattern(count, RANK, 250, 3, dev))
    dist.all_reduce(x)
    torch.cuda.synchronize()
    keep(res["bad"], [mismatch("eager after", 250, x,
                               sum(pattern(count, r, 250, 3, dev) for r in range(N)))])
    del g
    dist.destroy_process_group()


MODES = {"capture": mode_capture, "two_graphs": mode_two_graphs, "timing": mode_timing,
         "refuse": mode_refuse, "dist": mode_dist, "three": mode_three, "cpu": mode_cpu}


def main() -> int:
    res: Dict[str, Any] = {"rank": RANK, "mode": MODE, "capture_error_mode": CAPTURE_MODE,
                           "torch": torch.__version__,
                           "hetccl_env": sorted(k for k in os.environ if k.startswith("HETCCL_"))}
    try:
        MODES[MODE](res)
    except Exception as e:
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    print("RESULT " + json.dumps(res), flush=True)
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
