"""One rank of a torch.distributed job on the "hetccl" backend, checked
against gloo on the same inputs (tests/test_torch_backend.py on CPU ranks,
tools/device/torch_backend_check.py with GPU and CPU ranks mixed).

Environment: T_RANK, T_NRANKS, T_STORE (a FileStore path, new per job),
T_DEVICES (comma list, one per rank: "cpu" or "cuda:N"), T_PRELOAD (colon list
of libraries each rank loads before torch, as a CUDA build of torch loads
its runtime), T_PARTS (comma
list of "collectives", "ddp"), T_STEPS (DDP steps, default 100), T_TRACE
(set: each check's name on stderr before it runs, and a GPU rank waits for
its device after each, so an asynchronous device fault names its check).

Every input is a function of (check name, rank), so each rank runs each
collective on the hetccl group with tensors on its device and on a gloo
group with CPU copies, and compares. Where gloo lacks the collective or the
type, the reference is computed locally from every rank's inputs (the
check's "ref" says which). Values are small integers, so every reduction
is exact in any order and the comparison is exact; one check uses random
floats with a tolerance. Prints one line "RESULT {json}": each check's
ok/ref/detail, and per-step DDP losses of both backends.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import time
import traceback
import zlib
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

RANK = int(os.environ["T_RANK"])
N = int(os.environ["T_NRANKS"])
DEVICES = os.environ.get("T_DEVICES", ",".join(["cpu"] * N)).split(",")
PARTS = os.environ.get("T_PARTS", "collectives,ddp").split(",")
STEPS = int(os.environ.get("T_STEPS", "100"))
TRACE = bool(os.environ.get("T_TRACE"))
# T_PRELOAD: libraries loaded first, as a GPU build of torch loads its CUDA
# runtime (tests/c/vendor's stand-ins: a machine where every process sees
# one GPU). No HETCCL_* variable is set: a rank's kind follows its tensors.
for _path in filter(None, os.environ.get("T_PRELOAD", "").split(":")):
    ctypes.CDLL(_path, mode=ctypes.RTLD_GLOBAL)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)  # several ranks share few cores: no intra-op thread pools
DEV = torch.device(DEVICES[RANK])
if DEV.type == "cuda":
    torch.cuda.set_device(DEV)

import hetccl.torch_backend  # noqa: E402,F401  (registers "hetccl")

R = dist.ReduceOp
OPS = {"sum": R.SUM, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
GLOO: Any = None


def name_of(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def data(name: str, rank: int, shape: Tuple[int, ...], dtype: torch.dtype = torch.float32,
         lo: int = -4, hi: int = 5) -> torch.Tensor:
    """Rank `rank`'s input of check `name`: small integers in [lo, hi)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype == torch.uint8:
        lo = max(lo, 0)
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def on_dev(t: torch.Tensor) -> torch.Tensor:
    """A copy on this rank's device (never t itself: the inputs stay for gloo)."""
    return t.to(DEV, copy=True)


def same(a: torch.Tensor, b: torch.Tensor) -> Tuple[bool, str]:
    a = a.detach().cpu()
    b = b.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    if a.dtype == torch.bool:  # a bool byte must be 0 or 1, which == does not see
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    if torch.equal(a, b):
        return True, ""
    bad = (a != b).nonzero()
    i = tuple(bad[0].tolist())
    return False, f"{len(bad)} elements differ, first at {i}: {a[i].item()} vs {b[i].item()}"


def same_lists(a: List[torch.Tensor], b: List[torch.Tensor]) -> Tuple[bool, str]:
    for i, (x, y) in enumerate(zip(a, b)):
        ok, why = same(x, y)
        if not ok:
            return False, f"tensor {i}: {why}"
    return len(a) == len(b), "" if len(a) == len(b) else f"{len(a)} vs {len(b)} tensors"


