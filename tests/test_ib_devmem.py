"""A device rank's buffers over the ib transport (transport/ib/ib_devmem.c,
exec/devpath.c), on a real kernel verbs stack with a stand-in GPU runtime.

Marked `rdma` (tools/rdma/run_vm.sh runs them in a Soft-RoCE VM). The
ranks are HIP ranks of the stand-in libamdhip64 built here from
tests/c/vendor/fakes (its "device memory" is host memory, its copies
memmove, so the GPU's copy engine is played by the CPU inside the
stand-in: what is measured is what hetccl's own code copies), forced into
islands of their own and onto ib:

- registered staging: sendrecv, broadcast, allgather and allreduce of
  device buffers move through pinned staging that core declares as RDMA
  memory, so the ib transport copies no byte of them
  (hetcclCommCopiedBytes; the allreduce's reduce half lands in the
  receiver's bounce buffer and is reduced from there), while a 1 KiB
  sendrecv, below the rendezvous threshold, goes through ib's slots and is
  counted; every result is checked;
- the GPUDirect decision, logged once per context at init, names the step
  that stops each branch: rxe refusing the import of the stand-in's
  dma-buf, the export refused by the runtime, a ROCm 5 runtime without the
  export call, HETCCL_IB_DMABUF=0, HETCCL_IB_GDR=0; the peer-memory trial
  (ibv_reg_mr of device memory) passes, since the stand-in's device memory
  is host memory that rxe registers as a peer-memory client would let a
  NIC register a GPU's;
- in that branch, sends from device memory registered with
  ncclCommRegister go unstaged, by RDMA WRITE at every size: no copy by
  the stand-in's "copy engine" on the sender, none by either CPU, to a
  HIP rank (staged receive) and to a host rank (its plain buffer
  registered for the one message when it exceeds HETCCL_IB_BOUNCE); the
  same sends from unregistered, or deregistered, memory are staged;
- receives into device memory registered with ncclCommRegister, of at
  least the threshold, go unstaged too: the NIC writes them (RDMA WRITE
  from the sender's registered memory, staging or, for a host rank's plain
  buffer, staging ring), since every peer asks such a rank first: no copy
  by the stand-in's "copy engine" on the receiver, none by its CPU,
  whether the receive or the send came first; with HETCCL_IB_GDR_RECV=0
  they are staged;
- sends and receives of at least the threshold in unregistered device
  memory (PyTorch's buffers) are staged in device memory that core
  registers with the NIC, not in pinned host memory: one copy on the
  "GPU" (the stand-in counts those from device to device memory apart),
  then RDMA; with HETCCL_IB_GDR_STAGING=0 through pinned host memory.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

import pytest

from rank_procs import can_unshare_ipc, run_ranks
from test_hip import RANK_PY, _cc, build_hip

pytestmark = [pytest.mark.rdma, pytest.mark.usefixtures("hetccl_library")]

TIMEOUT = 240
THRESHOLD = 16 << 10  # HETCCL_IB_ZCOPY_THRESHOLD here: a broadcast of 256 KiB goes in
# pieces of about 64 KiB
DECISION = re.compile(r"ib rank (\d+): GPUDirect RDMA (through dma-buf|by peer memory|off)[^:]*: "
                      r"hip device buffers reach (\S+) through registered pinned staging .*?; "
                      r"dma-buf: (.*?)(?:; peer memory: (.*))?$", re.M)


@pytest.fixture(scope="module")
def hip_fakes(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler for the stand-in libamdhip64")
    d = tmp_path_factory.mktemp("fakes")
    return {"6": build_hip(cc, d, 6), "5": build_hip(cc, d, 5)}


def run_hip_ranks(tmp_path: Path, hip: Path, extra: Dict[str, str], n: int = 2,
                  host_ranks: tuple = (), own_host: tuple = ()) -> List[dict]:
    """n stand-in HIP ranks, one island each (no RCCL: HETCCL_VENDOR=0), every pair on ib; each rank's
    INFO log in tmp_path/log.R, returned in the result as "log". The data
    plane is off: it would carry these same-host device buffers itself
    (docs/dataplane.md), where ranks on two hosts go through staging and ib."""
    envs = []
    for rank in range(n):
        env = {**os.environ, "T_RANK": str(rank), "T_NRANKS": str(n),
               "T_ID_FILE": str(tmp_path / "id"),
               "T_PRELOAD": "" if rank in host_ranks else str(hip),
               "HETCCL_ISLANDS": "rank", "HETCCL_VENDOR": "0", "HETCCL_TRANSPORT": "ib",
               "HETCCL_PLANE": "off",
               "HETCCL_IB_ZCOPY_THRESHOLD": str(THRESHOLD), "HETCCL_CONNECT_TIMEOUT": "60",
               "HETCCL_DEBUG": "INFO", "HETCCL_DEBUG_SUBSYS": "INIT,NET",
               "HETCCL_DEBUG_FILE": str(tmp_path / f"log.{rank}"), **extra}
        envs.append(env)
    prefixes = [["unshare", "--ipc"] if r in own_host else [] for r in range(n)]
    results = run_ranks(RANK_PY, envs, TIMEOUT, prefixes=prefixes)
    for rank, res in enumerate(results):
        res["log"] = (tmp_path / f"log.{rank}").read_text()
    return results


FLUSHED = re.compile(r"ib rank \d+: (\d+) receives into device memory read back through the NIC "
                     r"before done")
READ_BACK_LINE = "the NIC's writes into device memory are read back through it"


def flushed(res: dict) -> int:
    """How many receives that landed in device memory the rank read back
    (ib_flush.c: the stand-in HIP runtime has no flush call of its own);
    -1 if it reads none back at all (no line)."""
    found = FLUSHED.findall(res["log"])
    assert len(found) <= 1, found
    return int(found[0]) if found else -1


def decision(res: dict) -> tuple:
    """(branch, why not dma-buf, why not peer memory) of the rank's one line."""
    found = DECISION.findall(res["log"])
    assert len(found) == 1, f"want one decision line, got {found}: {res['log'][-2000:]}"
    return found[0][1], found[0][3], found[0][4]


