#!/usr/bin/env python3
"""What the copy engines of one GPU move between device and pinned host
memory, in this run: the ceiling of any staged path (the data plane's
included) on this machine.

    python3 tools/device/copy_limit.py [--gib 1] [--device 0]

Prints D2H alone, H2D alone, and both at once on two streams (GB/s each
way), best of three; then what a kernel reads from mapped pinned host
memory (as a reduction that reads a shared slot over the bus does), alone
and beside a D2H copy: the reason the data plane's reductions copy the
peer's piece into device memory first (HETCCL_PLANE_REDUCE_READ=copy). Two ranks on ONE GPU share its one PCIe link: an
AllReduce or SendRecv between them moves 2 x the message each way over it,
so their busbw ceiling there is half the concurrent figure.

With several GPUs it then runs the same both-ways copies on every GPU at
once, each against 1 GiB of pinned host memory of its own: what host DRAM
gives all copy engines together. It is not the ceiling of a cross-island
SendRecv: the data plane's ring of a few MiB of slots per direction is
written and read back while it is likely still in the CPU's last-level
cache, and moved more than this on 2 x H200 (42.3-42.7 GB/s each way per
GPU against 35.9 here, 2026-11-28, docs/measurements.md).
"""
from __future__ import annotations

import argparse
import time

import cupy as cp
import cupyx
import numpy as np

# dst[i] += src[i] in 16-byte words, grid-stride: the access pattern of the
# data plane's reduction kernel, src in mapped host memory.
READ_HOST = cp.RawKernel(r"""
extern "C" __global__ void read_host(const uint4 *src, uint4 *dst, unsigned long long n) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint4 a = src[i], b = dst[i];
    b.x += a.x; b.y += a.y; b.z += a.z; b.w += a.w;
    dst[i] = b;
  }
}
""", "read_host")


def timed(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    cp.cuda.Device(args.device).use()
    n = int(args.gib * (1 << 30))
    dev = [cp.empty(n, dtype=cp.uint8) for _ in range(2)]
    host = [cupyx.empty_pinned(n, dtype=cp.uint8) for _ in range(2)]
    for h in host:
        h[:] = 1
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def d2h(stream=s1, i=0):
        dev[i].get(out=host[i], stream=stream, blocking=False)

    def h2d(stream=s2, i=1):
        dev[i].set(host[i], stream=stream)

    t_d2h = timed(d2h)
    t_h2d = timed(h2d)
    t_both = timed(lambda: (d2h(s1, 0), h2d(s2, 1)))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    words = n // 16

    def kernel_read(stream=s2, i=1):
        with stream:
            READ_HOST((sms * 4,), (256,), (np.uint64(host[i].ctypes.data), dev[i], np.uint64(words)))

    t_kread = timed(kernel_read)
    t_kread_both = timed(lambda: (d2h(s1, 0), kernel_read(s2, 1)))
    gb = n / 1e9
    print(f"copy_limit device {args.device}: {args.gib:g} GiB, best of 3")
    print(f"  D2H alone {gb / t_d2h:.1f} GB/s, H2D alone {gb / t_h2d:.1f} GB/s, "
          f"both at once {gb / t_both:.1f} GB/s each way")
    print(f"  a kernel reading mapped host memory: alone {gb / t_kread:.1f} GB/s, beside a D2H "
          f"copy {gb / t_kread_both:.1f} GB/s each way (against the copy engine's "
          f"{gb / t_h2d:.1f} / {gb / t_both:.1f})")
    print(f"  two ranks on this one GPU: staged busbw ceiling about {gb / t_both / 2:.1f} GB/s")
    gpus = cp.cuda.runtime.getDeviceCount()
    if gpus > 1:
        t_all = all_gpus_both_ways(n, gpus)
        print(f"  every GPU at once ({gpus}), both ways on each, 1 GiB host buffers: "
              f"{gb / t_all:.1f} GB/s each way per GPU (host DRAM under four copy streams)")


def all_gpus_both_ways(n: int, gpus: int, reps: int = 3) -> float:
    """Seconds for every GPU to copy n bytes D2H and n bytes H2D at once, best of reps."""
    rigs = []
    for g in range(gpus):
        with cp.cuda.Device(g):
            dev = [cp.empty(n, dtype=cp.uint8) for _ in range(2)]
            host = [cupyx.empty_pinned(n, dtype=cp.uint8) for _ in range(2)]
            for h in host:
                h[:] = 1
            streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
            rigs.append((g, dev, host, streams))

    def sync_all() -> None:
        for g, *_ in rigs:
            cp.cuda.Device(g).synchronize()

    best = float("inf")
    for _ in range(reps):
        sync_all()
        t0 = time.perf_counter()
        for g, dev, host, streams in rigs:
            with cp.cuda.Device(g):
                dev[0].get(out=host[0], stream=streams[0], blocking=False)
                dev[1].set(host[1], stream=streams[1])
        sync_all()
        best = min(best, time.perf_counter() - t0)
    return best


if __name__ == "__main__":
    main()
