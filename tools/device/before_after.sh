#!/usr/bin/env bash
# Two commits of the library against each other and against MPICH in one
# call on the 16-core single-GPU machine: the host figures a refactor must
# keep, paired in the same run.
#
# Beforehand, here (build-* is git-ignored; the device copies only what
# carry names of it):
#   rm -rf build-before/src build-after/src; mkdir -p build-before/src build-after/src
#   git archive OLD | tar -x -C build-before/src
#   git archive HEAD | tar -x -C build-after/src
#   device run (carry ["build-before", "build-after", ".whl/cp312"]):
#     bash tools/device/before_after.sh
#
# What it does (logs and JSON under $OUT):
#   build   each tree's libhetccl and hetccl-perf (release) in its own folder
#   peer    the MPICH venv of cpu_sweep.sh (.whl/cp312)
#   compare tools/bench_cpu.py from the after tree, MPICH as the peer, the
#           after library as the default and the before library as a
#           variant (HETCCL_PERF_LIB, HETCCL_LIBRARY), $BA_CASES at $BA_N,
#           $BA_REPS alternations; then $BA_EXTRA (more bench_cpu.py
#           arguments for a second run on the after tree, if set)
# Knobs: BA_CASES, BA_N (2,8,16), BA_REPS (3), BA_EXTRA, BA_PYTHON.
set -u
START=$(date +%s)
OUT=${OUT:-/tmp/before_after_out}
mkdir -p "$OUT"
PY=${BA_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
export PYTHONUNBUFFERED=1
CASES=${BA_CASES:-all_reduce:1K..64K*8,broadcast:1K,reduce:1K,alltoall:16M}
NS=${BA_N:-2,8,16}
REPS=${BA_REPS:-3}
VENV=/tmp/hetccl-peer
log() { echo "[$(( $(date +%s) - START )) s] $*" | tee -a "$OUT/log.txt"; }

for side in before after; do
  log "build $side"
  src=build-$side/src
  if ! { [ -f $src/build/build.ninja ] || meson setup $src/build $src --buildtype=release \
           >/dev/null; } || ! ninja -C $src/build >"$OUT/build-$side.log" 2>&1; then
    log "FAIL: build $side"; tail -20 "$OUT/build-$side.log" | tee -a "$OUT/log.txt"; exit 1
  fi
done
BEFORE_LIB=$PWD/build-before/src/build/libhetccl/libhetccl.so
AFTER=$PWD/build-after/src

log "peer: MPICH venv"
if ! { $PY -m venv --system-site-packages $VENV &&
       $VENV/bin/pip install -q --no-index --find-links .whl/cp312 --ignore-installed \
         mpich mpi4py cffi pycparser numpy; } >>"$OUT/log.txt" 2>&1; then
  log "FAIL: peer install"; exit 1
fi

log "compare: $CASES at n=$NS, $REPS alternations"
(cd "$AFTER" && $VENV/bin/python tools/bench_cpu.py --perf build/tools/perf/hetccl-perf \
   --peer mpich --peer-python $VENV/bin/python --reps "$REPS" --progress --n "$NS" \
   --variant after: --variant "before:HETCCL_PERF_LIB=$BEFORE_LIB,HETCCL_LIBRARY=$BEFORE_LIB" \
   --cases "$CASES" --json "$OUT/compare.json") 2>>"$OUT/log.txt" | tee -a "$OUT/tables.txt"
if [ -n "${BA_EXTRA:-}" ]; then
  log "extra: $BA_EXTRA"
  # shellcheck disable=SC2086
  (cd "$AFTER" && $VENV/bin/python tools/bench_cpu.py --perf build/tools/perf/hetccl-perf \
     --peer mpich --peer-python $VENV/bin/python --progress --json "$OUT/extra.json" \
     $BA_EXTRA) 2>>"$OUT/log.txt" | tee -a "$OUT/tables.txt"
fi
log "done"
