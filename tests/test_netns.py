"""Multi-host without extra machines: ranks on "hosts" that are network
namespaces joined by a bridge (tests/netns_util.py builds them).

Each host has its own network namespace, hostname and IPC namespace, so
hetccl sees different hosts exactly as across machines: shm between the
ranks of one host, the socket transport between hosts, interfaces chosen by
NCCL_SOCKET_IFNAME among the host's own (hnet0, the link, and decoy0, a dead
end that comes first). Ranks are real processes started per host by a
launcher inside the host, with the HETCCL_LAUNCH_* environment of
docs/launching.md; host 0's launcher creates the unique id, so the bootstrap
root listens inside the host network. Each rank checks every result against
numpy; hetccl's TRACE log (INIT, NET, SHM, BOOTSTRAP) shows which transport
and which addresses it used.

Needs root, `ip` (iproute2) and `unshare` (util-linux); skipped with the
reason otherwise. A delayed, lossy link uses tc netem where the kernel has
it, and a TAP-pair link emulator (netns_util) everywhere.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

import pytest

from netns_util import (DECOY_IF, LINK_IF, LINK_IFINDEX, LINK_NET, Cluster, Impairment,
                        JobResult, Unavailable)

pytestmark = [pytest.mark.usefixtures("hetccl_library"), pytest.mark.timeout(180)]

COLLS = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "sendrecv"]
SMALL = {"counts": [1, 1031], "colls": COLLS}
CONNECT_TIMEOUT_S = 2     # HETCCL_CONNECT_TIMEOUT where init is meant to fail
FAIL_FAST_S = 10.0        # a failing init must end this soon (no hang)


def build(workdir: Path, nhosts: int, **kw) -> Cluster:
    try:
        return Cluster(nhosts, workdir, **kw).__enter__()
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Four hosts, plain links (shared by the tests that only run jobs)."""
    c = build(tmp_path_factory.mktemp("netns"), 4)
    try:
        yield c
    finally:
        c.destroy()


# -- reading the job's results and log ------------------------------------------------

LOG_LINE = re.compile(r"^(?P<host>[^:\s]+):(?P<pid>\d+):\d+ hetccl (?P<level>[A-Z]+) (?P<msg>.*)$")


def log_lines(job: JobResult, pattern: str) -> List[Tuple[str, int, re.Match]]:
    """(hostname, pid, match) of each log line whose text matches."""
    rx = re.compile(pattern)
    out = []
    for line in job.log:
        m = LOG_LINE.match(line)
        if m:
            hit = rx.search(m.group("msg"))
            if hit:
                out.append((m.group("host"), int(m.group("pid")), hit))
    return out


def host_of_rank(ranks_per_host: Sequence[int]) -> List[int]:
    return [h for h, k in enumerate(ranks_per_host) for _ in range(k)]


def ip_of(addr: str) -> str:
    """The address part of "1.2.3.4:56" or "[v6%scope]:56"."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.split("%")[0]


def assert_ok(job: JobResult) -> None:
    assert job.ok, job.describe()
    warnings = [line for line in job.log if " hetccl WARN " in line]
    assert not warnings, "\n".join(warnings)


def assert_addresses(job: JobResult, cluster: Cluster, ifname: str = LINK_IF,
                     v6: bool = False) -> None:
    """Every interface choice ("net: using ADDR (IF)") of every process is
    `ifname` with its own host's address on it."""
    by_name = {h.hostname: h for h in cluster.hosts}
    used = log_lines(job, r"net: using (\S+) \((\S+)\)")
    assert used, "no interface choice in the log"
    for host, pid, m in used:
        h = by_name[host]
        want = h.addr6 if v6 else h.addr
        assert m.group(2) == ifname and ip_of(m.group(1)) == want, \
            f"{host} pid {pid} used {m.group(1)} on {m.group(2)}; expected {want} on {ifname}"


def timings(job: JobResult) -> str:
    """Slowest rank's seconds per collective, one line."""
    colls: Dict[str, float] = {}
    for r in job.ranks:
        for k, v in (r or {}).get("times", {}).items():
            colls[k] = max(colls.get(k, 0.0), v)
    return ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in colls.items())


# -- (1) collectives across hosts; shm inside, socket between ----------------------------

