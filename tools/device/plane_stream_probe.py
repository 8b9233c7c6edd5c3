"""Where does an eager all_reduce between two processes on one GPU spend
its time, by the stream it is issued on? Run under `python -m hetccl run
-n 2 -- python tools/device/plane_stream_probe.py` with HETCCL_LIBRARY set
(torch with CUDA needed). Each rank issues REPS back-to-back
ncclAllReduce calls of BYTES (out of place, float32) on: torch's current
stream (the legacy default stream outside a graph), a torch.cuda.Stream of
its own, and that stream again with a synchronisation after every call;
then the same call captured in a CUDA graph and replayed REPS times. It
prints one line per case and rank: mean microseconds per call from CUDA
events, and whether the result was right.

Arguments: [BYTES (default 4194304)] [REPS (default 200)].
"""
from __future__ import annotations

import ctypes
import os
import sys

import torch

BYTES = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 20
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
RANK, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def main() -> None:
    torch.cuda.set_device(0)
    lib = ctypes.CDLL(os.environ["HETCCL_LIBRARY"])
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.ncclGetLastError.argtypes = [ctypes.c_void_p]

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: {rc}: {lib.ncclGetLastError(None)!r}")
    uid = ctypes.create_string_buffer(128)
    path = os.environ.get("PROBE_ID", "/tmp/plane_stream_probe.id")
    if RANK == 0:
        ok(lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
        with open(path + ".tmp", "wb") as f:
            f.write(uid.raw)
        os.replace(path + ".tmp", path)
    else:
        import time
        while not os.path.exists(path):
            time.sleep(0.01)
        time.sleep(0.05)
        uid.raw = open(path, "rb").read()
    comm = ctypes.c_void_p()

    class Uid(ctypes.Structure):
        _fields_ = [("b", ctypes.c_ubyte * 128)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, Uid,
                                     ctypes.c_int]
    ok(lib.ncclCommInitRank(ctypes.byref(comm), N, Uid.from_buffer_copy(uid.raw), RANK), "ncclCommInitRank")
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    count = BYTES // 4
    x = torch.full((count,), float(RANK + 1), device="cuda")
    y = torch.empty_like(x)
    want = float(sum(range(1, N + 1)))

    def call() -> None:
        s = torch.cuda.current_stream().cuda_stream
        ok(lib.ncclAllReduce(x.data_ptr(), y.data_ptr(), count, 7, 0, comm, s), "ncclAllReduce")

    def timed(label: str, step, sync_each: bool = False) -> None:
        y.fill_(-1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(REPS):
            step()
            if sync_each:
                torch.cuda.current_stream().synchronize()
        b.record()
        b.synchronize()
        ok = bool((y == want).all())
        print(f"PROBE {label} bytes={BYTES} rank={RANK} us={a.elapsed_time(b) * 1e3 / REPS:.1f} "
              f"right={ok}", flush=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    timed("legacy-default-stream", call)
    own = torch.cuda.Stream()
    with torch.cuda.stream(own):
        for _ in range(3):
            call()
        timed("own-stream", call)
        timed("own-stream-sync-each", call, sync_each=True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        call()
    timed("graph-replay", g.replay)
    torch.cuda.synchronize()
    lib.ncclCommDestroy(comm)


if __name__ == "__main__":
    main()
