"""One rank of tests/test_scale.py: the NCCL ABI through ctypes (no numpy,
no hetccl package, so that 64 of them start fast on 2 cores).

argv: rank nranks dir nids. The ranks that start a group (NCCL's
documented split of ranks over nids ids) each make one unique id and
publish it in dir; every rank waits for all of them, then joins with
ncclCommInitRank (nids 1) or ncclCommInitRankScalable, runs a ring
AllReduce, an AlltoAll and a Broadcast, checks every result, and prints
"RESULT {json}" with what it held after each step: sockets (from
/proc/self/fd) and shared-memory mappings of hetccl segments (from
/proc/self/maps).
"""
import ctypes
import json
import os
import sys
import time

lib = ctypes.CDLL(os.environ["HETCCL_LIBRARY"])
rank, n, d, nids = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
F32, SUM = 7, 0


class Uid(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def group_first(g: int) -> int:
    per, extra = n // nids, n % nids
    return g * (per + 1) if g < extra else extra * (per + 1) + (g - extra) * per


def held() -> dict:
    socks = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            socks += os.readlink("/proc/self/fd/" + f).startswith("socket:")
        except OSError:
            pass
    with open("/proc/self/maps") as m:
        maps = sum("/dev/shm/hetccl-" in line for line in m)
    return {"sockets": socks, "shm_maps": maps}


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = lib.ncclGetErrorString
        err.restype = ctypes.c_char_p
        raise SystemExit(f"rank {rank}: {what} returned {rc} ({err(rc).decode()})")


firsts = [group_first(g) for g in range(nids)]
if rank in firsts:
    uid = Uid()
    check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    path = f"{d}/id.{firsts.index(rank)}"
    with open(path + ".tmp", "wb") as f:
        f.write(ctypes.string_at(ctypes.byref(uid), 128))
    os.rename(path + ".tmp", path)
ids = (Uid * nids)()
for g in range(nids):
    deadline = time.time() + 60
    while not os.path.exists(f"{d}/id.{g}"):
        if time.time() > deadline:
            raise SystemExit(f"rank {rank}: no unique id {g}")
        time.sleep(0.005)
    raw = open(f"{d}/id.{g}", "rb").read()
    ctypes.memmove(ctypes.byref(ids[g]), raw, len(raw))

before = held()
comm = ctypes.c_void_p()
t0 = time.perf_counter()
if nids == 1:
    check(lib.ncclCommInitRank(ctypes.byref(comm), n, ids[0], rank), "ncclCommInitRank")
else:
    check(lib.ncclCommInitRankScalable(ctypes.byref(comm), n, rank, nids, ids, None),
          "ncclCommInitRankScalable")
init_s = time.perf_counter() - t0
after_init = held()

count = 1 << 17  # 512 KiB: past halving-doubling (256 KiB), below the reads (1 MiB): a ring
x = (ctypes.c_float * count)(*([float(rank + 1)] * count))
y = (ctypes.c_float * count)()
check(lib.ncclAllReduce(x, y, ctypes.c_size_t(count), F32, SUM, comm, None), "ncclAllReduce")
want = n * (n + 1) / 2
assert y[0] == want and y[count - 1] == want and y[count // 2] == want, (y[0], want)
after_allreduce = held()

per = 64
a = (ctypes.c_float * (per * n))(*[float(rank * 1000 + p) for p in range(n) for _ in range(per)])
b = (ctypes.c_float * (per * n))()
check(lib.ncclAlltoAll(a, b, ctypes.c_size_t(per), F32, comm, None), "ncclAlltoAll")
for p in range(n):
    assert b[p * per] == p * 1000 + rank and b[p * per + per - 1] == p * 1000 + rank, p
after_alltoall = held()

c = (ctypes.c_float * 1000)(*([float(rank)] * 1000))
check(lib.ncclBroadcast(c, c, ctypes.c_size_t(1000), F32, n - 1, comm, None), "ncclBroadcast")
assert c[0] == n - 1 and c[999] == n - 1
check(lib.ncclCommDestroy(comm), "ncclCommDestroy")
print("RESULT " + json.dumps({"rank": rank, "init_s": init_s, "before": before,
                              "init": after_init, "allreduce": after_allreduce,
                              "alltoall": after_alltoall}), flush=True)
