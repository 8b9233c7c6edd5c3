"""Rank discovery from the environment a launcher gives each process, and
the unique id carried from rank 0 to the others over TCP (docs/launching.md).

Contract:

- `discover(env)` reads only the variables named in LAUNCHERS (and the
  HETCCL_* knobs in KNOBS); it has no side effect. The first launcher of
  the table whose `detect` variables are all set wins, unless
  HETCCL_LAUNCHER names one. Order matters: a launcher that runs inside
  another's allocation (mpirun or torchrun inside a Slurm job, which sets
  SLURM_PROCID for the batch script) comes before it.
- The result (`RankInfo`) says which launcher it detected and every
  variable it read with its value (`RankInfo.variables`), so a user (and
  the tests) can see where each number came from.
- The unique id: under `hetccl run` the first communicator's is in
  HETCCL_LAUNCH_ID (one id serves one communicator); the later ones, and
  every one under other launchers, rank 0 makes with ncclGetUniqueId and
  serves at the root address (port on every interface); the other ranks
  connect there and fetch it. `hetccl run` sets HETCCL_ROOT_ADDR for that
  (127.0.0.1 and a port free at the launch), as `hetccl rank` passes on the
  address its own exchange used. Where
  the root address comes from, first that applies: HETCCL_ROOT_ADDR
  (host[:port]); MASTER_ADDR (torchrun's convention, also honoured under
  other launchers); the first host of the Slurm step's node list; 127.0.0.1
  when the launcher says every rank is on one host. The port: HETCCL_ROOT_PORT,
  else the port in HETCCL_ROOT_ADDR, else MASTER_PORT + 1 (MASTER_PORT
  itself is torch's store: torchrun's agent holds it on the first node, and
  init_process_group binds it in rank 0), else DEFAULT_ROOT_PORT.
- The exchange is bounded by HETCCL_ROOT_TIMEOUT seconds on every rank: a
  rank that cannot fetch the id in time raises LaunchEnvError naming the
  address and where it came from; rank 0 stops serving once every other
  rank has fetched the id, or when its communicator is made.
- Every request names the job (a launcher's job id variable, when it has
  one), the world size and the request's sequence number in the process
  (one per `init_from_env` call): a server of another job, of another size
  or of an earlier call answers with an error, never with a wrong id.

Threads: `IdServer` runs one daemon thread per served id; it owns its
listening socket and exits on `close()` or after serving every rank.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from typing import TYPE_CHECKING

from .nccl import get_unique_id, unique_id_from_hex_bytes, unique_id_to_hex

if TYPE_CHECKING:
    from .arrays import Communicator

DEFAULT_ROOT_PORT = 29501      # torch's default MASTER_PORT (29500) + 1
DEFAULT_ROOT_TIMEOUT_S = 120.0
RETRY_S = 0.1                  # between connection attempts of a fetching rank
PROTOCOL = "hetccl-id 1"

# (name, default, help) of the Python-side knobs; `hetccl info` prints them.
KNOBS: Tuple[Tuple[str, str, str], ...] = (
    ("HETCCL_LAUNCHER", "", "use this entry of the launcher table instead of detecting one"),
    ("HETCCL_ROOT_ADDR", "", "host[:port] where rank 0 serves the unique id"),
    ("HETCCL_ROOT_PORT", "", f"port of the unique id's server (default MASTER_PORT+1, "
                             f"else {DEFAULT_ROOT_PORT})"),
    ("HETCCL_ROOT_TIMEOUT", f"{DEFAULT_ROOT_TIMEOUT_S:g}",
     "seconds a rank waits to serve or fetch the unique id"),
    ("HETCCL_WORLD_SIZE", "", "number of ranks where the launcher does not say (PMIx)"),
    ("HETCCL_LAUNCH_START", "spawn", "how hetccl.launch starts rank processes: spawn, or "
                                     "forkserver (forks of a server that imported numpy and "
                                     "hetccl once)"),
)


class LaunchEnvError(RuntimeError):
    """The environment does not describe this rank, or the unique id could
    not be served or fetched."""


@dataclass(frozen=True)
class Launcher:
    """One row of the table. Each field lists candidate variables; the first
    one set is read. `job` names the variables that identify one job."""
    name: str
    detect: Tuple[str, ...]
    rank: Tuple[str, ...]
    size: Tuple[str, ...]
    local_rank: Tuple[str, ...] = ()
    local_size: Tuple[str, ...] = ()
    job: Tuple[str, ...] = ()
    nodelist: Tuple[str, ...] = ()   # a Slurm-style host list: rank 0 is on its first host
    nnodes: Tuple[str, ...] = ()     # number of hosts of the job, where said


LAUNCHERS: Tuple[Launcher, ...] = (
    Launcher("hetccl", detect=("HETCCL_LAUNCH_ID",), rank=("HETCCL_LAUNCH_RANK",),
             size=("HETCCL_LAUNCH_NRANKS",), local_rank=("HETCCL_LAUNCH_LOCAL_RANK",)),
    Launcher("torchrun", detect=("RANK", "WORLD_SIZE"), rank=("RANK",), size=("WORLD_SIZE",),
             local_rank=("LOCAL_RANK",), local_size=("LOCAL_WORLD_SIZE",),
             job=("TORCHELASTIC_RUN_ID",)),
    Launcher("openmpi", detect=("OMPI_COMM_WORLD_RANK",), rank=("OMPI_COMM_WORLD_RANK",),
             size=("OMPI_COMM_WORLD_SIZE",), local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
             local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
             job=("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")),
    Launcher("mpich", detect=("PMI_RANK",), rank=("PMI_RANK",), size=("PMI_SIZE",),
             local_rank=("MPI_LOCALRANKID",), local_size=("MPI_LOCALNRANKS",)),
    # PMIx gives the size only through PMIx_Get, not in the environment.
    Launcher("pmix", detect=("PMIX_RANK",), rank=("PMIX_RANK",),
             size=("HETCCL_WORLD_SIZE", "SLURM_NTASKS"), job=("PMIX_NAMESPACE",),
             nodelist=("SLURM_STEP_NODELIST",)),
    Launcher("slurm", detect=("SLURM_PROCID",), rank=("SLURM_PROCID",),
             size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
             local_rank=("SLURM_LOCALID",), job=("SLURM_JOB_ID", "SLURM_JOBID"),
             nodelist=("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
             nnodes=("SLURM_STEP_NUM_NODES", "SLURM_NNODES")),
)

BY_NAME: Dict[str, Launcher] = {l.name: l for l in LAUNCHERS}


@dataclass(frozen=True)
class RankInfo:
    launcher: str
    rank: int
    size: int
    local_rank: int
    local_size: Optional[int]
    job: str                                  # "" where the launcher names no job
    root: Optional[Tuple[str, int]]           # None under `hetccl run` (the id is in the env)
    root_source: str                          # which variables gave the root address
    unique_id: Optional[str] = None           # hex, where the environment carries it
    variables: Dict[str, str] = field(default_factory=dict)  # every variable read

    def describe(self) -> str:
        where = (f"id from {self.root[0]}:{self.root[1]} ({self.root_source})"
                 if self.root else "id from HETCCL_LAUNCH_ID")
        local = f"local {self.local_rank}" + (f" of {self.local_size}"
                                              if self.local_size is not None else "")
        read = " ".join(f"{k}={v}" for k, v in self.variables.items())
        return f"{self.launcher}: rank {self.rank} of {self.size} ({local}); {where}; read {read}"


# -- Slurm host lists ----------------------------------------------------------------

def _split_top(text: str) -> List[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    out.append(cur)
    return [p for p in (s.strip() for s in out) if p]


def expand_nodelist(text: str) -> List[str]:
    """Slurm's compressed host list ("gpu[01-03,7],login1", "r[1-2]n[0-1]")
    as host names, in order."""
    hosts: List[str] = []
    for item in _split_top(text):
        m = re.search(r"\[([^\]]*)\]", item)
        if not m:
            hosts.append(item)
            continue
        head, tail = item[:m.start()], item[m.end():]
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise LaunchEnvError(f"cannot read the host list {text!r} at {part!r}")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.extend(expand_nodelist(f"{head}{n:0{len(lo)}d}{tail}"))
    return hosts


# -- reading the environment -----------------------------------------------------------

def _first(env: Mapping[str, str], names: Sequence[str],
           read: Dict[str, str]) -> Optional[Tuple[str, str]]:
    for n in names:
        value = env.get(n)
        if value is not None and value != "":
            read[n] = value
            return n, value
    return None


def _int(env: Mapping[str, str], names: Sequence[str], read: Dict[str, str],
         launcher: str, what: str, required: bool = True) -> Optional[int]:
    hit = _first(env, names, read)
    if hit is None:
        if required:
            raise LaunchEnvError(f"{launcher}: no {what} in the environment "
                                 f"(looked for {', '.join(names)})")
        return None
    try:
        value = int(hit[1])
    except ValueError:
        raise LaunchEnvError(f"{launcher}: {hit[0]}={hit[1]!r} is not a number") from None
    if value < 0:
        raise LaunchEnvError(f"{launcher}: {hit[0]}={hit[1]} is negative")
    return value


def detect(env: Optional[Mapping[str, str]] = None) -> Optional[Launcher]:
    """The launcher whose variables are set (HETCCL_LAUNCHER forces one), or
    None: a process started by hand."""
    env = os.environ if env is None else env
    forced = env.get("HETCCL_LAUNCHER", "")
    if forced:
        if forced not in BY_NAME:
            raise LaunchEnvError(f"HETCCL_LAUNCHER={forced!r}: not one of "
                                 f"{', '.join(BY_NAME)}")
        return BY_NAME[forced]
    for launcher in LAUNCHERS:
        if all(env.get(v) for v in launcher.detect):
            return launcher
    return None


def _root(env: Mapping[str, str], l: Launcher, size: int, local_size: Optional[int],
          read: Dict[str, str]) -> Tuple[Tuple[str, int], str]:
    """(host, port) of the id server and the variables it came from."""
    host, source, port = None, "", None
    explicit = _first(env, ("HETCCL_ROOT_ADDR",), read)
    master = _first(env, ("MASTER_ADDR",), read)
    if explicit:
        text = explicit[1]
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:]+)(?::(\d+))?|([0-9a-fA-F:]+)", text)
        if not m:
            raise LaunchEnvError(f"HETCCL_ROOT_ADDR={text!r} is not host[:port]")
        host = m.group(1) or m.group(3) or m.group(5)
        port_text = m.group(2) or m.group(4)
        port = int(port_text) if port_text else None
        source = "HETCCL_ROOT_ADDR"
    elif master:
        host, source = master[1], "MASTER_ADDR"
    else:
        nodes = _first(env, l.nodelist, read)
        nnodes = _int(env, l.nnodes, read, l.name, "node count", required=False)
        if nodes:
            host, source = expand_nodelist(nodes[1])[0], f"first host of {nodes[0]}"
        elif local_size == size or nnodes == 1 or size == 1:
            host, source = "127.0.0.1", "every rank on this host"
    if host is None:
        raise LaunchEnvError(
            f"{l.name}: no address for rank 0's unique id server: set HETCCL_ROOT_ADDR to the "
            f"host of rank 0 (or MASTER_ADDR); `hetccl run --launcher` sets it")
    explicit_port = _int(env, ("HETCCL_ROOT_PORT",), read, l.name, "port", required=False)
    if explicit_port is not None:
        port, source = explicit_port, source + ", HETCCL_ROOT_PORT"
    elif port is None:
        master_port = _int(env, ("MASTER_PORT",), read, l.name, "port", required=False)
        if master_port is not None:
            port, source = master_port + 1, source + ", MASTER_PORT+1"
        else:
            port, source = DEFAULT_ROOT_PORT, source + f", default port {DEFAULT_ROOT_PORT}"
    if not 0 < port < 65536:
        raise LaunchEnvError(f"unique id server port {port} is out of range ({source})")
    return (host, port), source


def discover(env: Optional[Mapping[str, str]] = None) -> Optional[RankInfo]:
    """This process's place in its job, from the environment; None when no
    launcher started it. Raises LaunchEnvError when a launcher's variables
    are there but do not describe a rank (with the variable at fault)."""
    env = os.environ if env is None else env
    l = detect(env)
    if l is None:
        return None
    read: Dict[str, str] = {}
    if env.get("HETCCL_LAUNCHER"):
        read["HETCCL_LAUNCHER"] = env["HETCCL_LAUNCHER"]
    rank = _int(env, l.rank, read, l.name, "rank")
    size = _int(env, l.size, read, l.name, "world size")
    assert rank is not None and size is not None
    if not rank < size:
        raise LaunchEnvError(f"{l.name}: rank {rank} is not below the world size {size} "
                             f"({', '.join(f'{k}={v}' for k, v in read.items())})")
    local_rank = _int(env, l.local_rank, read, l.name, "local rank", required=False)
    local_size = _int(env, l.local_size, read, l.name, "local size", required=False)
    job_hit = _first(env, l.job, read)
    job = job_hit[1] if job_hit else ""
    if l.name == "hetccl":
        uid = env["HETCCL_LAUNCH_ID"]
        read["HETCCL_LAUNCH_ID"] = uid[:8] + "..."
        if env.get("HETCCL_LAUNCH_SOURCE"):  # set by `hetccl rank`: the outer launcher
            read["HETCCL_LAUNCH_SOURCE"] = env["HETCCL_LAUNCH_SOURCE"]
        return RankInfo(l.name, rank, size, rank if local_rank is None else local_rank,
                        local_size, job, None, "", uid, read)
    root, source = _root(env, l, size, local_size, read)
    return RankInfo(l.name, rank, size, rank if local_rank is None else local_rank,
                    local_size, job, root, source, None, read)


def root_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    env = os.environ if env is None else env
    text = env.get("HETCCL_ROOT_TIMEOUT", "")
    try:
        value = float(text) if text else DEFAULT_ROOT_TIMEOUT_S
    except ValueError:
        raise LaunchEnvError(f"HETCCL_ROOT_TIMEOUT={text!r} is not a number of seconds") \
            from None
    if value <= 0:
        raise LaunchEnvError(f"HETCCL_ROOT_TIMEOUT={text!r} must be positive")
    return value


# -- the unique id over TCP ----------------------------------------------------------------

_generation = [0]
_generation_lock = threading.Lock()


def next_generation() -> int:
    """Sequence number of this process's next id exchange (the same on
    every rank when every rank makes its communicators in the same order)."""
    with _generation_lock:
        _generation[0] += 1
        return _generation[0]


def _request(info: RankInfo, gen: int) -> str:
    return f"{PROTOCOL} job={info.job or '-'} gen={gen} size={info.size} rank={info.rank}\n"


def _read_line(conn: socket.socket, limit: int = 1024) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
        if len(data) >= limit:
            break
    return data.decode(errors="replace").strip()


class IdServer:
    """Rank 0's side: serves `uid_hex` to the job's other ranks on `port`
    (every interface) until each has fetched it, or close()."""

    def __init__(self, info: RankInfo, gen: int, uid_hex: str, timeout: float) -> None:
        assert info.root is not None
        self.info, self.gen, self.uid_hex = info, gen, uid_hex
        self.served: set = set()
        self.errors: List[str] = []
        port = info.root[1]
        try:
            if socket.has_dualstack_ipv6():
                self.sock = socket.create_server(("", port), family=socket.AF_INET6,
                                                 dualstack_ipv6=True, reuse_port=False)
            else:
                self.sock = socket.create_server(("", port))
        except OSError as e:
            raise LaunchEnvError(
                f"rank 0 cannot serve the unique id on port {port} "
                f"({info.root_source}): {e.strerror or e}; choose another with "
                f"HETCCL_ROOT_PORT") from None
        self.sock.settimeout(0.2)
        self.deadline = time.monotonic() + timeout
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="hetccl-id-server",
                                       daemon=True)
        self.thread.start()

    def _answer(self, line: str) -> Tuple[str, Optional[int]]:
        f = dict(kv.split("=", 1) for kv in line[len(PROTOCOL):].split() if "=" in kv)
        if not line.startswith(PROTOCOL + " "):
            return f"{PROTOCOL} error not a hetccl id request\n", None
        want = {"job": self.info.job or "-", "size": str(self.info.size)}
        for key, value in want.items():
            if f.get(key) != value:
                return (f"{PROTOCOL} error rank 0 serves {key} {value}, the request has "
                        f"{f.get(key)}\n"), None
        try:
            gen, rank = int(f.get("gen", "")), int(f.get("rank", ""))
        except ValueError:
            return f"{PROTOCOL} error malformed request\n", None
        if gen > self.gen:
            return f"{PROTOCOL} later\n", None   # that rank is ahead: it retries
        if gen < self.gen or not 0 < rank < self.info.size:
            return f"{PROTOCOL} error request {gen}/rank {rank} does not fit exchange " \
                   f"{self.gen}\n", None
        return f"{PROTOCOL} ok {self.uid_hex}\n", rank

    def _serve(self) -> None:
        while not self._stop.is_set() and len(self.served) < self.info.size - 1:
            if time.monotonic() > self.deadline:
                break
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            with conn:
                try:
                    conn.settimeout(5.0)
                    reply, rank = self._answer(_read_line(conn))
                    conn.sendall(reply.encode())
                    if rank is not None:
                        self.served.add(rank)
                except OSError as e:
                    self.errors.append(str(e))
        self.sock.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join()


def fetch_id(info: RankInfo, gen: int, timeout: float) -> str:
    """A non-zero rank's side: the hex unique id from rank 0's server,
    retried until `timeout`."""
    assert info.root is not None
    host, port = info.root
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LaunchEnvError(
                f"rank {info.rank} ({info.launcher}) could not fetch the unique id from "
                f"{host}:{port} ({info.root_source}) within {timeout:g} s: {last}; rank 0 "
                f"serves it there (HETCCL_ROOT_ADDR / HETCCL_ROOT_TIMEOUT)")
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)) as conn:
                conn.settimeout(min(max(left, 0.1), 10.0))
                conn.sendall(_request(info, gen).encode())
                reply = _read_line(conn)
        except OSError as e:
            last = e.strerror or str(e)
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        if reply.startswith(f"{PROTOCOL} ok "):
            uid = reply.split()[-1]
            unique_id_from_hex_bytes(uid)  # checks the length and digits
            return uid
        if reply == f"{PROTOCOL} later":
            last = "rank 0 is still serving an earlier communicator"
            time.sleep(RETRY_S)
            continue
        if reply.startswith(f"{PROTOCOL} error "):
            raise LaunchEnvError(f"rank {info.rank}: the unique id server at {host}:{port} "
                                 f"refused: {reply[len(PROTOCOL) + 7:]}")
        last = f"unexpected answer {reply[:80]!r}"
        time.sleep(RETRY_S)


def _served(info: RankInfo, env: Optional[Mapping[str, str]]) -> RankInfo:
    """`info` of a `hetccl run` rank for an exchange over TCP: the root
    from HETCCL_ROOT_ADDR (set by the launcher) and the rest of the
    launcher table's rules, the job named by the launch id."""
    env = os.environ if env is None else env
    read = dict(info.variables)
    try:
        root, source = _root(env, BY_NAME["hetccl"], info.size, info.local_size, read)
    except LaunchEnvError as e:
        raise LaunchEnvError(f"{e} (HETCCL_LAUNCH_ID serves the first communicator only; "
                             f"`hetccl run` sets HETCCL_ROOT_ADDR for the later ones)") from None
    job = info.job or (info.unique_id or "")[:16]
    return RankInfo(info.launcher, info.rank, info.size, info.local_rank, info.local_size, job,
                    root, source, None, read)


