"""Several "hosts" on one machine, for tests/test_netns.py.

A host is a network namespace (`ip netns`) whose ranks also run in a UTS and
IPC namespace of their own with a distinct hostname, so that hetccl's host
identity (hostname, boot id, IPC namespace) differs between hosts as it does
between machines, and their traffic goes over an interface of their own:

    host i (netns <prefix>-<i>)               switch (netns <prefix>-sw)
      lo      127.0.0.1
      decoy0  10.214.<i>.1/24 (veth pair with decoy0p, both in host i: a dead end)
      hnet0   10.213.0.<i+1>/24, fd13:213::<i+1>/64, fe80::/64
              interface index 20+i  ---------------  p<i> -- br0 (bridge, no address)

Only addresses inside these namespaces are used; nothing is added to the
namespace the tests start in. `decoy0` is created first, so it is the first
non-loopback interface of every host: without NCCL_SOCKET_IFNAME a rank
picks it (as NCCL would) and cannot reach the other hosts.

A host's link can be impaired (delay, random loss), in each direction:
  - "netem": `tc qdisc ... netem` on both ends of the veth pair, where the
    kernel has sch_netem;
  - "emulated": the link is a pair of TAP devices (hnet0 in the host, p<i>
    on the bridge) and a process of this module copies Ethernet frames
    between them, holding each one for the delay and dropping each with the
    loss probability (kernel-independent; the kernels of our CI machines
    have no sch_netem).

The module is also the program of the processes it starts (see main()):
  `host`     a host's launcher, inside the host's namespaces: creates the
             unique id when asked (so the bootstrap root listens inside the
             host network), starts the host's ranks, waits for them;
  `rank`     one rank: runs the collectives of a spec and checks each result
             against numpy; writes rank<r>.json into the job directory;
  `emulate`  the link emulator of an "emulated" link.

Namespaces are named hetccl-test-<pid>-<n>-*: a cluster left behind by a
killed run is removed by the next one (its pid no longer runs).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

NS_PREFIX = "hetccl-test-"
LINK_IF = "hnet0"          # each host's interface to the other hosts
DECOY_IF = "decoy0"        # each host's first non-loopback interface, a dead end
LINK_NET = "10.213.0"      # host i: 10.213.0.<i+1>/24
LINK_NET6 = "fd13:213::"   # host i: fd13:213::<i+1>/64 (and a link-local fe80::/64)
LINK_IFINDEX = 20          # host i's LINK_IF has interface index 20 + i
DECOY_NET = "10.214"       # host i: 10.214.<i>.1/24
IP_TIMEOUT_S = 20.0
KILL_GRACE_S = 3.0         # SIGTERM, then SIGKILL
REPORT_GRACE_S = 3.0       # after a host fails, how long the others may still finish

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


class Unavailable(Exception):
    """This machine cannot build the namespaces (not root, no veth, ...)."""


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this process when the process that started it
    exits (kept across exec), so that a killed test leaves no ranks."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (ip, tc) and capture its output; CalledProcessError
    carries stderr when it fails."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, list(argv), p.stdout, p.stderr)
    return p


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_netns() -> List[str]:
    p = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def remove_stale() -> None:
    """Delete namespaces of earlier runs whose process no longer runs."""
    for name in list_netns():
        m = re.match(re.escape(NS_PREFIX) + r"(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            sh("ip", "netns", "del", name, check=False)


def check_capabilities() -> None:
    """Raise Unavailable with the reason when namespaces cannot be built."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root (ip netns, veth, unshare)")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            raise Unavailable(f"'{tool}' not found (iproute2 / util-linux)")


# -- link impairment -----------------------------------------------------------

@dataclass(frozen=True)
class Impairment:
    """Per-direction delay and loss of one host's link."""
    delay_ms: float
    loss: float        # probability 0..1 that a frame is dropped
    method: str        # "netem" or "emulated"
    seed: int = 1


@dataclass
class Host:
    index: int
    netns: str
    hostname: str
    addr: str           # address on LINK_IF
    addr6: str          # IPv6 (unique local) address on LINK_IF, where IPv6 is on
    decoy_addr: str     # address on DECOY_IF