@pytest.mark.parametrize("ranks_per_host", [(1, 1), (2, 2), (2, 1, 1), (1, 1, 1, 1)],
                         ids=["2x1", "2x2", "2+1+1", "4x1"])
def test_collectives_across_hosts(cluster: Cluster, ranks_per_host: Tuple[int, ...]) -> None:
    spec = {"counts": [1, 1031, 262147], "colls": COLLS}  # up to ~1 MiB per rank and block
    job = cluster.run(ranks_per_host, spec, env={"NCCL_SOCKET_IFNAME": LINK_IF})
    assert_ok(job)
    print(f"\n{ranks_per_host}: {job.seconds:.2f} s; {timings(job)}")
    home = host_of_rank(ranks_per_host)
    n = len(home)
    for r, res in enumerate(job.ranks):
        assert res["hostname"] == cluster.hosts[home[r]].hostname
        assert res["backend"] == "engine"
    # Pairs connect on first use (the spec's AlltoAll connects them all);
    # the engine logs each with its transport.
    first_use = r"engine: rank (\d+) connected to rank (\d+) \((\w+)\) on first use"
    pairs = {(int(m.group(1)), int(m.group(2)), m.group(3))
             for _, _, m in log_lines(job, first_use)}
    # shm exactly between the ranks of one host ...
    shm = {(a, b) for a, b, t in pairs if t == "shm"}
    assert shm == {(a, b) for a in range(n) for b in range(n) if a != b and home[a] == home[b]}
    # ... and socket between every pair of ranks on different hosts
    sock = {(a, b) for a, b, t in pairs if t == "socket"}
    assert sock == {(a, b) for a in range(n) for b in range(n) if home[a] != home[b]}
    assert_addresses(job, cluster)


