#!/usr/bin/env python3
"""What a wait and a signal between two pieces cost a copy stream: the
data plane's per-piece overhead, taken apart on one GPU and between two.

    python3 tools/device/memop_gap.py [--piece-mib 4] [--pieces 128] [--peer 1] [--load 30]

Every figure is the time of N copies of one piece between device memory
and pinned host memory (a ring of slots, as the plane's channels), in
GB/s and as microseconds per piece above the bare copies it is compared
with (measured in the same run; Python's enqueueing is not timed: the
streams start only once everything is enqueued):

  bare            the copies alone, one stream (D2H; H2D)
  +wait           each copy after a stream wait on a host counter that is
                  already satisfied (cuStreamWaitValue64, GEQ)
  +write          each copy followed by a stream write of a host counter
                  (cuStreamWriteValue64, with its memory barrier)
  +both           wait, copy, write: a piece of the plane's send lane
  +kwait +kwrite  the same with the wait and the write done by one-thread
                  kernels instead of the stream's own operations
  ring S=.. K=..  the plane's channel on one GPU: K producer streams copy
                  pieces D2H into S slots, K consumer streams copy them back
                  H2D; each piece waits for its slot to be free (producer)
                  or full (consumer) and signals the other side. Against
                  "bare both", D2H and H2D copies on two streams at once
                  with no waits. "kwait": the waits done by a polling kernel.
  shm ...         the slots in a /dev/shm mapping registered with the
                  runtime, as the plane's segment is
  2 GPUs ...      (--peer) each GPU sends to the other through its own ring
                  (a sendrecv), against both GPUs copying both ways at once
                  with no waits; then the same rings over other host memory:
                  private 4 KiB pages, private huge pages, shm, and
                  cuMemCreate host memory exported as a file descriptor
  ..., loaded      (--load N) the two-GPU bare copies and rings again while
                  each GPU runs N fp16 GEMMs started at the same moment: what
                  the copies and their waits lose beside compute that holds
                  every SM, as in a training step's backward pass
  pingpong        two streams handing a counter back and forth: the
                  latency of a signal reaching a waiting stream (per hop)

Nothing here is hetccl's code: it measures the mechanism the plane uses
(plane/exec_stream.c) so that a change to it is chosen on figures.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import mmap
import os

import cupy as cp
import cupyx

CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
DEFAULT = 4  # cudaMemcpyDefault: the direction from the pointers (UVA)
GATE = 63  # the counter that releases a timed run

KERNELS = cp.RawModule(code=r"""
extern "C" __global__ void wait_geq(volatile unsigned long long *p, unsigned long long v) {
  while (*p < v) __nanosleep(64);
}
extern "C" __global__ void write_val(volatile unsigned long long *p, unsigned long long v) {
  __threadfence_system();
  *p = v;
}
""")
WAIT_K = KERNELS.get_function("wait_geq")
WRITE_K = KERNELS.get_function("write_val")


class Driver:
    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.wait = lib.cuStreamWaitValue64_v2
        self.write = lib.cuStreamWriteValue64_v2
        for f in (self.wait, self.write):
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
            f.restype = ctypes.c_int
        self.devptr = lib.cuMemHostGetDevicePointer_v2
        self.devptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        self.devptr.restype = ctypes.c_int

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what} failed: CUresult {rc}")


class Counters:
    """n 64-bit counters in mapped pinned host memory."""

    def __init__(self, drv: Driver, n: int) -> None:
        self.mem = cp.cuda.runtime.hostAlloc(8 * n, 0x2 | 0x1)  # mapped | portable
        ctypes.memset(self.mem, 0, 8 * n)
        d = ctypes.c_uint64()
        drv.check(drv.devptr(ctypes.byref(d), self.mem, 0), "cuMemHostGetDevicePointer")
        self.dev = d.value
        self.host = (ctypes.c_uint64 * n).from_address(self.mem)

    def reset(self) -> None:
        for i in range(len(self.host)):
            self.host[i] = 0

    def addr(self, i: int) -> int:
        return self.dev + 8 * i


def timed(ctr: "Counters", drv: "Driver", streams, enqueue, reps: int = 3, load=None) -> float:
    """Best of reps: seconds from a start event to the join of `streams`.
    The start waits on a gate counter that the host opens only once
    everything is enqueued, so Python's enqueueing is not timed; the
    counters are zeroed before each repetition. `load(gate_addr)`, if
    given, enqueues work that starts at the same gate and is not waited
    for (a compute load beside the copies)."""
    best = float("inf")
    main = cp.cuda.Stream(non_blocking=True)
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        ctr.reset()
        drv.check(drv.wait(main.ptr, ctr.addr(GATE), 1, CU_STREAM_WAIT_VALUE_GEQ), "gate")
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(main)
        for s in streams:
            with cp.cuda.Device(s.device_id):
                s.wait_event(start)
        if load is not None:
            load(ctr.addr(GATE))
        enqueue()
        for s in streams:
            with cp.cuda.Device(s.device_id):  # an event is recorded on its stream's device
                e = cp.cuda.Event()
                e.record(s)
            main.wait_event(e)
        end.record(main)
        ctr.host[GATE] = 1
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return best


class MemProp(ctypes.Structure):
    """CUmemAllocationProp (cuda.h)."""
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("alloc_flags", ctypes.c_ubyte * 8)]


class AccessDesc(ctypes.Structure):
    """CUmemAccessDesc (cuda.h)."""
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


KEEP = []  # mappings that must outlive the rings that use them


def host_memory(drv: "Driver", kind: str, size: int, devices) -> int:
    """`size` bytes of host memory of `kind`, registered or mapped for the
    devices: anon4k (private, 4 KiB pages, registered), anonthp (private,
    transparent huge pages asked, registered), shm (a /dev/shm file mapped
    shared, registered: the plane's segment), vmm (cuMemCreate on the host
    NUMA node 0 with a POSIX fd handle, which another process could map)."""
    lib = ctypes.CDLL("libc.so.6", use_errno=True)
    if kind in ("anon4k", "anonthp"):
        m = mmap.mmap(-1, size + (2 << 20), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ptr = (base + (2 << 20) - 1) & ~((2 << 20) - 1)
        advice = 14 if kind == "anonthp" else 15  # MADV_HUGEPAGE / MADV_NOHUGEPAGE
        if lib.madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(size), advice):
            raise OSError(ctypes.get_errno(), "madvise")
        ctypes.memset(ptr, 0, size)
        KEEP.append(m)
        cp.cuda.runtime.hostRegister(ptr, size, 0x1 | 0x2)
        return ptr
    if kind == "shm":
        name = f"/dev/shm/memop_gap.{os.getpid()}"  # unlinked at once
        fd = os.open(name, os.O_CREAT | os.O_RDWR, 0o600)
        os.unlink(name)
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ctypes.memset(ptr, 0, size)
        KEEP.append(m)
        cp.cuda.runtime.hostRegister(ptr, size, 0x1 | 0x2)
        return ptr
    cu = ctypes.CDLL("libcuda.so.1")
    prop = MemProp(type=1, handle_types=1, loc_type=3, loc_id=0)  # PINNED, POSIX_FD, HOST_NUMA 0
    gran = ctypes.c_size_t()
    drv.check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
              "cuMemGetAllocationGranularity")
    size = (size + gran.value - 1) // gran.value * gran.value
    handle, va = ctypes.c_uint64(), ctypes.c_uint64()
    drv.check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                             ctypes.c_uint64(0)), "cuMemCreate(host numa)")
    drv.check(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size),
                                     ctypes.c_size_t(gran.value), ctypes.c_uint64(0),
                                     ctypes.c_uint64(0)), "cuMemAddressReserve")
    drv.check(cu.cuMemMap(va, ctypes.c_size_t(size), ctypes.c_size_t(0), handle,
                          ctypes.c_uint64(0)), "cuMemMap")
    descs = (AccessDesc * (len(devices) + 1))()
    for i, d in enumerate(devices):
        descs[i] = AccessDesc(1, d, 3)  # DEVICE d, PROT_READWRITE
    descs[len(devices)] = AccessDesc(3, 0, 3)  # HOST_NUMA 0: the CPU
    drv.check(cu.cuMemSetAccess(va, ctypes.c_size_t(size), descs, ctypes.c_size_t(len(descs))),
              "cuMemSetAccess")
    ctypes.memset(va.value, 0, size)
    fd = ctypes.c_int(-1)
    drv.check(cu.cuMemExportToShareableHandle(ctypes.byref(fd), handle, 1, ctypes.c_uint64(0)),
              "cuMemExportToShareableHandle")
    print(f"vmm: granularity {gran.value} bytes, exported as fd {fd.value}", flush=True)
    return va.value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--piece-mib", type=float, default=4.0)
    ap.add_argument("--pieces", type=int, default=128)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--peer", type=int, default=None, help="a second GPU: rings between the two")
    ap.add_argument("--watchdog", type=float, default=100.0, help="seconds before a dump and exit")
    ap.add_argument("--load", type=int, default=0,
                    help="with --peer: run the two-GPU cases again beside this many fp16 GEMMs "
                         "of 8192^3 per GPU (a training step's compute holding the SMs)")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)  # a hang shows where
    cp.cuda.Device(args.device).use()
    drv = Driver()
    piece, n = int(args.piece_mib * (1 << 20)), args.pieces
    slots_max = 8
    src = cp.ones(piece * n, dtype=cp.uint8)
    dst = cp.zeros(piece * n, dtype=cp.uint8)
    ring = cupyx.empty_pinned(piece * slots_max, dtype=cp.uint8)
    ring2 = cupyx.empty_pinned(piece * slots_max, dtype=cp.uint8)
    rptr, r2ptr = ring.ctypes.data, ring2.ctypes.data
    ctr = Counters(drv, 64)
    d2h = cp.cuda.runtime.memcpyDeviceToHost
    h2d = cp.cuda.runtime.memcpyHostToDevice
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    a = streams[0]
    mb = piece * n / 1e9

    def wait(s, i, v):
        drv.check(drv.wait(s.ptr, ctr.addr(i), v, CU_STREAM_WAIT_VALUE_GEQ), "wait")

    def write(s, i, v, flags=CU_STREAM_WRITE_VALUE_DEFAULT):
        drv.check(drv.write(s.ptr, ctr.addr(i), v, flags), "write")

    def kwait(s, i, v):
        WAIT_K((1,), (1,), (cp.uint64(ctr.addr(i)), cp.uint64(v)), stream=s)

    def kwrite(s, i, v):
        WRITE_K((1,), (1,), (cp.uint64(ctr.addr(i)), cp.uint64(v)), stream=s)

    def copy_d2h(s, k, base=None):
        cp.cuda.runtime.memcpyAsync((base or rptr) + (k % 4) * piece, src.data.ptr + k * piece,
                                    piece, d2h, s.ptr)

    def copy_h2d(s, k, base=None):
        cp.cuda.runtime.memcpyAsync(dst.data.ptr + k * piece, (base or rptr) + (k % 4) * piece,
                                    piece, h2d, s.ptr)

    def report(name, t, bare=None):
        gbs = mb / t
        extra = f"{(t - bare) / n * 1e6:8.1f} us/piece" if bare else ""
        print(f"{name:28s} {gbs:7.1f} GB/s {t * 1e3:8.2f} ms {extra}", flush=True)

    def one_stream(step):
        def go():
            for k in range(n):
                step(a, k)
        return timed(ctr, drv, [a], go)

    bare_d2h = one_stream(lambda s, k: copy_d2h(s, k))
    report("bare D2H", bare_d2h)
    bare_h2d = one_stream(lambda s, k: copy_h2d(s, k))
    report("bare H2D", bare_h2d)
    report("D2H +wait", one_stream(lambda s, k: (wait(s, 0, 0), copy_d2h(s, k))), bare_d2h)
    report("D2H +write", one_stream(lambda s, k: (copy_d2h(s, k), write(s, 1, k + 1))), bare_d2h)
    report("D2H +both", one_stream(
        lambda s, k: (wait(s, 0, 0), copy_d2h(s, k), write(s, 1, k + 1))), bare_d2h)
    report("H2D +both", one_stream(
        lambda s, k: (wait(s, 0, 0), copy_h2d(s, k), write(s, 1, k + 1))), bare_h2d)
    report("D2H +kwait +kwrite", one_stream(
        lambda s, k: (kwait(s, 0, 0), copy_d2h(s, k), kwrite(s, 1, k + 1))), bare_d2h)

    # Both ways at once with no waits: the ceiling of the ring below.
    p0, c0 = streams[0], streams[1]

    def both():
        for k in range(n):
            copy_d2h(p0, k, r2ptr)
            copy_h2d(c0, k)
    bare_both = timed(ctr, drv, [p0, c0], both)
    report("bare both (per direction)", bare_both)

    # The plane's channel: producers 0..K-1 fill S slots, consumers drain.
    # Counters: produced[slot] at base..base+7, consumed[slot] at base+8..
    # (per slot, as the plane's hdr arrays), each written by one stream in
    # order. A ring may run from one device's memory to another's.
    class Ring:
        def __init__(self, slots, k_streams, slot_ptr, src_arr, dst_arr, cbase=0,
                     src_dev=args.device, dst_dev=args.device):
            self.slots, self.k, self.slot_ptr, self.cbase = slots, k_streams, slot_ptr, cbase
            self.src, self.dst = src_arr, dst_arr
            with cp.cuda.Device(src_dev):
                self.prod = [cp.cuda.Stream(non_blocking=True) for _ in range(k_streams)]
            with cp.cuda.Device(dst_dev):
                self.cons = [cp.cuda.Stream(non_blocking=True) for _ in range(k_streams)]

        def step(self, k, w):
            slot, rnd = k % self.slots, k // self.slots
            ps, cs = self.prod[k % self.k], self.cons[k % self.k]
            at = self.slot_ptr + slot * piece
            with cp.cuda.Device(ps.device_id):
                if k >= self.slots:
                    w(ps, self.cbase + 8 + slot, rnd)  # the consumer freed the slot's last piece
                cp.cuda.runtime.memcpyAsync(at, self.src.data.ptr + k * piece, piece, DEFAULT, ps.ptr)
                write(ps, self.cbase + slot, rnd + 1)
            with cp.cuda.Device(cs.device_id):
                w(cs, self.cbase + slot, rnd + 1)
                cp.cuda.runtime.memcpyAsync(self.dst.data.ptr + k * piece, at, piece, DEFAULT, cs.ptr)
                write(cs, self.cbase + 8 + slot, rnd + 1)

    def run_rings(rings, kernel_waits=False, load=None):
        w = kwait if kernel_waits else wait

        def go():
            for k in range(n):
                for r in rings:
                    r.step(k, w)
        return timed(ctr, drv, [st for r in rings for st in r.prod + r.cons], go, load=load)

    def ring_case(slots, k_streams, kernel_waits=False, slot_ptr=rptr):
        return run_rings([Ring(slots, k_streams, slot_ptr, src, dst)], kernel_waits)

    for slots, k_streams in ((4, 1), (8, 1), (4, 2), (8, 2)):
        report(f"ring S={slots} K={k_streams}", ring_case(slots, k_streams), bare_both)
    report("ring S=4 K=1 kwait", ring_case(4, 1, True), bare_both)

    # The slots in a /dev/shm mapping (4 KiB pages) registered with the
    # runtime, as the plane's segment is, instead of cudaHostAlloc memory.
    sptr = host_memory(drv, "shm", piece * slots_max * 2, [args.device])
    report("shm bare D2H", one_stream(lambda s, k: copy_d2h(s, k, sptr)))
    report("shm bare H2D", one_stream(lambda s, k: copy_h2d(s, k, sptr)))
    report("shm ring S=4 K=1", ring_case(4, 1, slot_ptr=sptr), bare_both)
    report("shm ring S=4 K=2", ring_case(4, 2, slot_ptr=sptr), bare_both)

    # Two GPUs: each sends to the other through its own ring of slots
    # (both directions at once, as a sendrecv), against each GPU copying
    # both ways at once with no waits.
    if args.peer is not None and args.peer != args.device:
        with cp.cuda.Device(args.peer):
            psrc = cp.ones(piece * n, dtype=cp.uint8)
            pdst = cp.zeros(piece * n, dtype=cp.uint8)
            pstreams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        ring3 = cupyx.empty_pinned(piece * slots_max, dtype=cp.uint8)
        r3ptr = ring3.ctypes.data

        def both2():
            for k in range(n):
                copy_d2h(p0, k, r2ptr)
                copy_h2d(c0, k)
                with cp.cuda.Device(args.peer):
                    cp.cuda.runtime.memcpyAsync(r3ptr + (k % 4) * piece,
                                                psrc.data.ptr + k * piece, piece, d2h,
                                                pstreams[0].ptr)
                    cp.cuda.runtime.memcpyAsync(pdst.data.ptr + k * piece,
                                                r3ptr + (k % 4) * piece, piece, h2d,
                                                pstreams[1].ptr)
        bare2 = timed(ctr, drv, [p0, c0] + pstreams, both2)
        report("2 GPUs bare both (per dir)", bare2)

        def pair_rings(slots, k_streams, base, other):
            return [Ring(slots, k_streams, base, src, pdst, 0, args.device, args.peer),
                    Ring(slots, k_streams, other, psrc, dst, 32, args.peer, args.device)]

        if args.load:
            # A compute load on both GPUs, started at the gate with the copies:
            # what the copies and the stream waits between them lose while
            # GEMMs hold every SM, as during a training step's backward pass.
            gemm = {}
            for d in (args.device, args.peer):
                with cp.cuda.Device(d):
                    m = cp.ones((8192, 8192), dtype=cp.float16)
                    gemm[d] = (m, cp.empty_like(m), cp.cuda.Stream(non_blocking=True))
                    with gemm[d][2]:  # the library's handle and workspace made now, not
                        cp.matmul(m, m, out=gemm[d][1])  # behind the gate (where that waits)
                    gemm[d][2].synchronize()

            def load(gate_addr):
                for d, (m, o, st) in gemm.items():
                    with cp.cuda.Device(d):
                        drv.check(drv.wait(st.ptr, gate_addr, 1, CU_STREAM_WAIT_VALUE_GEQ), "gate")
                        with st:
                            for _ in range(args.load):
                                cp.matmul(m, m, out=o)

            with cp.cuda.Device(args.device):
                m, o, st = gemm[args.device]
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                with st:
                    cp.matmul(m, m, out=o)
                    e0.record(st)
                    for _ in range(10):
                        cp.matmul(m, m, out=o)
                    e1.record(st)
                e1.synchronize()
                ms = cp.cuda.get_elapsed_time(e0, e1) / 10
            print(f"load: {args.load} GEMMs of 8192^3 fp16 per GPU, {ms:.2f} ms each alone",
                  flush=True)
            loaded2 = timed(ctr, drv, [p0, c0] + pstreams, both2, load=load)
            report("2 GPUs bare both, loaded", loaded2, bare2)
            for slots, k_streams in ((4, 1), (4, 2)):
                t = run_rings(pair_rings(slots, k_streams, rptr, r3ptr), load=load)
                report(f"2 GPUs ring S={slots} K={k_streams}, loaded", t, loaded2)
        for slots, k_streams, base in ((4, 1, rptr), (4, 2, rptr), (8, 1, rptr), (4, 1, sptr)):
            other = base + slots_max * piece if base == sptr else r3ptr
            rings = pair_rings(slots, k_streams, base, other)
            name = f"2 GPUs ring S={slots} K={k_streams}{' shm' if base == sptr else ''}"
            report(name, run_rings(rings), bare2)
        # The same rings over other kinds of host memory: which property of
        # the plane's segment (shared, 4 KiB pages, registered) costs.
        for kind in ("anon4k", "anonthp", "shm", "vmm"):
            try:
                mem = host_memory(drv, kind, 2 * slots_max * piece, [args.device, args.peer])
            except (OSError, RuntimeError) as e:
                print(f"2 GPUs ring S=4 K=1 {kind}: not made: {e}", flush=True)
                continue
            rings = [Ring(4, 1, mem, src, pdst, 0, args.device, args.peer),
                     Ring(4, 1, mem + slots_max * piece, psrc, dst, 32, args.peer, args.device)]
            report(f"2 GPUs ring S=4 K=1 {kind}", run_rings(rings), bare2)

    # Ping-pong: the latency of one signal reaching a stream that waits.
    hops = 200
    x, y = streams[2], streams[3]

    def pingpong(kernel_waits: bool):
        w = kwait if kernel_waits else wait

        def go():
            for i in range(1, hops + 1):
                write(x, 60, i)
                w(x, 61, i)
                w(y, 60, i)
                write(y, 61, i)
        return timed(ctr, drv, [x, y], go)

    for kw in (False, True):
        t = pingpong(kw)
        print(f"pingpong {'kernel' if kw else 'stream'} waits: {t / (2 * hops) * 1e6:.1f} us per hop",
              flush=True)


if __name__ == "__main__":
    main()
