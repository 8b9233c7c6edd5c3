"""libhetccl on a GPU machine, driven from Python with ctypes (no cffi
needed): which NCCL it forwards to and from where, the version it reports,
the host/cuda decision, forwarded calls on real device memory, re-entry
from the real NCCL, and a broken HETCCL_NCCL_LIBRARY.

Each check runs in its own Python process: the vendor library is loaded
once per process, and the point is what a fresh program sees. Needs torch
with CUDA (it loads libcudart and the real libnccl.so.2, as PyTorch
programs do); skipped elsewhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import torch_cuda_ok
from libpath import find_library

pytestmark = pytest.mark.cuda

LIB = find_library()


if LIB is None or not torch_cuda_ok():
    pytest.skip("needs libhetccl.so and torch with a CUDA device", allow_module_level=True)

# Shared prologue of the child programs: ctypes bindings of the few calls used.
PRELUDE = textwrap.dedent("""
    import ctypes, json, os, sys
    LIB = os.environ["T_LIB"]
    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    def bind(lib):
        lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                         UniqueId, ctypes.c_int]
        lib.ncclCommInitAll.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                        ctypes.c_void_p]
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p]
        lib.ncclCommCuDevice.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
        lib.ncclGetLastError.restype = ctypes.c_char_p
        return lib
    def version(lib):
        v = ctypes.c_int(0)
        assert lib.ncclGetVersion(ctypes.byref(v)) == 0
        return v.value
    def last_error(lib, comm=None):
        return (lib.ncclGetLastError(comm) or b"").decode(errors="replace")
    def report(**kw):
        print("RESULT " + json.dumps(kw))
