"""`hetccl run --launcher mpirun|srun|torchrun` (python/hetccl/delegate.py):
the command lines it builds (--dry-run), and real runs on this host where
the launcher is installed (mpirun from Open MPI; torchrun with torch).
Across hosts: tests/test_launchers.py."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

import hetccl as hetccl_pkg
from test_discovery import JOB, clean_env, job_results
from hetccl.ports import free_ports

pytestmark = [pytest.mark.usefixtures("hetccl_library"), pytest.mark.timeout(120)]

RANK = [sys.executable, "-m", "hetccl", "rank", "--"]


def hetccl(*args: str, env: Dict[str, str] = None, timeout: float = 90
           ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetccl", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def dry(*args: str, env: Dict[str, str] = None) -> List[str]:
    p = hetccl("run", "--dry-run", *args, env=env)
    assert p.returncode == 0, p.stderr
    return shlex.split(p.stdout)


def test_mpirun_command() -> None:
    env = {**clean_env(), "NCCL_SOCKET_IFNAME": "eth1", "HETCCL_TRANSPORT": "socket"}
    # Forwarded where set (a checkout run sets it; an installed package
    # needs none): set here, so the test sees it go either way.
    env["PYTHONPATH"] = env.get("PYTHONPATH") or str(Path(hetccl_pkg.__file__).parents[1])
    argv = dry("--launcher", "mpirun", "--mpi", "openmpi", "-n", "4", "--hosts", "a,b",
               "--", "prog", "-x", "1", env=env)
    cut = argv.index(sys.executable)
    assert argv[cut:] == RANK + ["prog", "-x", "1"]
    head = argv[:cut]
    assert head[:5] == ["mpirun", "-np", "4", "-H", "a:2,b:2"]
    pairs = {head[i + 1] for i in range(len(head) - 1) if head[i] == "-x"}
    assert {"HETCCL_ROOT_ADDR=a", "NCCL_SOCKET_IFNAME", "HETCCL_TRANSPORT",
            "PYTHONPATH"} <= pairs, head


def test_mpich_command() -> None:
    argv = dry("--launcher", "mpirun", "--mpi", "mpich", "-n", "6", "--hosts", "a,b,c",
               "--root-addr", "10.0.0.1", "--", "prog")
    cut = argv.index(sys.executable)
    assert argv[:7] == ["mpiexec", "-n", "6", "-hosts", "a,b,c", "-ppn", "2"]
    assert ["-genv", "HETCCL_ROOT_ADDR", "10.0.0.1"] == argv[cut - 3:cut]


def test_srun_command() -> None:
    argv = dry("--launcher", "srun", "-n", "8", "--hosts", "n1,n2",
               "--launcher-args=--partition=gpu --time=5", "--", "prog")
    assert argv == ["srun", "--ntasks=8", "--nodes=2", "--ntasks-per-node=4",
                    "--nodelist=n1,n2", "--distribution=block", "--partition=gpu",
                    "--time=5", *RANK, "prog"]


def test_torchrun_command() -> None:
    argv = dry("--launcher", "torchrun", "-n", "4", "--hosts", "h0,h1", "--node-rank", "1",
               "--master-port", "29400", "--", "python", "train.py")
    assert argv == ["torchrun", "--nnodes=2", "--nproc_per_node=2", "--node_rank=1",
                    "--master_addr=h0", "--master_port=29400", "--no_python", *RANK,
                    "python", "train.py"]
    # without the wrapper, the library is preloaded through torchrun's environment
    argv = dry("--launcher", "torchrun", "-n", "3", "--no-wrap", "--", "python", "t.py")
    assert argv[0] == "env" and argv[1].startswith("LD_PRELOAD=")
    # --standalone draws MASTER_PORT at random: the id's port is chosen free
    # here, not MASTER_PORT + 1, which may belong to anyone
    assert argv[3].startswith("HETCCL_ROOT_PORT=") and int(argv[3].split("=")[1]) > 0
    assert argv[4:] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=3",
                        "--no_python", "python", "t.py"]


@pytest.mark.parametrize("args,message", [
    (["--launcher", "mpirun", "-n", "3", "--hosts", "a,b"], "does not split evenly"),
    (["--launcher", "torchrun", "-n", "2", "--hosts", "nosuchhost-a,nosuchhost-b"],
     "pass --node-rank"),
    (["--launcher", "srun", "-n", "2"], "no command"),
])
def test_bad_options(args: List[str], message: str) -> None:
    cmd = [] if message == "no command" else ["--", "prog"]
    p = hetccl("run", "--dry-run", *args, *cmd)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_local_form_has_no_dry_run() -> None:
    p = hetccl("run", "-n", "2", "--dry-run", "--", "true")
    assert p.returncode == 2 and "--launcher" in p.stderr


def test_rank_without_a_launcher() -> None:
    p = hetccl("rank", "--", "true", env=clean_env())
    assert p.returncode == 2 and "no launcher's variables" in p.stderr


def test_rank_wrapper_exit_status() -> None:
    """`hetccl rank` under Slurm's variables (one rank): the command's status
    is the wrapper's, and the command sees HETCCL_LAUNCH_* and the source."""
    env = {**clean_env(), "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "HETCCL_ROOT_PORT": str(free_ports(1)[0])}
    script = ("import os, sys; print(os.environ['HETCCL_LAUNCH_RANK'], "
              "os.environ['HETCCL_LAUNCH_NRANKS'], os.environ['HETCCL_LAUNCH_SOURCE']); "
              "sys.exit(5)")
    p = hetccl("rank", "--", sys.executable, "-c", script, env=env)
    assert p.returncode == 5, p.stderr
    assert p.stdout.startswith("0 1 slurm: rank 0 of 1"), p.stdout


def _mpirun_env() -> Dict[str, str]:
    return {**clean_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "HETCCL_ROOT_PORT": str(free_ports(1)[0])}


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed "
                    "(apt-get install openmpi-bin)")
