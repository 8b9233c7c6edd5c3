#!/usr/bin/env bash
# Everything the GPU machine checks, in one call (see ../shared/device.md):
#
#   device run (kind nvidia-h200-x2, carry [".whl"]):
#     bash tools/device/run.sh
#
# Stages (each logs to $OUT/NN-name.log and prints one PASS/FAIL line; a
# failed stage does not stop the next; exit status 1 if any failed):
#   1 build    libhetccl (and hetccl-perf) with meson into build-dev
#   2 pytest   the cuda-marked tests (tests/test_cuda.py and others marked so)
#   3 torch    tools/device/torch_dropin.py without and with
#              LD_PRELOAD=libhetccl.so: results identical, and the hetccl log
#              shows the calls went through hetccl to the real NCCL
#   4 cupy     tools/device/cupy_dropin.py, the same way
#   5 perf     tools/device/compare_nccl.{sh,py}: hetccl-perf, real NCCL
#              against hetccl forwarding to it, --mem_type cuda -g 2 (if present)
#   6 broken   HETCCL_NCCL_LIBRARY=/nonexistent under PyTorch: a clean error
#              that names it, no crash, no hang
#   7 features tools/device/forward_features.sh: a C program built against
#              the real NCCL (nonblocking init, device-scalar PreMulSum, graph
#              capture, windows, split, shrink, finalize), without and with
#              hetccl preloaded: the same output, every step ok
#   8 overhead tools/device/overhead.sh: per-call forwarding cost
#   9 staging  tools/device/stage_bench.py: device buffers on an engine
#              communicator (forced islands), staged whole and in 4 MiB
#              pieces, against the same ranks on host buffers
#  10 latency  tools/device/paired_latency.c: small-message latency of
#              hetccl and NCCL paired in one process on 2 GPUs, after a
#              control run of NCCL against itself (the method's own bias);
#              fails if hetccl misses NCCL + 0.5 us
# STAGES="build features ..." runs only those (build is always first); the
# default is every stage. One GPU suffices for all but torch, cupy, perf
# and latency.
# $OUT also gets summary.txt and extra.tgz (JSON results, hetccl debug logs,
# raw perf tables). At most 8 files come back, so when more than 6 stage
# logs were written, those of passing stages move into extra.tgz.
#
# Wheels for what the machine lacks (cffi, pycparser) travel in .whl (see
# the device README); NCCL_NVLS_ENABLE=0 everywhere. Budget: about 10 minutes.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/hetccl-dev.XXXXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LIB=$ROOT/build-dev/libhetccl/libhetccl.so
export HETCCL_LIBRARY=$LIB
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)
REAL_NCCL=${REAL_NCCL:-$SITE/nvidia/nccl/lib/libnccl.so.2}
. "$ROOT/tools/device/stages.sh"

# --- stages -------------------------------------------------------------------

do_build() {
  set -e
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || echo "WARN: the wheels in .whl did not install"
  fi
  [ -d build-dev ] || meson setup build-dev --buildtype=release
  ninja -C build-dev
  ls -l "$LIB"
  nvidia-smi -L || true
  echo "real NCCL: $REAL_NCCL"
  ls -l "$REAL_NCCL"
}

do_pytest() {
  set -e
  $PY -m pytest -q -m cuda tests -p no:cacheprovider -rs
}

# dropin NAME SCRIPT: run SCRIPT once without and once with hetccl
# preloaded, compare the results, check the log for forwarded calls.
dropin() {
  local name=$1 script=$2 base="$WORK/$1"
  echo "--- without hetccl"
  $PY "$script" "$base.nccl.json" || { echo "FAIL: $name without hetccl"; return 1; }
  echo "--- with LD_PRELOAD=$LIB"
  LD_PRELOAD=$LIB HETCCL_DEBUG=TRACE HETCCL_DEBUG_SUBSYS=VENDOR,INIT,CALL \
    HETCCL_DEBUG_FILE="$WORK/$name.hetccl.%p.log" \
    $PY "$script" "$base.hetccl.json" || { echo "FAIL: $name with hetccl"; return 1; }
  $PY - "$base.nccl.json" "$base.hetccl.json" <<'EOF' || return 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ka = a.get("ranks", a.get("results"))
kb = b.get("ranks", b.get("results"))
same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)
diff = sorted(k for k in set(ka) | set(kb) if not same(ka.get(k), kb.get(k)))
if not same(a.get("nccl_version"), b.get("nccl_version")):
    diff.append("nccl_version %s != %s" % (a.get("nccl_version"), b.get("nccl_version")))
print("timing without:", json.dumps(a.get("timing")))
print("timing with:   ", json.dumps(b.get("timing")))
if diff:
    print("FAIL: results differ:", diff)
    for k in diff[:5]:
        print(" ", k, ka.get(k), "!=", kb.get(k))
    sys.exit(1)
print("identical results:", len(ka), "entries")
EOF
  cat "$WORK/$name".hetccl.*.log >"$WORK/$name.hetccl.log" 2>/dev/null
  local log="$WORK/$name.hetccl.log" vendor fwd calls
  vendor=$(grep -c "INFO VENDOR NCCL" "$log")
  fwd=$(grep -c "forwarding to" "$log")
  calls=$(grep -c " CALL " "$log")
  grep -m3 "INFO VENDOR" "$log"
  grep -m3 "forwarding to" "$log"
  grep -m5 " CALL " "$log"
  echo "hetccl log: $vendor NCCL loads, $fwd forwarded communicators, $calls CALL lines"
  if [ "$vendor" -eq 0 ]; then echo "FAIL: the hetccl log shows no NCCL loaded"; return 1; fi
  if [ "$fwd" -eq 0 ]; then echo "FAIL: the hetccl log shows no forwarded communicator"; return 1; fi
}