def local_reduce(xs: List[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of every rank's input, computed here (float64)."""
    dtype = xs[0].dtype
    s = torch.stack([x.to(torch.float64) for x in xs])
    if dtype == torch.bool:
        s = s.bool()
        out = s.any(0) if op in ("sum", "max") else s.all(0)
        return out
    out = {"sum": lambda: s.sum(0), "product": lambda: s.prod(0), "min": lambda: s.min(0)[0],
           "max": lambda: s.max(0)[0], "avg": lambda: s.sum(0) / len(xs)}[op]()
    return out.to(dtype)


# -- the checks: each returns (ok, ref, detail) --------------------------------
Check = Callable[[], Tuple[bool, str, str]]
CHECKS: Dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def deco(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn
    return deco


def gloo_or_local(gloo_fn: Callable[[], Any], local_fn: Callable[[], Any]) -> Tuple[Any, str]:
    """gloo's answer, or the local one where gloo raises (it lacks the
    collective or the type)."""
    try:
        return gloo_fn(), "gloo"
    except (RuntimeError, ValueError, TypeError) as e:
        return local_fn(), f"local (gloo: {str(e).splitlines()[0][:80]})"


def add_all_reduce(op: str, dtype: torch.dtype) -> None:
    name = f"all_reduce/{op}/{name_of(dtype)}"
    lo, hi = (-2, 3) if op == "product" else (-9, 10)

    @check(name)
    def run() -> Tuple[bool, str, str]:
        x = data(name, RANK, (7, 5), dtype, lo, hi)
        mine = on_dev(x)
        dist.all_reduce(mine, op=OPS[op])

        def gloo() -> torch.Tensor:
            ref = x.clone()
            if op == "avg":  # gloo has no AVG: its SUM over the rank count
                dist.all_reduce(ref, op=R.SUM, group=GLOO)
                return (ref.to(torch.float64) / N).to(dtype)
            dist.all_reduce(ref, op=OPS[op], group=GLOO)
            if dtype == torch.bool:  # gloo sums the bytes (2 in a bool); NCCL's rule: or
                return ref.view(torch.uint8) != 0
            return ref
        ref, how = gloo_or_local(gloo, lambda: local_reduce(
            [data(name, r, (7, 5), dtype, lo, hi) for r in range(N)], op))
        ok, why = same(mine, ref)
        return ok, how, why


for _dtype in FLOATS + INTS + [torch.bool]:
    for _op in ("sum", "product", "min", "max"):
        add_all_reduce(_op, _dtype)
for _dtype in FLOATS:
    add_all_reduce("avg", _dtype)


@check("all_reduce/premul_sum/float32")
def _premul() -> Tuple[bool, str, str]:
    name = "all_reduce/premul_sum"
    x = data(name, RANK, (33,))
    mine = on_dev(x)
    dist.all_reduce(mine, op=dist._make_nccl_premul_sum(0.25))
    ref = x * 0.25
    dist.all_reduce(ref, group=GLOO)
    ok, why = same(mine, ref)
    return ok, "gloo (sum of x * 0.25)", why


@check("all_reduce/random_float32_1e6")
def _random() -> Tuple[bool, str, str]:
    gen = torch.Generator().manual_seed(99 + RANK)
    x = torch.randn(100_003, generator=gen)
    mine = on_dev(x)
    dist.all_reduce(mine)
    ref = x.clone()
    dist.all_reduce(ref, group=GLOO)
    # the sum's order may differ from gloo's: a rounding step of the inputs' scale
    err = (mine.cpu() - ref).abs().max().item()
    return err <= 1e-5, "gloo", f"max difference {err:.2e} (limit 1e-5, inputs ~N(0, 1))"


@check("all_reduce/non_contiguous")
def _noncontig() -> Tuple[bool, str, str]:
    x = data("nc", RANK, (6, 4))
    mine = on_dev(x).t()  # a transposed view: the backend copies it in and out
    dist.all_reduce(mine)
    ref = x.clone()
    dist.all_reduce(ref, group=GLOO)
    ok, why = same(mine.t(), ref)
    return ok, "gloo", why


@check("all_reduce/async_work")
def _async() -> Tuple[bool, str, str]:
    x = data("async", RANK, (1000,))
    mine = on_dev(x)
    work = dist.all_reduce(mine, async_op=True)
    waited = work.wait()
    fut = work.get_future()
    value = fut.wait()
    ref = x.clone()
    dist.all_reduce(ref, group=GLOO)
    ok, why = same(mine, ref)
    vok, vwhy = same(value[0], ref)
    good = ok and vok and waited is True and fut.done()
    return good, "gloo", (f"wait()={waited} future.done()={fut.done()} "
                          f"is_completed()={work.is_completed()} {why} {vwhy}").strip()


@check("all_reduce/async_goes_on")
def _goes_on() -> Tuple[bool, str, str]:
    """An async all_reduce returns before its peers have made theirs: rank
    0 publishes that its call returned, and only then do the others call.
    A call that waited for its peers would never return (the store's wait
    times out)."""
    x = data("goes_on", RANK, (1 << 16,))
    mine = on_dev(x)
    store = dist.distributed_c10d._get_default_store()
    if RANK == 0:
        work = dist.all_reduce(mine, async_op=True)
        store.set("goes_on/returned", "1")
        work.wait()
    else:
        store.wait(["goes_on/returned"], timedelta(seconds=60))
        dist.all_reduce(mine)
    ref = x.clone()
    dist.all_reduce(ref, group=GLOO)
    ok, why = same(mine, ref)
    return ok, "gloo", why


@check("all_reduce/coalesced")
def _coalesced() -> Tuple[bool, str, str]:
    xs = [data(f"coal{i}", RANK, (5 + i,)) for i in range(3)]
    mine = [on_dev(x) for x in xs]
    dist.all_reduce_coalesced(mine)
    refs = [x.clone() for x in xs]
    for r in refs:
        dist.all_reduce(r, group=GLOO)
    ok, why = same_lists(mine, refs)
    return ok, "gloo (one all_reduce each)", why


def add_broadcast(root: int, dtype: torch.dtype) -> None:
    name = f"broadcast/root{root}/{name_of(dtype)}"

    @check(name)
    def run() -> Tuple[bool, str, str]:
        x = data(name, RANK, (9, 2), dtype)
        mine = on_dev(x)
        dist.broadcast(mine, src=root)

        def gloo() -> torch.Tensor:
            ref = x.clone()
            dist.broadcast(ref, src=root, group=GLOO)
            return ref
        ref, how = gloo_or_local(gloo, lambda: data(name, root, (9, 2), dtype))
        ok, why = same(mine, ref)
        return ok, how, why


for _root in range(N):
    add_broadcast(_root, torch.float32)
add_broadcast(N - 1, torch.int16)  # no NCCL type: moved as bytes
add_broadcast(0, torch.bool)
add_broadcast(0, torch.complex64)


def add_all_gather(dtype: torch.dtype) -> None:
    name = f"all_gather/{name_of(dtype)}"

    @check(name)
    def run() -> Tuple[bool, str, str]:
        x = data(name, RANK, (4, 3), dtype)
        outs = [on_dev(torch.zeros(4, 3, dtype=dtype)) for _ in range(N)]
        dist.all_gather(outs, on_dev(x))
        refs, how = gloo_or_local(
            lambda: _gloo_all_gather(x),
            lambda: [data(name, r, (4, 3), dtype) for r in range(N)])
        ok, why = same_lists(outs, refs)
        return ok, how, why


def _gloo_all_gather(x: torch.Tensor) -> List[torch.Tensor]:
    refs = [torch.zeros_like(x) for _ in range(N)]
    dist.all_gather(refs, x, group=GLOO)
    return refs


for _dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
    add_all_gather(_dtype)


@check("all_gather/uneven")
def _ag_uneven() -> Tuple[bool, str, str]:
    x = data("agu", RANK, (RANK + 2,))
    outs = [on_dev(torch.zeros(r + 2)) for r in range(N)]
    dist.all_gather(outs, on_dev(x))
    refs = [data("agu", r, (r + 2,)) for r in range(N)]
    ok, why = same_lists(outs, refs)
    return ok, "local (gloo needs equal sizes)", why


def add_all_gather_into_tensor(dtype: torch.dtype, stacked: bool) -> None:
    name = f"all_gather_into_tensor/{name_of(dtype)}" + ("/stacked" if stacked else "")

    @check(name)
    def run() -> Tuple[bool, str, str]:
        x = data(name, RANK, (5, 3), dtype)
        shape = (N, 5, 3) if stacked else (N * 5, 3)
        out = on_dev(torch.zeros(shape, dtype=dtype))
        dist.all_gather_into_tensor(out, on_dev(x))

        def gloo() -> torch.Tensor:
            ref = torch.zeros(shape, dtype=dtype)
            dist.all_gather_into_tensor(ref, x, group=GLOO)
            return ref
        ref, how = gloo_or_local(gloo, lambda: torch.cat(
            [data(name, r, (5, 3), dtype) for r in range(N)]).view(shape))
        ok, why = same(out, ref)
        return ok, how, why


add_all_gather_into_tensor(torch.float32, False)
add_all_gather_into_tensor(torch.float32, True)
add_all_gather_into_tensor(torch.float16, False)
add_all_gather_into_tensor(torch.int32, False)


@check("all_gather_into_tensor/async_input_dropped")
def _ag_dropped() -> Tuple[bool, str, str]:
    """An asynchronous operation whose caller dropped its input before the
    work ran: the backend keeps the input alive until then (on a host rank
    the worker may make the call after the caller's frame is gone), and
    the memory torch frees after it is not written into the output."""
    x = data("dropped", RANK, (1 << 15,))
    out = on_dev(torch.zeros(N * x.numel()))

    def start() -> Any:
        return dist.all_gather_into_tensor(out, on_dev(x.clone()), async_op=True)
    work = start()
    junk = [on_dev(torch.full_like(x, -7.0)) for _ in range(8)]  # may reuse freed memory
    work.wait()
    ref = torch.zeros(N * x.numel())
    dist.all_gather_into_tensor(ref, x, group=GLOO)
    ok, why = same(out, ref)
    return ok and len(junk) == 8, "gloo", why


def add_reduce_scatter(op: str, dtype: torch.dtype) -> None:
    name = f"reduce_scatter/{op}/{name_of(dtype)}"

    @check(name)
    def run() -> Tuple[bool, str, str]:
        ins = [data(f"{name}/{i}", RANK, (6,), dtype) for i in range(N)]
        out = on_dev(torch.zeros(6, dtype=dtype))
        dist.reduce_scatter(out, [on_dev(i) for i in ins], op=OPS[op])

        def gloo() -> torch.Tensor:
            ref = torch.zeros(6, dtype=dtype)
            dist.reduce_scatter(ref, [i.clone() for i in ins], op=OPS[op], group=GLOO)
            return ref
        ref, how = gloo_or_local(gloo, lambda: local_reduce(
            [data(f"{name}/{RANK}", r, (6,), dtype) for r in range(N)], op))
        ok, why = same(out, ref)
        return ok, how, why


add_reduce_scatter("sum", torch.float32)
add_reduce_scatter("max", torch.int32)


@check("reduce_scatter/uneven")
def _rs_uneven() -> Tuple[bool, str, str]:
    ins = [data(f"rsu/{i}", RANK, (i + 1,)) for i in range(N)]
    out = on_dev(torch.zeros(RANK + 1))
    dist.reduce_scatter(out, [on_dev(i) for i in ins])
    ref = local_reduce([data(f"rsu/{RANK}", r, (RANK + 1,)) for r in range(N)], "sum")
    ok, why = same(out, ref)
    return ok, "local (gloo needs equal sizes)", why


def add_reduce_scatter_tensor(op: str, dtype: torch.dtype) -> None:
    name = f"reduce_scatter_tensor/{op}/{name_of(dtype)}"

    @check(name)
    def run() -> Tuple[bool, str, str]:
        x = data(name, RANK, (N * 4, 2), dtype)
        out = on_dev(torch.zeros(4, 2, dtype=dtype))
        dist.reduce_scatter_tensor(out, on_dev(x), op=OPS[op])

        def gloo() -> torch.Tensor:
            if op == "avg":
                raise ValueError("gloo has no AVG")
            ref = torch.zeros(4, 2, dtype=dtype)
            dist.reduce_scatter_tensor(ref, x.clone(), op=OPS[op], group=GLOO)
            return ref
        ref, how = gloo_or_local(gloo, lambda: local_reduce(
            [data(name, r, (N * 4, 2), dtype)[RANK * 4:(RANK + 1) * 4] for r in range(N)], op))
        ok, why = same(out, ref)
        return ok, how, why


add_reduce_scatter_tensor("sum", torch.float32)
add_reduce_scatter_tensor("avg", torch.float64)
add_reduce_scatter_tensor("min", torch.int64)
add_reduce_scatter_tensor("sum", torch.bfloat16)


@check("all_to_all/uneven")
def _a2a_list() -> Tuple[bool, str, str]:
    # rank r sends (r + d + 1) elements to rank d
    ins = [data(f"a2a/{RANK}->{d}", 0, (RANK + d + 1,)) for d in range(N)]
    outs = [on_dev(torch.zeros(s + RANK + 1)) for s in range(N)]
    dist.all_to_all(outs, [on_dev(i) for i in ins])

    def gloo() -> List[torch.Tensor]:
        refs = [torch.zeros(s + RANK + 1) for s in range(N)]
        dist.all_to_all(refs, [i.clone() for i in ins], group=GLOO)
        return refs
    refs, how = gloo_or_local(gloo, lambda: [data(f"a2a/{s}->{RANK}", 0, (s + RANK + 1,))
                                             for s in range(N)])
    ok, why = same_lists(outs, refs)
    return ok, how, why


def add_all_to_all_single(kind: str) -> None:
    name = f"all_to_all_single/{kind}"

    @check(name)
    def run() -> Tuple[bool, str, str]:
        width = 3
        if kind == "even":
            ins_splits = outs_splits = None
            rows_in = rows_out = 2 * N
        else:  # rank r sends (r + 2 * d) % 3 + 1 rows to rank d
            ins_splits = [(RANK + 2 * d) % 3 + 1 for d in range(N)]
            outs_splits = [(s + 2 * RANK) % 3 + 1 for s in range(N)]
            rows_in, rows_out = sum(ins_splits), sum(outs_splits)
        x = data(name, RANK, (rows_in, width))
        out = on_dev(torch.zeros(rows_out, width))
        dist.all_to_all_single(out, on_dev(x), outs_splits, ins_splits)
        ref = torch.zeros(rows_out, width)
        dist.all_to_all_single(ref, x.clone(), outs_splits, ins_splits, group=GLOO)
        ok, why = same(out, ref)
        return ok, "gloo", why


add_all_to_all_single("even")
add_all_to_all_single("uneven")


@check("send_recv/ring")
def _ring() -> Tuple[bool, str, str]:
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N
    x = data("ring", RANK, (300_001,))  # past the small-message paths
    got = on_dev(torch.zeros(300_001))
    if RANK % 2 == 0:
        dist.send(on_dev(x), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(on_dev(x), nxt)
    ok, why = same(got, data("ring", prv, (300_001,)))
    return ok, "local (the sender's input)", why


@check("send_recv/isend_irecv")
def _isend() -> Tuple[bool, str, str]:
    if N < 2:
        return True, "none", "one rank"
    got = on_dev(torch.zeros(17, dtype=torch.int64))
    if RANK == 0:
        works = [dist.isend(on_dev(data("isend", 0, (17,), torch.int64)), d) for d in range(1, N)]
        waited = all(w.wait() for w in works)
        return waited, "none", f"wait()={waited}"
    work = dist.irecv(got, 0)
    waited = work.wait()
    ok, why = same(got, data("isend", 0, (17,), torch.int64))
    return ok and waited, "local (the sender's input)", why


@check("send_recv/isend_goes_on")
def _isend_goes_on() -> Tuple[bool, str, str]:
    """isend of a large message returns before the peer receives it: rank 0
    publishes that its isend returned, and only then does rank 1 post the
    receive (a send made on the calling thread would wait for ever)."""
    if N < 2 or RANK > 1:
        return True, "none", "not in the pair"
    x = data("isend_goes_on", 0, (1 << 22,))  # 16 MiB: more than any transport buffers
    store = dist.distributed_c10d._get_default_store()
    if RANK == 0:
        work = dist.isend(on_dev(x), 1)
        store.set("isend_goes_on/returned", "1")
        return bool(work.wait()), "none", ""
    store.wait(["isend_goes_on/returned"], timedelta(seconds=60))
    got = on_dev(torch.zeros_like(x))
    dist.recv(got, 0)
    ok, why = same(got, x)
    return ok, "local (the sender's input)", why


@check("send_recv/batch_isend_irecv")
def _batch() -> Tuple[bool, str, str]:
    # every rank sends to the next and receives from the previous, sends
    # first: small messages, which the transports buffer
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N
    got = on_dev(torch.zeros(1000))
    send = on_dev(data("batch", RANK, (1000,)))
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt),
                                    dist.P2POp(dist.irecv, got, prv)])
    waited = all(w.wait() for w in works)
    ok, why = same(got, data("batch", prv, (1000,)))
    return ok and waited, "local (the sender's input)", why


@check("barrier")
def _barrier() -> Tuple[bool, str, str]:
    dist.barrier()
    t0 = time.monotonic()
    if RANK == 0:
        time.sleep(0.5)
    dist.barrier()
    waited = time.monotonic() - t0
    ok = waited >= 0.4
    return ok, "none", f"waited {waited:.2f} s for rank 0's 0.5 s"


@check("reduce/root_last")
def _reduce() -> Tuple[bool, str, str]:
    x = data("reduce", RANK, (11,))
    mine = on_dev(x)
    dist.reduce(mine, dst=N - 1)
    ref = x.clone()
    dist.reduce(ref, dst=N - 1, group=GLOO)
    if RANK != N - 1:
        return True, "gloo", "non-root output undefined"
    ok, why = same(mine, ref)
    return ok, "gloo", why


@check("gather_scatter")
def _gather_scatter() -> Tuple[bool, str, str]:
    x = data("gather", RANK, (4,))
    outs = [on_dev(torch.zeros(4)) for _ in range(N)] if RANK == 0 else None
    dist.gather(on_dev(x), outs, dst=0)
    ok, why = (same_lists(outs, [data("gather", r, (4,)) for r in range(N)])
               if RANK == 0 else (True, ""))
    pieces = [on_dev(data("scatter", r, (3,))) for r in range(N)] if RANK == N - 1 else None
    got = on_dev(torch.zeros(3))
    dist.scatter(got, pieces, src=N - 1)
    sok, swhy = same(got, data("scatter", RANK, (3,)))
    return ok and sok, "local", f"{why} {swhy}".strip()


def expect_error(fn: Callable[[], Any], kind: type, words: List[str]) -> Tuple[bool, str, str]:
    try:
        fn()
    except kind as e:
        text = str(e)
        missing = [w for w in words if w not in text]
        return not missing, "none", text[:160] + (f" (missing {missing})" if missing else "")
    except Exception as e:  # noqa: BLE001 (a wrong kind of error is the finding)
        return False, "none", f"{type(e).__name__}: {e}"[:200]
    return False, "none", "no error"


@check("errors/int16_all_reduce")
def _err_dtype() -> Tuple[bool, str, str]:
    return expect_error(lambda: dist.all_reduce(on_dev(torch.ones(3, dtype=torch.int16))),
                        TypeError, ["int16", "reduction"])


@check("errors/band")
def _err_band() -> Tuple[bool, str, str]:
    return expect_error(lambda: dist.all_reduce(on_dev(torch.ones(3, dtype=torch.int32)),
                                                op=R.BAND), ValueError, ["BAND"])


@check("errors/avg_int")
def _err_avg() -> Tuple[bool, str, str]:
    return expect_error(lambda: dist.all_reduce(on_dev(torch.ones(3, dtype=torch.int32)),
                                                op=R.AVG), TypeError, ["AVG", "int32"])


def trace_devices(where: str) -> None:
    """With T_TRACE: wait for every visible device, naming one that faults."""
    if not TRACE or not torch.cuda.is_available():
        return
    for d in range(torch.cuda.device_count()):
        try:
            torch.cuda.synchronize(d)
            print(f"rank {RANK}: after {where}: cuda:{d} ok", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 (the finding)
            print(f"rank {RANK}: after {where}: cuda:{d}: {e}"[:200], file=sys.stderr, flush=True)
            raise


def run_collectives() -> Dict[str, Dict[str, Any]]:
    results: Dict[str, Dict[str, Any]] = {}
    for name, fn in CHECKS.items():
        if TRACE:
            print(f"rank {RANK}: check {name}", file=sys.stderr, flush=True)
        try:
            ok, ref, detail = fn()
            if TRACE and DEV.type == "cuda":
                torch.cuda.synchronize(DEV)
        except Exception:  # noqa: BLE001 (reported as the check's failure)
            ok, ref, detail = False, "none", traceback.format_exc()[-600:]
        results[name] = {"ok": bool(ok), "ref": ref, "detail": detail}
    return results


# -- DDP ---------------------------------------------------------------------
def train(group: Optional[Any], steps: int) -> List[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1)).to(DEV)
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(1000 * step + RANK)
        x = torch.randn(16, 8, generator=gen)
        y = torch.sin(x.sum(1, keepdim=True))
        loss = torch.nn.functional.mse_loss(ddp(x.to(DEV)), y.to(DEV))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_ddp() -> Dict[str, Any]:
    mine = train(None, STEPS)  # the default group: hetccl
    ref = train(GLOO, STEPS)
    rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mine, ref))
    return {"hetccl": mine, "gloo": ref, "max_rel": rel, "steps": STEPS,
            "finite": all(math.isfinite(v) for v in mine)}