def test_same_hostname_is_still_another_host(cluster: Cluster) -> None:
    """Two hosts called alike (containers, say) differ by their IPC
    namespace: still socket between them, shm within each."""
    # Every pair at init, where the transports log each connection.
    job = cluster.run((2, 2), SMALL, env={"NCCL_SOCKET_IFNAME": LINK_IF,
                                          "HETCCL_RUNTIME_CONNECT": "0"},
                      hostnames=["node", "node"])
    assert job.ok, job.describe()
    assert {r["hostname"] for r in job.ranks} == {"node"}
    shm = {(int(m.group(1)), int(m.group(2)))
           for _, _, m in log_lines(job, r"shm: rank (\d+) -> (\d+) connected")}
    assert shm == {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert {int(m.group(1)) for _, _, m in log_lines(job, r"socket rank (\d+): connected")} == \
        {0, 1, 2, 3}


def test_transport_knob(cluster: Cluster) -> None:
    """HETCCL_TRANSPORT=socket: sockets within a host too; =shm across
    hosts: init refuses, naming both hosts."""
    job = cluster.run((2, 2), SMALL, env={"NCCL_SOCKET_IFNAME": LINK_IF,
                                          "HETCCL_TRANSPORT": "socket",
                                          "HETCCL_RUNTIME_CONNECT": "0"})
    assert_ok(job)
    assert not log_lines(job, r"shm: rank \d+ -> \d+ connected")
    assert {int(m.group(1)) for _, _, m in log_lines(job, r"socket rank (\d+): connected")} == \
        {0, 1, 2, 3}
    job = cluster.run((1, 1), SMALL, env={"NCCL_SOCKET_IFNAME": LINK_IF,
                                          "HETCCL_TRANSPORT": "shm"}, timeout=FAIL_FAST_S)
    assert not job.ok and not job.timed_out, job.describe()
    for r in job.ranks:
        assert r is not None and r["error"]["name"] == "ncclInvalidUsage", job.describe()
        assert "nshost0" in r["error"]["message"] and "nshost1" in r["error"]["message"]


# -- (2) NCCL_SOCKET_IFNAME --------------------------------------------------------------

@pytest.mark.parametrize("ifname", ["hnet", "=hnet0", "^decoy,lo"])
def test_socket_ifname_picks_the_link(cluster: Cluster, ifname: str) -> None:
    """Prefix, exact and exclusion forms all pick hnet0 over the decoy that
    comes first; the bootstrap root and every connection use its subnet."""
    job = cluster.run((1, 2), {"counts": [1031], "colls": ["allreduce", "alltoall"]},
                      env={"NCCL_SOCKET_IFNAME": ifname})
    assert_ok(job)
    assert_addresses(job, cluster)
    subnet = ipaddress.ip_network(f"{LINK_NET}.0/24")
    roots = log_lines(job, r"bootstrap root (\S+): listening")
    assert len(roots) == 1 and roots[0][0] == cluster.hosts[0].hostname
    assert ip_of(roots[0][2].group(1)) == cluster.hosts[0].addr
    arrived = log_lines(job, r"rank (\d+)/\d+ arrived from ([^\s,]+)")
    assert len(arrived) == 3
    for _, _, m in arrived:
        assert ipaddress.ip_address(ip_of(m.group(2))) in subnet, m.group(0)


def test_default_interface_is_the_first_one(cluster: Cluster) -> None:
    """Without NCCL_SOCKET_IFNAME every rank takes its first non-loopback
    interface (decoy0, as NCCL would), the other hosts cannot reach it, and
    init fails within HETCCL_CONNECT_TIMEOUT naming the address: this is
    the choice the variable exists to correct."""
    job = cluster.run((1, 1), SMALL, env={"HETCCL_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S)})
    assert not job.ok and not job.timed_out, job.describe()
    assert job.seconds < CONNECT_TIMEOUT_S + FAIL_FAST_S
    for host, _, m in log_lines(job, r"net: using (\S+) \((\S+)\)"):
        h = next(x for x in cluster.hosts if x.hostname == host)
        assert (ip_of(m.group(1)), m.group(2)) == (h.decoy_addr, DECOY_IF)
    for r in job.ranks:
        assert r is not None and r["error"] is not None, job.describe()
    # host 1 was told to reach host 0 at host 0's decoy address
    assert cluster.hosts[0].decoy_addr in job.ranks[1]["error"]["message"], job.describe()


@pytest.fixture(scope="module")
def bad_ifname_job(cluster: Cluster) -> JobResult:
    """Every rank has NCCL_SOCKET_IFNAME=nosuch0, an interface no host has
    (the unique id comes from host 0's launcher, whose interface is fine)."""
    return cluster.run((1, 2), SMALL, env={"NCCL_SOCKET_IFNAME": "nosuch0"},
                       id_env={"NCCL_SOCKET_IFNAME": LINK_IF}, timeout=FAIL_FAST_S)


def assert_ifname_error(r: Dict, job: JobResult) -> None:
    assert r["error"]["name"] == "ncclSystemError", job.describe()
    assert "NCCL_SOCKET_IFNAME='nosuch0'" in r["error"]["message"], job.describe()
    assert r["init_s"] < FAIL_FAST_S / 2, job.describe()


def test_socket_ifname_nonexistent_fails_at_init(cluster: Cluster,
                                                 bad_ifname_job: JobResult) -> None:
    """An interface no host has: rank 0's init (it listens for the other
    ranks) and ncclGetUniqueId fail at once with ncclSystemError naming
    the variable."""
    job = bad_ifname_job
    assert not job.ok and not job.timed_out, job.describe()
    assert job.ranks[0] is not None, job.describe()
    assert_ifname_error(job.ranks[0], job)
    job = cluster.run((1, 1), SMALL, env={"NCCL_SOCKET_IFNAME": "nosuch0"})
    assert job.id_error is not None and "NCCL_SOCKET_IFNAME='nosuch0'" in job.id_error, \
        job.describe()


class IfnameNotChecked(AssertionError):
    """A rank other than 0 did not fail at once on its own bad interface."""


def test_socket_ifname_nonexistent_fails_at_init_on_every_rank(
        bad_ifname_job: JobResult) -> None:
    """Every rank, not only rank 0, reports its own bad interface at once."""
    job = bad_ifname_job
    for rank, r in enumerate(job.ranks[1:], 1):
        if r is None or "NCCL_SOCKET_IFNAME" not in (r["error"] or {}).get("message", ""):
            raise IfnameNotChecked(f"rank {rank} did not fail on its interface: "
                                   f"{job.describe()}")
        assert_ifname_error(r, job)


# -- IPv6 --------------------------------------------------------------------------------

def test_ipv6_across_hosts(cluster: Cluster) -> None:
    """NCCL_SOCKET_FAMILY=AF_INET6: the hosts' unique local addresses."""
    if not cluster.ipv6:
        pytest.skip("IPv6 is off on this machine")
    job = cluster.run((1, 2), SMALL, env={"NCCL_SOCKET_IFNAME": LINK_IF,
                                          "NCCL_SOCKET_FAMILY": "AF_INET6"})
    assert_ok(job)
    assert_addresses(job, cluster, v6=True)


class ForeignScopeId(AssertionError):
    """A rank connected to a peer's link-local address with the peer's
    interface index."""


def test_ipv6_link_local_across_hosts(tmp_path: Path) -> None:
    """Only link-local IPv6 on the link, the last choice of
    hetccl_net_local_addr: a peer's fe80:: address must be reached through
    this host's interface, not through the index it has on the peer."""
    c = build(tmp_path, 2, ipv6_global=False)
    try:
        if not c.ipv6:
            pytest.skip("IPv6 is off on this machine")
        job = c.run((1, 1), SMALL, env={"NCCL_SOCKET_IFNAME": LINK_IF,
                                        "NCCL_SOCKET_FAMILY": "AF_INET6",
                                        "HETCCL_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S)})
    finally:
        c.destroy()
    used = [m.group(1) for _, _, m in log_lines(job, r"net: using (\S+)")]
    assert used and all(u.startswith("[fe80:") for u in used), used
    if not job.ok:
        err = (job.ranks[1] or {}).get("error") or {}
        if f"%{LINK_IFINDEX}]" in (err.get("message") or ""):  # host 0's index, on host 1
            raise ForeignScopeId(err["message"])
    assert_ok(job)


# -- (3) NCCL_COMM_ID ---------------------------------------------------------------------

@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_comm_id_across_hosts(cluster: Cluster, family: str) -> None:
    """NCCL_COMM_ID=addr:port of host 0: every rank makes the id itself,
    rank 0 serves the root there; no id is passed around."""
    if family == "ipv6" and not cluster.ipv6:
        pytest.skip("IPv6 is off on this machine")
    port = 29500
    where = f"{cluster.hosts[0].addr}:{port}" if family == "ipv4" else \
        f"[{cluster.hosts[0].addr6}]:{port}"
    env = {"NCCL_SOCKET_IFNAME": LINK_IF, "NCCL_COMM_ID": where}
    if family == "ipv6":
        env["NCCL_SOCKET_FAMILY"] = "AF_INET6"
    job = cluster.run((2, 1, 1), SMALL, env=env, make_id=False)
    assert_ok(job)
    roots = log_lines(job, r"bootstrap root (\S+): listening")
    assert [(h, pid, m.group(1)) for h, pid, m in roots] == \
        [(cluster.hosts[0].hostname, job.ranks[0]["pid"], where)]
    assert len(log_lines(job, r"rank \d+/4 arrived from")) == 4
    assert_addresses(job, cluster, v6=family == "ipv6")


# -- (4) a delayed, lossy link ----------------------------------------------------------------

DELAY_MS = 5.0
LOSS = 0.02


@pytest.mark.parametrize("method", ["netem", "emulated"])
def test_collectives_over_a_lossy_link(tmp_path: Path, method: str) -> None:
    """Host 1's link delays every frame by 5 ms and drops 2 %, each way;
    collectives of a few MiB (4 MiB allreduce, 4 MiB per peer alltoall,
    1 MiB broadcast, send/recv and allgather per rank) stay exact, and a
    1-element allreduce takes at least the delay. Timings are printed
    (pytest -s)."""
    imp = Impairment(DELAY_MS, LOSS, method)
    c = build(tmp_path, 2, impaired={1: imp})
    try:
        spec = {"latency_probe": 10, "counts": [1031, 1 << 20],
                "colls": ["allreduce", "allgather", "broadcast", "alltoall", "sendrecv"]}
        job = c.run((1, 2), spec, env={"NCCL_SOCKET_IFNAME": LINK_IF}, timeout=120)
        stats = c.link_stats()
    finally:
        c.destroy()
    assert_ok(job)
    lat = min(r["latency_ms"] for r in job.ranks)
    print(f"\n{method} link, delay {DELAY_MS} ms, loss {LOSS:.0%}: job {job.seconds:.2f} s; "
          f"1-element allreduce median {lat:.1f} ms; {timings(job)}; link {stats[1]}")
    assert lat >= DELAY_MS, "the link's delay is not in effect"
    assert sum(stats[1]["dropped"]) > 0, f"the link dropped nothing: {stats}"


# -- (5) a lower rank on another host that never connects -------------------------------------

# Connections on first use: the lower rank of a pair connects, the higher
# one waits for it. On another host /proc cannot say whether it still
# lives; the waiting rank probes its listener (transport/base/probe.h).
LONG_TIMEOUT_S = 60       # HETCCL_TIMEOUT: the probe, not the timeout, must end these
DETECT_S = 3.0            # a killed lower rank must be named this soon after the kill
PROBE_ENV = {"NCCL_SOCKET_IFNAME": LINK_IF, "HETCCL_TIMEOUT": str(LONG_TIMEOUT_S),
             "HETCCL_RUNTIME_CONNECT": "1"}
ALIVE = r"socket rank (\d+): rank (\d+)'s listener at (\S+) answers \(alive"


def test_killed_lower_rank_on_another_host_is_named(cluster: Cluster) -> None:
    """Rank 0 (host 0) is SIGKILLed after init, before it connected to
    anyone; ranks 1 and 2 (host 1) are already in an AllReduce waiting for
    it to connect. Each fails with ncclRemoteError naming rank 0 within
    DETECT_S of the kill, far below HETCCL_TIMEOUT."""
    spec = {"counts": [1031], "colls": ["allreduce"], "die": {"rank": 0, "after_s": 1.0}}
    job = cluster.run((1, 2), spec, env=PROBE_ENV, timeout=LONG_TIMEOUT_S / 2)
    assert not job.timed_out and 0 in job.killed_at, job.describe()
    took = []
    for r in (1, 2):
        res = job.ranks[r]
        assert res is not None and res["error"] is not None, job.describe()
        assert res["error"]["name"] == "ncclRemoteError", job.describe()
        assert "rank 0 is gone" in res["error"]["message"], job.describe()
        took.append(res["failed_at"] - job.killed_at[0])
    print(f"\nkilled rank 0 named by ranks 1, 2 after {took[0]:.2f} s, {took[1]:.2f} s: "
          f"{job.ranks[1]['error']['message']!r}")
    assert max(took) < DETECT_S, job.describe()
    gone = log_lines(job, r"rank 0 is gone: its listener at (\S+) refused a connection")
    assert gone and all(ip_of(m.group(1)) == cluster.hosts[0].addr for _, _, m in gone), \
        job.describe()


def test_slow_lower_rank_on_another_host_is_not_dead(cluster: Cluster) -> None:
    """Rank 0 (host 0) starts its AllReduce 2.5 s after ranks 1 and 2
    (host 1): they probe its listener meanwhile, find it alive, and the
    AllReduce completes, without a warning."""
    spec = {"counts": [1031], "colls": ["allreduce"], "sleep": {"0": 2.5}}
    job = cluster.run((1, 2), spec, env=PROBE_ENV, timeout=LONG_TIMEOUT_S / 2)
    assert_ok(job)
    alive = {(int(m.group(1)), int(m.group(2))) for _, _, m in log_lines(job, ALIVE)}
    assert (1, 0) in alive or (2, 0) in alive, "no probe of rank 0 answered"


def test_slow_lower_rank_connected_below_is_not_dead(cluster: Cluster) -> None:
    """Socket everywhere, a host per rank. Rank 1 takes rank 0's connection
    (a send/recv between them) and then waits 2.5 s before the ring that
    makes it connect to rank 2: its listener must stay open meanwhile
    (every lower rank has connected, but it has not connected to every
    higher one), or rank 2's probes would be refused and a live rank
    called gone."""
    spec = {"counts": [1031], "colls": ["sendrecv"], "pairs": [[0, 1]], "sleep": {"1": 2.5}}
    job = cluster.run((1, 1, 1), spec, env=dict(PROBE_ENV, HETCCL_TRANSPORT="socket"),
                      timeout=LONG_TIMEOUT_S / 2)
    assert_ok(job)
    alive = {(int(m.group(1)), int(m.group(2))) for _, _, m in log_lines(job, ALIVE)}
    assert (2, 1) in alive, f"rank 2 never found rank 1 alive: {sorted(alive)}"
