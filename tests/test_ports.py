"""hetccl.ports: the ports a launcher hands to ranks that bind them later
are free on every address, and taken outside the kernel's ephemeral range
(the module's docstring says how a port free on 127.0.0.1 alone broke
torch's TCPStore under `hetccl run`)."""

from __future__ import annotations

import random
import socket

import pytest

from hetccl import ports
from hetccl.ports import free_ports


def _bindable(port: int) -> bool:
    """As TCPStore binds its port: every address, SO_REUSEADDR."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def test_ports_are_outside_the_ephemeral_range_and_free():
    lo, hi = ports.ephemeral_range()
    got = free_ports(8, rng=random.Random(7))
    assert len(set(got)) == 8
    if lo > ports.LOWEST or hi < 65535:     # the range leaves room
        assert all(not lo <= p <= hi and p >= ports.LOWEST for p in got), (got, lo, hi)
    assert all(_bindable(p) for p in got)


def test_the_range_is_read_from_the_kernel(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ports.ephemeral_range(str(f)) == (40000, 50000)
    assert ports.ephemeral_range(str(tmp_path / "absent")) == ports.DEFAULT_EPHEMERAL


def test_a_port_held_at_another_address_is_passed_over():
    """A listener at 127.0.0.2 (as an earlier job's on the host's address)
    leaves 127.0.0.1's port free and the wildcard's not; and where the range
    leaves no room the kernel picks."""
    only = ports.LOWEST                       # the one port outside (LOWEST+1, 65535)
    narrow = (only + 1, 65535)
    held = socket.socket()
    try:
        held.bind(("127.0.0.2", only))
    except OSError:
        pytest.skip(f"port {only} is in use on this machine")
    try:
        held.listen(1)
        assert free_ports(1, host="127.0.0.1", ephemeral=narrow) == [only]
        got = free_ports(2, ephemeral=narrow)
        assert only not in got and len(set(got)) == 2 and all(_bindable(p) for p in got)
    finally:
        held.close()
    assert free_ports(1, ephemeral=narrow) == [only]
    assert len(free_ports(1, ephemeral=(1, 65535))) == 1    # no room at all