@pytest.mark.timeout(TIMEOUT)
def test_device_buffers_cross_ib_without_cpu_copies(tmp_path: Path,
                                                    hip_fakes: Dict[str, Path]) -> None:
    results = run_hip_ranks(tmp_path, hip_fakes["6"], {"T_IBDEV": "1", "T_BYTES": str(256 << 10)})
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["backend"] == "engine" and res["kind"] == "hip", res
        assert res["wrong"] == [], f"rank {rank}: wrong data in {res['wrong']}"
        c = res["copied"]
        print(f"\n[ib device buffers] rank {rank}: ib bytes copied by the CPU {c}")
        for coll in ("sendrecv", "broadcast", "allgather", "allreduce"):
            assert c[coll] == 0, f"rank {rank}: {coll} copied {c[coll]} bytes"
        # the contrast: below the threshold, into the slots and out
        assert c["sendrecv 1 KiB"] == 2 * 1024, c
        # the sendrecv is staged in device memory registered with the NIC (one
        # copy on the "GPU" each way), the collectives in pinned host memory
        assert res["device_copies"] == {"sendrecv": 2, "broadcast": 0, "allgather": 0,
                                        "allreduce": 0, "sendrecv 1 KiB": 0}, res["device_copies"]
        assert STAGING_LINE in res["log"], res["log"][-2000:]
        how, why, _ = decision(res)
        assert why.startswith("ibv_reg_dmabuf_mr on ") and "refused hip memory" in why, why
        assert how == "by peer memory", how


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("case", ["export-refused", "rocm5", "knob-off", "gdr-off"])
def test_gpudirect_decision_names_what_stops_it(case: str, tmp_path: Path,
                                                hip_fakes: Dict[str, Path]) -> None:
    hip, extra, want = {
        "export-refused": (hip_fakes["6"], {"FAKE_HIP_DMABUF": "refuse"},
                           "hipMemGetHandleForAddressRange of 65536 bytes at"),
        "rocm5": (hip_fakes["5"], {}, "has no hipMemGetHandleForAddressRange (ROCm 6 adds it)"),
        "knob-off": (hip_fakes["6"], {"HETCCL_IB_DMABUF": "0"}, "not tried (HETCCL_IB_DMABUF=0"),
        "gdr-off": (hip_fakes["6"], {"HETCCL_IB_GDR": "0"}, "not tried (HETCCL_IB_GDR=0)"),
    }[case]
    for res in run_hip_ranks(tmp_path, hip, extra):
        assert "error" not in res and res["sum"] == 3.0, res
        how, why, peer = decision(res)
        assert want in why, res["log"][-2000:]
        # the stand-in's device memory is host memory: rxe registers it by address
        assert how == ("off" if case == "gdr-off" else "by peer memory"), (how, peer)


