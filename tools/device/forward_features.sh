#!/usr/bin/env bash
# tools/device/forward_features.py without and with hetccl preloaded, on one
# GPU; the results must be identical.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
[ -d build-dev ] || meson setup build-dev --buildtype=release >/dev/null
ninja -C build-dev >/dev/null || exit 1
LIB=$PWD/build-dev/libhetccl/libhetccl.so
OUTDIR=${OUT:-/tmp}
timeout 60 $PY tools/device/forward_features.py "$OUTDIR/features.nccl.json" || echo "FAIL: without hetccl"
LD_PRELOAD=$LIB HETCCL_DEBUG=TRACE HETCCL_DEBUG_SUBSYS=VENDOR,INIT,CALL \
  HETCCL_DEBUG_FILE="$OUTDIR/features.hetccl.log" \
  timeout 60 $PY tools/device/forward_features.py "$OUTDIR/features.hetccl.json" || echo "FAIL: with hetccl"
if cmp -s "$OUTDIR/features.nccl.json" "$OUTDIR/features.hetccl.json"; then
  echo "PASS: identical"
else
  echo "FAIL: results differ"; diff "$OUTDIR/features.nccl.json" "$OUTDIR/features.hetccl.json"
fi
grep -c " CALL " "$OUTDIR/features.hetccl.log" | sed 's/^/CALL lines: /'
grep -m2 "forwarding to" "$OUTDIR/features.hetccl.log"
