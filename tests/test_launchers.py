"""Acceptance of rank discovery (hetccl.discovery) across two hosts: two
network namespaces (tests/netns_util.py), the same allreduce job
(test_discovery.JOB: hetccl.init_from_env, an allreduce checked on every
rank) launched

  (a) by mpirun (Open MPI), through `hetccl run --launcher mpirun`, with an
      rsh agent that enters the other host's namespace;
  (b) by torchrun, one agent per host (--nnodes 2), when torch is installed;
  (c) with the variables srun sets (SLURM_PROCID, SLURM_NTASKS,
      SLURM_LOCALID, SLURM_STEP_NODELIST, ...), set by hand per host.

Host names resolve as on a cluster: every host process runs in its own
mount namespace with an /etc/hosts naming nshost0 and nshost1. The unique
id travels over TCP from rank 0 (no shared file system is used for it; the
job directory only collects each rank's JSON for the test). Every rank
reports the launcher it detected and the variables it read; the test checks
them and prints them (pytest -s). Skipped where namespaces cannot be made
(not root, no ip/unshare), and each launcher where it is not installed.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import pytest

from netns_util import LINK_IF, Cluster, Host, Unavailable, _die_with_parent, _kill_group
from test_cli import THREE_COMMUNICATORS
from test_discovery import JOB, clean_env, job_results

pytestmark = [pytest.mark.usefixtures("hetccl_library"), pytest.mark.timeout(300)]

WANT = [i * 10.0 for i in range(7)]   # sum over 4 ranks of arange(7) * (rank + 1)
PORT = 29400                          # torchrun's; inside the namespaces nothing else listens


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("launchers")
    try:
        c = Cluster(2, workdir).__enter__()
    except Unavailable as e:
        pytest.skip(str(e))
    hosts = workdir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" +
                     "".join(f"{h.addr} {h.hostname}\n" for h in c.hosts))
    c.hosts_file = hosts  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        c.destroy()


def inside(c: Cluster, h: Host, argv: Sequence[str]) -> List[str]:
    """argv run on host h: its network namespace, its own UTS, IPC and mount
    namespaces, its host name and the cluster's /etc/hosts."""
    return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--ipc", "--mount", "--",
            "sh", "-c", 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
            str(c.hosts_file), h.hostname, *argv]  # type: ignore[attr-defined]


def job_env(out: Path, **extra: str) -> Dict[str, str]:
    return {**clean_env(), "JOB_OUT": str(out), "NCCL_SOCKET_IFNAME": LINK_IF,
            "HETCCL_ROOT_TIMEOUT": "60", **extra}


