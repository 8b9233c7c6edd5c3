#!/usr/bin/env python3
"""Copy engines against pinned host memory on each NUMA node: does where the
host memory lives set the cross-island path's speed?

    python3 tools/device/numa_copies.py [--mib 256] [--reps 5]

Prints the host's nodes and each GPU's (its PCI function's numa_node), then
GB/s, best of --reps, for host memory bound to each node (mmap, mbind with
MPOL_BIND, touched, then cudaHostRegister, as the data plane registers its
shared segment):

  per GPU and node   D2H alone, H2D alone, both at once (two streams)
  both GPUs          the cross-island pattern: GPU0 writes slot X and GPU1
                     reads it while GPU1 writes Y and GPU0 reads it, all
                     four at once; X and Y on the reader's node, on the
                     writer's node, or both on one node

x86_64 Linux only (syscall numbers). One node: says so and measures it.
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import subprocess
import sys
import time

import torch

SYS_MBIND, SYS_MOVE_PAGES = 237, 279
MPOL_BIND = 2
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def nodes() -> list[int]:
    base = "/sys/devices/system/node"
    if not os.path.isdir(base):
        return [0]
    return sorted(int(d[4:]) for d in os.listdir(base) if d.startswith("node") and d[4:].isdigit())


def gpu_node(i: int) -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                          "-i", str(i)], capture_output=True, text=True).stdout.strip()
    bdf = out[-12:].lower()
    try:
        with open(f"/sys/bus/pci/devices/{bdf}/numa_node") as f:
            return int(f.read())
    except OSError:
        return -1


class HostBlock:
    """`nbytes` of anonymous memory bound to `node`, touched, registered."""

    def __init__(self, nbytes: int, node: int):
        self.map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        mask = ctypes.c_ulong(1 << node)
        if libc.syscall(SYS_MBIND, ctypes.c_void_p(self.addr), ctypes.c_ulong(nbytes), MPOL_BIND,
                        ctypes.byref(mask), ctypes.c_ulong(64), 0) != 0:
            raise OSError(ctypes.get_errno(), f"mbind to node {node}")
        ctypes.memset(self.addr, 1, nbytes)
        self.where = self.placed()
        err = torch.cuda.cudart().cudaHostRegister(self.addr, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister: {err}")
        self.t = torch.frombuffer(self.map, dtype=torch.uint8)

    def placed(self) -> int:
        """The node of the first page (move_pages with no target: a query)."""
        page = ctypes.c_void_p(self.addr)
        status = ctypes.c_int(-1)
        libc.syscall(SYS_MOVE_PAGES, 0, ctypes.c_ulong(1), ctypes.byref(page), None,
                     ctypes.byref(status), 0)
        return status.value


def copy_on(stream, dst, src):
    """A function that enqueues dst.copy_(src) on stream."""
    def enqueue():
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
    return enqueue


def timed(fns, devs, reps: int) -> float:
    """Best seconds over reps of enqueuing every fn, then syncing devs."""
    best = float("inf")
    for _ in range(reps):
        for d in devs:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for f in fns:
            f()
        for d in devs:
            torch.cuda.synchronize(d)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    n = a.mib << 20
    ns = nodes()
    ngpu = torch.cuda.device_count()
    gnode = [gpu_node(i) for i in range(ngpu)]
    print(f"nodes {ns}; GPU nodes {gnode}; cpus {os.cpu_count()}")
    for node in ns:
        try:
            with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
                print(f"  node {node}: cpus {f.read().strip()}")
        except OSError:
            pass
    dev = [torch.device("cuda", i) for i in range(ngpu)]
    dbuf = [torch.empty(n, dtype=torch.uint8, device=d) for d in dev]
    dbuf2 = [torch.empty(n, dtype=torch.uint8, device=d) for d in dev]
    blocks = {node: (HostBlock(n, node), HostBlock(n, node)) for node in ns}
    for node, (x, y) in blocks.items():
        print(f"host memory for node {node}: pages on node {x.where} / {y.where}")
    gb = lambda s: n / s / 1e9  # noqa: E731
    for g in range(ngpu):
        s1, s2 = torch.cuda.Stream(dev[g]), torch.cuda.Stream(dev[g])
        for node, (x, y) in blocks.items():
            d2h, h2d = copy_on(s1, x.t, dbuf[g]), copy_on(s2, dbuf2[g], y.t)
            a1 = gb(timed([d2h], [dev[g]], a.reps))
            a2 = gb(timed([h2d], [dev[g]], a.reps))
            a3 = gb(timed([d2h, h2d], [dev[g]], a.reps))
            print(f"GPU{g} (node {gnode[g]}) host on node {node}: D2H {a1:.1f}  H2D {a2:.1f}  "
                  f"both {a3:.1f} GB/s each way", flush=True)
    if ngpu < 2:
        return 0
    # X: GPU0 -> GPU1, Y: GPU1 -> GPU0
    streams = [(torch.cuda.Stream(dev[g]), torch.cuda.Stream(dev[g])) for g in range(2)]
    layouts = {}
    if gnode[0] >= 0 and gnode[1] >= 0 and gnode[0] != gnode[1]:
        layouts["reader's node"] = (gnode[1], gnode[0])
        layouts["writer's node"] = (gnode[0], gnode[1])
    for node in ns:
        layouts[f"both on node {node}"] = (node, node)
    for name, (nx, ny) in layouts.items():
        x, y = blocks[nx][0], blocks[ny][1]
        copies = [copy_on(streams[0][0], x.t, dbuf[0]), copy_on(streams[1][0], y.t, dbuf[1]),
                  copy_on(streams[0][1], dbuf2[0], y.t), copy_on(streams[1][1], dbuf2[1], x.t)]
        s = timed(copies, dev, a.reps)
        print(f"both GPUs, slots {name} (X node {nx}, Y node {ny}): {gb(s):.1f} GB/s per "
              f"copy, 4 at once", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
