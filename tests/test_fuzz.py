"""Fuzzing the ports a communicator opens (DESIGN.md: a foreign connection
is an answer, never a crash or a hang).

While real ranks (spawned processes, HETCCL_TRANSPORT=socket) form
communicators one after another and run collectives, a fuzzer thread in this
process connects to

- the bootstrap root: the address in the unique id (a thread of this
  process), or under NCCL_COMM_ID the port that rank 0 serves;
- every listening TCP socket that a rank process owns (rank 0's bootstrap
  star listener and the socket transport's listeners), found in
  /proc/<pid>/fd and /proc/<pid>/net/tcp{,6};

and sends garbage, truncated frames, oversized length fields, headers with
the right magic but wrong fields or a wrong secret, slow partial headers,
silent connections and resets. A random rank starts late and another is
stopped (SIGSTOP) for a moment during each init, so that the listeners stay
open long enough to be hit.

Asserted: every communicator forms and computes the right results; no rank
crashes; once a communicator is up, every fuzz connection has been closed by
hetccl (its listeners close after init); the only bytes hetccl ever sends to
a fuzz connection are a bounded reject from the root, and only to a
connection that sent a hello with the right magic.

Modes: `uid` and `commid` (the id from ncclGetUniqueId / NCCL_COMM_ID) with
every pair connected at init (HETCCL_RUNTIME_CONNECT=0); `lazy`, pairs
connected on first use, where the socket transport's listener and its
nonblocking inbox (transport/base/inbox.c) stay open after init until the
rank is connected to every peer (higher ranks that wait for it probe the
listener meanwhile, transport/base/probe.c): the ranks wait a moment before their collectives
and the fuzzer keeps firing through them, and the test asserts that fuzz
cases reached a rank's listener after init, that the collectives were
right, and that every fuzz connection was closed once the communicator
had run and been destroyed.

Reproduce with HETCCL_FUZZ_SEED (printed; the cases repeat, their timing
against the ranks does not). HETCCL_FUZZ_SECONDS (default 16) is the
fuzzing time of the whole file, split over the three modes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import random
import re
import selectors
import signal
import socket
import struct
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from hetccl import nccl
from hetccl.ports import free_ports

pytestmark = pytest.mark.usefixtures("hetccl_library")

FUZZ_SECONDS = float(os.environ.get("HETCCL_FUZZ_SECONDS", "16"))
FUZZ_SEED = int(os.environ.get("HETCCL_FUZZ_SEED", str(random.SystemRandom().getrandbits(32))))
NRANKS = 3
MODES = ["uid", "commid", "lazy"]
RANK_ENV = {
    "HETCCL_TRANSPORT": "socket",
    "HETCCL_SOCKET_NSTREAMS": "2",
    "HETCCL_SOCKET_CHUNK": "4096",   # small messages still cross pieces and streams
    "HETCCL_CONNECT_TIMEOUT": "20",
    # Every pair connects at init, so that "no port is open once the
    # communicator is up" holds (with connections on first use a socket
    # listener stays open until the rank is connected to every peer).
    "HETCCL_RUNTIME_CONNECT": "0",
}
CYCLE_DEADLINE_S = 60.0      # one communicator's init + collectives, under fire
CLOSE_GRACE_S = 3.0          # after a communicator is up, its fuzz connections must close
MAX_OPEN = 48                # fuzz connections open at once
READ_CAP = 4096              # bytes kept of what hetccl sends to one fuzz connection

# Wire constants of libhetccl (comm/bootstrap_wire.h, transport/socket/socket.c).
HELLO_MAGIC = 0x48455442534845
LINK_MAGIC = 0x484554425354CB
FRAME_MAGIC = 0x48455442534652
REJECT_MAGIC = 0x4845544253524A
SOCK_HS_MAGIC = 0x534F434B48414E44
HELLO_BYTES = 88             # hello_t
REJECT_BYTES_MAX = 512       # HETCCL_NET_REPLY_MAX
MAX_INFO = 1 << 20           # BS_MAX_INFO
MAX_RANKS = 1 << 20          # BS_MAX_RANKS


# -- the ranks --------------------------------------------------------------------------

def _collectives(comm: Any, rank: int, n: int, seed: int) -> int:
    """A few collectives with sizes from `seed`; returns how many checks passed
    (raises on a wrong result)."""
    rng = np.random.default_rng(seed)
    checks = 0
    for count in rng.choice([0, 1, 7, 1031, 4099, 65537], size=3, replace=False):
        count = int(count)
        base = np.arange(count, dtype=np.float32)
        x, y = base * (rank + 1), np.full(count, -1.0, dtype=np.float32)
        comm.allReduce(x.ctypes.data, y.ctypes.data, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
        assert np.array_equal(y, base * (n * (n + 1) // 2)), f"allreduce count={count}"
        g = np.full(count * n, -1.0, dtype=np.float32)
        mine = np.full(count, float(rank), dtype=np.float32)
        comm.allGather(mine.ctypes.data, g.ctypes.data, count, nccl.NCCL_FLOAT32)
        assert np.array_equal(g, np.repeat(np.arange(n, dtype=np.float32), count)), \
            f"allgather count={count}"
        root = int(rng.integers(n))
        b = base + root if rank == root else np.zeros(count, dtype=np.float32)
        comm.bcast(b.ctypes.data, count, nccl.NCCL_FLOAT32, root)
        assert np.array_equal(b, base + root), f"bcast root={root} count={count}"
        checks += 3
    return checks


def _rank_main(rank: int, n: int, conn: Any, env: Dict[str, str], mode: str) -> None:
    """One rank: for every (cycle, uid, delay, seed) from the parent, form a
    communicator, say so, and on the parent's word run the collectives,
    destroy it, and report."""
    os.environ.update(env)  # before the library reads its knobs
    from hetccl.nccl import NcclCommunicator, get_unique_id, unique_id_to_hex
    try:
        if mode == "commid" and rank == 0:  # every rank makes the same id
            conn.send(("uid", unique_id_to_hex(get_unique_id())))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            cycle, uid, delay, seed = msg
            if uid is None:
                uid = unique_id_to_hex(get_unique_id())
            time.sleep(delay)
            t0 = time.monotonic()
            comm = NcclCommunicator(n, uid, rank)
            conn.send(("up", cycle, time.monotonic() - t0))
            conn.recv()  # the parent looked at our ports
            checks = _collectives(comm, rank, n, seed)
            comm.destroy()
            conn.send(("ok", cycle, checks))
    except BaseException:  # noqa: B902 - every failure goes back to the parent
        conn.send(("raised", traceback.format_exc()))
    conn.close()


# -- finding the ports --------------------------------------------------------------------

def _proc_addr(hexaddr: str) -> Tuple[int, str, int]:
    """(family, ip, port) of a /proc/net/tcp{,6} address."""
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    port = int(port_hex, 16)
    if len(raw) == 4:
        return socket.AF_INET, socket.inet_ntop(socket.AF_INET, raw[::-1]), port
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.AF_INET6, socket.inet_ntop(socket.AF_INET6, words), port


Addr = Tuple[int, str, int]  # (family, ip, port)


def listening_ports(pids: List[int]) -> Dict[Addr, int]:
    """Listening TCP sockets owned by these processes: address -> index in pids."""
    owner: Dict[str, int] = {}
    for i, pid in enumerate(pids):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[link[8:-1]] = i
        except OSError:
            continue
    found: Dict[Addr, int] = {}
    if not owner:
        return found
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pids[0]}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == "0A" and cols[9] in owner:
                        found[_proc_addr(cols[1])] = owner[cols[9]]
        except (OSError, StopIteration):
            continue
    return found


def _uid_root(uid_hex: str) -> Tuple[Addr, int]:
    """The root address and the secret in a unique id (comm/bootstrap.c id_layout_t)."""
    raw = bytes.fromhex(uid_hex)
    assert raw[:8] == b"HETCCLID"
    secret = struct.unpack_from("<Q", raw, 16)[0]
    fam, port_be = struct.unpack_from("<HH", raw, 24)
    port = socket.ntohs(port_be)
    if fam == 4:
        return (socket.AF_INET, socket.inet_ntop(socket.AF_INET, raw[32:36]), port), secret
    return (socket.AF_INET6, socket.inet_ntop(socket.AF_INET6, raw[32:48]), port), secret


# -- the cases ---------------------------------------------------------------------------

@dataclass
class Case:
    kind: str
    target: str                       # "root", or "rank R" (a listener of rank R)
    addr: Addr
    chunks: List[Tuple[float, bytes]]  # (delay before, bytes)
    end: str                          # "hold", "shut" (half-close), "close", "reset"
    hello_magic: bool = False         # sends a hello with the right magic: a reply may come
    sock: Optional[socket.socket] = None
    state: str = "connecting"         # -> sending -> waiting -> done
    next_at: float = 0.0
    born: float = 0.0
    outcome: str = ""                 # refused, closed-by-peer, closed-by-us
    got: bytes = b""
    after_init: bool = False          # opened while the communicator was up


def _hello(rng: random.Random, secret: int, rank: int, nranks: int, info: int) -> bytes:
    listen = bytes(rng.getrandbits(8) for _ in range(32))
    return struct.pack("<QQiiQ32sIIiiii", HELLO_MAGIC, secret, rank, nranks, info, listen,
                       rng.getrandbits(32), rng.getrandbits(32), 0, max(nranks - 1, 0), 0, 0)


def _rand(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def _i32(rng: random.Random) -> int:
    return rng.choice([-1, 0, 1, 2, NRANKS, NRANKS + 1, MAX_RANKS + 1, -(1 << 31),
                       (1 << 31) - 1, rng.randrange(-(1 << 31), 1 << 31)])


def _root_payload(rng: random.Random, secret: int) -> Tuple[str, bytes, bool]:
    """A hello-ish byte string for the root: (kind, bytes, right magic?).
    With the right secret the fields are out of range or the hello stops
    short, so that a fuzz hello can never join (that would take a rank's
    place: the secret is what admits a rank). A hello carries no payload:
    what follows one is never read."""
    wrong = secret ^ (rng.getrandbits(64) | 1)
    kind = rng.choice(["wrong-secret", "bad-fields", "oversized", "truncated-header"])
    if kind == "wrong-secret":
        return kind, _hello(rng, wrong, rng.randrange(NRANKS), NRANKS, rng.randrange(512)) + \
            _rand(rng, rng.randrange(512)), True
    if kind == "bad-fields":
        nranks = rng.choice([0, -1, -(1 << 31), MAX_RANKS + 1, NRANKS])
        rank = rng.choice([-1, nranks, nranks + 1, (1 << 31) - 1]) if nranks > 0 else _i32(rng)
        return kind, _hello(rng, secret, rank, nranks, rng.randrange(64)), True
    if kind == "oversized":
        info = rng.choice([MAX_INFO + 1, 1 << 32, (1 << 63) - 1, (1 << 64) - 1,
                           rng.randrange(MAX_INFO + 1, 1 << 64)])
        s = rng.choice([secret, wrong])
        return kind, _hello(rng, s, rng.randrange(NRANKS), NRANKS, info) + \
            _rand(rng, rng.randrange(4096)), True
    cut = rng.randrange(1, HELLO_BYTES)
    return kind, _hello(rng, rng.choice([secret, wrong]), 0, NRANKS, 64)[:cut], cut >= 8


def _rank_payload(rng: random.Random, secret: int) -> Tuple[str, bytes]:
    """Link (bootstrap star) and handshake (socket transport) look-alikes:
    right magic, wrong secret or communicator, odd ranks and streams."""
    kind = rng.choice(["link", "handshake", "frame"])
    s = rng.choice([secret, secret ^ (rng.getrandbits(64) | 1), 0])
    comm_id = rng.getrandbits(64)  # never the real one: with it a link could take a place
    if kind == "link":
        data = struct.pack("<QQQii", LINK_MAGIC, s, comm_id, _i32(rng), _i32(rng))
    elif kind == "handshake":
        data = struct.pack("<QQQiiii", SOCK_HS_MAGIC, comm_id, s, _i32(rng), _i32(rng),
                           _i32(rng), _i32(rng))
    else:
        data = struct.pack("<QQiIQQ", FRAME_MAGIC, comm_id, _i32(rng), rng.getrandbits(32),
                           rng.getrandbits(64), rng.choice([(1 << 64) - 1, 1 << 40, 0]))
    if rng.random() < 0.3:
        data = data[:rng.randrange(1, len(data))]
    return kind, data + _rand(rng, rng.choice([0, 0, 7, 300]))


def make_case(rng: random.Random, target: str, addr: Addr, secret: int) -> Case:
    kind = rng.choice(["garbage", "silent", "slowloris", "reset", "protocol", "protocol",
                       "protocol"])
    hello = False
    if kind == "garbage":
        data = _rand(rng, rng.choice([1, 7, 31, 71, 72, 73, 500, 4096, 65536]))
    elif kind in ("silent", "reset"):
        data = b""
    elif kind == "slowloris":
        full = _hello(rng, secret ^ 1, 0, NRANKS, 64) if target == "root" else \
            _rank_payload(rng, secret)[1]
        data = full[:rng.randrange(1, max(2, len(full) - 1))]
        hello = target == "root" and len(data) >= 8
    elif target == "root":
        kind, data, hello = _root_payload(rng, secret)
    else:
        kind, data = _rank_payload(rng, secret)
    if kind == "slowloris":  # a byte at a time
        chunks = [(rng.uniform(0.02, 0.08), data[i:i + 1]) for i in range(len(data))]
    else:
        cut = sorted(rng.sample(range(1, len(data)), min(2, len(data) - 1))) \
            if len(data) > 2 and rng.random() < 0.4 else []
        bounds = [0, *cut, len(data)]
        chunks = [(0.0 if i == 0 else rng.uniform(0, 0.05), data[a:b])
                  for i, (a, b) in enumerate(zip(bounds, bounds[1:]))] if data else []
    end = "reset" if kind == "reset" else rng.choice(["hold", "hold", "shut", "close"])
    return Case(kind=kind, target=target, addr=addr, chunks=chunks, end=end, hello_magic=hello)


# -- the fuzzer -------------------------------------------------------------------------

@dataclass
class Stats:
    cases: int = 0
    by_kind: Dict[str, int] = field(default_factory=dict)
    by_target: Dict[str, int] = field(default_factory=dict)
    connected: Dict[str, int] = field(default_factory=dict)
    connected_after_init: int = 0     # to a rank's listener, the communicator up
    refused: int = 0
    closed_by_peer: int = 0
    replies: List[bytes] = field(default_factory=list)
    wrong: List[str] = field(default_factory=list)


class Fuzzer:
    """One thread, nonblocking sockets: opens cases against the current
    targets while enabled, drives their sends, and watches for hetccl closing
    them."""

    def __init__(self, seed: int, pids: List[int]) -> None:
        self.rng = random.Random(seed)
        self.pids = [*pids, os.getpid()]  # the ranks, and this process (the root's)
        self.lock = threading.Lock()
        self.root: Optional[Addr] = None
        self.secret = 0
        self.enabled = False
        self.after_init = False  # cases opened now are labelled so
        self.stop_flag = False
        self.open: List[Case] = []
        self.stats = Stats()
        self.ports: Dict[Addr, int] = {}  # listening now -> owner (index in pids)
        self.sel = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._run, name="fuzzer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_flag = True
        self.thread.join(10)
        with self.lock:
            for c in self.open:
                self._finish(c, "closed-by-us")

    def set_root(self, uid_hex: str) -> None:
        root, secret = _uid_root(uid_hex)
        with self.lock:
            self.root, self.secret = root, secret

    def enable(self, on: bool) -> bool:
        """Returns whether it was enabled."""
        with self.lock:
            was, self.enabled = self.enabled, on
        return was

    def set_after_init(self, on: bool) -> None:
        with self.lock:
            self.after_init = on

    def still_open(self) -> List[Case]:
        with self.lock:
            return list(self.open)

    # the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        last_scan = 0.0
        while not self.stop_flag:
            now = time.monotonic()
            if now - last_scan > 0.02:
                ports = listening_ports(self.pids)
                with self.lock:
                    self.ports = ports
                last_scan = now
            with self.lock:
                self._open_more(now)
                self._drive(now)
            for key, _ in self.sel.select(timeout=0.005):
                with self.lock:
                    self._readable(key.data)

    def _open_more(self, now: float) -> None:
        if not self.enabled:
            return
        nranks = len(self.pids) - 1
        while len(self.open) < MAX_OPEN:
            # Only what listens now (a port that closed refuses: no case).
            # This process listens for other tests' roots too: only ours.
            targets = [(f"rank {o}", a) for a, o in sorted(self.ports.items())
                       if o < nranks and a != self.root]
            if self.root in self.ports:
                targets += [("root", self.root)] * max(1, len(targets))
            if not targets:
                return
            target, addr = self.rng.choice(targets)
            case = make_case(self.rng, target, addr, self.secret)
            case.born = now
            case.after_init = self.after_init
            self.stats.cases += 1
            self.stats.by_kind[case.kind] = self.stats.by_kind.get(case.kind, 0) + 1
            self.stats.by_target[target] = self.stats.by_target.get(target, 0) + 1
            s = socket.socket(addr[0], socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(addr[1:])
            case.sock = s
            if err not in (0, 115):  # EINPROGRESS
                self._finish(case, "refused")
                continue
            self.open.append(case)
            self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, case)

    def _drive(self, now: float) -> None:
        for c in list(self.open):
            if c.state == "sending" and now >= c.next_at:
                self._send_next(c, now)

    def _readable(self, c: Case) -> None:
        if c.state == "done" or c.sock is None:
            return
        if c.state == "connecting":
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._finish(c, "refused")
                return
            self.stats.connected[c.target] = self.stats.connected.get(c.target, 0) + 1
            if c.after_init and c.target != "root":
                self.stats.connected_after_init += 1
            self.sel.modify(c.sock, selectors.EVENT_READ, c)
            if c.end == "reset":
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self._finish(c, "closed-by-us")
                return
            c.state = "sending"
            c.next_at = time.monotonic() + (c.chunks[0][0] if c.chunks else 0)
            return
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._finish(c, "closed-by-peer")
            return
        if not data:
            self._finish(c, "closed-by-peer")
            return
        if len(c.got) < READ_CAP:
            c.got += data[:READ_CAP - len(c.got)]

    def _send_next(self, c: Case, now: float) -> None:
        assert c.sock is not None
        if c.chunks:
            _, data = c.chunks.pop(0)
            try:
                c.sock.send(data)  # small, or the rest is simply dropped: still a case
            except BlockingIOError:
                pass
            except OSError:
                self._finish(c, "closed-by-peer")
                return
            if c.chunks:
                c.next_at = now + c.chunks[0][0]
                return
        c.state = "waiting"
        if c.end == "close":
            self._finish(c, "closed-by-us")
        elif c.end == "shut":
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._finish(c, "closed-by-peer")

    def _finish(self, c: Case, outcome: str) -> None:
        if c.state == "done":
            return
        c.state, c.outcome = "done", outcome
        if outcome == "refused":
            self.stats.refused += 1
        elif outcome == "closed-by-peer":
            self.stats.closed_by_peer += 1
        if c.got:
            self._judge_reply(c)
        if c.sock is not None:
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()
        if c in self.open:
            self.open.remove(c)

    def _judge_reply(self, c: Case) -> None:
        """hetccl may answer only a root hello that had the right magic, and
        only with one bounded reject."""
        where = f"{c.kind} case to {c.target} at {c.addr[1]}:{c.addr[2]}"
        if c.target != "root" or not c.hello_magic:
            self.stats.wrong.append(f"{where}: got {len(c.got)} bytes back: {c.got[:64]!r}")
            return
        if len(c.got) < 16 or struct.unpack_from("<Q", c.got)[0] != REJECT_MAGIC:
            self.stats.wrong.append(f"{where}: reply is not a reject: {c.got[:64]!r}")
            return
        _, _, n = struct.unpack_from("<QiI", c.got)
        if n > REJECT_BYTES_MAX - 16 or len(c.got) != 16 + n:
            self.stats.wrong.append(f"{where}: reject of {len(c.got)} bytes says {n}")
            return
        self.stats.replies.append(c.got[16:])


# -- one mode: many communicators under fire ---------------------------------------------

def _wait_replies(conns: List[Any], procs: List[Any], want: Dict[int, str],
                  timeout: float) -> Dict[int, Tuple[Any, ...]]:
    """One message from each rank in `want`; a rank that dies or stays
    silent past `timeout` fails the test."""
    got: Dict[int, Tuple[Any, ...]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(want):
        left = deadline - time.monotonic()
        assert left > 0, f"ranks {sorted(set(want) - set(got))} silent for {timeout} s " \
                         f"({', '.join(want.values())})"
        waiting = {}
        for r in want:
            if r not in got:
                waiting[conns[r]] = r
                waiting[procs[r].sentinel] = r
        for ready in multiprocessing.connection.wait(list(waiting), left):
            r = waiting[ready]
            if r in got:
                continue
            if conns[r].poll():
                got[r] = conns[r].recv()
                assert got[r][0] != "raised", f"rank {r} raised:\n{got[r][1]}"
            elif not procs[r].is_alive():
                pytest.fail(f"rank {r} died (exit status {procs[r].exitcode}) during "
                            f"{want[r]}")
    return got


def _stall(pid: int, after: float, for_s: float) -> None:
    """Stop a rank for a moment: the others wait on it with their ports open."""
    time.sleep(after)
    try:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(for_s)
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _check_closed(fuzzer: Fuzzer, pids: List[int], what: str) -> None:
    """Within CLOSE_GRACE_S, every fuzz connection is closed and no rank
    listens. The fuzzer opens no new case meanwhile (it resumes after): it
    aims at what a scan of /proc up to 20 ms old says listens, and cases
    opened against a port that had just closed would count as left open. A
    listener left open is what the second check finds; either failure
    names the ports still listening."""
    was = fuzzer.enable(False)
    end = time.monotonic() + CLOSE_GRACE_S
    while (fuzzer.still_open() or listening_ports(pids)) and time.monotonic() < end:
        time.sleep(0.02)
    left = fuzzer.still_open()
    ports = listening_ports(pids)
    assert not left, f"fuzz connections still open once {what} was up:\n" + "\n".join(
        f"  {c.kind} ({c.end}) to {c.target} at {c.addr[1]}:{c.addr[2]}, "
        f"{time.monotonic() - c.born:.1f} s old, state {c.state}" for c in left[:20]) + (
        "\nranks listening now: " + (", ".join(f"rank {o} on {a[1]}:{a[2]}"
                                            for a, o in sorted(ports.items())) or "none"))
    assert not ports, f"ranks still listen once {what} was up: " + ", ".join(
        f"rank {o} on {a[1]}:{a[2]}" for a, o in sorted(ports.items()))
    fuzzer.enable(was)


def fuzz_mode(mode: str, seconds: float, seed: int) -> Tuple[Stats, int, float]:
    rng = random.Random(seed)
    ctx = multiprocessing.get_context("spawn")
    env = dict(RANK_ENV)
    if mode == "lazy":
        env["HETCCL_RUNTIME_CONNECT"] = "1"
    if mode == "commid":
        env["NCCL_COMM_ID"] = f"127.0.0.1:{free_ports(1)[0]}"
    procs, conns = [], []
    for rank in range(NRANKS):
        here, there = ctx.Pipe()
        p = ctx.Process(target=_rank_main, name=f"fuzz-rank{rank}",
                        args=(rank, NRANKS, there, env, mode))
        p.start()
        there.close()
        procs.append(p)
        conns.append(here)
    fuzzer = Fuzzer(rng.getrandbits(64), [p.pid for p in procs])
    fuzzer.start()
    cycles, t0 = 0, time.monotonic()
    try:
        fixed_uid = None
        if mode == "commid":
            fixed_uid = _wait_replies(conns, procs, {0: "start"}, CYCLE_DEADLINE_S)[0][1]
        while cycles == 0 or time.monotonic() - t0 < seconds:
            uid = fixed_uid or nccl.unique_id_to_hex(nccl.get_unique_id())
            fuzzer.set_root(uid)
            fuzzer.enable(True)
            time.sleep(rng.uniform(0.05, 0.2))  # the root alone under fire first
            late, ops_seed = rng.randrange(NRANKS), rng.getrandbits(32)
            for r in range(NRANKS):
                delay = rng.uniform(0.1, 0.4) if r == late else 0.0
                conns[r].send((cycles, None if fixed_uid else uid, delay, ops_seed))
            victim = procs[rng.randrange(NRANKS)].pid
            staller = threading.Thread(target=_stall, args=(victim, rng.uniform(0.0, 0.3),
                                                            rng.uniform(0.1, 0.4)))
            staller.start()
            _wait_replies(conns, procs, {r: f"init of communicator {cycles}"
                                         for r in range(NRANKS)}, CYCLE_DEADLINE_S)
            staller.join()
            if mode != "lazy":
                # The communicator is up: hetccl has closed every port it
                # opened to form it, and with them every fuzz connection (the
                # fuzzer pauses for the check, then goes on against whatever listens).
                _check_closed(fuzzer, [p.pid for p in procs], f"communicator {cycles}")
            else:
                # Up, no pair connected yet: the transport's listeners stay
                # open until the collectives connect every pair; fire at them.
                fuzzer.set_after_init(True)
                time.sleep(rng.uniform(0.1, 0.3))
            for c in conns:
                c.send("go")
            _wait_replies(conns, procs, {r: f"collectives of communicator {cycles}"
                                         for r in range(NRANKS)}, CYCLE_DEADLINE_S)
            fuzzer.enable(False)
            fuzzer.set_after_init(False)
            if mode == "lazy":
                _check_closed(fuzzer, [p.pid for p in procs],
                              f"communicator {cycles} had run and was destroyed")
            cycles += 1
        for c in conns:
            c.send(None)
        for p in procs:
            p.join(10)
            assert p.exitcode == 0, f"{p.name} exit status {p.exitcode}"
    finally:
        fuzzer.stop()
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.join(5)
    return fuzzer.stats, cycles, time.monotonic() - t0


@pytest.mark.timeout(int(FUZZ_SECONDS / len(MODES)) + 120)
@pytest.mark.parametrize("mode", MODES)
def test_fuzz_ports_while_ranks_form(mode: str) -> None:
    seed = FUZZ_SEED + MODES.index(mode)
    stats, cycles, took = fuzz_mode(mode, FUZZ_SECONDS / len(MODES), seed)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_kind.items()))
    hit = ", ".join(f"{k} {v}" for k, v in sorted(stats.connected.items()))
    print(f"\n[fuzz {mode}] HETCCL_FUZZ_SEED={FUZZ_SEED}: {stats.cases} fuzz cases in "
          f"{took:.1f} s against {cycles} communicators of {NRANKS} ranks\n"
          f"  connected to: {hit}; refused {stats.refused}; closed by hetccl "
          f"{stats.closed_by_peer}; rejects received {len(stats.replies)}\n"
          f"  kinds: {kinds}")
    shapes = {re.sub(rb"[0-9]+", b"N", r): r for r in stats.replies}
    for text in sorted(shapes.values()):
        print(f"  reject: {text.decode(errors='replace')}")
    assert not stats.wrong, "hetccl answered a fuzz connection it should not have:\n" + \
        "\n".join(stats.wrong[:20])
    assert stats.connected.get("root", 0) > 0, "no fuzz case reached the root"
    assert any(k.startswith("rank") for k in stats.connected), \
        "no fuzz case reached a rank's listener"
    assert any(b"secret does not match" in r for r in stats.replies), \
        "no wrong-secret hello was told why it was refused"
    if mode == "lazy":
        print(f"  fuzz connections to a rank's listener after init: "
              f"{stats.connected_after_init}")
        assert stats.connected_after_init > 0, \
            "no fuzz case reached a rank's listener while the communicator was up"
