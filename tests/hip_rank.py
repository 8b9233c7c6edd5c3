"""One rank of tests/test_hip.py: joins a communicator, runs an allreduce on
host buffers, prints one line "RESULT {json}".

Environment: T_RANK, T_NRANKS, T_ID_FILE (rank 0 writes the unique id
there), T_PRELOAD (colon list of libraries to load first, RTLD_GLOBAL, as a
program linking them would have), T_GPU (the stand-in device the rank
selects before init; unset: the stand-in's default, which every process
shares), T_DEVBUF=1 (the allreduce runs on a
buffer from the stand-in libamdhip64's hipMalloc, the first preloaded
library, and the result adds what its counters saw: "copies", "writes",
"waits"), T_INPLACE=1 (instead of the allreduce: rank 0, a HIP rank, sends to
rank 1 (HIP or host) from device memory it registered with ncclCommRegister,
T_BYTES and 1 KiB, then from memory it did not, then from the first again
after ncclCommDeregister; the result adds "wrong" and, per send, "copied"
(ib's CPU-copied bytes) and "copies" (the stand-in's hipMemcpyAsync calls)),
T_IBDEV=1 (instead of the allreduce: sendrecv, broadcast,
allgather and allreduce of T_BYTES bytes per rank, then a 1 KiB sendrecv, on the stand-in's device
memory, each checked; the result adds "wrong", "plane_copied" (the data
plane's host copies, all of them) and "copied": the ib
transport's CPU-copied bytes per collective), T_HOST_SENDS=1 (instead of
the allreduce: rank 0, a host rank, sends T_BYTES from plain host memory
to rank 1, a HIP rank, four times, each 0.5 s after the receive was
posted (T_SEND_FIRST=1: rank 1 waits 0.5 s before each receive instead);
rank 1 receives into device memory, which it stages; the result adds
"wrong", "copied", ib's CPU-copied bytes over the last three, and "copies",
the stand-in's hipMemcpyAsync calls over them), T_RECV_REG=1 (with
T_INPLACE or T_HOST_SENDS: the receiving HIP rank registers its device
buffer with ncclCommRegister, so that the NIC may write into it); with
T_INPLACE, T_IBDEV and T_HOST_SENDS the result also has "device_copies",
those of the stand-in's copies from device memory to device memory (staging
in device memory), T_P2P=1 (instead of the allreduce: one group, a ring of 4-float send/recv
on host buffers, rank r sending 10 * (r + 1); the result adds "p2p_recv"
(what arrived) and what the stand-in vendor library saw: "vendor_sends",
"vendor_recvs", "vendor_send_peer", "vendor_recv_peer"), T_CONFIG=1 (also an ncclAllReduceConfig with a config through
the C ABI; the result adds what the stand-in vendor library saw:
"config_calls", "config_magic", and "plain_calls"), T_LATE_HIP=PATH
(instead of the allreduce: this host rank loads the stand-in libamdhip64 at
PATH after its communicator was made and passes it that library's device
memory; the result adds "late_error" and "late_message", then "sum" of an
allreduce on host memory after), T_HOST_BYTES=N (instead of the allreduce
of 4 floats: one of N bytes of host memory; the result has "sum", or
"call_error", "call_message" and "comm_last_error", ncclGetLastError(comm)
after it). The result:
"error"/"message" when init
failed, else "backend", "kind" (the device kind this rank presented) and
"sum"; always "hip_mapped" and "cudart_mapped" (what the process loaded).
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import time

from rank_procs import publish, wait_for

for path in filter(None, os.environ.get("T_PRELOAD", "").split(":")):
    _loaded = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    # T_GPU=N: the rank selects device N before init, as a program of one
    # GPU per rank does (hipSetDevice / cudaSetDevice of the stand-in).
    for _set in ("hipSetDevice", "cudaSetDevice"):
        if os.environ.get("T_GPU") and hasattr(_loaded, _set):
            assert getattr(_loaded, _set)(int(os.environ["T_GPU"])) == 0

import numpy as np  # noqa: E402

from hetccl import _lib, nccl  # noqa: E402
from hetccl.errors import NcclError, last_error  # noqa: E402

RANK, NRANKS = int(os.environ["T_RANK"]), int(os.environ["T_NRANKS"])


def _fake_count(hip, name: str) -> int:
    """One of the stand-in libamdhip64's counters (fake_copies,
    fake_device_copies); 0 in a process without it (a host rank)."""
    return ctypes.c_int.in_dll(hip, name).value if hip else 0


def exchange_id() -> str:
    path = os.environ["T_ID_FILE"]
    if RANK == 0:
        text = nccl.unique_id_to_hex(nccl.get_unique_id())
        publish(path, text.encode())
        return text
    return wait_for(path).decode()


def main() -> dict:
    out: dict = {}
    try:
        comm = nccl.NcclCommunicator(NRANKS, nccl.unique_id_from_hex(exchange_id()), RANK)
    except NcclError as e:
        return {"error": e.name, "message": e.message}
    out["backend"] = comm.backend()
    out["kind"] = _device_kind()
    x = np.full(4, RANK + 1, dtype=np.float32)
    if os.environ.get("T_LEFT") == "1":
        return _left_after_its_part(comm)
    if os.environ.get("T_IBDEV") == "1":
        out.update(_device_collectives(comm))
    elif os.environ.get("T_INPLACE") == "1":
        out.update(_sends_in_place(comm))
    elif os.environ.get("T_HOST_SENDS") == "1":
        out.update(_host_sends(comm))
    elif os.environ.get("T_DEVBUF") == "1":
        out.update(_device_allreduce(comm, x))
    elif os.environ.get("T_P2P") == "1":
        out.update(_ring(comm))
    elif os.environ.get("T_LATE_HIP"):
        out.update(_late_device_buffer(comm, x))
    elif os.environ.get("T_HOST_BYTES"):
        out.update(_host_allreduce(comm, int(os.environ["T_HOST_BYTES"])))
    else:
        comm.allReduce(x.ctypes.data, x.ctypes.data, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
        out["sum"] = float(x[0])
    if os.environ.get("T_CONFIG") == "1":
        out.update(_config_allreduce(comm))
    comm.destroy()
    return out


def _late_device_buffer(comm: nccl.NcclCommunicator, x: np.ndarray) -> dict:
    """This host rank's process loads the stand-in libamdhip64 (T_LATE_HIP,
    its path) only now, after its communicator was made, and passes it
    'device' memory: the error it gets. Then host buffers, which still
    work."""
    hip = ctypes.CDLL(os.environ["T_LATE_HIP"], mode=ctypes.RTLD_GLOBAL)
    dev = ctypes.c_void_p()
    assert hip.hipMalloc(ctypes.byref(dev), ctypes.c_size_t(x.nbytes)) == 0
    out: dict = {"late_error": None}
    try:
        comm.allReduce(dev.value, dev.value, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    except NcclError as e:
        out.update(late_error=e.name, late_message=e.message)
    comm.allReduce(x.ctypes.data, x.ctypes.data, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out["sum"] = float(x[0])
    return out


def _host_allreduce(comm: nccl.NcclCommunicator, nbytes: int) -> dict:
    """An in-place AllReduce of nbytes of host memory: its sum, or the error
    it gets and ncclGetLastError(comm) after it."""
    x = np.ones(nbytes // 4, dtype=np.float32)
    try:
        comm.allReduce(x.ctypes.data, x.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    except NcclError as e:
        return {"call_error": e.name, "call_message": e.message,
                "comm_last_error": last_error(_lib.ffi.cast("ncclComm_t", comm.comm))}
    return {"sum": float(x[0])}


def _ring(comm: nccl.NcclCommunicator) -> dict:
    s = np.full(4, 10.0 * (RANK + 1), dtype=np.float32)
    r = np.full(4, -1.0, dtype=np.float32)
    nccl.groupStart()
    comm.send(s.ctypes.data, 4, nccl.NCCL_FLOAT32, (RANK + 1) % NRANKS)
    comm.recv(r.ctypes.data, 4, nccl.NCCL_FLOAT32, (RANK - 1) % NRANKS)
    nccl.groupEnd()
    out = {"p2p_recv": float(r[0])}
    vendor = os.environ.get("HETCCL_RCCL_LIBRARY")
    if vendor:
        v = ctypes.CDLL(vendor)
        for key, sym in (("vendor_sends", "fake_send_calls"), ("vendor_recvs", "fake_recv_calls"),
                         ("vendor_send_peer", "fake_last_send_peer"),
                         ("vendor_recv_peer", "fake_last_recv_peer")):
            out[key] = ctypes.c_int.in_dll(v, sym).value
    return out


class _CollConfig(ctypes.Structure):
    """ncclCollConfig_t's leading fields (include/nccl.h); the rest zero."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint),
                ("version", ctypes.c_uint), ("rest", ctypes.c_char * 64)]


