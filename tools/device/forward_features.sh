#!/usr/bin/env bash
# tools/device/forward_features.c, built against the real NCCL's header and
# linked to the real libnccl.so.2, run without and with hetccl preloaded on
# one GPU: both runs must print the same lines, every step "ok", and the
# hetccl log must show the communicators forwarded.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NCCL_DIR=${NCCL_DIR:-$SITE/nvidia/nccl}
OUTDIR=${OUT:-/tmp}
[ -d build-dev ] || meson setup build-dev --buildtype=release >/dev/null
ninja -C build-dev >/dev/null || exit 1
LIB=$PWD/build-dev/libhetccl/libhetccl.so
BIN=/tmp/hetccl-forward-features
nvcc -O2 -o "$BIN" tools/device/forward_features.c -I"$NCCL_DIR/include" -L"$NCCL_DIR/lib" \
  -l:libnccl.so.2 -Xlinker -rpath="$NCCL_DIR/lib" || { echo "FAIL: build"; exit 1; }
ldd "$BIN" | grep -E "nccl|cudart"
rc=0
timeout 120 "$BIN" >"$OUTDIR/features.nccl.txt" 2>"$OUTDIR/features.nccl.err" ||
  { echo "FAIL: without hetccl"; rc=1; }
LD_PRELOAD=$LIB HETCCL_DEBUG=TRACE HETCCL_DEBUG_SUBSYS=VENDOR,INIT,CALL \
  HETCCL_DEBUG_FILE="$OUTDIR/features.hetccl.log" \
  timeout 120 "$BIN" >"$OUTDIR/features.hetccl.txt" 2>"$OUTDIR/features.hetccl.err" ||
  { echo "FAIL: with hetccl"; rc=1; }
echo "--- without hetccl"; cat "$OUTDIR/features.nccl.txt" "$OUTDIR/features.nccl.err"
echo "--- with LD_PRELOAD=$LIB"; cat "$OUTDIR/features.hetccl.txt" "$OUTDIR/features.hetccl.err"
if cmp -s "$OUTDIR/features.nccl.txt" "$OUTDIR/features.hetccl.txt"; then
  echo "identical output"
else
  echo "FAIL: outputs differ"; diff "$OUTDIR/features.nccl.txt" "$OUTDIR/features.hetccl.txt"; rc=1
fi
calls=$(grep -c " CALL " "$OUTDIR/features.hetccl.log")
fwd=$(grep -c "forwarding to" "$OUTDIR/features.hetccl.log")
echo "hetccl log: $fwd forwarded communicators, $calls CALL lines"
grep -m3 "forwarding to" "$OUTDIR/features.hetccl.log"
grep " CALL " "$OUTDIR/features.hetccl.log" | grep -o "nccl[A-Za-z]* rank" | sort | uniq -c
[ "$fwd" -gt 0 ] || { echo "FAIL: no forwarded communicator in the hetccl log"; rc=1; }
[ $rc -eq 0 ] && echo "PASS forward_features"
exit $rc