def far_sysfs(root: Path) -> Path:
    """A sysfs tree (HETCCL_SYSFS) in which the stand-in's GPU (device 1,
    bus id 0000:C1:00.0) sits under one root complex and rxe0's "device"
    under the other: NCCL's SYS."""
    gpu = root / "devices/pci0000:80/0000:80:01.0/0000:c1:00.0"
    nic = root / "devices/pci0000:00/0000:00:01.0/0000:17:00.0"
    for d in (gpu, nic, root / "bus/pci/devices", root / "class/infiniband/rxe0"):
        d.mkdir(parents=True, exist_ok=True)
    (root / "bus/pci/devices/0000:c1:00.0").symlink_to(gpu)
    (root / "class/infiniband/rxe0/device").symlink_to(nic)
    return root


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("level", ["default", "SYS"])
def test_gpudirect_level_keeps_a_far_nic_staged(level: str, tmp_path: Path,
                                                 hip_fakes: Dict[str, Path]) -> None:
    """A NIC across the CPU from the GPU (another socket, per the sysfs
    tree) is not used for GPUDirect at NCCL's default level (PXB): the
    trial is not even made, and every device buffer is staged; with
    NCCL_NET_GDR_LEVEL=SYS it is, and the peer-memory branch is taken."""
    extra = {"HETCCL_SYSFS": str(far_sysfs(tmp_path / "sys"))}
    if level != "default":
        extra["NCCL_NET_GDR_LEVEL"] = level
    for res in run_hip_ranks(tmp_path, hip_fakes["6"], extra):
        assert "error" not in res and res["sum"] == 3.0, res
        how, why, _ = decision(res)
        if level == "default":
            assert how == "off", (how, why)
            assert why == "not tried: rxe0 is SYS from the GPU, beyond HETCCL_IB_GDR_LEVEL=PXB", why
        else:
            assert how == "by peer memory", (how, why)
            assert why.startswith("ibv_reg_dmabuf_mr on rxe0"), why


SENDS = ("registered", "registered 1 KiB", "plain", "deregistered")
STAGING_LINE = (f"unregistered device memory: sends and receives of {THRESHOLD} bytes and more "
                "staged in registered device memory (a copy on the GPU)")


def check_in_place(results: List[dict], receiver_copies: Dict[str, int],
                   receiver_copied: Dict[str, int], receiver_device: Dict[str, int],
                   staging: bool = True) -> None:
    """receiver_device: which of the receiver's copies are device to
    device (staged in registered device memory). The sender's unregistered
    256 KiB sends are staged there too, unless staging is False."""
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["wrong"] == [], f"rank {rank}: wrong data in {res['wrong']}"
        print(f"\n[device sends in place] rank {rank}: ib bytes copied by the CPU "
              f"{res['copied']}, stand-in copies {res['copies']}, of them device to device "
              f"{res['device_copies']}")
    sender, receiver = results
    assert decision(sender)[0] == "by peer memory"
    # registered: no staging copy on the sender, no CPU copy on either side, at any size
    sent = {k: v for k, v in sender["copies"].items() if k != "both ways"}
    assert sent == {"registered": 0, "registered 1 KiB": 0, "plain": 1, "deregistered": 1}, sent
    sent = {k: v for k, v in sender["device_copies"].items() if k != "both ways"}
    assert sent == {"registered": 0, "registered 1 KiB": 0, "plain": int(staging),
                    "deregistered": int(staging)}, sent
    assert sender["copied"]["registered"] == 0 and sender["copied"]["registered 1 KiB"] == 0
    assert receiver["copies"] == receiver_copies, receiver["copies"]
    assert receiver["device_copies"] == receiver_device, receiver["device_copies"]
    for name, want in receiver_copied.items():
        assert receiver["copied"][name] == want, (name, receiver["copied"])


