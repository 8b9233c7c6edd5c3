"""`hetccl run --launcher mpirun|srun|torchrun`: ranks across hosts by
delegating to the launcher people already run (docs/launching.md).

Contract:

- `build(opts, cmd)` returns the launcher's argv and the environment
  additions for it; it runs nothing and reads only `opts`, this process's
  environment (which variables to forward) and, for mpirun without
  `--mpi`, the output of `mpirun --version` (Open MPI or MPICH's Hydra).
  `--dry-run` prints exactly this argv.
- Each rank runs `python -m hetccl rank -- CMD` (unless `--no-wrap`): the
  wrapper discovers its rank (hetccl.discovery), obtains the unique id
  (rank 0's wrapper makes and serves it), and runs CMD with the
  HETCCL_LAUNCH_* variables of docs/launching.md and libhetccl.so preloaded
  (the library of the package on that host), so any program that runs
  under the local `hetccl run` runs the same way here; HETCCL_ROOT_ADDR
  becomes the address the wrapper's exchange used, where CMD's later
  communicators (a second hetccl.init_from_env) exchange theirs. Rank 0's wrapper
  holds the bootstrap root, as the local launcher does, so it stays until
  its command ends; it exits with the command's status.
- Rank 0 is on the first host given (`--hosts`): mpirun places ranks by
  slot, host by host; srun's block distribution does the same; torchrun's
  node 0 is the master. The id server's address comes from that host.
- The single-host form, `hetccl run -n N -- CMD` (no --launcher), is
  launcher.run_command and is not touched here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .launcher import ENV_ID, ENV_LOCAL_RANK, ENV_NRANKS, ENV_RANK, KILL_GRACE_S, \
    TIMEOUT_STATUS, preload_env
from .ports import free_ports

LAUNCHERS = ("mpirun", "srun", "torchrun")
FORWARD_PREFIXES = ("HETCCL_", "NCCL_")           # knobs every rank should see
FORWARD_NAMES = ("PYTHONPATH", "LD_LIBRARY_PATH")  # where the package and libraries are
DEFAULT_MASTER_PORT = 29500                       # torchrun's own default


class DelegateError(RuntimeError):
    """The options do not make a command line (the message says which)."""


@dataclass
class Options:
    launcher: str
    nranks: int
    hosts: List[str] = field(default_factory=list)
    node_rank: Optional[int] = None
    master_port: int = DEFAULT_MASTER_PORT
    root_addr: Optional[str] = None
    mpi: Optional[str] = None            # "openmpi" or "mpich"; None: ask mpirun
    launcher_args: List[str] = field(default_factory=list)
    wrap: bool = True
    preload: bool = True
    tag_output: bool = False             # the launcher's own rank tag on each line


def _forwarded(env: Dict[str, str]) -> List[str]:
    names = [k for k in sorted(env) if k.startswith(FORWARD_PREFIXES) and
             not k.startswith("HETCCL_LAUNCH_")]
    return names + [k for k in FORWARD_NAMES if env.get(k)]


def mpi_flavor(program: str = "mpirun") -> str:
    """"openmpi" or "mpich" (Hydra), from `mpirun --version`."""
    exe = shutil.which(program)
    if exe is None:
        return "openmpi"
    try:
        text = subprocess.run([exe, "--version"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "openmpi"
    return "mpich" if ("HYDRA" in text or "MPICH" in text) else "openmpi"


def _per_host(o: Options) -> int:
    if not o.hosts:
        return o.nranks
    if o.nranks % len(o.hosts):
        raise DelegateError(f"-n {o.nranks} does not split evenly over {len(o.hosts)} hosts")
    return o.nranks // len(o.hosts)


def _rank_cmd(o: Options, cmd: Sequence[str]) -> List[str]:
    if not o.wrap:
        return list(cmd)
    return [sys.executable, "-m", "hetccl", "rank", *([] if o.preload else ["--no-preload"]),
            "--", *cmd]


def _unwrapped_env(o: Options, env: Dict[str, str]) -> Dict[str, str]:
    """What the ranks need when no wrapper sets it: the library, preloaded."""
    if o.wrap or not o.preload:
        return {}
    pre = preload_env(env)
    return {"LD_PRELOAD": pre["LD_PRELOAD"], "HETCCL_LIBRARY": pre["HETCCL_LIBRARY"]}


def _mpirun(o: Options, cmd: Sequence[str], env: Dict[str, str]) -> List[str]:
    flavor = o.mpi or mpi_flavor()
    k = _per_host(o)
    root = o.root_addr or (o.hosts[0] if o.hosts else None)
    extra = _unwrapped_env(o, env)
    if root:
        extra["HETCCL_ROOT_ADDR"] = root
    if flavor == "openmpi":
        argv = ["mpirun", "-np", str(o.nranks)]
        if o.hosts:
            argv += ["-H", ",".join(f"{h}:{k}" for h in o.hosts)]
        for name in _forwarded(env):
            if name not in extra:
                argv += ["-x", name]
        for name, value in extra.items():
            argv += ["-x", f"{name}={value}"]
        if o.tag_output:
            argv.append("--tag-output")
    elif flavor == "mpich":
        argv = ["mpiexec", "-n", str(o.nranks)]
        if o.hosts:
            argv += ["-hosts", ",".join(o.hosts), "-ppn", str(k)]
        names = [n for n in _forwarded(env) if n not in extra]
        if names:
            argv += ["-genvlist", ",".join(names)]
        for name, value in extra.items():
            argv += ["-genv", name, value]
        if o.tag_output:
            argv.append("-prepend-rank")
    else:
        raise DelegateError(f"--mpi {flavor}: openmpi or mpich")
    return argv + o.launcher_args + _rank_cmd(o, cmd)


def _srun(o: Options, cmd: Sequence[str], env: Dict[str, str]) -> List[str]:
    argv = ["srun", f"--ntasks={o.nranks}"]
    if o.hosts:
        argv += [f"--nodes={len(o.hosts)}", f"--ntasks-per-node={_per_host(o)}",
                 f"--nodelist={','.join(o.hosts)}", "--distribution=block"]
    extra = _unwrapped_env(o, env)
    if o.root_addr:
        extra["HETCCL_ROOT_ADDR"] = o.root_addr
    if extra:  # srun exports the whole environment by default; name the additions
        argv.append("--export=" + ",".join(["ALL"] + [f"{k}={v}" for k, v in extra.items()]))
    if o.tag_output:
        argv.append("--label")
    return argv + o.launcher_args + _rank_cmd(o, cmd)


def _this_node(hosts: Sequence[str]) -> Optional[int]:
    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    for i, h in enumerate(hosts):
        if h in names or h.split(".")[0] in names:
            return i
    return None


def _torchrun(o: Options, cmd: Sequence[str], env: Dict[str, str]) -> List[str]:
    if o.tag_output:
        raise DelegateError("--tag-output: torchrun has no such option (its --tee and "
                            "--log-dir keep each rank's output apart)")
    k = _per_host(o)
    argv = ["torchrun"]
    if len(o.hosts) > 1:
        node = o.node_rank if o.node_rank is not None else _this_node(o.hosts)
        if node is None or not 0 <= node < len(o.hosts):
            raise DelegateError(f"torchrun: this host ({socket.gethostname()}) is not in "
                                f"--hosts {','.join(o.hosts)}: pass --node-rank")
        argv += [f"--nnodes={len(o.hosts)}", f"--nproc_per_node={k}", f"--node_rank={node}",
                 f"--master_addr={o.hosts[0]}", f"--master_port={o.master_port}"]
    else:
        argv += ["--standalone", "--nnodes=1", f"--nproc_per_node={k}"]
    return argv + o.launcher_args + ["--no_python"] + _rank_cmd(o, cmd)


def build(o: Options, cmd: Sequence[str], env: Optional[Dict[str, str]] = None
          ) -> Tuple[List[str], Dict[str, str]]:
    """(argv of the launcher, variables to add to its environment)."""
    env = dict(os.environ if env is None else env)
    if o.nranks < 1:
        raise DelegateError("-n must be at least 1")
    if not cmd:
        raise DelegateError("no command (hetccl run --launcher L -n N -- CMD ARGS...)")
    if o.launcher == "mpirun":
        return _mpirun(o, cmd, env), {}
    if o.launcher == "srun":
        return _srun(o, cmd, env), {}
    if o.launcher == "torchrun":
        add = _unwrapped_env(o, env)
        if o.root_addr:
            add["HETCCL_ROOT_ADDR"] = o.root_addr
        elif len(o.hosts) <= 1 and "HETCCL_ROOT_PORT" not in env:
            # --standalone: torchrun picks a random free MASTER_PORT, and
            # the port after it is nobody's to promise; serve the id on
            # one that is free now.
            add["HETCCL_ROOT_PORT"] = str(free_ports(1)[0])
        return _torchrun(o, cmd, env), add
    raise DelegateError(f"--launcher {o.launcher}: one of {', '.join(LAUNCHERS)}")


def show(argv: Sequence[str], add: Dict[str, str]) -> str:
    prefix = ["env", *(f"{k}={v}" for k, v in add.items())] if add else []
    return shlex.join([*prefix, *argv])


def run(argv: Sequence[str], add: Dict[str, str], timeout: Optional[float]) -> int:
    """Run the launcher in its own process group; SIGINT/SIGTERM forwarded;
    its exit status, or 124 after `timeout` seconds (the group is killed)."""
    if shutil.which(argv[0]) is None:
        print(f"hetccl run: {argv[0]} not found on PATH", file=sys.stderr)
        return 127
    p = subprocess.Popen(list(argv), env={**os.environ, **add}, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        if p.poll() is None:
            os.killpg(p.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            return TIMEOUT_STATUS
        return 128 - rc if rc < 0 else rc
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _kill_group(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(KILL_GRACE_S)
            break
        except subprocess.TimeoutExpired:
            continue


# -- `hetccl rank -- CMD`: one rank under a foreign launcher --------------------------------

def rank_main(cmd: Sequence[str], preload: bool = True) -> int:
    from .discovery import LaunchEnvError, discover, exchange_id

    try:
        info = discover()
        if info is None:
            print("hetccl rank: no launcher's variables in the environment (run it under "
                  "mpirun, srun or torchrun; see docs/launching.md)", file=sys.stderr)
            return 2
        uid, server = exchange_id(info)
    except LaunchEnvError as e:
        print(f"hetccl rank: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if preload:
        env = preload_env(env)
    env.update({ENV_RANK: str(info.rank), ENV_NRANKS: str(info.size),
                ENV_LOCAL_RANK: str(info.local_rank), ENV_ID: uid,
                "HETCCL_LAUNCH_SOURCE": info.describe()})
    if info.root is not None:  # where CMD's later communicators exchange their ids
        host, port = info.root
        env["HETCCL_ROOT_ADDR"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        env.pop("HETCCL_ROOT_PORT", None)
    try:
        p = subprocess.Popen(list(cmd), env=env)
    except OSError as e:
        print(f"hetccl rank: cannot start {cmd[0]}: {e}", file=sys.stderr)
        if server is not None:
            server.close()
        return 127

    def forward(signum: int, _frame: object) -> None:
        if p.poll() is None:
            p.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    while p.poll() is None:
        time.sleep(0.05)
    if server is not None:
        server.close()
    rc = p.returncode
    return 128 - rc if rc < 0 else rc


def add_arguments(run: argparse.ArgumentParser) -> None:
    """The --launcher options of `hetccl run` (cli.py owns the rest)."""
    g = run.add_argument_group("across hosts (delegated to a launcher; docs/launching.md)")
    g.add_argument("--launcher", choices=LAUNCHERS,
                   help="build and run this launcher's command line; -n is the total rank "
                        "count")
    g.add_argument("--hosts", default="",
                   help="comma-separated hosts, rank 0 on the first; -n splits evenly")
    g.add_argument("--node-rank", type=int, default=None,
                   help="torchrun: this host's index in --hosts (default: found by hostname)")
    g.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                   help="torchrun: MASTER_PORT (the unique id is served on it + 1)")
    g.add_argument("--root-addr", default=None,
                   help="address of rank 0's host for the unique id (default: first of --hosts)")
    g.add_argument("--mpi", choices=("openmpi", "mpich"), default=None,
                   help="mpirun's kind (default: from `mpirun --version`)")
    g.add_argument("--launcher-args", default="",
                   help="more options for the launcher, one string (shell-split)")
    g.add_argument("--no-wrap", action="store_true",
                   help="run CMD itself, without `hetccl rank` (it must call "
                        "hetccl.init_from_env or bring its own id exchange)")
    g.add_argument("--dry-run", action="store_true", help="print the command and exit")


def options_from(args: argparse.Namespace) -> Options:
    return Options(launcher=args.launcher, nranks=args.n,
                   hosts=[h for h in args.hosts.split(",") if h],
                   node_rank=args.node_rank, master_port=args.master_port,
                   root_addr=args.root_addr, mpi=args.mpi,
                   launcher_args=shlex.split(args.launcher_args), wrap=not args.no_wrap,
                   preload=not args.no_preload, tag_output=args.tag_output)

