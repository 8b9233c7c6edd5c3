#!/usr/bin/env python3
"""A model of what a communicator costs as it grows (docs/scale.md).

For n ranks it counts, from the protocol (comm/bootstrap*.c, p2p/connect.c),
before and after the ring bootstrap and connections on first use:

- messages and bytes handled during init by the busiest process, with the
  root in rank 0's process (as when rank 0 calls ncclGetUniqueId): hellos,
  replies, bootstrap links and frames, the two init allgathers (spare ports
  + info, transport addresses);
- what a root handles with several ids (ncclCommInitRankScalable);
- rounds of latency in the bootstrap (one round: one message on the
  critical path);
- peers a rank is connected to, after init and after the first collective
  of each algorithm, and the sockets that makes on the socket transport.

`--check FILE` compares the model with tools/scale_measure.py's --json
lines (its stderr) and exits 1 if a count differs. Examples:

    python3 tools/scale_model.py --n 2 4 8 16 32 64 --check /tmp/after.json
    python3 tools/scale_model.py --before --n 2 4 8 16 32 64 --check /tmp/before.json
    python3 tools/scale_model.py                  # the table in docs/scale.md
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, List

# Wire sizes (bytes), from the structs.
INFO = 304          # hetccl_peer_info_t (comm/comm.h)
SPARE = 32          # hetccl_net_wire_addr_t
ADDRS = 3 * 128     # HETCCL_TRANSPORT_COUNT x HETCCL_TRANSPORT_ADDR_BYTES
FRAME = 40          # frame_t
LINK = 32           # link_t
OLD_HELLO, OLD_TABLE = 72, 64       # before: hello_t (+ info), table_t (+ every info)
HELLO, REPLY = 88, 64               # after: hello_t, reply_t (bootstrap_wire.h)
NSTREAMS = 2                        # HETCCL_SOCKET_NSTREAMS default
SOCK_PER_PEER = NSTREAMS + 1        # + the note line


def before(n: int) -> Dict[str, float]:
    """Root and star at rank 0; every pair connected at init."""
    root_msgs = 2 * n
    root_bytes = n * (OLD_HELLO + INFO) + n * (OLD_TABLE + n * INFO)
    own_msgs, own_bytes = 2, OLD_HELLO + INFO + OLD_TABLE + n * INFO
    links = n - 1
    gathers = [SPARE, ADDRS]
    g_msgs = sum(2 * (n - 1) for _ in gathers)
    g_bytes = sum((n - 1) * (FRAME + b) + (n - 1) * (FRAME + n * b) for b in gathers)
    return {
        "busiest_msgs": root_msgs + own_msgs + links + g_msgs if n > 1 else root_msgs + own_msgs,
        "busiest_bytes": root_bytes + own_bytes + links * LINK + g_bytes if n > 1
        else root_bytes + own_bytes,
        # hello, table, link; each allgather: up, then rank 0 sends n-1 down one after another
        "rounds": 3 + len(gathers) * (1 + (n - 1)),
        "peers_init": n - 1, "peers_ring": n - 1, "peers_tree": n - 1, "peers_a2a": n - 1,
        "star_links_rank0": n - 1,
    }


def after(n: int, nids: int = 1) -> Dict[str, float]:
    """Ring bootstrap (root in rank 0's process); pairs connect on first use."""
    group = math.ceil(n / nids)
    root_msgs = 2 * (group + (1 if nids > 1 else 0))
    root_bytes = root_msgs // 2 * (HELLO + REPLY)
    own_msgs = 2 + (2 if nids > 1 else 0) + (2 if n > 1 else 0)  # hello(s), reply(ies), link out/in
    own_bytes = own_msgs // 2 * (HELLO + REPLY) if n > 1 else HELLO + REPLY
    if n > 1:
        own_bytes = (2 + (2 if nids > 1 else 0)) // 2 * (HELLO + REPLY) + 2 * LINK
    gathers = [SPARE + INFO, ADDRS]
    g_msgs = sum(2 * (n - 1) for _ in gathers)
    g_bytes = sum(2 * (n - 1) * (FRAME + b) for b in gathers)
    lg = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    return {
        "busiest_msgs": root_msgs + own_msgs + g_msgs,
        "busiest_bytes": root_bytes + own_bytes + g_bytes,
        "rank_msgs": own_msgs + g_msgs,
        "root_msgs": root_msgs,
        "rounds": 3 + len(gathers) * (n - 1),
        "peers_init": 0,
        "peers_ring": min(2, n - 1),
        "peers_rd": min(n - 1, lg + (0 if n & (n - 1) == 0 else 1)),
        "peers_tree": min(n - 1, lg + 1),  # binomial: the root has log2 n children
        "peers_a2a": n - 1,
    }


def check(path: str, model) -> int:
    bad = 0
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        m = json.loads(line)
        n = m["n"]
        want = model(n)
        sock_init = 4 if model is after else None
        pairs = [("busiest_msgs", m["busiest_msgs"], want["busiest_msgs"]),
                 ("busiest_bytes", m["busiest_bytes"], want["busiest_bytes"])]
        if model is after:
            pairs += [("sockets after init", m["fd_init_max"], sock_init),
                      # A rank's transport listener closes once it is connected
                      # to every peer (the ring does that for n <= 3).
                      ("sockets after ring AllReduce", m["fd_allreduce_max"],
                       sock_init + SOCK_PER_PEER * want["peers_ring"]
                       - (want["peers_ring"] == n - 1)),
                      ("sockets after AlltoAll", m["fd_alltoall_max"],
                       sock_init + SOCK_PER_PEER * want["peers_a2a"] - 1)]
        else:
            # rank 0: its star links, the spare port, every peer, less the root's
            # listener (made before the count began, closed during init)
            pairs += [("sockets after init (rank 0)", m["fd_init_max"],
                       (n - 1) + 1 + SOCK_PER_PEER * (n - 1) - 1)]
        for what, got, exp in pairs:
            # The root's thread may not have closed its listener yet: + 1.
            ok = got == exp or (what.startswith("sockets") and got == exp + 1)
            bad |= not ok
            print(f"n={n:3d} {what:30s} measured {got:>10} model {exp:>10} {'ok' if ok else 'DIFF'}")
    return bad


def table(ns: List[int]) -> None:
    print("| n | before: busiest msgs | before: busiest bytes | after: busiest msgs "
          "| after: busiest bytes | after: root msgs, n/32 ids | bootstrap rounds before / after "
          "| peers per rank after init before / after | after ring AllReduce | after tree "
          "Broadcast | after rd AllReduce | after AlltoAll |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in ns:
        b, a = before(n), after(n)
        sc = after(n, max(1, n // 32))
        print(f"| {n} | {b['busiest_msgs']:,} | {fmt_bytes(b['busiest_bytes'])} "
              f"| {a['busiest_msgs']:,} | {fmt_bytes(a['busiest_bytes'])} | {sc['root_msgs']:,} "
              f"| {b['rounds']:,} / {a['rounds']:,} | {b['peers_init']:,} / {a['peers_init']} "
              f"| {a['peers_ring']} | {a['peers_tree']} | {a['peers_rd']} | {a['peers_a2a']:,} |")


def fmt_bytes(x: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{int(x)} B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+",
                    default=[2, 8, 64, 256, 1024, 4096, 16384])
    ap.add_argument("--check", help="tools/scale_measure.py --json output to compare with")
    ap.add_argument("--before", action="store_true", help="check against the star bootstrap")
    a = ap.parse_args()
    if a.check:
        return check(a.check, before if a.before else after)
    table(a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
