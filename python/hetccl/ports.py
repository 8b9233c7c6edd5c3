"""Ports that a job's processes will listen on later, chosen now.

A launcher picks a port, hands it to its ranks, and one rank binds it some
time later (after `import torch`: a second or more). Two things made a port
that looked free at the launch fail that bind with EADDRINUSE (PyTorch's
TCPStore: "The server socket has failed to listen on any local network
address", seen in CI after the tests before it had run many jobs):

- the check bound 127.0.0.1 only, where the rank binds every address
  (0.0.0.0). A socket on the same port at another address (a listener of an
  earlier job on the host's address, or one of its accepted connections in
  TIME_WAIT for a minute after it closed) does not stop the first and does
  stop the second;
- the port came from the kernel (bind to port 0), that is from the
  ephemeral range, where every other bind(0) and connect() of the machine
  takes its ports too, during the wait as well.

So `free_ports` checks the wildcard address by default, and picks at random
among ports outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range)
and above LOWEST; only where the range leaves no room does it take the
kernel's pick. Concurrent launchers may still choose the same port: at random
among some 20,000, and the loser's bind says so plainly.
"""

from __future__ import annotations

import random
import socket
from typing import List, Optional, Tuple

LOWEST = 15000          # below: well-known and registered services, often listening
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL = (32768, 60999)   # Linux's default range
TRIES = 200


def ephemeral_range(path: str = EPHEMERAL_FILE) -> Tuple[int, int]:
    """The kernel's range of ports for connect()'s local end, inclusive."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def _candidates(ephemeral: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The spans (first, last) of listen ports no connect() takes by itself."""
    lo, hi = ephemeral
    spans = [(LOWEST, lo - 1), (hi + 1, 65535)]
    return [(a, b) for a, b in spans if a <= b]


def free_ports(count: int, host: str = "",
               ephemeral: Optional[Tuple[int, int]] = None,
               rng: Optional[random.Random] = None) -> List[int]:
    """`count` distinct ports that nobody holds at this moment on `host`
    ("": on any address), outside the ephemeral range where it leaves room
    (module docstring)."""
    spans = _candidates(ephemeral or ephemeral_range())
    rng = rng or random.Random()
    sizes = [b - a + 1 for a, b in spans]
    socks: List[socket.socket] = []
    try:
        for _ in range(TRIES if spans else 0):
            if len(socks) == count:
                break
            a, b = rng.choices(spans, weights=sizes)[0]
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, rng.randint(a, b)))
            except OSError:      # held, or in TIME_WAIT: try another
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:   # no room outside the range: the kernel's pick
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
