"""One rank of tests/test_ib.py's per-pair transport cases: joins a
communicator, exchanges a message with every peer (so that every pair
connects), runs an allreduce, checks both against what they must be and
prints one line "RESULT {json}".

Environment: T_RANK, T_NRANKS, T_ID_FILE (rank 0 writes the unique id
there), T_COUNT (float32 elements per message). The result: "error" and
"message" when a call failed, else "wrong" (the checks that failed) and
"copied" (comm.copied_bytes(): payload bytes the CPU copied, per
transport). T_DIE_RANK, T_DIE_AFTER_S: that rank SIGKILLs itself that long
after init, before it sends anything (no note, as an OOM kill), having
written time.monotonic() to T_ID_FILE + ".killed"; the others' "error"
results then carry "failed_at" (time.monotonic(): one clock per machine).
"""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

from hetccl import nccl
from hetccl.errors import NcclError
from rank_procs import publish, wait_for

RANK, NRANKS = int(os.environ["T_RANK"]), int(os.environ["T_NRANKS"])
COUNT = int(os.environ.get("T_COUNT", "65536"))
F32 = nccl.NCCL_FLOAT32


def exchange_id() -> str:
    path = os.environ["T_ID_FILE"]
    if RANK == 0:
        text = nccl.unique_id_to_hex(nccl.get_unique_id())
        publish(path, text.encode())
        return text
    return wait_for(path, timeout=120).decode()


def pattern(src: int, dst: int) -> np.ndarray:
    return (np.arange(COUNT, dtype=np.float32) % 997) + 1000 * src + dst


def main() -> dict:
    try:
        comm = nccl.NcclCommunicator(NRANKS, nccl.unique_id_from_hex(exchange_id()), RANK)
    except NcclError as e:
        return {"error": e.name, "message": e.message}
    if os.environ.get("T_DIE_RANK") == str(RANK):
        time.sleep(float(os.environ.get("T_DIE_AFTER_S", "1")))
        with open(os.environ["T_ID_FILE"] + ".killed", "w") as f:
            f.write(repr(time.monotonic()))
        os.kill(os.getpid(), signal.SIGKILL)
    wrong = []
    try:
        peers = [p for p in range(NRANKS) if p != RANK]
        sends = {p: pattern(RANK, p) for p in peers}
        recvs = {p: np.full(COUNT, -1, dtype=np.float32) for p in peers}
        nccl.groupStart()
        for p in peers:
            comm.send(int(sends[p].ctypes.data), COUNT, F32, p)
            comm.recv(int(recvs[p].ctypes.data), COUNT, F32, p)
        nccl.groupEnd()
        wrong += [f"from rank {p}" for p in peers if not (recvs[p] == pattern(p, RANK)).all()]
        x = np.arange(COUNT, dtype=np.float32) % 13 + RANK
        y = np.zeros(COUNT, dtype=np.float32)
        comm.allReduce(int(x.ctypes.data), int(y.ctypes.data), COUNT, F32, nccl.NCCL_SUM)
        want = NRANKS * (np.arange(COUNT, dtype=np.float32) % 13) + sum(range(NRANKS))
        if not (y == want).all():
            wrong.append("allreduce")
        out = {"wrong": wrong}
        out["copied"] = comm.copied_bytes()
    except NcclError as e:
        failed_at = time.monotonic()
        comm.abort()
        return {"error": e.name, "message": e.message, "failed_at": failed_at}
    comm.destroy()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
