#!/usr/bin/env bash
# The host engine against MPICH on the 16-core single-GPU machine, in one
# call, under 9 minutes:
#
#   device run (kind nvidia-h200, timeout_s 540, carry [".whl"]):
#     bash tools/device/cpu_sweep.sh
#
# Beforehand, here (the machine has no registry; .whl/ is git-ignored):
#   pip download --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 mpich mpi4py cffi numpy -d .whl/cp312
#
# What it does, printing progress, every table and JSON under $OUT:
#   build   libhetccl and hetccl-perf (meson + ninja, release) in build-sweep
#   peer    a venv with MPICH's wheel, mpi4py, cffi and numpy from .whl/cp312;
#           checks that mpiexec runs, that mpi4py loads MPICH (bench_cpu.py
#           checks every run too) and that hetccl's package imports
#   host    CPUs, caches, NUMA, huge pages, ptrace scope, and the copy
#           profile that the shm transport's single-copy default reads
#           (transport/shm/shm_host.c), with the default it chose
#   groups  tools/bench_cpu.py --peer mpich, paired medians, each hetccl
#           setting (--variant) against the same MPICH run of an alternation:
#             defaults  every case (--cases all) at n = 2,4,8,16 with no knob
#                     set, 5 alternations: the acceptance table
#             colls   sendrecv, all_gather, reduce_scatter, alltoall, broadcast
#                     of 16 MiB at n = 2,4,8,16: ring (HETCCL_SHM_CMA=0)
#                     against reads (=1: the pull algorithms), and reads
#                     stored by streaming stores (HETCCL_SHM_CMA_STREAM=1)
#             small   all_reduce 1 KiB: the default against recursive doubling
#             ar      all_reduce 1 MiB and 64 MiB: the default (ring)
#                     against the pull AllReduce (reads from 16 KiB)
#             thresh  sendrecv 64 KiB..4 MiB and all_gather 256 KiB..16 MiB at
#                     n = 2 and 16, ring against reads from 32 KiB: where
#                     single copy starts to pay (HETCCL_SHM_CMA_MIN)
#             rhd     all_reduce 1 KiB..4 MiB at n = 8 and 16: the default
#                     against recursive halving-doubling (algo/rhd.c) and
#                     the ring, forced
#             forms   AllReduce, AllGather, ReduceScatter, Broadcast, Reduce,
#                     AlltoAll, 256 KiB..16 MiB at n = 8 and 16: the default
#                     against the host's own ring and chain (ring.c's
#                     executor, HETCCL_ALGO=ring) and the data plane's forms
#                     on the host executor (HETCCL_ALGO=wavefront): ring
#                     against wave isolates the executor, def against
#                     either the algorithm (docs/architecture.md)
#           A group starts only if the time left allows its estimate.
# Knobs: SWEEP_LIMIT_S (default 500: seconds from the start after which no
# group starts), SWEEP_REPS (3), SWEEP_GROUPS (default: all, in the order above;
# SWEEP_GROUPS=forms runs that group alone),
# SWEEP_PYTHON (/opt/torch/.venv/bin/python3), SWEEP_WHEELS (.whl/cp312), SWEEP_N.
# $OUT gets log.txt, host.txt, tables.txt and one JSON per group (8 files at most).
set -u
START=$(date +%s)
OUT=${OUT:-/tmp/cpu_sweep_out}
mkdir -p "$OUT"
LIMIT=${SWEEP_LIMIT_S:-500}
REPS=${SWEEP_REPS:-3}
SET=${SWEEP_GROUPS:-defaults colls small ar thresh rhd forms}
WHEELS=${SWEEP_WHEELS:-.whl/cp312}
PY=${SWEEP_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
NS=${SWEEP_N:+--n $SWEEP_N}  # SWEEP_N=2: every group at these n only (a quick check)
VENV=/tmp/hetccl-peer
BUILD=build-sweep
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH  # meson, ninja
elapsed() { echo $(( $(date +%s) - START )); }
log() { echo "[$(elapsed) s] $*" | tee -a "$OUT/log.txt"; }

log "build"
if ! { [ -f $BUILD/build.ninja ] || meson setup $BUILD --buildtype=release >/dev/null; } ||
   ! ninja -C $BUILD >/tmp/cpu_sweep_build.log 2>&1; then
  log "FAIL: build"; tail -20 /tmp/cpu_sweep_build.log | tee -a "$OUT/log.txt"; exit 1
fi
PERF=$BUILD/tools/perf/hetccl-perf

# The venv's own numpy too: --system-site-packages reaches the base
# interpreter's packages, and /opt/torch/.venv is itself a venv whose numpy
# it does not see (the first run of this script failed on that).
log "peer: venv with MPICH, mpi4py, cffi, numpy from $WHEELS"
if ! { $PY -m venv --system-site-packages $VENV &&
       $VENV/bin/pip install -q --no-index --find-links "$WHEELS" --ignore-installed \
         mpich mpi4py cffi pycparser numpy; } >>"$OUT/log.txt" 2>&1; then
  log "FAIL: peer install"; exit 1
fi
VPY=$VENV/bin/python
LD_LIBRARY_PATH=$VENV/lib MPI4PY_LIBMPI=$VENV/lib/libmpi.so.12 MPI4PY_MPIABI=mpich $VPY -c \
  "from mpi4py import MPI; print('mpi4py loads:', MPI.Get_library_version().splitlines()[0])" \
  2>&1 | tee -a "$OUT/log.txt"
$VENV/bin/mpiexec --version 2>&1 | head -3 | tee -a "$OUT/log.txt"
if ! PYTHONPATH=python $VPY -c "import numpy, cffi, hetccl.cli" >>"$OUT/log.txt" 2>&1; then
  log "FAIL: hetccl's package does not import in $VENV"; exit 1
fi

log "host"
{
  echo "# nproc $(nproc)"; lscpu; echo
  cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
  echo "ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null)"
  numactl -H 2>/dev/null || ls /sys/devices/system/node/ 2>/dev/null
  grep -E "MemTotal|Hugepagesize|HugePages_Total" /proc/meminfo
  rm -f /dev/shm/hetccl-host-*  # measure afresh, as a first job after boot would
  echo "# the shm transport's copy profile and default (INFO lines):"
  HETCCL_DEBUG=INFO HETCCL_DEBUG_SUBSYS=INIT,SHM PYTHONPATH=python \
    HETCCL_LIBRARY=$BUILD/libhetccl/libhetccl.so $VPY -m hetccl run -n 2 -- \
    $PERF sendrecv -b 16M -e 16M -n 5 -w 2 -c 1 2>&1 | grep -E "shm: (measured|single copy)|Wrong|^ +[0-9]"
  cat /dev/shm/hetccl-host-* 2>/dev/null
} >"$OUT/host.txt" 2>&1
cat "$OUT/host.txt" | grep -E "Model name|nproc|NUMA node|L2|L3|ptrace|shm:|stream_gbps" | tee -a "$OUT/log.txt"

# group NAME ESTIMATE_S ARGS...: one bench_cpu.py run, if time allows.
group() {
  local name=$1 est=$2
  shift 2
  case " $SET " in *" $name "*) ;; *) return 0 ;; esac
  local left=$(( LIMIT - $(elapsed) ))
  if [ "$left" -lt "$est" ]; then
    log "skip $name: ${left} s left, estimate ${est} s"
    return 0
  fi
  log "group $name (estimate ${est} s)"
  {
    echo "## $name: $*"
    timeout $(( left + 20 )) $VPY tools/bench_cpu.py --perf $PERF --peer mpich \
      --peer-python $VPY --reps "$REPS" --progress --json "$OUT/$name.json" "$@" $NS \
      2>>"$OUT/log.txt"
    echo "## $name: exit $? at $(elapsed) s"
  } | tee -a "$OUT/tables.txt"
}

