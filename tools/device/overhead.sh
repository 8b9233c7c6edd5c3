#!/usr/bin/env bash
# Forwarding overhead per call on the GPU machine: tools/device/overhead.c
# against the real NCCL and against hetccl forwarding to it, alternated.
set -eu
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
REAL=${REAL_NCCL:-$SITE/nvidia/nccl/lib/libnccl.so.2}
CUDART_DIR=$SITE/nvidia/cu13/lib
[ -d build-dev ] || meson setup build-dev --buildtype=release >/dev/null
ninja -C build-dev >/dev/null
gcc -O2 tools/device/overhead.c -ldl -o /tmp/overhead
export LD_LIBRARY_PATH=$CUDART_DIR:$(dirname "$REAL")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for rep in 1 2 3; do
  /tmp/overhead "$REAL" "${ITERS:-1000000}"
  HETCCL_DEVICE=cuda HETCCL_NCCL_LIBRARY=$REAL /tmp/overhead "$PWD/build-dev/libhetccl/libhetccl.so" "${ITERS:-1000000}"
done