@pytest.mark.parametrize("wrap", [True, False], ids=["wrapped", "direct"])
def test_mpirun_on_this_host(wrap: bool, tmp_path: Path) -> None:
    """Real mpirun, 3 ranks: wrapped, the job sees `hetccl` with the outer
    launcher in HETCCL_LAUNCH_SOURCE; direct, it reads OMPI_COMM_WORLD_*."""
    flags = [] if wrap else ["--no-wrap"]
    p = hetccl("run", "--launcher", "mpirun", "-n", "3", "--launcher-args=--oversubscribe",
               "--timeout", "80", *flags, "--", sys.executable, "-c", JOB,
               env={**_mpirun_env(), "JOB_OUT": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr
    res = job_results(tmp_path)
    assert [r["rank"] for r in res] == [0, 1, 2]
    for r in res:
        assert r["sum"] == [i * 6 for i in range(7)]
        if wrap:
            assert r["launcher"] == "hetccl"
            assert r["read"]["HETCCL_LAUNCH_SOURCE"].startswith(f"openmpi: rank {r['rank']} of 3")
        else:
            assert r["launcher"] == "openmpi"
            assert r["read"]["OMPI_COMM_WORLD_RANK"] == str(r["rank"])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_mpirun_runs_hetccl_perf() -> None:
    """A program of the local launcher's contract (HETCCL_LAUNCH_*) runs
    unchanged under mpirun through the wrapper."""
    from hetccl.cli import find_perf

    perf = find_perf()
    if perf is None:
        pytest.skip("hetccl-perf not built")
    p = hetccl("run", "--launcher", "mpirun", "-n", "2", "--launcher-args=--oversubscribe",
               "--timeout", "80", "--", str(perf), "all_reduce", "-b", "8", "-e", "64K",
               "-f", "64", env=_mpirun_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ranks: 2 (2 processes" in p.stdout and "# Wrong elements       : 0 OK" in p.stdout


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_torchrun_on_this_host(tmp_path: Path) -> None:
    p = hetccl("run", "--launcher", "torchrun", "-n", "2", "--timeout", "100",
               "--no-wrap", "--", sys.executable, "-c", JOB,
               env={**clean_env(), "JOB_OUT": str(tmp_path)}, timeout=110)
    assert p.returncode == 0, p.stdout + p.stderr
    res = job_results(tmp_path)
    assert sorted(r["rank"] for r in res) == [0, 1]
    assert all(r["launcher"] == "torchrun" for r in res)


def test_info_lists_the_launchers() -> None:
    from hetccl import discovery

    env = {**clean_env(), "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "1"}
    p = hetccl("info", env=env)
    assert p.returncode == 0, p.stderr
    for l in discovery.LAUNCHERS:
        assert f"\n  {l.name:<9} {l.rank[0]}" in p.stdout, l.name
    for name, _, _ in discovery.KNOBS:
        assert f"\n  {name} " in p.stdout, name
    assert "this process: slurm: rank 1 of 2" in p.stdout