@pytest.mark.timeout(TIMEOUT)
def test_plane_across_hosts_moves_device_buffers_by_copy_engine_and_nic(
        tmp_path: Path, hip_fakes: Dict[str, Path]) -> None:
    """The data plane spanning two hosts (HETCCL_PLANE_HOSTS=all; rank 1 in
    an IPC namespace of its own, so a host of its own): each channel is a
    segment on each side, declared for RDMA, and its pieces of 16 KiB cross
    from segment to segment by RDMA WRITE (plane/bridge.c). The stand-in's
    copies fill and drain the slots; the CPU copies no payload. The
    allreduce goes through staging (the stand-in compiles no kernels)."""
    if not can_unshare_ipc():
        pytest.skip("needs `unshare --ipc` (util-linux, and the right) for a host of its own")
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_IBDEV": "1", "T_BYTES": str(256 << 10), "HETCCL_PLANE": "auto",
                             "HETCCL_PLANE_HOSTS": "all", "HETCCL_PLANE_PIECE": "16384",
                             "HETCCL_PLANE_SLOTS": "4"}, own_host=(1,))
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["wrong"] == [], f"rank {rank}: wrong data in {res['wrong']}"
        assert "(1 of other hosts, bridged" in res["log"], res["log"][-2000:]
        assert "moved by this GPU's copy engines" in res["log"], res["log"][-2000:]
        c = res["copied"]
        print(f"\n[plane across hosts] rank {rank}: ib bytes copied by the CPU {c}")
        for coll in ("sendrecv", "broadcast", "allgather", "allreduce"):
            assert c[coll] == 0, f"rank {rank}: {coll} copied {c[coll]} bytes"
        # one piece below the threshold: eager, into the slots and out
        assert c["sendrecv 1 KiB"] == 2 * 1024, c
        assert res["plane_copied"] == 0, res  # the stand-in's copy engines fill the slots


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("staging,cap", [("1", "64M"), ("0", "64M"), ("1", "128K")],
                         ids=["device-staging", "host-staging", "over-the-cap"])
def test_registered_device_sends_go_unstaged(staging: str, cap: str, tmp_path: Path,
                                             hip_fakes: Dict[str, Path]) -> None:
    """over-the-cap: a batch that needs more device memory than
    HETCCL_IB_GDR_STAGING_MAX (here every 256 KiB one) is staged in pinned
    host memory, as with staging off."""
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_INPLACE": "1", "T_BOTHWAYS": "1", "T_BYTES": str(256 << 10),
                             "HETCCL_IB_GDR_STAGING": staging,
                             "HETCCL_IB_GDR_STAGING_MAX": cap})
    # the receiver stages (its buffer is not registered): one copy in per
    # send, device to device from the registered device-memory block the NIC
    # wrote for the 256 KiB ones (with HETCCL_IB_GDR_STAGING=0, out of pinned
    # host memory); the 1 KiB send, below the threshold, lands by RDMA WRITE
    # in its pinned host staging all the same
    on = staging == "1" and cap == "64M"
    check_in_place(results, {name: 1 for name in SENDS + ("both ways",)},
                   {"registered": 0, "registered 1 KiB": 0, "plain": 0},
                   {"registered": int(on), "registered 1 KiB": 0, "plain": int(on),
                    "deregistered": int(on), "both ways": int(on)}, staging=on)
    # the receives that landed in device memory (the staging block) were read
    # back through the NIC before done: the receiver's three 256 KiB ones and
    # each rank's "both ways" one
    assert [flushed(res) for res in results] == ([1, 4] if on else [0, 0]), \
        [flushed(res) for res in results]
    # both ways in one group: each rank's send unstaged, its receive staged
    for res in results:
        assert res["copies"]["both ways"] == 1 and res["copied"]["both ways"] == 0, res
        assert res["device_copies"]["both ways"] == int(on), res
        assert (STAGING_LINE in res["log"]) == (staging == "1"), res["log"][-2000:]
        if staging == "0":
            assert "unregistered device memory staged in host memory (HETCCL_IB_GDR_STAGING=0)" \
                in res["log"], res["log"][-2000:]


