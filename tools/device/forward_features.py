"""The forwarded features that the PyTorch and CuPy drop-ins do not reach,
on one GPU (a 1-rank communicator): nonblocking init, PreMulSum with a
device scalar, CUDA graph capture, ncclMemAlloc + buffer and window
registration, split, shrink, finalize, abort. Run once against the real
NCCL and once under LD_PRELOAD=libhetccl.so; the two JSON files must match.

    python tools/device/forward_features.py OUT.json
"""
from __future__ import annotations

import ctypes as C
import json
import os
import sys
import time

import cupy as cp
import cupy.cuda.nccl  # noqa: F401  (loads the real libnccl.so.2, as an application does)

UNDEF = -2147483648


class Config(C.Structure):
    # ncclConfig_t as NCCL 2.28 declares it (a prefix of 2.32's).
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint)] + [
        (name, C.c_int) for name in ("blocking", "cgaClusterSize", "minCTAs", "maxCTAs")] + [
        ("netName", C.c_char_p), ("splitShare", C.c_int), ("trafficClass", C.c_int),
        ("commName", C.c_char_p)] + [(name, C.c_int) for name in (
            "collnetEnable", "CTAPolicy", "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer",
            "nvlinkCentricSched", "graphUsageMode", "numRmaCtx", "maxP2pPeers",
            "graphStreamOrdering")]


def api() -> C.CDLL:
    """Through hetccl when it is preloaded (its global nccl* names), else the
    real library the process loaded."""
    if "libhetccl" in os.environ.get("LD_PRELOAD", ""):
        return C.CDLL(None)
    path = [l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("libnccl.so.2")][0]
    return C.CDLL(path)


def main(out: str) -> int:
    L = api()
    res: dict = {}

    def step(name: str) -> None:
        print(f"step {name}: {res.get(name)}", file=sys.stderr, flush=True)
    ver = C.c_int()
    res["version"] = (L.ncclGetVersion(C.byref(ver)), ver.value)
    step("version")
    uid = (C.c_char * 128)()
    res["unique_id"] = L.ncclGetUniqueId(uid)
    cfg = Config(C.sizeof(Config), 0xCAFEBEEF, ver.value, *([UNDEF] * 4), None, UNDEF, UNDEF,
                 None, *([UNDEF] * 10))
    cfg.blocking = 0
    comm = C.c_void_p()
    rc = L.ncclCommInitRankConfig(C.byref(comm), 1, uid, 0, C.byref(cfg))
    state = C.c_int(7)
    t0 = time.time()
    while rc in (0, 7) and state.value == 7 and time.time() - t0 < 30:
        if L.ncclCommGetAsyncError(comm, C.byref(state)) != 0:
            break
    res["nonblocking_init"] = (rc, state.value)
    if rc not in (0, 7):  # this NCCL refuses the 2.28-shaped config: go on blocking
        comm = C.c_void_p()
        L.ncclGetUniqueId(uid)
        res["blocking_init"] = L.ncclCommInitRank(C.byref(comm), 1, uid, 0)
        step("blocking_init")
    step("nonblocking_init")

    stream = cp.cuda.Stream(non_blocking=True)
    x = cp.arange(1 << 20, dtype=cp.float32)
    y = cp.zeros_like(x)
    def wait_async():
        st = C.c_int(7)
        while st.value == 7:
            L.ncclCommGetAsyncError(comm, C.byref(st))
        return st.value
    rc = L.ncclAllReduce(C.c_void_p(x.data.ptr), C.c_void_p(y.data.ptr), C.c_size_t(x.size), 7, 0,
                         comm, C.c_void_p(stream.ptr))
    res["allreduce"] = (rc in (0, 7), wait_async(), stream.synchronize(), float(y.sum()))
    step("allreduce")

    scalar = cp.array([2.5], dtype=cp.float32)
    op = C.c_int()
    rc = L.ncclRedOpCreatePreMulSum(C.byref(op), C.c_void_p(scalar.data.ptr), 7, 0, comm)
    rc2 = L.ncclAllReduce(C.c_void_p(x.data.ptr), C.c_void_p(y.data.ptr), C.c_size_t(x.size), 7,
                          op, comm, C.c_void_p(stream.ptr))
    wait_async()
    stream.synchronize()
    res["premulsum_device_scalar"] = (rc, rc2 in (0, 7), float(y.sum()),
                                      L.ncclRedOpDestroy(op, comm))
    step("premulsum_device_scalar")

    # CUDA graph capture: the captured allreduce replays with new input.
    z = cp.zeros_like(x)
    with stream:
        stream.begin_capture()
        rc = L.ncclAllReduce(C.c_void_p(x.data.ptr), C.c_void_p(z.data.ptr), C.c_size_t(x.size),
                             7, 0, comm, C.c_void_p(stream.ptr))
        graph = stream.end_capture()
    sums = []
    for k in range(3):
        x.fill(k + 1)
        graph.launch(stream)
        stream.synchronize()
        sums.append(float(z.sum()))
    res["graph_capture"] = (rc in (0, 7), sums)
    step("graph_capture")

    ptr = C.c_void_p()
    size = 1 << 21
    res["mem_alloc"] = L.ncclMemAlloc(C.byref(ptr), C.c_size_t(size)) == 0
    step("mem_alloc")
    handle = C.c_void_p()
    res["register"] = (L.ncclCommRegister(comm, ptr, C.c_size_t(size), C.byref(handle)),
                       L.ncclCommDeregister(comm, handle))
    step("register")
    win = C.c_void_p()
    rc = L.ncclCommWindowRegister(comm, ptr, C.c_size_t(size), C.byref(win), 0)
    res["window"] = (rc, L.ncclCommWindowDeregister(comm, win) if rc == 0 else None)
    step("window")
    res["mem_free"] = L.ncclMemFree(ptr)
    step("mem_free")

    child = C.c_void_p()
    rc = L.ncclCommSplit(comm, 0, 0, C.byref(child), None)
    wait_child = C.c_int(7)
    while child.value and wait_child.value == 7:
        L.ncclCommGetAsyncError(child, C.byref(wait_child))
    n = C.c_int()
    res["split"] = (rc in (0, 7), bool(child.value), L.ncclCommCount(child, C.byref(n)), n.value,
                    L.ncclCommDestroy(child))
    step("split")
    shrunk = C.c_void_p()
    rc = L.ncclCommShrink(comm, None, 0, C.byref(shrunk), None, 0)
    st = C.c_int(7)
    while shrunk.value and st.value == 7:
        L.ncclCommGetAsyncError(shrunk, C.byref(st))
    res["shrink"] = (rc in (0, 7), bool(shrunk.value), L.ncclCommAbort(shrunk))
    step("shrink")
    rc = L.ncclCommFinalize(comm)
    res["finalize"] = (rc in (0, 7), wait_async(), L.ncclCommDestroy(comm))
    step("finalize")
    json.dump({"results": res}, open(out, "w"), indent=1, sort_keys=True)
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
