"""hetccl.discovery: each launcher's variables read into a rank, and the
unique id carried from rank 0 over TCP, with ranks as real processes on
this host given each launcher's environment by hand (the same variables,
with the values the launcher would set). tests/test_launchers.py runs the
launchers themselves across two network namespaces."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from hetccl import discovery
from hetccl.discovery import LaunchEnvError, discover, expand_nodelist
from hetccl.ports import free_ports

pytestmark = pytest.mark.timeout(120)

# One rank of an allreduce job: its result and what discovery read, as JSON
# on stdout, or in $JOB_OUT/rank<r>.json (a launcher's merged output can
# interleave long lines).
JOB = r"""
import json, os, socket, sys, numpy as np, hetccl
comm, info = hetccl.init_from_env()
x = np.arange(7, dtype=np.float64) * (info.rank + 1)
comm.all_reduce(x)
comm.destroy()
text = json.dumps({"rank": info.rank, "size": info.size, "local": info.local_rank,
                   "launcher": info.launcher, "root": info.root, "source": info.root_source,
                   "read": info.variables, "sum": x.tolist(),
                   "hostname": socket.gethostname()})
out = os.environ.get("JOB_OUT")
if out:
    open(os.path.join(out, f"rank{info.rank}.json"), "w").write(text)
else:
    print(text, flush=True)
"""


def job_results(out: Path) -> List[dict]:
    """The JOB results written into `out`, by rank."""
    return [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"),
                                                       key=lambda f: int(f.stem[4:]))]


def clean_env() -> Dict[str, str]:
    """This environment without any launcher's variables."""
    names = {v for l in discovery.LAUNCHERS for f in (l.detect, l.rank, l.size, l.local_rank,
                                                     l.local_size, l.job, l.nodelist, l.nnodes)
             for v in f}
    names |= {"MASTER_ADDR", "MASTER_PORT"} | {k for k, _, _ in discovery.KNOBS}
    return {k: v for k, v in os.environ.items() if k not in names}


def run_ranks(envs: List[Dict[str, str]], script: str = JOB,
              timeout: float = 60) -> List[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([sys.executable, "-c", script], env={**clean_env(), **e},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for e in envs]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


# -- reading the table ------------------------------------------------------------------

def test_nodelist() -> None:
    assert expand_nodelist("gpu[01-03,7],login1") == ["gpu01", "gpu02", "gpu03", "gpu7",
                                                       "login1"]
    assert expand_nodelist("r[1-2]n[0-1]") == ["r1n0", "r1n1", "r2n0", "r2n1"]
    assert expand_nodelist("node9") == ["node9"]
    with pytest.raises(LaunchEnvError, match="host list"):
        expand_nodelist("n[a-b]")


LAUNCHER_ENVS = {
    "torchrun": {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                 "TORCHELASTIC_RUN_ID": "none"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "HETCCL_ROOT_ADDR": "10.0.0.1:29600"},
    "mpich": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
              "MASTER_ADDR": "10.0.0.1"},
    "pmix": {"PMIX_RANK": "3", "HETCCL_WORLD_SIZE": "4", "PMIX_NAMESPACE": "job7",
             "HETCCL_ROOT_ADDR": "[fd00::1]:29600"},
    "slurm": {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
              "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_JOB_ID": "4242"},
}
WANT_ROOT = {"torchrun": ("10.0.0.1", 29501), "openmpi": ("10.0.0.1", 29600),
             "mpich": ("10.0.0.1", 29501), "pmix": ("fd00::1", 29600),
             "slurm": ("node07", 29501)}


@pytest.mark.parametrize("name", sorted(LAUNCHER_ENVS))
def test_each_launcher(name: str) -> None:
    env = LAUNCHER_ENVS[name]
    info = discover(env)
    assert info is not None and info.launcher == name
    # PMIx has no local rank in the environment: the rank stands in
    assert (info.rank, info.size, info.local_rank) == (3, 4, 3 if name == "pmix" else 1)
    assert info.root == WANT_ROOT[name]
    for var, value in env.items():  # every variable it used is reported
        if var not in ("TORCHELASTIC_RUN_ID",) or info.job:
            assert info.variables.get(var) == value, (var, info.variables)
    assert info.describe().startswith(f"{name}: rank 3 of 4")