def _config_allreduce(comm: nccl.NcclCommunicator) -> dict:
    """ncclAllReduceConfig as a C program calls it; what the vendor saw."""
    lib = ctypes.CDLL(str(_lib.loaded_path()))
    vendor = ctypes.CDLL(os.environ["HETCCL_RCCL_LIBRARY"])
    plain_before = ctypes.c_int.in_dll(vendor, "fake_allreduce_calls").value
    cfg = _CollConfig(size=ctypes.sizeof(_CollConfig), magic=0xcafebeef, version=23203)
    x = np.zeros(8, dtype=np.float32)
    lib.ncclAllReduceConfig.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p]
    res = lib.ncclAllReduceConfig(x.ctypes.data, x.ctypes.data, 8, nccl.NCCL_FLOAT32,
                                  nccl.NCCL_SUM, comm.comm, None, ctypes.addressof(cfg))
    return {"config_result": res,
            "config_calls": ctypes.c_int.in_dll(vendor, "fake_allreduce_config_calls").value,
            "config_magic": ctypes.c_uint.in_dll(vendor, "fake_last_config_magic").value,
            "plain_calls": ctypes.c_int.in_dll(vendor, "fake_allreduce_calls").value - plain_before}


def _device_allreduce(comm: nccl.NcclCommunicator, x: np.ndarray) -> dict:
    """In place on 'device' memory of the stand-in (its streams run at once,
    so the result is there when the call returns)."""
    hip = ctypes.CDLL(os.environ["T_PRELOAD"].split(":")[0])
    dev = ctypes.c_void_p()
    assert hip.hipMalloc(ctypes.byref(dev), ctypes.c_size_t(x.nbytes)) == 0
    ctypes.memmove(dev.value, x.ctypes.data, x.nbytes)
    comm.allReduce(dev.value, dev.value, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    ctypes.memmove(x.ctypes.data, dev.value, x.nbytes)
    counts = {k: ctypes.c_int.in_dll(hip, "fake_" + k).value for k in ("copies", "writes", "waits")}
    return {"sum": float(x[0]), **counts}


def _left_after_its_part(comm: nccl.NcclCommunicator) -> dict:
    """Three HIP ranks on the data plane: rank 0 sends rank 1 a message of
    stand-in device memory, says its result and leaves (its process exits,
    as one whose work is done may). Rank 1 passes the message on to rank 2,
    which receives it late, so that rank 1's stream waits on rank 2 for
    free slots long after rank 0 has gone: rank 0's exit is no failure of
    theirs."""
    count, f32 = int(os.environ.get("T_BYTES", str(1 << 20))) // 4, nccl.NCCL_FLOAT32
    hip = ctypes.CDLL(os.environ["T_PRELOAD"].split(":")[0])
    buf = ctypes.c_void_p()
    assert hip.hipMalloc(ctypes.byref(buf), ctypes.c_size_t(4 * count)) == 0
    host = np.full(count, RANK + 1, dtype=np.float32)
    ctypes.memmove(buf.value, host.ctypes.data, host.nbytes)
    out: dict = {"kind": _device_kind(), "backend": comm.backend()}
    try:
        if RANK == 0:
            comm.send(buf.value, count, f32, 1)
            print("RESULT " + json.dumps({**out, "left": True}), flush=True)
            os._exit(0)
        if RANK == 1:
            comm.recv(buf.value, count, f32, 0)
            time.sleep(0.3)  # rank 0 has left by now
            comm.send(buf.value, count, f32, 2)
        else:
            time.sleep(0.8)
            comm.recv(buf.value, count, f32, 1)
        time.sleep(0.3)  # a failure the watch finds after the transfer is seen too
        comm.check_async_error()
        ctypes.memmove(host.ctypes.data, buf.value, host.nbytes)
        out["got"] = sorted({float(v) for v in host})
    except NcclError as e:
        out.update({"error": e.name, "message": e.message})
    comm.abort()
    return out


def _host_sends(comm: nccl.NcclCommunicator) -> dict:
    """Rank 0 (host, plain numpy) sends rank 1 (HIP, device memory) four
    messages, each after a 0.5 s wait, so that rank 1's receive (into its
    registered staging, or with T_RECV_REG its registered device buffer) is
    posted, and its offer made, before the send (T_SEND_FIRST: the other
    way round); the first, which connects the pair, is not counted."""
    count = int(os.environ.get("T_BYTES", str(256 << 10))) // 4
    f32, wrong, before, calls, dcalls = nccl.NCCL_FLOAT32, [], 0, 0, 0
    send_first = os.environ.get("T_SEND_FIRST") == "1"
    hip = ctypes.CDLL(os.environ["T_PRELOAD"].split(":")[0]) if RANK == 1 else None

    hip_copies = functools.partial(_fake_count, hip, "fake_copies")
    hip_device_copies = functools.partial(_fake_count, hip, "fake_device_copies")

    if RANK == 1:
        buf = ctypes.c_void_p()
        assert hip.hipMalloc(ctypes.byref(buf), ctypes.c_size_t(4 * count)) == 0
        got = np.empty(count, dtype=np.float32)
        if os.environ.get("T_RECV_REG") == "1":
            lib = ctypes.CDLL(str(_lib.loaded_path()))
            handle = ctypes.c_void_p()
            assert lib.ncclCommRegister(ctypes.c_void_p(comm.comm), buf,
                                        ctypes.c_size_t(4 * count), ctypes.byref(handle)) == 0
    x = np.empty(count, dtype=np.float32)
    for i in range(-1, 3):  # -1: not counted (the pair connects on its first message)
        if i == 0:
            before, calls, dcalls = comm.copied_bytes()["ib"], hip_copies(), hip_device_copies()
        if RANK == 0:
            x[:] = np.arange(count, dtype=np.float32) + i
            if not send_first:
                time.sleep(0.5)
            comm.send(x.ctypes.data, count, f32, 1)
        else:
            if send_first:
                time.sleep(0.5)
            comm.recv(buf.value, count, f32, 0)
            ctypes.memmove(got.ctypes.data, buf.value, got.nbytes)
            if not np.array_equal(got, np.arange(count, dtype=np.float32) + i):
                wrong.append(i)
    return {"wrong": wrong, "copied": comm.copied_bytes()["ib"] - before,
            "copies": hip_copies() - calls, "device_copies": hip_device_copies() - dcalls}


def _device_collectives(comm: nccl.NcclCommunicator) -> dict:
    """Collectives on the stand-in's device memory (two buffers, reused:
    its arena is small and never given back), each checked against numpy,
    with the ib transport's copied bytes per collective."""
    hip = ctypes.CDLL(os.environ["T_PRELOAD"].split(":")[0])
    count = int(os.environ.get("T_BYTES", str(256 << 10))) // 4
    big, small = ctypes.c_void_p(), ctypes.c_void_p()
    assert hip.hipMalloc(ctypes.byref(big), ctypes.c_size_t(4 * count * NRANKS)) == 0
    assert hip.hipMalloc(ctypes.byref(small), ctypes.c_size_t(4 * count)) == 0

    def put(ptr: int, arr: np.ndarray) -> None:
        ctypes.memmove(ptr, arr.ctypes.data, arr.nbytes)

    def get(ptr: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        ctypes.memmove(out.ctypes.data, ptr, out.nbytes)
        return out

    def mine(rank: int) -> np.ndarray:
        return (np.arange(count, dtype=np.float32) % 251) + 1000 * rank

    f32, wrong, copied, device_copies = nccl.NCCL_FLOAT32, [], {}, {}

    hip_device_copies = functools.partial(_fake_count, hip, "fake_device_copies")

    def settled() -> int:
        """ib's copied bytes once they stop moving: a call returns when its
        stream has its data, but on the data plane across hosts the
        sender's bridge may still be sending (its eager copy counted then),
        so the count is read once it has held still for 0.15 s (2 s at
        most)."""
        last, still, t0 = comm.copied_bytes()["ib"], 0, time.monotonic()
        while still < 3 and time.monotonic() - t0 < 2:
            time.sleep(0.05)
            now = comm.copied_bytes()["ib"]
            still = still + 1 if now == last else 0
            last = now
        return last

    def run(name: str, call, want: np.ndarray, at: int) -> None:
        before, dbefore = settled(), hip_device_copies()
        call()
        copied[name] = settled() - before
        device_copies[name] = hip_device_copies() - dbefore
        if not np.array_equal(get(at, want.size), want):
            wrong.append(name)

    put(small.value, mine(RANK))
    peer_to, peer_from = (RANK + 1) % NRANKS, (RANK - 1) % NRANKS

    def sendrecv() -> None:
        nccl.groupStart()
        comm.send(small.value, count, f32, peer_to)
        comm.recv(big.value, count, f32, peer_from)
        nccl.groupEnd()
    run("sendrecv", sendrecv, mine(peer_from), big.value)
    run("broadcast", lambda: comm.broadcast(small.value, big.value, count, f32, 0), mine(0),
        big.value)
    run("allgather", lambda: comm.allGather(small.value, big.value, count, f32),
        np.concatenate([mine(r) for r in range(NRANKS)]), big.value)
    run("allreduce", lambda: comm.allReduce(small.value, big.value, count, f32, nccl.NCCL_SUM),
        sum(mine(r) for r in range(NRANKS)), big.value)

    def sendrecv_1k() -> None:  # below any rendezvous threshold: through ib's slots
        nccl.groupStart()
        comm.send(small.value, 256, f32, peer_to)
        comm.recv(big.value, 256, f32, peer_from)
        nccl.groupEnd()
    run("sendrecv 1 KiB", sendrecv_1k, mine(peer_from)[:256], big.value)
    return {"wrong": wrong, "copied": copied, "device_copies": device_copies,
            "plane_copied": comm.copied_bytes()["plane"]}


def _sends_in_place(comm: nccl.NcclCommunicator) -> dict:
    lib = ctypes.CDLL(str(_lib.loaded_path()))
    preload = os.environ.get("T_PRELOAD", "")
    hip = ctypes.CDLL(preload.split(":")[0]) if preload else None
    count = int(os.environ.get("T_BYTES", str(256 << 10))) // 4
    f32, wrong, copied, copies = nccl.NCCL_FLOAT32, [], {}, {}
    device_copies: dict = {}

    def device(nbytes: int) -> int:
        p = ctypes.c_void_p()
        assert hip.hipMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        return p.value

    hip_copies = functools.partial(_fake_count, hip, "fake_copies")
    hip_device_copies = functools.partial(_fake_count, hip, "fake_device_copies")

    want = (np.arange(count, dtype=np.float32) % 251) + 7
    keep = []
    if RANK == 0:
        registered, plain = device(4 * count), device(4 * count)
        for ptr in (registered, plain):
            ctypes.memmove(ptr, want.ctypes.data, want.nbytes)
        handle = ctypes.c_void_p()
        assert lib.ncclCommRegister(ctypes.c_void_p(comm.comm), ctypes.c_void_p(registered),
                                    ctypes.c_size_t(4 * count), ctypes.byref(handle)) == 0
    elif hip:
        dst = device(4 * count)
        if os.environ.get("T_RECV_REG") == "1":  # the NIC may write into it
            handle = ctypes.c_void_p()
            assert lib.ncclCommRegister(ctypes.c_void_p(comm.comm), ctypes.c_void_p(dst),
                                        ctypes.c_size_t(4 * count), ctypes.byref(handle)) == 0
    else:
        host = np.zeros(count, dtype=np.float32)
        keep.append(host)
        dst = host.ctypes.data

    def one(name: str, src: int, n: int) -> None:
        before, calls, dcalls = comm.copied_bytes()["ib"], hip_copies(), hip_device_copies()
        if RANK == 0:
            comm.send(src, n, f32, 1)
        else:
            ctypes.memset(dst, 0, 4 * n)
            comm.recv(dst, n, f32, 0)
            got = np.empty(n, dtype=np.float32)
            ctypes.memmove(got.ctypes.data, dst, got.nbytes)
            if not np.array_equal(got, want[:n]):
                wrong.append(name)
        copied[name] = comm.copied_bytes()["ib"] - before
        copies[name] = hip_copies() - calls
        device_copies[name] = hip_device_copies() - dcalls

    one("registered", registered if RANK == 0 else 0, count)
    one("registered 1 KiB", registered if RANK == 0 else 0, 256)
    one("plain", plain if RANK == 0 else 0, count)
    if os.environ.get("T_BOTHWAYS") == "1":  # both HIP: each sends from its own registered memory
        before = hip_device_copies()
        _both_ways(comm, lib, device, hip_copies, count, want, wrong, copied, copies,
                   registered if RANK == 0 else None)
        device_copies["both ways"] = hip_device_copies() - before
    if RANK == 0:
        assert lib.ncclCommDeregister(ctypes.c_void_p(comm.comm), handle) == 0
    one("deregistered", registered if RANK == 0 else 0, count)
    return {"wrong": wrong, "copied": copied, "copies": copies, "device_copies": device_copies}


def _both_ways(comm, lib, device, hip_copies, count, want, wrong, copied, copies, mine) -> None:
    """One group per rank: a send from device memory it registered (rank 1's
    holds want + 1000) and a receive into unregistered device memory: an
    unstaged send beside a staged receive in one batch."""
    f32 = nccl.NCCL_FLOAT32
    peer = 1 - RANK
    if mine is None:
        mine = device(4 * count)
        theirs_want = want + 1000
        ctypes.memmove(mine, theirs_want.ctypes.data, theirs_want.nbytes)
        handle = ctypes.c_void_p()
        assert lib.ncclCommRegister(ctypes.c_void_p(comm.comm), ctypes.c_void_p(mine),
                                    ctypes.c_size_t(4 * count), ctypes.byref(handle)) == 0
    into = device(4 * count)
    ctypes.memset(into, 0, 4 * count)
    before, calls = comm.copied_bytes()["ib"], hip_copies()
    nccl.groupStart()
    comm.send(mine, count, f32, peer)
    comm.recv(into, count, f32, peer)
    nccl.groupEnd()
    copied["both ways"] = comm.copied_bytes()["ib"] - before
    copies["both ways"] = hip_copies() - calls
    got = np.empty(count, dtype=np.float32)
    ctypes.memmove(got.ctypes.data, into, got.nbytes)
    if not np.array_equal(got, want + 1000 if RANK == 0 else want):
        wrong.append("both ways")


def _device_kind() -> str:
    """The GPU runtime this process has loaded (the one the auto rule picks
    up), else host."""
    maps = _maps()
    return "hip" if "libamdhip64" in maps else "cuda" if "libcudart" in maps else "host"


def _maps() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


if __name__ == "__main__":
    _lib.lib()
    res = main()
    maps = _maps()
    res["hip_mapped"] = "libamdhip64" in maps
    res["cudart_mapped"] = "libcudart" in maps
    print("RESULT " + json.dumps(res), flush=True)