def run_hosts(argvs: Sequence[Sequence[str]], envs: Sequence[Dict[str, str]], out: Path,
              timeout: float = 200) -> List[subprocess.CompletedProcess]:
    procs = []
    for i, (argv, env) in enumerate(zip(argvs, envs)):
        procs.append(subprocess.Popen(list(argv), env=env, stdout=open(out / f"h{i}.out", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + 5)
            time.sleep(0.1)
    finally:
        for p in procs:
            _kill_group(p)
    return [subprocess.CompletedProcess(p.args, p.returncode,
                                        (out / f"h{i}.out").read_text(errors="replace"), "")
            for i, p in enumerate(procs)]


def check_job(c: Cluster, out: Path, procs: Sequence[subprocess.CompletedProcess],
              launcher: str, per_host: int, must_read: Sequence[str],
              source: Optional[str] = None) -> None:
    log = "\n".join(f"--- host {i}: exit {p.returncode}\n{p.stdout[-3000:]}"
                    for i, p in enumerate(procs))
    assert all(p.returncode == 0 for p in procs), log
    res = job_results(out)
    n = per_host * len(c.hosts)
    assert [r["rank"] for r in res] == list(range(n)), log
    print(f"\n{launcher}:")
    for r in res:
        assert r["sum"] == [x * (n * (n + 1) // 2) / 10 for x in WANT], r
        assert r["hostname"] == c.hosts[r["rank"] // per_host].hostname, r
        assert r["launcher"] == launcher and r["size"] == n, r
        assert r["local"] == r["rank"] % per_host, r
        assert r["root"][0] in (c.hosts[0].hostname, c.hosts[0].addr), r
        assert set(must_read) <= set(r["read"]), (must_read, r["read"])
        if source:
            assert source in r["source"], r
        print(f"  {r['hostname']} rank {r['rank']}: root {r['root'][0]}:{r['root'][1]} "
              f"({r['source']}); read " + " ".join(f"{k}={v}" for k, v in r["read"].items()))


# -- (c) Slurm's variables, set by hand ------------------------------------------------

def test_slurm_variables(cluster: Cluster, tmp_path: Path) -> None:
    """2 hosts x 2 tasks, as `srun -N 2 -n 4` (block distribution) sets them."""
    argvs, envs = [], []
    for h in cluster.hosts:
        for local in range(2):
            rank = h.index * 2 + local
            argvs.append(inside(cluster, h, [sys.executable, "-c", JOB]))
            envs.append(job_env(tmp_path, SLURM_PROCID=str(rank), SLURM_NTASKS="4",
                                SLURM_LOCALID=str(local), SLURM_NNODES="2",
                                SLURM_STEP_NODELIST="nshost[0-1]", SLURM_NODEID=str(h.index),
                                SLURM_JOB_ID="4242", SLURM_STEP_ID="0"))
    procs = run_hosts(argvs, envs, tmp_path)
    check_job(cluster, tmp_path, procs, "slurm", 2,
              ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
               "SLURM_JOB_ID"], source="first host of SLURM_STEP_NODELIST")


# -- (a) mpirun ---------------------------------------------------------------------------

AGENT = """#!/bin/sh
# rsh agent for mpirun: "AGENT [options] HOST COMMAND..." runs COMMAND (a
# shell command line, as ssh would) inside HOST's namespaces.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%s
  *) echo "agent: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts --ipc --mount -- sh -c \\
  'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec sh -c "$*"' \\
  %s "$host" "$@"
"""


@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="mpirun not installed (apt-get install openmpi-bin)")
def test_mpirun(cluster: Cluster, tmp_path: Path) -> None:
    """`hetccl run --launcher mpirun --hosts nshost0,nshost1 --no-wrap`, run
    on nshost0; Open MPI starts nshost1's ranks through the agent."""
    agent = tmp_path / "agent.sh"
    cases = "\n".join(f"  {h.hostname}) ns={h.netns} ;;" for h in cluster.hosts)
    agent.write_text(AGENT % (cases, cluster.hosts_file))  # type: ignore[attr-defined]
    agent.chmod(agent.stat().st_mode | stat.S_IXUSR)
    mca = f"--mca plm_rsh_agent {agent} --mca oob_tcp_if_include {LINK_IF}"
    argv = [sys.executable, "-m", "hetccl", "run", "--launcher", "mpirun", "--mpi", "openmpi",
            "-n", "4", "--hosts", "nshost0,nshost1", f"--launcher-args={mca}", "--no-wrap",
            "--timeout", "150", "--", sys.executable, "-c", JOB]
    env = job_env(tmp_path, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    procs = run_hosts([inside(cluster, cluster.hosts[0], argv)], [env], tmp_path)
    check_job(cluster, tmp_path, procs, "openmpi", 2,
              ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "HETCCL_ROOT_ADDR"], source="HETCCL_ROOT_ADDR")


# -- (b) torchrun ---------------------------------------------------------------------------

def test_torchrun(cluster: Cluster, tmp_path: Path) -> None:
    """One torchrun agent per host, --nnodes 2 --nproc_per_node 2, static
    rendezvous at nshost0:PORT; the id is served on PORT + 1."""
    pytest.importorskip("torch")
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH")
    argvs, envs = [], []
    for h in cluster.hosts:
        argvs.append(inside(cluster, h, [
            "torchrun", "--nnodes=2", "--nproc_per_node=2", f"--node_rank={h.index}",
            "--master_addr=nshost0", f"--master_port={PORT}", "--no_python",
            sys.executable, "-c", JOB]))
        envs.append(job_env(tmp_path, OMP_NUM_THREADS="1"))
    procs = run_hosts(argvs, envs, tmp_path, timeout=250)
    check_job(cluster, tmp_path, procs, "torchrun", 2,
              ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"],
              source="MASTER_ADDR, MASTER_PORT+1")


# -- on this host: repeated communicators and tagged output through a launcher -----------------



@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="mpirun not installed (apt-get install openmpi-bin)")
@pytest.mark.parametrize("wrap", [True, False])
def test_mpirun_repeated_init_from_env(tmp_path: Path, wrap: bool) -> None:
    """Three communicators in a row through `hetccl run --launcher mpirun`:
    wrapped (`hetccl rank` hands CMD the launch id and the address its own
    exchange used) and not (CMD exchanges every id itself)."""
    env = {**clean_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "HETCCL_CONNECT_TIMEOUT": "10", "HETCCL_ROOT_TIMEOUT": "30"}
    argv = [sys.executable, "-m", "hetccl", "run", "--launcher", "mpirun", "--mpi", "openmpi",
            "-n", "2", "--launcher-args=--oversubscribe", "--timeout", "100",
            *([] if wrap else ["--no-wrap"]), "--", sys.executable, "-c", THREE_COMMUNICATORS]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launcher = "hetccl" if wrap else "openmpi"
    assert sorted(proc.stdout.splitlines()) == sorted(
        f"{launcher} rank {r} communicator {i} sum 3" for r in range(2) for i in range(3))


@pytest.mark.parametrize("mpi,flag", [("openmpi", "--tag-output"), ("mpich", "-prepend-rank")])
def test_tag_output_through_mpirun(mpi: str, flag: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "hetccl", "run", "--launcher", "mpirun",
                           "--mpi", mpi, "-n", "2", "--tag-output", "--dry-run", "--", "prog"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f" {flag} " in proc.stdout, proc.stdout
