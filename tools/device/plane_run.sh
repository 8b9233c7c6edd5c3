#!/usr/bin/env bash
# The cross-island data plane on the GPU machine, in one call:
#
#   device run (carry [".whl"]): bash tools/device/plane_run.sh
#
# Stages (each logs to $OUT/NN-name.log, one PASS/FAIL line in summary.txt):
#   build     libhetccl, hetccl-perf and the C tests (meson, release)
#   reduce    tests/c/reduce/test_devreduce gpu: the device reductions, every
#             type x operator x mode x layout, bit for bit against the host
#   pytest    tests/test_cuda_engine.py: every collective on CUDA ranks in
#             forced islands (now on the data plane), a CUDA rank with a host
#             rank, the call returning before the stream reaches it
#   limit     tools/device/copy_limit.py: what the copy engines move, this run
#   perf      hetccl-perf --mem_type cuda under `hetccl run -n $NRANKS`, islands
#             forced one per rank, every collective 1 MiB..1 GiB with every
#             result checked; then all_reduce and sendrecv with
#             HETCCL_PLANE=off (the staged engine path) for comparison
#   perf1     the same from ONE process driving every rank (ncclCommInitAll,
#             -g NRANKS): several ranks per process, and on one GPU no
#             context switches between processes in the measurement
#   sweep     the data plane's piece size and slot count (HETCCL_PLANE_PIECE,
#             HETCCL_PLANE_SLOTS): all_reduce and sendrecv at 32 and 256 MiB
#             for each pair, ROUNDS (3) rounds; the medians are the figures
#             behind the defaults (docs/dataplane.md)
#   readpath  the two ways a device reduction reads the peer's piece
#             (HETCCL_PLANE_REDUCE_READ=copy: copy engine into device memory,
#             then the kernel; =mapped: the kernel reads the shared slot over
#             the bus), all_reduce, reduce_scatter and reduce at 64 MiB..1 GiB,
#             ROUNDS (2) rounds alternating
#   torch     tools/device/torch_backend_check.py: torch's hetccl backend
#             with GPU ranks and a CPU rank in one job, every collective
#             against gloo, then DDP
#   dmabuf    tests/c/vendor/test_runtime gpu: the cuda entry exports device
#             memory as a dma-buf (what GPUDirect RDMA through dma-buf
#             imports), or says why it cannot; the flush of a NIC's writes
#             into device memory (cuFlushGPUDirectRDMAWrites) succeeds
#   cupy      tools/device/cupy_api_check.py with NRANKS ranks: hetccl's two
#             Python APIs against numpy, then again with libhetccl in
#             LD_PRELOAD so that cupy.cuda.nccl's own calls reach hetccl
#   hang      one process driving NRANKS ranks (-g) at 1 MiB under a 60 s
#             bound; if it does not finish, every thread's name, state and
#             kernel wait point, and the last log lines, for the diagnosis
# STAGES="build perf" runs only those. NRANKS (default 2) ranks share the
# GPUs round-robin (one GPU: all on GPU 0). NCCL_NVLS_ENABLE=0 everywhere.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LIB=$ROOT/build-dev/libhetccl/libhetccl.so
export HETCCL_LIBRARY=$LIB HETCCL_PERF_LIB=$LIB
NRANKS=${NRANKS:-2}
. "$ROOT/tools/device/stages.sh"

