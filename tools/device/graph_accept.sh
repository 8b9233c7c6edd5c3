#!/usr/bin/env bash
# CUDA graphs across islands on the single-GPU machine (one H200): two
# processes on the one GPU capture collectives and send/recv into graphs and
# replay them (tests/test_cuda_graph.py), in one call, with no HETCCL_*
# variable set for the library (HETCCL_LIBRARY only tells the tests which
# file to load and preload):
#
#   device run (kind nvidia-h200):
#     bash tools/device/graph_accept.sh
#
# Stages (logs in $OUT/NN-name.log, PASS/FAIL lines in summary.txt):
#   build   libhetccl with meson (release) into $BUILD (default build-dev,
#           the other device scripts' tree) when it has none, then ninja (a
#           no-op when it is current)
#   graphs  $PYTHON -m pytest -q -s tests/test_cuda_graph.py ($PYTEST_ARGS
#           added, e.g. "-k refused"): scenario 1 (one graph of five calls,
#           100 replays between eager calls, capture modes global and
#           thread_local), 2 (two graphs alternately), 3 (timing), 4
#           (torch.distributed's nccl backend under LD_PRELOAD; a skip says
#           why), 5 (a host rank: capture refused)
# Then, on stdout: the TIMING lines (eager call against replay, per rank),
# what served torch's NCCL under LD_PRELOAD (rank N: probe / served by),
# the skips with their reasons, the graphs log's end when it failed,
# nvidia-smi -L and the summary. Exit status 1 when a stage failed.
# PYTHON defaults to /opt/torch/.venv/bin/python3 (torch with CUDA, pytest).
# GRAPHS_LIMIT_S bounds the tests (default 360: six launches of two ranks,
# each killed at 120 s, normally 10-30 s each). NCCL_NVLS_ENABLE=0.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
BUILD=${BUILD:-build-dev}
LIB=$ROOT/$BUILD/libhetccl/libhetccl.so
export HETCCL_LIBRARY=$LIB
. "$ROOT/tools/device/stages.sh"
GRAPHS_LIMIT_S=${GRAPHS_LIMIT_S:-360}
PYTEST_ARGS=${PYTEST_ARGS:-}

do_graph_build() {
  set -e
  [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" --buildtype=release
  ninja -C "$BUILD"
  ls -l "$LIB"
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
}
do_graphs() {
  local rc=0
  $PY -m pytest -q -s -rs -p no:cacheprovider tests/test_cuda_graph.py $PYTEST_ARGS || rc=$?
  # 5: nothing collected, the module skipped itself (no CUDA torch, no library)
  [ $rc -eq 5 ] && echo "FAIL: no test ran (the module was skipped: see the reason above)"
  return $rc
}
export -f note do_graph_build do_graphs
export PY OUT ROOT BUILD LIB PYTEST_ARGS

stage 01 build 180 do_graph_build
if [ -f "$LIB" ]; then
  stage 02 graphs "$GRAPHS_LIMIT_S" do_graphs
else
  note "FAIL graphs: not run, no $LIB"
  STATUS=1
fi

GLOG=$OUT/02-graphs.log
if [ -f "$GLOG" ]; then
  echo "--- timing (4 MiB all_reduce, mean per call over 200)"
  grep -E '^TIMING ' "$GLOG" || echo "(no TIMING line: the timing test did not get that far)"
  echo "--- torch's NCCL under LD_PRELOAD"
  grep -E '^rank [0-9]+: (probe|served by)' "$GLOG" || echo "(no probe line)"
  echo "--- capture notes"
  grep -E '^(capture \(|refused:)' "$GLOG" || true
  echo "--- skips"
  grep -E '^SKIPPED' "$GLOG" || echo "(none)"
  if grep -q '^FAIL graphs' "$OUT/summary.txt"; then
    echo "--- end of $GLOG"
    tail -80 "$GLOG"
  fi
fi
echo "--- GPU"
timeout 30 nvidia-smi -L || echo "nvidia-smi -L failed"
echo "--- summary"
cat "$OUT/summary.txt"
exit $STATUS