def test_order_inside_a_slurm_allocation() -> None:
    """mpirun or torchrun inside sbatch: the batch script's SLURM_PROCID=0
    is still in the environment; the inner launcher decides."""
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert discover({**slurm, **LAUNCHER_ENVS["openmpi"]}).launcher == "openmpi"
    assert discover({**slurm, **LAUNCHER_ENVS["torchrun"]}).launcher == "torchrun"
    forced = discover({**slurm, **LAUNCHER_ENVS["openmpi"], "HETCCL_LAUNCHER": "slurm"})
    assert forced.launcher == "slurm" and forced.rank == 0
    assert forced.variables["HETCCL_LAUNCHER"] == "slurm"


def test_not_launched_and_bad_environments() -> None:
    assert discover({}) is None
    with pytest.raises(LaunchEnvError, match="SLURM_PROCID='x' is not a number"):
        discover({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"})
    with pytest.raises(LaunchEnvError, match="rank 4 is not below the world size 4"):
        discover({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"})
    with pytest.raises(LaunchEnvError, match="HETCCL_WORLD_SIZE"):
        discover({"PMIX_RANK": "1"})
    with pytest.raises(LaunchEnvError, match="set HETCCL_ROOT_ADDR"):
        discover({"PMI_RANK": "1", "PMI_SIZE": "4"})  # ranks may be on several hosts
    with pytest.raises(LaunchEnvError, match="HETCCL_LAUNCHER='lsf'"):
        discover({"HETCCL_LAUNCHER": "lsf"})
    with pytest.raises(LaunchEnvError, match="not host"):
        discover({"PMI_RANK": "1", "PMI_SIZE": "4", "HETCCL_ROOT_ADDR": "node1:http"})
    # every rank on one host (the launcher says so): loopback, no address needed
    one_host = discover({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"})
    assert one_host.root == ("127.0.0.1", discovery.DEFAULT_ROOT_PORT)


# -- the id over TCP, real ranks ---------------------------------------------------------------

def rank_env(name: str, rank: int, size: int, port: int) -> Dict[str, str]:
    """The variables launcher `name` gives rank `rank` of `size` on this host."""
    r, n = str(rank), str(size)
    return {
        "torchrun": {"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": n,
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
                     "TORCHELASTIC_RUN_ID": "t1"},
        "openmpi": {"OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": n,
                    "OMPI_COMM_WORLD_LOCAL_RANK": r, "OMPI_COMM_WORLD_LOCAL_SIZE": n,
                    "HETCCL_ROOT_PORT": str(port)},
        "mpich": {"PMI_RANK": r, "PMI_SIZE": n, "MPI_LOCALRANKID": r, "MPI_LOCALNRANKS": n,
                  "HETCCL_ROOT_ADDR": f"localhost:{port}"},
        "pmix": {"PMIX_RANK": r, "HETCCL_WORLD_SIZE": n, "PMIX_NAMESPACE": "ns1",
                 "HETCCL_ROOT_ADDR": f"127.0.0.1:{port}"},
        "slurm": {"SLURM_PROCID": r, "SLURM_NTASKS": n, "SLURM_LOCALID": r,
                  "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_ID": "99",
                  "HETCCL_ROOT_PORT": str(port)},
    }[name]


@pytest.mark.usefixtures("hetccl_library")
@pytest.mark.parametrize("name", sorted(LAUNCHER_ENVS))
def test_allreduce_under_each_launcher(name: str) -> None:
    """3 ranks, rank 0 started last: the others wait for its server."""
    port, n = free_ports(1)[0], 3
    envs = [rank_env(name, r, n, port) for r in range(n)]
    envs = envs[1:] + envs[:1]
    results = run_ranks(envs)
    outs = {}
    for p in results:
        assert p.returncode == 0, p.stderr
        res = json.loads(p.stdout)
        outs[res["rank"]] = res
    assert sorted(outs) == list(range(n))
    want = [i * sum(range(1, n + 1)) for i in range(7)]
    for r, res in outs.items():
        assert res["launcher"] == name and res["size"] == n and res["local"] == r
        assert res["sum"] == want
        assert res["root"][1] == port, res


@pytest.mark.usefixtures("hetccl_library")
def test_fetch_times_out_naming_the_address() -> None:
    """No rank 0: rank 1 gives up after HETCCL_ROOT_TIMEOUT, naming where it looked."""
    port = free_ports(1)[0]
    env = {**rank_env("slurm", 1, 2, port), "HETCCL_ROOT_TIMEOUT": "1.5"}
    start = time.monotonic()
    (p,) = run_ranks([env])
    assert time.monotonic() - start < 20
    assert p.returncode != 0
    assert f"could not fetch the unique id from localhost:{port}" in p.stderr, p.stderr
    assert "first host of SLURM_STEP_NODELIST" in p.stderr and "1.5 s" in p.stderr


@pytest.mark.usefixtures("hetccl_library")
def test_server_refuses_another_job() -> None:
    """A rank of another job (other SLURM_JOB_ID) or of another size asking
    rank 0's server gets a refusal naming the difference, never the id."""
    port = free_ports(1)[0]
    env0 = rank_env("slurm", 0, 2, port)
    rank0 = subprocess.Popen([sys.executable, "-c", JOB], env={**clean_env(), **env0,
                                                               "HETCCL_ROOT_TIMEOUT": "20"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        other = {**rank_env("slurm", 1, 2, port), "SLURM_JOB_ID": "100",
                 "HETCCL_ROOT_TIMEOUT": "15"}
        (p,) = run_ranks([other])
        assert p.returncode != 0 and "refused: rank 0 serves job 99" in p.stderr, p.stderr
        bigger = {**rank_env("slurm", 1, 3, port), "HETCCL_ROOT_TIMEOUT": "15"}
        (p,) = run_ranks([bigger])
        assert p.returncode != 0 and "refused: rank 0 serves size 2" in p.stderr, p.stderr
        (p,) = run_ranks([rank_env("slurm", 1, 2, port)])  # the right one completes the job
        assert p.returncode == 0, p.stderr
        out, err = rank0.communicate(timeout=60)
        assert rank0.returncode == 0, err
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.communicate()


@pytest.mark.usefixtures("hetccl_library")
def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        (p,) = run_ranks([rank_env("openmpi", 0, 2, port)])
    assert p.returncode != 0
    assert f"rank 0 cannot serve the unique id on port {port}" in p.stderr, p.stderr
    assert "HETCCL_ROOT_PORT" in p.stderr


@pytest.mark.usefixtures("hetccl_library")
def test_two_communicators_in_a_row() -> None:
    """Two init_from_env calls per rank: each exchange is its own (a fast
    rank's second request never takes the first id)."""
    script = JOB.replace("comm, info = hetccl.init_from_env()",
                         "c1, info = hetccl.init_from_env()\n"
                         "comm, _ = hetccl.init_from_env()\n"
                         "assert c1.size == comm.size\nc1.destroy()")
    port = free_ports(1)[0]
    results = run_ranks([rank_env("openmpi", r, 3, port) for r in range(3)], script)
    for p in results:
        assert p.returncode == 0, p.stderr


@pytest.mark.usefixtures("hetccl_library")
def test_hetccl_run_is_a_launcher_too(tmp_path: Path) -> None:
    """Under `hetccl run` the id is in the environment: no server, no port."""
    p = subprocess.run([sys.executable, "-m", "hetccl", "run", "-n", "2", "--", sys.executable,
                        "-c", JOB], capture_output=True, text=True, timeout=60,
                       env={**clean_env(), "JOB_OUT": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    res = job_results(tmp_path)
    assert sorted(r["rank"] for r in res) == [0, 1]
    assert all(r["launcher"] == "hetccl" and r["root"] is None for r in res)
