#!/usr/bin/env bash
# What users meet on the single-GPU machine (one H200, 16 CPU cores), in
# one call, with no HETCCL_* variable set unless a stage says so:
#
#   device run (kind nvidia-h200, carry [".whl"]):
#     STAGES="torch torchbench" bash tools/device/single_accept.sh
#
# The wheels the machine lacks (cffi, pycparser; mpich and mpi4py for the
# host-engine stages) are downloaded beforehand for CPython 3.12 into
# .whl/cp312 (git ignored). Stages (logs in $OUT/NN-name.log, PASS/FAIL
# lines in summary.txt):
#   build       the wheels into /tmp/site, libhetccl and hetccl-perf (release)
#   torch       tools/device/torch_backend_check.py, every collective DDP and
#               FSDP use against gloo and DDP's loss, on CPU jobs of 4 and 8
#               ranks, cuda:0 with two CPU ranks, and two CUDA ranks on the
#               one GPU
#   torchbench  tools/bench_torch.py at n=4 and n=8 ($TORCH_REPS alternating
#               launches each): gloo against hetccl per collective and size,
#               with the library's own time beside (--direct), the DDP step
#               taken apart ($TORCH_ARGS: more of its options,
#               e.g. "--colls all_reduce --sizes 16M" for the DDP step alone)
#   gpushare    hetccl-perf, two processes on the one GPU (hetccl run -n 2):
#               with no variable, and with HETCCL_ISLANDS=rank beside it
#   cudatests   tests/test_devreduce.py and tests/test_cuda_engine.py (the cases
#               one GPU runs: ranks on one GPU in islands of their own, a CUDA
#               rank with host ranks, the device reductions bit for bit)
#   cpu         tools/device/cpu_sweep.sh's acceptance group: tools/bench_cpu.py
#               against MPICH, every case at n=2,4,8,16, no knob set
#               ($CPU_GROUPS: more of its groups)
# STAGES picks them (default: all); build always runs. NCCL_NVLS_ENABLE=0.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LIB=$ROOT/build-dev/libhetccl/libhetccl.so
export HETCCL_LIBRARY=$LIB HETCCL_PERF_LIB=$LIB
export PYTHONPATH=/tmp/site:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
. "$ROOT/tools/device/stages.sh"
STAGES=${STAGES:-torch torchbench gpushare cudatests cpu}
TORCH_REPS=${TORCH_REPS:-3}
CPU_GROUPS=${CPU_GROUPS:-defaults}

do_single_build() {
  set -e
  # cffi and pycparser (numpy stays the machine's own, torch's; MPICH goes
  # into cpu_sweep.sh's venv, where its library is kept)
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/cp312/*.whl | grep -E '/(cffi|pycparser)-')
  [ -d build-dev ] || meson setup build-dev --buildtype=release
  ninja -C build-dev
  nvidia-smi -L
  nproc
}
do_torch() {
  local rc=0 d
  for d in ${TORCH_DEVICES:-cpu,cpu,cpu,cpu cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu cuda:0,cpu,cpu cuda:0,cuda:0}; do
    echo "--- devices $d"
    $PY tools/device/torch_backend_check.py --devices $d --steps 20 --timeout 240 || rc=1
  done
  return $rc
}
do_torchbench() {
  local n
  for n in 4 8; do
    echo "--- n=$n"
    $PY tools/bench_torch.py -n $n --reps "$TORCH_REPS" --profile --direct \
      --json "$OUT/torch-n$n.json" \
      ${TORCH_ARGS:-} || return 1
  done
}
do_gpushare() {
  local c mem="--mem_type cuda"
  build-dev/tools/perf/hetccl-perf --help 2>&1 | grep -q -- "--mem_type" || mem="-m cuda"
  for c in all_reduce sendrecv; do
    echo "--- $c, two processes on one GPU, no variable"
    $PY -m hetccl run -n 2 -- build-dev/tools/perf/hetccl-perf $c $mem -c 1 -n 10 -w 3 \
      -b 1M -e 256M -f 16 || return 1
    echo "--- $c, the same with HETCCL_ISLANDS=rank"
    HETCCL_ISLANDS=rank $PY -m hetccl run -n 2 -- build-dev/tools/perf/hetccl-perf $c \
      $mem -c 1 -n 10 -w 3 -b 1M -e 256M -f 16 || return 1
  done
}
do_cudatests() {
  $PY -m pytest -q tests/test_devreduce.py tests/test_cuda_engine.py -p no:cacheprovider -rs \
    -k "not bandwidth"
}
do_cpu() { OUT=$OUT/cpu SWEEP_GROUPS=$CPU_GROUPS SWEEP_LIMIT_S=400 bash tools/device/cpu_sweep.sh; }
export -f note do_single_build do_torch do_torchbench do_gpushare do_cudatests do_cpu
export PY OUT ROOT TORCH_REPS CPU_GROUPS TORCH_ARGS

stage 01 build 240 do_single_build
want torch && stage 02 torch 300 do_torch
want torchbench && stage 03 torchbench 420 do_torchbench
want gpushare && stage 04 gpushare 120 do_gpushare
want cudatests && stage 05 cudatests 200 do_cudatests
want cpu && stage 06 cpu 520 do_cpu
cat "$OUT/summary.txt"
exit $STATUS