do_reduce() {
  CUDART=$(ls "$($PY -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"/nvidia/*/lib/libcudart.so* 2>/dev/null | sort -r | head -1)
  HETCCL_TEST_CUDART=$CUDART HETCCL_DEBUG=INFO HETCCL_DEBUG_SUBSYS=RUNTIME \
    build-dev/tests/c/reduce/test_devreduce gpu
}
do_pytest() { $PY -m pytest -q tests/test_cuda_engine.py -p no:cacheprovider -rs -x; }
do_limit() { $PY tools/device/copy_limit.py; }
perf() { # perf LABEL COLL ARGS... (environment from the caller)
  echo "--- $1"
  HETCCL_ISLANDS=rank $PY -m hetccl run -n "$NRANKS" -- build-dev/tools/perf/hetccl-perf "$2" \
    --mem_type cuda -c 1 -n 10 -w 3 "${@:3}"
}
# One process driving every rank (ncclCommInitAll, ranks sharing the GPUs
# round-robin): no context switch between processes on one GPU.
perf1() {
  echo "--- one process: $1"
  HETCCL_ISLANDS=rank build-dev/tools/perf/hetccl-perf "$2" --mem_type cuda -g "$NRANKS" -c 1 -n 10 -w 3 \
    "${@:3}"
}
do_perf1() {
  # With fewer GPUs than ranks, ranks of the process share a device: one
  # context, both ranks' streams on it.
  for c in all_reduce sendrecv all_gather reduce_scatter broadcast alltoall; do
    perf1 "$c" "$c" -b 1M -e 1G -f 4 || echo "FAIL: $c"
  done
  ! grep -q "^FAIL" "$OUT/06-perf1.log"
}
do_perf() {
  local colls="all_reduce sendrecv all_gather reduce_scatter broadcast alltoall reduce gather scatter"
  for c in $colls; do perf "plane $c" "$c" -b 1M -e 1G -f 4 || echo "FAIL: $c"; done
  perf "plane all_reduce small" all_reduce -b 8 -e 256K -f 8 || echo "FAIL: small"
  for c in all_reduce sendrecv; do
    HETCCL_PLANE=off perf "engine (HETCCL_PLANE=off) $c" "$c" -b 1M -e 256M -f 4 || echo "FAIL: off $c"
  done
  ! grep -q "^FAIL" "$OUT/05-perf.log"
}

do_sweep() { # ROUNDS rounds, each over every pair, so drift spreads evenly
  for round in $(seq "${ROUNDS:-3}"); do
    for piece in 1M 2M 4M 8M; do
      for slots in 2 4 8; do
        for c in all_reduce sendrecv; do
          HETCCL_PLANE_PIECE=$piece HETCCL_PLANE_SLOTS=$slots \
            perf "sweep round=$round piece=$piece slots=$slots $c" "$c" -b 32M -e 256M -f 8 -n 20 \
            || echo "FAIL: $piece $slots $c"
        done
      done
    done
  done
  ! grep -q "^FAIL" "$OUT/07-sweep.log"
}
do_readpath() {
  for round in $(seq "${ROUNDS:-2}"); do
    for read in copy mapped; do
      for c in all_reduce reduce_scatter reduce; do
        HETCCL_PLANE_REDUCE_READ=$read perf "readpath round=$round read=$read $c" "$c" \
          -b 64M -e 1G -f 4 || echo "FAIL: $read $c"
      done
    done
  done
  ! grep -q "^FAIL" "$OUT/10-readpath.log"
}
do_torch() { # one GPU: two GPU ranks (two processes, one island each) and a CPU rank
  local devices=()
  [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && devices=(--devices cuda:0,cuda:0,cpu)
  HETCCL_ISLANDS=rank TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    $PY tools/device/torch_backend_check.py "${devices[@]}" --json "$OUT/torch_backend.json"
}
do_dmabuf() {
  CUDART=$(ls "$($PY -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"/nvidia/*/lib/libcudart.so* 2>/dev/null | sort -r | head -1)
  LD_PRELOAD=$CUDART HETCCL_DEBUG=INFO HETCCL_DEBUG_SUBSYS=RUNTIME build-dev/tests/c/vendor/test_runtime gpu
}
do_cupy() {
  $PY tools/device/cupy_api_check.py --ranks "$NRANKS" --islands rank &&
    LD_PRELOAD=$LIB $PY tools/device/cupy_api_check.py --ranks "$NRANKS" --islands rank
}
do_hang() {
  local log=$OUT/hang-debug.log
  HETCCL_ISLANDS=rank NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL NCCL_DEBUG_FILE=$log \
    build-dev/tools/perf/hetccl-perf all_reduce -b 1M -e 1M --mem_type cuda -g "$NRANKS" -c 1 -n 5 -w 1 &
  bounded $! 60 "$log"
}

export ROOT OUT PY LIB NRANKS
export -f note bounded perf perf1 do_build do_reduce do_pytest do_limit do_perf do_perf1 do_sweep do_readpath do_torch do_hang do_dmabuf do_cupy
export PYTHONPATH=$ROOT/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
STAGES=${STAGES:-reduce pytest limit perf}
stage 01 build 240 do_build
if [ -f "$LIB" ]; then
  want reduce && stage 02 reduce 240 do_reduce
  want pytest && stage 03 pytest 480 do_pytest
  want limit && stage 04 limit 60 do_limit
  want perf && stage 05 perf 400 do_perf
  want perf1 && stage 06 perf1 300 do_perf1
  want sweep && stage 07 sweep 420 do_sweep
  want hang && stage 08 hang 120 do_hang
  want torch && stage 09 torch 240 do_torch
  want readpath && stage 10 readpath 300 do_readpath
  want dmabuf && stage 11 dmabuf 60 do_dmabuf
  want cupy && stage 12 cupy 300 do_cupy
fi
note "overall: $([ $STATUS -eq 0 ] && echo PASS || echo FAIL)"
exit $STATUS