@pytest.mark.timeout(TIMEOUT)
def test_registered_device_sends_to_a_host_rank(tmp_path: Path,
                                                hip_fakes: Dict[str, Path]) -> None:
    # 64 KiB of bounce buffer: the 256 KiB sends land in the host rank's own
    # buffer, registered for the message; the 1 KiB one in the bounce buffer
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_INPLACE": "1", "T_BYTES": str(256 << 10),
                             "HETCCL_IB_BOUNCE": str(64 << 10)}, host_ranks=(1,))
    check_in_place(results, {name: 0 for name in SENDS},
                   {"registered": 0, "registered 1 KiB": 1024}, {name: 0 for name in SENDS})


RECEIVES_LINE = (f"and receives of {THRESHOLD} bytes and more into registered device memory are "
                 "written there by the NIC (its peers ask first)")


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("gdr_recv,flush", [("1", "auto"), ("1", "off"), ("0", "auto")],
                         ids=["nic-writes", "nic-writes-no-read-back", "staged"])
def test_registered_device_receives_land_unstaged(gdr_recv: str, flush: str, tmp_path: Path,
                                                  hip_fakes: Dict[str, Path]) -> None:
    """HIP rank 0 sends HIP rank 1 the four sends of T_INPLACE, and rank 1
    receives each into device memory it registered: the NIC writes every
    message of the threshold or more straight into it (no stand-in copy on
    the receiver, no CPU copy on either side), and the receiver reads each
    back through the NIC before it is done (HIP has no flush call;
    HETCCL_IB_GDR_FLUSH=off: none is); the 1 KiB one, below the
    threshold, is staged. With HETCCL_IB_GDR_RECV=0 every receive is staged."""
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_INPLACE": "1", "T_RECV_REG": "1", "T_BYTES": str(256 << 10),
                             "HETCCL_IB_GDR_RECV": gdr_recv, "HETCCL_IB_GDR_FLUSH": flush})
    direct = gdr_recv == "1"
    read_back = direct and flush == "auto"
    assert flushed(results[1]) == (3 if read_back else -1), results[1]["log"][-2000:]
    assert (READ_BACK_LINE in results[1]["log"]) == read_back, results[1]["log"][-2000:]
    if direct and not read_back:
        assert "into device memory are not flushed (HETCCL_IB_GDR_FLUSH=off)" in results[1]["log"]
    # staged (HETCCL_IB_GDR_RECV=0): through pinned host memory, since device
    # staging of a receive needs its sender to ask first as well
    check_in_place(results,
                   {"registered": 1 - direct, "registered 1 KiB": 1, "plain": 1 - direct,
                    "deregistered": 1 - direct},
                   {name: 0 for name in SENDS}, {name: 0 for name in SENDS})
    assert results[0]["copied"] == {name: 0 for name in SENDS}, results[0]["copied"]
    for res in results:
        assert (RECEIVES_LINE in res["log"]) == direct, res["log"][-2000:]
        if not direct:
            assert "receives into device memory are staged (HETCCL_IB_GDR_RECV=0)" in res["log"]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("first", ["receive", "send"])