CMA0=cma0:HETCCL_SHM_CMA=0
CMA1=cma1:HETCCL_SHM_CMA=1
group defaults 270 --n 2,4,8,16 --variant def: --cases all --reps 5
group colls 200 --n 2,4,8,16 --variant $CMA0 --variant $CMA1 \
  --variant cma1s:HETCCL_SHM_CMA=1,HETCCL_SHM_CMA_STREAM=1 \
  --cases sendrecv:16M,all_gather:16M,reduce_scatter:16M,alltoall:16M,broadcast:16M
group small 30 --n 2,8,16 --variant def: --variant rd:HETCCL_ALGO=rd --cases all_reduce:1K
group ar 90 --n 2,4,8,16 --variant def: \
  --variant pull:HETCCL_SHM_CMA=1,HETCCL_ALGO=pull,HETCCL_SHM_CMA_MIN=16K \
  --cases all_reduce:1M,all_reduce:64M
group thresh 50 --n 2,16 --variant $CMA0 --variant cma1m:HETCCL_SHM_CMA=1,HETCCL_SHM_CMA_MIN=32K \
  --cases sendrecv:64K..4M,all_gather:256K..16M
group rhd 100 --n 8,16 --variant def: --variant rhd:HETCCL_ALGO=rhd \
  --variant ring:HETCCL_ALGO=ring --cases all_reduce:1K..4M
group forms 120 --n 8,16 --variant def: --variant ring:HETCCL_ALGO=ring \
  --variant wave:HETCCL_ALGO=wavefront \
  --cases all_reduce:256K..16M*4,all_gather:256K..16M*4,reduce_scatter:256K..16M*4,broadcast:1M..16M*4,reduce:1M..16M*4,alltoall:256K..16M*4
log "done"