@dataclass
class JobResult:
    """What a job's ranks left: per rank the JSON they wrote (None when the
    rank died first), its exit status, its stderr; the log lines of all."""
    ranks: List[Optional[Dict[str, Any]]]
    status: List[Optional[int]]
    stderr: List[str]
    hosts_status: List[Optional[int]]
    timed_out: bool
    seconds: float
    log: List[str] = field(default_factory=list)
    id_error: Optional[str] = None
    killed_at: Dict[int, float] = field(default_factory=dict)  # rank -> time.monotonic()

    @property
    def ok(self) -> bool:
        return (not self.timed_out and self.id_error is None and
                all(r is not None and r.get("ok") for r in self.ranks))

    def describe(self) -> str:
        out = [f"job: {self.seconds:.1f} s, timed out: {self.timed_out}, "
               f"host launchers exited {self.hosts_status}"]
        if self.id_error:
            out.append(f"unique id: {self.id_error}")
        for r, (res, st, err) in enumerate(zip(self.ranks, self.status, self.stderr)):
            out.append(f"--- rank {r}: exit {st}, result {json.dumps(res)[:400]}")
            if err.strip():
                out.append(err.rstrip()[-3000:])
        return "\n".join(out)


class Cluster:
    """`nhosts` namespaces joined by a bridge; `impaired` maps a host index
    to the impairment of its link. Use as a context manager: the namespaces
    and helper processes go away on exit, whatever happened."""

    _serial = 0

    def __init__(self, nhosts: int, workdir: Path,
                 impaired: Optional[Mapping[int, Impairment]] = None,
                 ipv6_global: bool = True) -> None:
        if not 1 <= nhosts <= 250:
            raise ValueError("1..250 hosts")
        Cluster._serial += 1
        self.prefix = f"{NS_PREFIX}{os.getpid()}-{Cluster._serial}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [Host(i, f"{self.prefix}-{i}", f"nshost{i}", f"{LINK_NET}.{i + 1}",
                           f"{LINK_NET6}{i + 1:x}", f"{DECOY_NET}.{i}.1") for i in range(nhosts)]
        self.workdir = workdir
        self.impaired = dict(impaired or {})
        self.ipv6 = os.path.exists("/proc/sys/net/ipv6/conf/default/accept_dad")
        self.ipv6_global = ipv6_global
        self._created: List[str] = []
        self._emulators: List[subprocess.Popen] = []
        self._jobs = 0

    # -- building and removing ------------------------------------------------
    def __enter__(self) -> "Cluster":
        try:
            self.build()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def _add_netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self._created.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def build(self) -> None:
        check_capabilities()
        remove_stale()
        try:
            self._build()
        except subprocess.CalledProcessError as e:
            raise Unavailable(f"'{' '.join(e.cmd)}' failed: {(e.stderr or '').strip()}") from None

    def _build(self) -> None:
        self._add_netns(self.switch)
        sw = self.switch
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for h in self.hosts:
            self._add_netns(h.netns)
            ns = h.netns
            if self.ipv6:  # addresses usable at once (no duplicate address detection)
                sh("ip", "netns", "exec", ns, "sh", "-c",
                   "for c in all default; do echo 0 > /proc/sys/net/ipv6/conf/$c/accept_dad; done")
            # the decoy first: the lowest interface index after lo
            sh("ip", "-n", ns, "link", "add", DECOY_IF, "type", "veth", "peer", "name",
               DECOY_IF + "p")
            sh("ip", "-n", ns, "addr", "add", f"{h.decoy_addr}/24", "dev", DECOY_IF)
            sh("ip", "-n", ns, "link", "set", DECOY_IF + "p", "up")
            sh("ip", "-n", ns, "link", "set", DECOY_IF, "up")
            imp = self.impaired.get(h.index)
            port = f"p{h.index}"
            if imp is not None and imp.method == "emulated":
                self._tap_link(h, port, imp)
            else:
                # Interface indexes differ between hosts, as between machines.
                sh("ip", "-n", ns, "link", "add", LINK_IF, "index", str(LINK_IFINDEX + h.index),
                   "type", "veth", "peer", "name", port, "netns", sw)
            sh("ip", "-n", sw, "link", "set", port, "master", "br0")
            sh("ip", "-n", sw, "link", "set", port, "up")
            sh("ip", "-n", ns, "addr", "add", f"{h.addr}/24", "dev", LINK_IF)
            if self.ipv6 and self.ipv6_global:
                sh("ip", "-n", ns, "addr", "add", f"{h.addr6}/64", "dev", LINK_IF, "nodad")
            sh("ip", "-n", ns, "link", "set", LINK_IF, "up")
            if imp is not None and imp.method == "netem":
                self._netem(h, port, imp)
        probe = sh(*self.host_argv(self.hosts[0], ["hostname"]), check=False)
        if probe.returncode != 0 or probe.stdout.strip() != self.hosts[0].hostname:
            raise Unavailable("cannot run in a new UTS+IPC namespace (unshare --uts --ipc): "
                              f"{probe.stderr.strip() or probe.stdout.strip()}")
        self._wait_reachable()

    def _tap_link(self, h: Host, port: str, imp: Impairment) -> None:
        sh("ip", "-n", h.netns, "tuntap", "add", "dev", LINK_IF, "mode", "tap")
        sh("ip", "-n", self.switch, "tuntap", "add", "dev", port, "mode", "tap")
        stats = self.workdir / f"emulator-{h.index}.json"
        p = subprocess.Popen(
            [sys.executable, __file__, "emulate", h.netns, LINK_IF, self.switch, port,
             str(imp.delay_ms), str(imp.loss), str(imp.seed), str(stats)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=_die_with_parent)
        self._emulators.append(p)
        ready, _, _ = select.select([p.stdout], [], [], IP_TIMEOUT_S)
        line = p.stdout.readline() if ready else ""
        if line.strip() != "ready":
            p.kill()
            p.wait()
            raise Unavailable(f"the link emulator did not start: {line!r} {p.stderr.read()}")

    def _netem(self, h: Host, port: str, imp: Impairment) -> None:
        spec = ["delay", f"{imp.delay_ms}ms", "loss", f"{imp.loss * 100:g}%"]
        for ns, dev in ((h.netns, LINK_IF), (self.switch, port)):
            p = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem",
                   *spec, check=False)
            if p.returncode != 0:
                raise Unavailable(f"tc netem unavailable: {p.stderr.strip() or p.stdout.strip()}"
                                  " (a kernel without sch_netem?)")

    def _wait_reachable(self) -> None:
        """Until every host reaches host 0 over TCP (ARP, bridge learning).
        A listener in host 0 and one connect from each other host."""
        if len(self.hosts) < 2:
            return
        code = ("import socket,sys,time\n"
                "d=time.monotonic()+15\n"
                "while True:\n"
                "  try:\n"
                "    socket.create_connection((sys.argv[1],int(sys.argv[2])),1).close();break\n"
                "  except OSError:\n"
                "    if time.monotonic()>d: raise\n"
                "    time.sleep(0.05)\n")
        server = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[0].netns, sys.executable, "-c",
             "import socket,sys\n"
             "s=socket.socket();s.bind((sys.argv[1],0));s.listen(64)\n"
             "print(s.getsockname()[1],flush=True)\n"
             "for _ in range(int(sys.argv[2])): s.accept()[0].close()\n",
             self.hosts[0].addr, str(len(self.hosts) - 1)],
            stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
        try:
            port = server.stdout.readline().strip()
            for h in self.hosts[1:]:
                sh("ip", "netns", "exec", h.netns, sys.executable, "-c", code,
                   self.hosts[0].addr, port)
            server.wait(IP_TIMEOUT_S)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    def link_stats(self) -> Dict[int, Dict[str, List[int]]]:
        """Per impaired host: frames "forwarded" and "dropped" in each
        direction (host to switch, switch to host). Stops the emulators:
        call once the jobs are done."""
        out: Dict[int, Dict[str, List[int]]] = {}
        for i, imp in self.impaired.items():
            if imp.method != "netem":
                continue
            out[i] = {"forwarded": [], "dropped": []}
            for ns, dev in ((self.hosts[i].netns, LINK_IF), (self.switch, f"p{i}")):
                text = sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev).stdout
                m = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", text)
                out[i]["forwarded"].append(int(m.group(1)) if m else -1)
                out[i]["dropped"].append(int(m.group(2)) if m else -1)
        for p in self._emulators:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(KILL_GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for i in self.impaired:
            f = self.workdir / f"emulator-{i}.json"
            if f.exists():
                out[i] = json.loads(f.read_text())
        return out

    def destroy(self) -> None:
        for p in self._emulators:
            if p.poll() is None:
                p.kill()
            p.communicate()
        self._emulators.clear()
        for name in reversed(self._created):
            sh("ip", "netns", "del", name, check=False)
        self._created.clear()

    # -- running ranks ----------------------------------------------------------
    def host_argv(self, h: Host, argv: Sequence[str],
                  hostname: Optional[str] = None) -> List[str]:
        """argv run inside host h: its network namespace, then fresh UTS and
        IPC namespaces with h's hostname (one pair per host launcher; the
        ranks it starts share them)."""
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--ipc", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', hostname or h.hostname, *argv]

    def run(self, ranks_per_host: Sequence[int], spec: Mapping[str, Any],
            env: Optional[Mapping[str, str]] = None,
            id_env: Optional[Mapping[str, str]] = None,
            make_id: bool = True, timeout: float = 60.0,
            hostnames: Optional[Sequence[str]] = None) -> JobResult:
        """Start the ranks: host i runs ranks_per_host[i] of them, numbered
        host by host. With `make_id`, host 0's launcher creates the unique
        id (with `env` plus `id_env`) and every rank gets it as
        HETCCL_LAUNCH_ID, as `hetccl run` does; without, the ranks call
        ncclGetUniqueId themselves (NCCL_COMM_ID in `env`). `hostnames`
        replaces the hosts' own names (nshost<i>). Every process gets `env`
        over this process's environment; hetccl logs at TRACE (subsystems
        INIT, NET, SHM, BOOTSTRAP) into the job directory. Returns when
        every rank has ended, or REPORT_GRACE_S after a host failed (the
        rest are killed), or at `timeout`."""
        if len(ranks_per_host) > len(self.hosts) or min(ranks_per_host) < 1:
            raise ValueError("one entry (>= 1 ranks) per host, at most one per host")
        self._jobs += 1
        jobdir = self.workdir / f"job{self._jobs}"
        jobdir.mkdir(parents=True)
        nranks = sum(ranks_per_host)
        base_env = dict(os.environ)
        base_env.update({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "INIT,NET,SHM,BOOTSTRAP",
                         "NCCL_DEBUG_FILE": str(jobdir / "log.%h.%p"),
                         "PYTHONUNBUFFERED": "1"})
        for k in ("HETCCL_DEBUG", "HETCCL_DEBUG_SUBSYS", "HETCCL_DEBUG_FILE", "NCCL_COMM_ID",
                  "NCCL_SOCKET_IFNAME", "HETCCL_LAUNCH_ID"):
            base_env.pop(k, None)
        base_env.update(env or {})
        start = time.monotonic()
        deadline = start + timeout
        launchers: List[subprocess.Popen] = []
        launch_id: Optional[str] = None
        id_error = None
        timed_out = False
        first = 0
        try:
            for h, k in zip(self.hosts, ranks_per_host):
                args = {"jobdir": str(jobdir), "first_rank": first, "nranks": nranks,
                        "local": k, "spec": dict(spec),
                        "make_id": make_id and h.index == 0}
                henv = dict(base_env)
                if h.index == 0 and make_id:
                    henv["HETCCL_NETNS_ID_ENV"] = json.dumps(dict(id_env or {}))
                elif make_id:
                    henv["HETCCL_LAUNCH_ID"] = launch_id
                with open(jobdir / f"host{h.index}.err", "w") as err:
                    launchers.append(subprocess.Popen(
                        self.host_argv(h, [sys.executable, __file__, "host", json.dumps(args)],
                                       hostnames[h.index] if hostnames else None),
                        env=henv, stdout=subprocess.PIPE, stderr=err, text=True,
                        start_new_session=True, preexec_fn=_die_with_parent))
                first += k
                if h.index == 0 and make_id:
                    launch_id, id_error = _read_id(launchers[0], deadline)
                    if id_error is not None:
                        break
            if id_error is None:
                timed_out = _wait_all(launchers, deadline)
        finally:
            for p in launchers:
                _kill_group(p)
        seconds = time.monotonic() - start
        ranks, status, stderr = [], [], []
        for r in range(nranks):
            f = jobdir / f"rank{r}.json"
            ranks.append(json.loads(f.read_text()) if f.exists() else None)
            rc = jobdir / f"rank{r}.rc"
            status.append(int(rc.read_text()) if rc.exists() else None)
            err = jobdir / f"rank{r}.err"
            stderr.append(err.read_text(errors="replace") if err.exists() else "")
        log: List[str] = []
        for f in sorted(jobdir.glob("log.*")):
            log.extend(f.read_text(errors="replace").splitlines())
        killed_at = {r: float((jobdir / f"rank{r}.killed").read_text())
                     for r in range(nranks) if (jobdir / f"rank{r}.killed").exists()}
        return JobResult(ranks, status, stderr, [p.returncode for p in launchers], timed_out,
                         seconds, log, id_error, killed_at)


def _read_id(p: subprocess.Popen, deadline: float):
    """The launch id that host 0's launcher prints, or (None, why)."""
    left = max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([p.stdout], [], [], left)
    line = p.stdout.readline().strip() if ready else ""
    if line.startswith("ID "):
        return line[3:], None
    if line.startswith("IDERROR "):
        return None, line[8:]
    return None, f"host 0's launcher printed {line!r} (exit {p.poll()})"


def _wait_all(procs: Sequence[subprocess.Popen], deadline: float) -> bool:
    """Wait for every launcher; once one fails the others get
    REPORT_GRACE_S. True when the deadline passed."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False
        now = time.monotonic()
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, now + REPORT_GRACE_S)
        if now > deadline:
            return not any(c not in (None, 0) for c in codes)
        time.sleep(0.02)


def _exited(pid: int) -> bool:
    """Has our child `pid` ended? It stays unreaped (a zombie still holds its
    process group id, so the group cannot be another's yet)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _kill_group(p: subprocess.Popen) -> None:
    """End a launcher that still runs and its ranks (its process group)."""
    if p.returncode is None and not _exited(p.pid):
        os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while not _exited(p.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGKILL)  # the ranks too, if the launcher went first
    p.wait()
    if p.stdout:
        p.stdout.close()


# -- inside a host: the launcher ----------------------------------------------------

def host_main(args: Dict[str, Any]) -> int:
    """Start this host's ranks (HETCCL_LAUNCH_* as docs/launching.md says)
    and wait; with make_id, create the unique id first and print it: this
    process then serves the bootstrap root, inside the host's network."""
    launch_id = os.environ.get("HETCCL_LAUNCH_ID")
    env = dict(os.environ)  # the ranks' environment: without id_env
    env.pop("HETCCL_NETNS_ID_ENV", None)
    if args["make_id"]:
        os.environ.update(json.loads(os.environ.pop("HETCCL_NETNS_ID_ENV", "{}")))
        from hetccl import nccl
        try:
            launch_id = nccl.unique_id_to_hex(nccl.get_unique_id())
        except Exception as e:  # noqa: BLE001 - the orchestrator reports it
            print(f"IDERROR {type(e).__name__}: {e}", flush=True)
            return 3
        print(f"ID {launch_id}", flush=True)
    jobdir = Path(args["jobdir"])
    procs = []
    for local in range(args["local"]):
        rank = args["first_rank"] + local
        renv = dict(env, HETCCL_LAUNCH_RANK=str(rank), HETCCL_LAUNCH_NRANKS=str(args["nranks"]),
                    HETCCL_LAUNCH_LOCAL_RANK=str(local))
        if launch_id:
            renv["HETCCL_LAUNCH_ID"] = launch_id
        else:
            renv.pop("HETCCL_LAUNCH_ID", None)
        with open(jobdir / f"rank{rank}.out", "w") as out, \
                open(jobdir / f"rank{rank}.err", "w") as err:
            procs.append((rank, subprocess.Popen(
                [sys.executable, __file__, "rank", json.dumps(args["spec"])], env=renv,
                stdout=out, stderr=err, preexec_fn=_die_with_parent)))

    def stop(signum: int, _frame: Any) -> None:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    failed = 0
    for rank, p in procs:
        rc = p.wait()
        (jobdir / f"rank{rank}.rc").write_text(str(rc))
        failed = failed or (rc if rc > 0 else 128 - rc if rc < 0 else 0)
    return failed


# -- inside a host: one rank -----------------------------------------------------------

def _inputs(np: Any, kind: str, rank: int, count: int, dtype: str) -> Any:
    """Rank `rank`'s input of a case; every rank computes every rank's."""
    rng = np.random.default_rng([sum(map(ord, kind)), rank, count])
    if dtype == "uint8":
        return rng.integers(0, 256, size=count, dtype=np.uint8)
    # small integers: sums are exact in float32
    return rng.integers(-8, 9, size=count).astype(dtype)


def rank_main(spec: Dict[str, Any]) -> int:
    """Run spec["colls"] for every count of spec["counts"] and check them;
    write rank<r>.json (ok, error, timings, hostname) into the job dir."""
    import socket
    rank = int(os.environ["HETCCL_LAUNCH_RANK"])
    nranks = int(os.environ["HETCCL_LAUNCH_NRANKS"])
    out: Dict[str, Any] = {"rank": rank, "nranks": nranks, "pid": os.getpid(),
                           "hostname": socket.gethostname(),
                           "ok": False, "error": None, "times": {}}
    jobdir = Path(os.environ["NCCL_DEBUG_FILE"]).parent
    try:
        _rank_body(spec, rank, nranks, out)
        out["ok"] = True
    except BaseException as e:  # noqa: B902 - reported in the rank's JSON
        out["failed_at"] = time.monotonic()  # one clock for every process of the machine
        out["error"] = {"type": type(e).__name__, "text": str(e),
                        "name": getattr(e, "name", None), "message": getattr(e, "message", None)}
        traceback.print_exc()
    (jobdir / f"rank{rank}.json").write_text(json.dumps(out))
    return 0 if out["ok"] else 1


def _rank_body(spec: Dict[str, Any], rank: int, n: int, out: Dict[str, Any]) -> None:
    import numpy as np
    from hetccl import nccl

    t0 = time.monotonic()
    launch_id = os.environ.get("HETCCL_LAUNCH_ID")
    uid = launch_id if launch_id else nccl.get_unique_id()  # NCCL_COMM_ID mode
    try:
        comm = nccl.NcclCommunicator(n, uid, rank)
    finally:
        out["init_s"] = time.monotonic() - t0
    out["backend"] = comm.backend()
    f32, u8 = nccl.NCCL_FLOAT32, nccl.NCCL_UINT8

    def p(a: Any) -> int:
        return int(a.ctypes.data)

    # Before the collectives: a pair's first connection, a rank killed, a
    # slow rank (the order of these keys).
    for pair in spec.get("pairs", []):  # one send/recv each way: connects the pair
        if rank in pair:
            other = pair[1] if rank == pair[0] else pair[0]
            mine, theirs = np.full(1, rank, np.uint8), np.zeros(1, np.uint8)
            nccl.groupStart()
            comm.send(p(mine), 1, u8, other)
            comm.recv(p(theirs), 1, u8, other)
            nccl.groupEnd()
            if theirs[0] != other:
                raise AssertionError(f"rank {rank}: pair {pair}: got {theirs[0]}")
    die = spec.get("die")
    if die and die["rank"] == rank:  # SIGKILL: no note, no goodbye, like an OOM kill
        time.sleep(float(die["after_s"]))
        jobdir = Path(os.environ["NCCL_DEBUG_FILE"]).parent
        (jobdir / f"rank{rank}.killed").write_text(repr(time.monotonic()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(spec.get("sleep", {}).get(str(rank), 0.0)))

    def check(label: str, got: Any, want: Any) -> None:
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            raise AssertionError(f"rank {rank}: {label}: {bad.size} of {want.size} elements "
                                 f"differ, first at {bad[0]}: got {got[bad[0]]}, want "
                                 f"{want[bad[0]]}")

    def timed(label: str, fn: Any) -> None:
        t = time.monotonic()
        fn()
        out["times"][label] = out["times"].get(label, 0.0) + time.monotonic() - t

    probe = int(spec.get("latency_probe", 0))
    if probe:  # small allreduces: each crosses a link at least once
        a = np.ones(1, np.float32)
        b = np.zeros(1, np.float32)
        lat = []
        for _ in range(probe):
            t = time.monotonic()
            comm.allReduce(p(a), p(b), 1, f32, nccl.NCCL_SUM)
            lat.append(time.monotonic() - t)
        check("latency probe", b, np.full(1, n, np.float32))
        out["latency_ms"] = float(np.median(lat) * 1000)

    for count in spec.get("counts", []):
        for coll in spec.get("colls", []):
            label = f"{coll} count={count}"
            if coll == "allreduce":
                xs = [_inputs(np, coll, j, count, "float32") for j in range(n)]
                res = np.zeros(count, np.float32)
                timed(coll, lambda: comm.allReduce(p(xs[rank]), p(res), count, f32,
                                                   nccl.NCCL_SUM))
                check(label, res, np.sum(xs, axis=0, dtype=np.float32))
            elif coll == "allgather":
                xs = [_inputs(np, coll, j, count, "uint8") for j in range(n)]
                res = np.zeros(n * count, np.uint8)
                timed(coll, lambda: comm.allGather(p(xs[rank]), p(res), count, u8))
                check(label, res, np.concatenate(xs))
            elif coll == "broadcast":
                root = n - 1  # on the last host: the data crosses hosts
                x = _inputs(np, coll, root, count, "uint8")
                res = x.copy() if rank == root else np.zeros(count, np.uint8)
                timed(coll, lambda: comm.broadcast(p(res), p(res), count, u8, root))
                check(label, res, x)
            elif coll == "reducescatter":
                xs = [_inputs(np, coll, j, n * count, "float32") for j in range(n)]
                res = np.zeros(count, np.float32)
                timed(coll, lambda: comm.reduceScatter(p(xs[rank]), p(res), count, f32,
                                                       nccl.NCCL_SUM))
                want = np.sum(xs, axis=0, dtype=np.float32)[rank * count:(rank + 1) * count]
                check(label, res, want)
            elif coll == "alltoall":
                xs = [_inputs(np, coll, j, n * count, "float32") for j in range(n)]
                res = np.zeros(n * count, np.float32)
                timed(coll, lambda: comm.alltoall(p(xs[rank]), p(res), count, f32))
                want = np.concatenate([xs[j][rank * count:(rank + 1) * count] for j in range(n)])
                check(label, res, want)
            elif coll == "sendrecv":  # a ring: to rank+1, from rank-1
                xs = [_inputs(np, coll, j, count, "uint8") for j in range(n)]
                res = np.zeros(count, np.uint8)
                nxt, prv = (rank + 1) % n, (rank - 1) % n

                def ring() -> None:
                    nccl.groupStart()
                    comm.send(p(xs[rank]), count, u8, nxt)
                    comm.recv(p(res), count, u8, prv)
                    nccl.groupEnd()
                timed(coll, ring)
                check(label, res, xs[prv])
            else:
                raise ValueError(f"unknown collective {coll}")
    comm.destroy()
    out["total_s"] = time.monotonic() - t0


# -- the link emulator ---------------------------------------------------------------

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def _open_tap(netns: str, name: str) -> int:
    """Attach to the persistent TAP device `name` of namespace `netns`."""
    import fcntl
    import struct
    nsfd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(nsfd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns})")
    finally:
        os.close(nsfd)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def emulate_main(argv: Sequence[str]) -> int:
    """Copy frames between two TAP devices, each held `delay` ms and
    dropped with probability `loss` (in each direction), in order. Writes
    its counters to `stats` on SIGTERM; exits when its parent does."""
    import random
    ns_a, dev_a, ns_b, dev_b, delay_ms, loss, seed, stats = argv
    delay, loss = float(delay_ms) / 1000.0, float(loss)
    rng = random.Random(int(seed))
    fds = [_open_tap(ns_a, dev_a), _open_tap(ns_b, dev_b)]
    parent = os.getppid()
    queues: List[deque] = [deque(), deque()]   # frames from side i, to the other side
    counts = {"forwarded": [0, 0], "dropped": [0, 0], "bytes": [0, 0]}
    running = [True]

    def stop(_signum: int, _frame: Any) -> None:
        running[0] = False

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while running[0]:
        now = time.monotonic()
        due = [q[0][0] for q in queues if q]
        wait = min(max(0.0, min(due) - now), 0.2) if due else 0.2
        try:
            readable, _, _ = select.select(fds, [], [], wait)
        except InterruptedError:
            continue
        now = time.monotonic()
        for i, fd in enumerate(fds):
            if fd not in readable:
                continue
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if rng.random() < loss:
                    counts["dropped"][i] += 1
                else:
                    queues[i].append((now + delay, frame))
        now = time.monotonic()
        for i, q in enumerate(queues):
            while q and q[0][0] <= now:
                _, frame = q.popleft()
                try:
                    os.write(fds[1 - i], frame)
                    counts["forwarded"][i] += 1
                    counts["bytes"][i] += len(frame)
                except OSError:
                    counts["dropped"][i] += 1
        if os.getppid() != parent:
            break
    Path(stats).write_text(json.dumps(counts))
    return 0


def main(argv: Sequence[str]) -> int:
    if argv[0] == "host":
        return host_main(json.loads(argv[1]))
    if argv[0] == "rank":
        return rank_main(json.loads(argv[1]))
    if argv[0] == "emulate":
        return emulate_main(argv[1:])
    raise SystemExit(f"usage: {argv[0]} host|rank|emulate ...")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