def exchange_id(info: RankInfo, timeout: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None
                ) -> Tuple[str, Optional[IdServer]]:
    """The job's unique id (hex) on every rank, a new one per call (the
    calls of every rank pair up by their order). Rank 0 makes it and
    returns the running server too: keep it until the communicator is
    made, then close() it. The id's bootstrap root lives in this process
    (rank 0), or in the launcher's for HETCCL_LAUNCH_ID."""
    gen = next_generation()
    if info.unique_id is not None:
        if gen == 1:
            return info.unique_id, None
        info = _served(info, env)
    timeout = root_timeout(env) if timeout is None else timeout
    if info.size == 1:
        return unique_id_to_hex(get_unique_id()), None
    if info.rank == 0:
        uid = unique_id_to_hex(get_unique_id())
        return uid, IdServer(info, gen, uid, timeout)
    return fetch_id(info, gen, timeout), None


def init_from_env(blocking: Optional[bool] = None, timeout: Optional[float] = None,
                  env: Optional[Mapping[str, str]] = None
                  ) -> Tuple["Communicator", RankInfo]:
    """(communicator over every rank of the job, this rank's RankInfo), from
    whatever launcher started the process (a one-rank communicator when
    none did). The communicator takes arrays (hetccl.arrays.Communicator)."""
    from .arrays import Communicator

    info = discover(env)
    if info is None:
        info = RankInfo("none", 0, 1, 0, 1, "", None, "not launched", None, {})
        return Communicator(1, get_unique_id(), 0, blocking=blocking), info
    uid, server = exchange_id(info, timeout, env)
    try:
        comm = Communicator(info.size, uid, info.rank, blocking=blocking)
    except BaseException:
        if server is not None:
            server.close()
        raise
    # Blocking: every rank has joined, so every rank has the id. Nonblocking:
    # the server ends by itself once every rank has fetched it.
    if server is not None and blocking is not False:
        server.close()
    return comm, info