def main() -> None:
    global GLOO
    store = dist.FileStore(os.environ["T_STORE"], N)
    dist.init_process_group("hetccl", store=store, rank=RANK, world_size=N,
                            timeout=timedelta(seconds=120))
    trace_devices("init")
    GLOO = dist.new_group(backend="gloo")
    trace_devices("new_group")
    out: Dict[str, Any] = {"rank": RANK, "device": str(DEV)}
    t0 = time.monotonic()
    if "collectives" in PARTS:
        out["checks"] = run_collectives()
        trace_devices("collectives")
    t1 = time.monotonic()
    out["comm_backend"], out["comm_device"] = hetccl_comm_backend()
    out["stand_in_counts"] = stand_in_counts()
    if "ddp" in PARTS:
        out["ddp"] = run_ddp()
    out["seconds"] = {"collectives": round(t1 - t0, 2), "ddp": round(time.monotonic() - t1, 2)}
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def stand_in_counts() -> Dict[str, int]:
    """What the stand-in CUDA libraries of T_PRELOAD counted so far: calls
    that initialise CUDA (cuInit, cudaGetDeviceCount) and host memory
    registered with it ({} without stand-ins)."""
    counts: Dict[str, int] = {}
    for path in filter(None, os.environ.get("T_PRELOAD", "").split(":")):
        lib = ctypes.CDLL(path)
        for name in ("fake_inits", "fake_device_counts", "fake_registered"):
            try:
                counts[name] = counts.get(name, 0) + ctypes.c_int.in_dll(lib, name).value
            except ValueError:  # not this library's counter
                pass
    return counts


def hetccl_comm_backend() -> Tuple[str, int]:
    """How the library serves the default group ("engine", "vendor:nccl")
    and the communicator's device (ncclCommCuDevice: -1 for a host rank)."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(
        torch.device("cuda" if DEV.type == "cuda" else "cpu"))
    comm = getattr(backend, "communicator", None)
    return (comm.backend(), comm.device_id()) if comm is not None else ("?", -2)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
