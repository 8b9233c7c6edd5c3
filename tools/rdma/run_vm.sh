#!/usr/bin/env bash
# Run the rdma tests (tests/test_ib.py) or any command inside a Soft-RoCE VM
# (the rxe-vm tool: $RXE_VM, default ../shared/tools/rxe-vm beside the
# checkout), against the library built in BUILD (default build-ib; configured
# with -Dtests=true it also holds the C ib conformance test).
#
#   tools/rdma/run_vm.sh [--hosts 1|2] [--cpus N] [--build DIR] [-- CMD ARGS...]
#
# Exit status: CMD's (the first non-zero of the two VMs'), 75 where the two
# VMs' wire carries nothing (checked before CMD), 124 on rxe-vm's timeout.
#
# --cpus: each VM's virtual CPUs (rxe-vm's default, 2, where not given).
# qemu emulates each on a thread of its own: two VMs of two on a 2-core
# machine thrash (the two cross-host tests took 150-230 s that way, 55 s
# with one each), while one VM's multi-rank tests want both.
#
# Default CMD: python3 -m pytest -q -m rdma tests/test_ib.py (with -s for the
# figures). With --hosts 2 both VMs run CMD; the tests then add the
# two-host cases, exchanging the unique id through a file in the checkout
# (named by HETCCL_RDMA_RUN, fresh per run). BUILD is brought up to date
# here first, so that nothing builds inside the VMs (slow under emulation,
# and two VMs would build one directory at once). Run from anywhere.
set -euo pipefail

top="$(cd "$(dirname "$0")/../.." && pwd)"
hosts=1 build="$top/build-ib" cpus=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --cpus) cpus=(--cpus "$2"); shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "run_vm.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f "$build/libhetccl/libhetccl.so" ]] || {
  echo "run_vm.sh: no $build/libhetccl/libhetccl.so (meson setup build-ib && ninja -C build-ib)" >&2
  exit 2
}
[[ $# -gt 0 ]] || set -- python3 -m pytest -q -s -m rdma tests/test_ib.py
if command -v ninja >/dev/null; then
  log="$(ninja -C "$build" 2>&1)" || { echo "$log" >&2; echo "run_vm.sh: ninja -C $build failed" >&2; exit 1; }
fi

# qemu's TCG default CPU (qemu64) lacks SSE4.2 and POPCNT, which numpy 2
# wheels require (the tests die with "Illegal instruction"): rxe-vm finds
# qemu on PATH, so a wrapper first on PATH asks for every feature TCG
# emulates (-cpu max). The VM is otherwise rxe-vm's own.
qemu="$(command -v qemu-system-x86_64 || true)"
wrap="$(mktemp -d)"
if [[ -n "$qemu" ]]; then
  printf '#!/bin/sh\nexec %q -cpu max "$@"\n' "$qemu" > "$wrap/qemu-system-x86_64"
  chmod +x "$wrap/qemu-system-x86_64"
  export PATH="$wrap:$PATH"
fi

run="$(date +%s)-$$"
# With --hosts 2, each VM first pings the other over the virtual wire, and
# exits WIRE_DEAD (75) where no answer comes: qemu's link has been seen dead
# from boot on, and tests on it would only wait out their timeouts.
wire=""
[[ $hosts == 2 ]] && wire="{ busybox ping -q -c 3 -w 30 \"\$RXE_VM_PEER\" >/dev/null || \
{ echo \"run_vm.sh: no answer from \$RXE_VM_PEER over the VMs' wire\" >&2; exit 75; }; } && "
# The guest's /dev is a bare devtmpfs: multiprocessing (and shm) want /dev/shm.
cmd="$wire{ [ -d /dev/shm ] || { mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm; }; } && cd '$top' && export HETCCL_LIBRARY='$build/libhetccl/libhetccl.so' PYTHONPATH='$top/python' \
HETCCL_RDMA_RUN='$run' HETCCL_RDMA_BUILD='$build' && $(printf '%q ' "$@")"
cd "$top"
trap 'rm -rf "$wrap"; rm -f "$top"/.rdma-uid-"$run"-*' EXIT
"${RXE_VM:-$top/../shared/tools/rxe-vm}" --hosts "$hosts" "${cpus[@]}" -- sh -c "$cmd"