do_torch() { dropin torch tools/device/torch_dropin.py; }
do_cupy() { dropin cupy tools/device/cupy_dropin.py; }

do_perf() {
  if [ -x tools/device/compare_nccl.sh ]; then
    tools/device/compare_nccl.sh
  elif [ -f tools/device/compare_nccl.py ]; then
    $PY tools/device/compare_nccl.py "$REAL_NCCL" --perf build-dev/tools/perf/hetccl-perf \
      --colls all_reduce,all_gather,broadcast,reduce_scatter,alltoall,sendrecv \
      -b 1M -e 1G -f 4 -n 20 -w 5 -c 0 --timeout 120 --out "$WORK/perf-large"
  else
    echo "no tools/device/compare_nccl.{sh,py}: skipped"
  fi
}

# Small messages differ by microseconds from one invocation to the next,
# so latency is measured paired, inside one process (paired_latency.c).
do_latency() {
  set -o pipefail
  gcc -O2 -Wall tools/device/paired_latency.c -ldl -lm -o "$WORK/paired_latency" || return 1
  HETCCL_PERF_CUDART=$(ls "$SITE"/nvidia/*/lib/libcudart.so* 2>/dev/null | sort -r | head -1)
  export HETCCL_PERF_CUDART
  local args=(--rounds "${ROUNDS:-400}" --iters 20)
  note "latency control: NCCL against itself (two pairs of communicators)"
  "$WORK/paired_latency" "$REAL_NCCL" "$REAL_NCCL" --sizes 8 "${args[@]}" |
    while IFS= read -r line; do note "$line"; done
  note "latency: hetccl forwarding to that NCCL, against it"
  HETCCL_DEVICE=cuda HETCCL_NCCL_LIBRARY=$REAL_NCCL HETCCL_DEBUG=INFO \
    HETCCL_DEBUG_FILE="$WORK/latency-hetccl.%p.log" \
    "$WORK/paired_latency" "$REAL_NCCL" "$LIB" --sizes 8,1K,64K "${args[@]}" |
    while IFS= read -r line; do note "$line"; done
  local rc=$?
  grep -h "forwarding to" "$WORK"/latency-hetccl.*.log | head -2
  return $rc
}

do_features() { OUT=$WORK bash tools/device/forward_features.sh; }
do_overhead() { ITERS=${ITERS:-1000000} bash tools/device/overhead.sh; }
do_staging() {
  set -o pipefail
  OUT=$WORK $PY tools/device/stage_bench.py --pieces 0,4M --reps 3 |
    while IFS= read -r line; do note "$line"; done
}

do_broken() {
  local log="$WORK/broken.out"
  LD_PRELOAD=$LIB HETCCL_NCCL_LIBRARY=/nonexistent/libnccl.so.2 \
    $PY tools/device/torch_dropin.py "$WORK/broken.json" --quick >"$log" 2>&1
  local rc=$?
  tail -30 "$log"
  echo "exit status $rc"
  if [ $rc -eq 0 ]; then echo "FAIL: PyTorch ran with no NCCL to forward to"; return 1; fi
  if [ $rc -ge 128 ] || grep -qE "Segmentation fault|core dumped|SIGSEGV|SIGABRT" "$log"; then
    echo "FAIL: crashed (rc $rc)"; return 1
  fi
  if ! grep -q "/nonexistent/libnccl.so.2" "$log"; then
    echo "FAIL: the error does not name HETCCL_NCCL_LIBRARY's value"; return 1
  fi
  echo "clean error naming the library"
}

export ROOT OUT WORK PY LIB REAL_NCCL SITE
export -f note dropin do_build do_pytest do_torch do_cupy do_perf do_broken do_features do_overhead \
  do_staging do_latency
STAGES=${STAGES:-pytest torch cupy perf broken features overhead staging latency}
want() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
stage 01 build 120 do_build
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [ -f "$LIB" ]; then
  want pytest && stage 02 pytest 300 do_pytest
  want torch && stage 03 torch 100 do_torch
  want cupy && stage 04 cupy 60 do_cupy
  want perf && stage 05 perf 160 do_perf
  want broken && stage 06 broken 40 do_broken
  want features && stage 07 features 150 do_features
  want overhead && stage 08 overhead 120 do_overhead
  want staging && stage 09 staging 180 do_staging
  want latency && stage 10 latency 120 do_latency
else
  note "FAIL skipped every later stage: no $LIB"
  STATUS=1
fi

logs=("$OUT"/[0-9][0-9]-*.log)
if [ ${#logs[@]} -gt 6 ]; then
  mkdir -p "$WORK/stage-logs"
  for f in "${logs[@]}"; do
    name=$(basename "$f" .log)
    grep -q "^PASS ${name#*-} " "$OUT/summary.txt" && mv "$f" "$WORK/stage-logs/"
  done
fi
tar czf "$OUT/extra.tgz" -C "$WORK" . 2>/dev/null
note "overall: $([ $STATUS -eq 0 ] && echo PASS || echo FAIL)"
exit $STATUS
