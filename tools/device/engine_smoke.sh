#!/usr/bin/env bash
# Device buffers on an engine communicator, rank by rank with logs: two
# processes on one GPU in forced islands (and a CUDA rank with a host rank)
# run tests/cuda_engine_rank.py checks one at a time, each under a time
# limit, and print every rank's output. For diagnosing what
# tests/test_cuda_engine.py reports. Usage: engine_smoke.sh [CHECKS...]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=${HETCCL_LIBRARY:-$ROOT/build-dev/libhetccl/libhetccl.so}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-45}
OUTDIR=${OUT:-/tmp}/engine-smoke
mkdir -p "$OUTDIR"
status=0
[ $# -gt 0 ] || set -- chain:cuda,cuda group:cuda,cuda sweep:cuda,cuda async,capture:cuda,cuda \
  chain:cuda,host
for spec in "$@"; do
  checks=${spec%%:*} modes=${spec#*:}
  IFS=, read -r -a m <<<"$modes"
  dir=$(mktemp -d)
  pids=()
  for r in "${!m[@]}"; do
    extra=()
    [ "${m[$r]}" = host ] && extra=(HETCCL_DEVICE=host)
    env T_LIB="$LIB" T_RANK="$r" T_NRANKS=${#m[@]} T_ID_FILE="$dir/id" T_MODE="${m[$r]}" \
      T_CHECKS="$checks" T_HANG_DUMP=$((LIMIT - 5)) HETCCL_ISLANDS=rank NCCL_NVLS_ENABLE=0 "${extra[@]}" \
      HETCCL_DEBUG=${HETCCL_DEBUG:-INFO} HETCCL_DEBUG_SUBSYS=${HETCCL_DEBUG_SUBSYS:-INIT,RUNTIME,PROXY} \
      timeout -k 5 "$LIMIT" "$PY" "$ROOT/tests/cuda_engine_rank.py" >"$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  rcs=()
  for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
  echo "=== $checks on $modes: exit ${rcs[*]}"
  for r in "${!m[@]}"; do
    cp "$dir/rank$r.log" "$OUTDIR/${checks//,/+}-$modes-rank$r.log"
    grep -v "^$" "$dir/rank$r.log" | tail -25 | sed "s/^/  [$r] /" | cut -c1-300
  done
  for rc in "${rcs[@]}"; do [ "$rc" -eq 0 ] || status=1; done
  rm -rf "$dir"
done
exit $status