""")


def run_child(body: str, env: dict[str, str] | None = None, timeout: float = 180) -> dict:
    code = PRELUDE + textwrap.dedent(body)
    full_env = dict(os.environ, T_LIB=str(LIB), NCCL_NVLS_ENABLE="0", HETCCL_DEBUG="INFO",
                    HETCCL_DEBUG_SUBSYS="VENDOR,RUNTIME,INIT")
    full_env.pop("HETCCL_NCCL_LIBRARY", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"child printed no RESULT:\n{out[-4000:]}"
    got = json.loads(lines[-1][len("RESULT "):])
    got["_log"] = out
    return got


def real_nccl_version() -> int:
    import torch
    major, minor, patch = torch.cuda.nccl.version()[:3]
    return major * 10000 + minor * 100 + patch


def test_forwards_to_the_loaded_nccl():
    """torch loaded the real libnccl.so.2 first: hetccl finds that one
    (RTLD_NOLOAD), reports its version, and says where it came from."""
    got = run_child("""
        import torch
        torch.cuda.init()
        lib = bind(ctypes.CDLL(LIB))
        report(version=version(lib), torch=list(torch.cuda.nccl.version()[:3]))
    """)
    assert got["version"] == real_nccl_version()
    assert "nvidia/nccl/lib/libnccl.so.2 (already loaded)" in got["_log"], got["_log"][-3000:]


def test_cpu_only_program_is_a_host_rank():
    """No CUDA loaded by the program: hetccl stays a host rank (its own API
    version, no vendor loaded) even on a GPU machine."""
    got = run_child("""
        lib = bind(ctypes.CDLL(LIB))
        loaded = [l for l in open("/proc/self/maps").read().splitlines()
                  if "libcudart" in l or "libnccl.so" in l]
        report(version=version(lib), cuda_mapped=len(loaded))
    """)
    assert got["version"] == 23203  # NCCL 2.32.3, the API hetccl implements
    assert got["cuda_mapped"] == 0
    assert "VENDOR" not in got["_log"]


def test_explicit_library_and_forwarded_allreduce():
    """HETCCL_NCCL_LIBRARY names the real NCCL; a one-rank communicator is
    forwarded and an all-reduce on torch device memory goes through it."""
    import torch
    path = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib",
                        "libnccl.so.2")
    path = os.path.realpath(path)
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    got = run_child("""
        import torch
        torch.cuda.set_device(0)
        lib = bind(ctypes.CDLL(LIB))
        uid = UniqueId()
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0, last_error(lib)
        comm = ctypes.c_void_p()
        rc = lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
        assert rc == 0, (rc, last_error(lib))
        dev = ctypes.c_int(-1)
        assert lib.ncclCommCuDevice(comm, ctypes.byref(dev)) == 0
        x = torch.arange(1000, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)
        s = torch.cuda.current_stream().cuda_stream
        rc = lib.ncclAllReduce(x.data_ptr(), y.data_ptr(), 1000, 7, 0, comm, s)  # float32, sum
        torch.cuda.synchronize()
        same = bool(torch.equal(x, y))
        assert lib.ncclCommDestroy(comm) == 0
        report(rc=rc, same=same, dev=dev.value, version=version(lib))
    """, env={"HETCCL_NCCL_LIBRARY": path})
    assert got["rc"] == 0 and got["same"] and got["dev"] == 0
    assert got["version"] == real_nccl_version()
    assert f"{path} (HETCCL_NCCL_LIBRARY)" in got["_log"]


def test_init_all_two_gpus():
    """ncclCommInitAll over every GPU (several ranks in one process), then a
    group-wrapped all-reduce."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    got = run_child("""
        import torch
        lib = bind(ctypes.CDLL(LIB))
        lib.ncclGroupStart.argtypes = []
        lib.ncclGroupEnd.argtypes = []
        comms = (ctypes.c_void_p * 2)()
        rc = lib.ncclCommInitAll(comms, 2, None)
        assert rc == 0, (rc, last_error(lib))
        xs = [torch.full((4096,), float(i + 1), device=f"cuda:{i}") for i in range(2)]
        assert lib.ncclGroupStart() == 0
        for i in range(2):
            with torch.cuda.device(i):
                s = torch.cuda.current_stream().cuda_stream
                assert lib.ncclAllReduce(xs[i].data_ptr(), xs[i].data_ptr(), 4096, 7, 0,
                                         comms[i], s) == 0, last_error(lib)
        assert lib.ncclGroupEnd() == 0, last_error(lib)
        sums = []
        for i in range(2):
            torch.cuda.synchronize(i)
            sums.append(float(xs[i].sum()))
        for c in comms:
            assert lib.ncclCommDestroy(c) == 0
        report(sums=sums)
    """)
    assert got["sums"] == [3.0 * 4096, 3.0 * 4096]


def test_reentry_from_the_real_library():
    """The program calls the real NCCL's ncclCommInitAll itself while hetccl
    is preloaded: the real library's calls to its own exported names (group
    start/end) may bind to hetccl and must go straight back, never loop or
    hang."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    got = run_child("""
        import torch
        torch.cuda.init()
        real_path = [l.split()[-1] for l in open("/proc/self/maps").read().splitlines()
                     if l.endswith("/libnccl.so.2")][0]
        real = bind(ctypes.CDLL(real_path))
        comms = (ctypes.c_void_p * 2)()
        rc = real.ncclCommInitAll(comms, 2, None)
        for c in comms:
            if c:
                real.ncclCommDestroy(c)
        report(rc=rc, real=real_path)
    """, env={"LD_PRELOAD": str(LIB)}, timeout=120)
    assert got["rc"] == 0, got["_log"][-3000:]


def test_broken_nccl_library():
    """HETCCL_NCCL_LIBRARY=/nonexistent on a CUDA rank: init fails with a
    message that names it; nothing crashes."""
    got = run_child("""
        import torch
        torch.cuda.set_device(0)
        lib = bind(ctypes.CDLL(LIB))
        uid = UniqueId()
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0, last_error(lib)
        comm = ctypes.c_void_p()
        rc = lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
        report(rc=rc, msg=last_error(lib))
    """, env={"HETCCL_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"})
    assert got["rc"] != 0, "ncclCommInitRank succeeded with no NCCL to forward to"
    assert "/nonexistent/libnccl.so.2" in got["msg"], got["msg"]