def test_host_rank_plain_memory_into_registered_device_memory(first: str, tmp_path: Path,
                                                               hip_fakes: Dict[str, Path]) -> None:
    """A host rank sends 256 KiB from plain memory into a HIP rank's
    registered device buffer: the HIP rank asked to be asked, so the host
    rank copies each message into its registered staging ring and the NIC
    writes it from there into device memory, whether the receive's offer
    came first or the send's request: the HIP rank neither copies (CPU) nor
    stages (stand-in copies), every message of three, no slack."""
    nbytes = 256 << 10
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_HOST_SENDS": "1", "T_RECV_REG": "1", "T_BYTES": str(nbytes),
                             "T_SEND_FIRST": "1" if first == "send" else "0"}, host_ranks=(0,))
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["wrong"] == [], (rank, res["wrong"])
        print(f"\n[host to registered device memory] {first} first: rank {rank} copied "
              f"{res['copied']} bytes, stand-in copies {res['copies']}")
    assert results[0]["copied"] == 3 * nbytes, results[0]["copied"]
    assert results[1]["copied"] == 0 and results[1]["copies"] == 0, results[1]
    assert RECEIVES_LINE in results[1]["log"], results[1]["log"][-2000:]
    assert flushed(results[1]) == 4, results[1]["log"][-2000:]  # each read back


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("staged", ["1", "0"], ids=["staged-writes", "no-staged-writes"])
def test_host_rank_plain_memory_to_a_device_rank(staged: str, tmp_path: Path,
                                                  hip_fakes: Dict[str, Path]) -> None:
    """A host rank sends 256 KiB from plain memory to a HIP rank, whose
    receive is staged through a registered block: with staged writes
    (docs/transports.md) the sender copies each message into its staging
    ring and RDMA-writes it into that block, so the HIP rank's CPU copies
    nothing; without, the eager pieces are copied on both sides. (The HIP
    rank does not ask to be asked here, HETCCL_IB_GDR_RECV=0: with it, the
    sender asks first and always writes; the test above.)"""
    nbytes = 256 << 10
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_HOST_SENDS": "1", "T_BYTES": str(nbytes),
                             "HETCCL_IB_STAGED_WRITE": staged, "HETCCL_IB_GDR_RECV": "0"},
                            host_ranks=(0,))
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["wrong"] == [], (rank, res["wrong"])
        print(f"\n[host to device rank] staged writes {staged}: rank {rank} copied "
              f"{res['copied']} bytes")
    assert results[0]["copied"] == 3 * nbytes, results[0]["copied"]
    # the receive is posted 0.5 s before each send; allow one late offer
    assert results[1]["copied"] <= (nbytes if staged == "1" else 3 * nbytes), results[1]["copied"]
    if staged == "0":
        assert results[1]["copied"] == 3 * nbytes, results[1]["copied"]


@pytest.mark.timeout(TIMEOUT)
def test_host_rank_plain_memory_into_unregistered_device_memory(
        tmp_path: Path, hip_fakes: Dict[str, Path]) -> None:
    """A host rank sends 256 KiB from plain memory into a HIP rank's device
    buffer that is not registered (PyTorch's case): the HIP rank stages
    the receive in device memory registered with the NIC, its peer asks
    first and writes from its staging ring, and the HIP rank's "GPU" copies
    each message out of the block (a device-to-device copy); its CPU copies
    nothing, no pinned host memory in between."""
    nbytes = 256 << 10
    results = run_hip_ranks(tmp_path, hip_fakes["6"],
                            {"T_HOST_SENDS": "1", "T_BYTES": str(nbytes),
                             "HETCCL_DEBUG_SUBSYS": "INIT,NET,ALLOC"}, host_ranks=(0,))
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert res["wrong"] == [], (rank, res["wrong"])
        print(f"\n[host to unregistered device memory] rank {rank} copied {res['copied']} "
              f"bytes, stand-in copies {res.get('copies')}, device to device "
              f"{res.get('device_copies')}")
    assert results[0]["copied"] == 3 * nbytes, results[0]["copied"]
    hip = results[1]
    assert hip["copied"] == 0 and hip["copies"] == 3 and hip["device_copies"] == 3, hip
    assert flushed(hip) == 4, hip["log"][-2000:]  # the first message, not counted above, too
    assert STAGING_LINE in hip["log"], hip["log"][-2000:]
    assert re.search(r"staging block of \d+ bytes of device memory", hip["log"]), hip["log"][-2000:]
    assert "bytes of pinned host memory" not in hip["log"], hip["log"][-2000:]
