#!/usr/bin/env bash
# The cross-island acceptance on two GPUs, in one call:
#
#   device run (kind nvidia-h200-x2, carry [".whl", ".peers"]):
#     bash tools/device/x2_accept.sh
#
# NVIDIA's nccl-tests are fetched beforehand into .peers/nccl-tests (git
# ignored, never committed) and built here against the machine's NCCL.
# Stages (logs in $OUT/NN-name.log, PASS/FAIL lines in summary.txt):
#   build     libhetccl and hetccl-perf (meson, release)
#   ntbuild   nccl-tests' six *_perf binaries, MPI off, for sm_90
#   ntmpibuild  the same with MPI on, against MPICH from its PyPI wheel
#             (fetched beforehand, git ignored: pip download --no-deps
#             mpich==4.3.2 -d .peers/mpich)
#   limit     tools/device/copy_limit.py on GPU 0: what the copy engines move
#   nt        nccl-tests -g 2 (one process, both GPUs), 8 B to 1 GiB, every
#             result checked: under LD_PRELOAD with HETCCL_ISLANDS=0,1 for
#             all six collectives; plain NCCL and NCCL_P2P_DISABLE=1 (its
#             shared-memory path) for sendrecv and all_reduce
#   ntmpi     nccl-tests with a process per GPU (mpiexec -n 2, -g 1), 8 B
#             to 1 GiB, the same runs as nt
#   perf      hetccl-perf, one process per GPU (hetccl run -n 2), islands
#             forced, the same six collectives 1 MiB to 1 GiB
#   train     tools/device/train_bench.py: DDP and a 2-stage pipeline across
#             the islands against one GPU and against NCCL on one island,
#             and again with each of $TRAIN_VARIANTS
#   big       all_reduce -g 2 at 256 MiB to 1 GiB under a 100 s bound, with
#             the threads' states where it stalls
#   readpath  nccl-tests all_reduce and reduce_scatter -g 2, 64 MiB..1 GiB,
#             with HETCCL_PLANE_REDUCE_READ=mapped (the kernel reads the shared
#             slot over the bus; nt has the default, copy): before and after
#   variants  sendrecv, all_reduce and reduce_scatter -g 2 at 16 MiB..1 GiB
#             in other configurations ($NT_VARIANTS; nt has the defaults;
#             NT_VARIANT_COLLS, NT_VARIANT_MIN, NT_VARIANT_FACTOR change it)
#   cupy      tools/device/cupy_api_check.py: cupy.cuda.nccl, hetccl.nccl and
#             hetccl.Communicator on CuPy arrays, same arguments, equal results
#   torch3    tools/device/torch_backend_check.py with two GPU ranks and a CPU
#             rank in one job
#   torch3trace  the same with T_TRACE=1 (every rank names the check and the
#             device that fault) and 5 DDP steps
#   torch3san the same collectives with rank 0 under compute-sanitizer
#   pytest    tests/test_cuda_engine.py (the two-GPU cases run here), or
#             $PYTEST_FILES (tests/test_programs.py -k cuda: random programs)
#   host      the host's huge-page settings, NUMA nodes and GPU topology
#   profile   tools/device/ddp_profile.py: where a DDP step's time goes,
#             across the islands and on NCCL
#   memop     tools/device/memop_gap.py --peer 1 $MEMOP_ARGS: what a wait and
#             a signal between pieces cost the copy streams, on one GPU and
#             between two (MEMOP_ARGS="--load 30": also beside a GEMM load)
#   numa      tools/device/numa_copies.py: the copy engines against pinned
#             host memory bound to each NUMA node, per GPU and both at once
#   hier      on a machine of 4 GPUs or more (kind nvidia-h100-x4): nccl-tests
#             -g N, 1 MiB to 1 GiB, the GPUs in two islands of N/2
#             (HETCCL_ISLANDS=0,0,1,1): AllReduce on the rails (default),
#             through the leaders (HETCCL_HIER_RAILS=0), flat (one island
#             per GPU), beside NCCL and its shared-memory path; then
#             all_gather, reduce_scatter and broadcast ($HIER_COLLS) on the
#             rails and through the leaders; all_reduce with a process per
#             GPU (hetccl run). HIER_AR=0 leaves the all_reduce runs out.
#   a2a       nccl-tests alltoall -g N (4 GPUs), two islands: its pairs as sends
#             and receives (inside an island on NCCL) against HETCCL_HIER=0;
#             A2A_COLLS="alltoall gather scatter" adds Gather and Scatter
#   p2p       tools/device/p2p_islands.py (4 GPUs): send/recv inside an island
#             (to its NCCL) and across, against HETCCL_HIER=0
#   hosts     hetccl-perf, a process per GPU, each rank a host of its own
#             (unshare --ipc), so the pair crosses by socket: device buffers on
#             the data plane's bridges (HETCCL_PLANE_HOSTS=all) against staged
#             for the engine (one), in turns, and host buffers (--mem_type host: what
#             the socket itself moves), 64 KiB to 256 MiB ($HOSTS_COLLS: all but
#             alltoall, which two ranks make a sendrecv)
#   hosts4    on a machine of 4 GPUs: two processes of two GPUs each (-g 2),
#             the second a host of its own (unshare --ipc), HETCCL_ISLANDS=0,0,1,1:
#             NCCL inside each host's island, hetccl across by socket, on the
#             plane's bridges against staged (HETCCL_PLANE_HOSTS=one), in turns,
#             1 MiB to 256 MiB ($HOSTS4_COLLS)
#   near      tools/../test_ib_near on this machine's /sys with every GPU's
#             bus id (nvidia-smi's spelling): the paths NIC affinity reads
# STAGES="..." picks stages (build always runs). NCCL_NVLS_ENABLE=0.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LIB=$ROOT/build-dev/libhetccl/libhetccl.so
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
REAL_NCCL=$SITE/nvidia/nccl/lib/libnccl.so.2
NT=/tmp/nccl-tests-build
export HETCCL_LIBRARY=$LIB HETCCL_PERF_LIB=$LIB HETCCL_NCCL_LIBRARY=$REAL_NCCL
. "$ROOT/tools/device/stages.sh"
COLLS="sendrecv all_reduce all_gather reduce_scatter broadcast alltoall"

NTM=/tmp/nccl-tests-mpi
MPICH=/tmp/mpich
# nt_make BUILDDIR MAKE-ARGS...: nccl-tests against the machine's NCCL, sm_90
nt_make() {
  local home=/tmp/nccl-home build=$1 cuda
  shift
  mkdir -p $home/lib
  ln -sfn "$(dirname "$REAL_NCCL")/../include" $home/include
  ln -sf "$REAL_NCCL" $home/lib/libnccl.so
  ln -sf "$REAL_NCCL" $home/lib/libnccl.so.2
  cuda=$(dirname "$(dirname "$(command -v nvcc)")")
  make -C .peers/nccl-tests/src -j16 NCCL_HOME=$home CUDA_HOME="$cuda" BUILDDIR="$build" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "$@" >/dev/null && ls "$build"/*_perf
}
do_ntbuild() { nt_make $NT MPI=0; }
mpi_home() { echo $MPICH/mpich-*.data/data; }
do_ntmpibuild() {
  set -e
  rm -rf $MPICH && mkdir -p $MPICH
  $PY -m zipfile -e "$(ls .peers/mpich/mpich-*.whl | head -1)" $MPICH
  chmod +x "$(mpi_home)"/bin/*
  "$(mpi_home)"/bin/mpichversion | head -2
  nt_make $NTM MPI=1 MPI_HOME="$(mpi_home)"
}
do_limit() { $PY tools/device/copy_limit.py; }
nt() { # nt LABEL COLL ENV... : nccl-tests -g 2, 8 B .. 1 GiB
  echo "--- $1"
  env "${@:3}" LD_LIBRARY_PATH="$(dirname "$REAL_NCCL")" timeout 60 \
    $NT/"$2"_perf -g 2 -b 8 -e 1G -f 8 -n 20 -w 5 -c 1
}
ntm() { # ntm LABEL COLL ENV... : nccl-tests, a process per GPU, 8 B .. 1 GiB
  local m
  m=$(mpi_home)
  echo "--- $1"
  PATH=$m/bin:$PATH LD_LIBRARY_PATH="$m/lib:$(dirname "$REAL_NCCL")" timeout 90 \
    mpiexec -launcher fork -n 2 env MPIR_CVAR_ENABLE_GPU=0 "${@:3}" $NTM/"$2"_perf -g 1 -b 8 -e 1G -f 8 -n 20 -w 5 -c 1
}
# nt_table RUN LOG: RUN (nt or ntm) over the table's runs: hetccl on every
# collective, plain NCCL and its shared-memory path on sendrecv and all_reduce
nt_table() {
  local run=$1 log=$2 c
  for c in $COLLS; do
    $run "hetccl $c" $c LD_PRELOAD=$LIB HETCCL_ISLANDS=0,1 || echo "FAIL: hetccl $c"
  done
  for c in sendrecv all_reduce; do
    $run "nccl $c" $c || echo "FAIL: nccl $c"
    $run "nccl NCCL_P2P_DISABLE=1 $c" $c NCCL_P2P_DISABLE=1 || echo "FAIL: nccl-shm $c"
  done
  grep -E "WARN|rror" "$log" | grep -v "^#" | head -5
  ! grep -q "^FAIL" "$log"
}
do_nt() { nt_table nt "$OUT/04-nt.log"; }
do_ntmpi() { nt_table ntm "$OUT/18-ntmpi.log"; }
PERF_COLLS=${PERF_COLLS-$COLLS}
do_perf() {
  for c in $PERF_COLLS; do
    echo "--- per process: $c"
    HETCCL_ISLANDS=rank $PY -m hetccl run -n 2 -- build-dev/tools/perf/hetccl-perf $c \
      --mem_type cuda -c 1 -n 20 -w 5 -b 1M -e 1G -f 32 || echo "FAIL: $c"
  done
  ! grep -q "^FAIL" "$OUT/05-perf.log"
}
do_big() { # all_reduce -g 2 at 256 MiB..1 GiB, bounded; where it stalls, the threads
  local log=$OUT/big-debug.log
  env LD_PRELOAD=$LIB HETCCL_ISLANDS=0,1 NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$log \
    LD_LIBRARY_PATH="$(dirname "$REAL_NCCL")" \
    $NT/all_reduce_perf -g 2 -b 256M -e 1G -f 2 -n 5 -w 2 -c 1 &
  bounded $! 100 "$log"
}
do_readpath() {
  for c in all_reduce reduce_scatter; do
    echo "--- hetccl $c HETCCL_PLANE_REDUCE_READ=mapped"
    env LD_PRELOAD=$LIB HETCCL_ISLANDS=0,1 HETCCL_PLANE_REDUCE_READ=mapped \
      LD_LIBRARY_PATH="$(dirname "$REAL_NCCL")" timeout 60 \
      $NT/${c}_perf -g 2 -b 64M -e 1G -f 4 -n 20 -w 5 -c 1 || echo "FAIL: $c"
  done
  ! grep -q "^FAIL" "$OUT/08-readpath.log"
}
# NT_VARIANTS: space-separated LABEL:VAR=VALUE[,VAR=VALUE] configurations
# in which $NT_VARIANT_COLLS (sendrecv, all_reduce, reduce_scatter) -g 2 run
# again from NT_VARIANT_MIN (16M) to 1 GiB, sizes NT_VARIANT_FACTOR (4)
# apart, beside nt's defaults (list a label twice, or the defaults as a
# label, to see the spread between runs).
NT_VARIANTS=${NT_VARIANTS-piece8M:HETCCL_PLANE_PIECE=8M slots8:HETCCL_PLANE_SLOTS=8}
NT_VARIANT_MIN=${NT_VARIANT_MIN-16M}
NT_VARIANT_FACTOR=${NT_VARIANT_FACTOR-4}
NT_VARIANT_COLLS=${NT_VARIANT_COLLS-sendrecv all_reduce reduce_scatter}
do_variants() {
  local v label c vars
  for v in $NT_VARIANTS; do
    label=${v%%:*} vars=${v#*:}
    for c in $NT_VARIANT_COLLS; do
      echo "--- hetccl $c $label ($vars)"
      env LD_PRELOAD=$LIB HETCCL_ISLANDS=0,1 ${vars//,/ } \
        LD_LIBRARY_PATH="$(dirname "$REAL_NCCL")" timeout 60 \
        $NT/${c}_perf -g 2 -b "$NT_VARIANT_MIN" -e 1G -f "$NT_VARIANT_FACTOR" -n 20 -w 5 -c 1 \
        || echo "FAIL: $c $label"
    done
  done
  ! grep -q "^FAIL" "$OUT/09-variants.log"
}
do_profile() { # where a DDP step's time goes, across the islands and on NCCL
  echo "--- hetccl, islands 0,1"
  LD_PRELOAD=$LIB HETCCL_ISLANDS=0,1 $PY tools/device/ddp_profile.py --bin-us 1000 || return 1
  echo "--- NCCL, one island"
  $PY tools/device/ddp_profile.py --bin-us 1000
}
do_host() { # what the host gives pinned shared memory: pages, NUMA, the GPUs' links
  cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled
  grep -i huge /proc/meminfo
  nvidia-smi topo -m
  ls /sys/devices/system/node/ | grep node
  nproc
  echo "iommu: $(ls /sys/class/iommu 2>/dev/null | wc -l) units; cmdline: $(cat /proc/cmdline)"
  for g in /sys/bus/pci/devices/*/iommu_group; do readlink "$g"; done 2>/dev/null | sort -u | wc -l
}
do_numa() { $PY tools/device/numa_copies.py; }
ntg() { # ntg LABEL COLL ENV... : nccl-tests -g (every GPU), 1 MiB .. 1 GiB
  echo "--- $1"
  env "${@:3}" LD_LIBRARY_PATH="$(dirname "$REAL_NCCL")" timeout 90 \
    $NT/"$2"_perf -g "$(nvidia-smi -L | wc -l)" -b 1M -e 1G -f 4 -n 20 -w 5 -c 1
}
do_p2p() { $PY tools/device/p2p_islands.py; }
HOSTS_COLLS=${HOSTS_COLLS-all_reduce sendrecv all_gather reduce_scatter broadcast}
hosts_perf() { # hosts_perf LABEL COLL MEMORY ENV...: two ranks, two hosts, one GPU each
  echo "--- $1"
  env "${@:4}" HETCCL_ISLANDS=rank $PY -m hetccl run -n 2 -- unshare --ipc \
    build-dev/tools/perf/hetccl-perf "$2" -m "$3" -c 1 -n 8 -w 2 -b 64K -e 256M -f 4
}
HOSTS4_COLLS=${HOSTS4_COLLS-all_reduce all_gather reduce_scatter broadcast}
do_hosts4() {
  local c h
  [ "$(nvidia-smi -L | wc -l)" -ge 4 ] || { echo "FAIL: the stage needs 4 GPUs"; return 1; }
  for c in $HOSTS4_COLLS; do
    for h in all one; do
      echo "--- hosts4 $c HETCCL_PLANE_HOSTS=$h"
      HETCCL_ISLANDS=0,0,1,1 HETCCL_PLANE_HOSTS=$h $PY -m hetccl run -n 2 -- sh -c \
        'if [ "$HETCCL_LAUNCH_RANK" = 1 ]; then exec unshare --ipc "$@"; fi; exec "$@"' sh \
        build-dev/tools/perf/hetccl-perf "$c" --mem_type cuda -g 2 -c 1 -n 8 -w 2 -b 1M -e 256M -f 4 ||
        echo "FAIL: $c $h"
    done
  done
  ! grep -q "^FAIL" "$OUT/26-hosts4.log"
}
do_hosts() {
  local c again
  for c in $HOSTS_COLLS; do
    for again in "" " again"; do
      hosts_perf "hosts $c plane$again" "$c" cuda HETCCL_PLANE_HOSTS=all || echo "FAIL: $c plane"
      hosts_perf "hosts $c staged$again" "$c" cuda HETCCL_PLANE_HOSTS=one || echo "FAIL: $c staged"
    done
    hosts_perf "hosts $c host memory" "$c" host || echo "FAIL: $c host"
  done
  ! grep -q "^FAIL" "$OUT/25-hosts.log"
}
halves() { $PY -c "print(','.join(str(2 * i // $1) for i in range($1)))"; }
# ntg_turns COLL ISLANDS NAME VAR=VALUE: COLL on hetccl with ISLANDS as it
# is and with VAR=VALUE (NAME), twice each in turns, then on NCCL alone
ntg_turns() {
  local c=$1 isl=$2 name=$3 var=$4 again
  for again in "" " again"; do
    ntg "hetccl $c$again ($isl)" "$c" LD_PRELOAD="$LIB" HETCCL_ISLANDS="$isl" || echo "FAIL: $c"
    ntg "hetccl $c $name$again ($isl)" "$c" LD_PRELOAD="$LIB" HETCCL_ISLANDS="$isl" "$var" ||
      echo "FAIL: $c $name"
  done
  ntg "nccl $c" "$c" || echo "FAIL: nccl $c"
}
do_a2a() {
  local c isl
  isl=$(halves "$(nvidia-smi -L | wc -l)")
  for c in ${A2A_COLLS-alltoall}; do ntg_turns "$c" "$isl" "HETCCL_HIER=0" HETCCL_HIER=0; done
  ! grep -q "^FAIL" "$OUT/24-a2a.log"
}
do_near() {
  # shellcheck disable=SC2046
  build-dev/tests/c/transport/test_ib_near $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader)
}
do_hier() {
  local n halves flat c
  n=$(nvidia-smi -L | wc -l)
  [ "$n" -ge 4 ] || { echo "FAIL: $n GPUs, the stage needs 4 or more"; return 1; }
  halves=$(halves "$n")
  flat=$($PY -c "print(','.join(str(i) for i in range($n)))")
  if [ "${HIER_AR-1}" = 1 ]; then
    ntg "hetccl all_reduce rails ($halves)" all_reduce LD_PRELOAD=$LIB HETCCL_ISLANDS=$halves || echo "FAIL: rails"
    ntg "hetccl all_reduce leaders ($halves)" all_reduce LD_PRELOAD=$LIB HETCCL_ISLANDS=$halves HETCCL_HIER_RAILS=0 || echo "FAIL: leaders"
    ntg "hetccl all_reduce flat ($flat)" all_reduce LD_PRELOAD=$LIB HETCCL_ISLANDS=$flat || echo "FAIL: flat"
    ntg "nccl all_reduce" all_reduce || echo "FAIL: nccl"
    ntg "nccl NCCL_P2P_DISABLE=1 all_reduce" all_reduce NCCL_P2P_DISABLE=1 || echo "FAIL: nccl-shm"
    ntg "hetccl all_reduce rails again ($halves)" all_reduce LD_PRELOAD=$LIB HETCCL_ISLANDS=$halves || echo "FAIL: rails"
    ntg "hetccl all_reduce leaders again ($halves)" all_reduce LD_PRELOAD=$LIB HETCCL_ISLANDS=$halves HETCCL_HIER_RAILS=0 || echo "FAIL: leaders"
  fi
  for c in ${HIER_COLLS-all_gather reduce_scatter broadcast}; do
    ntg_turns "$c" "$halves" leaders HETCCL_HIER_RAILS=0
  done
  if [ "${HIER_AR-1}" = 1 ]; then
    echo "--- a process per GPU: hetccl-perf all_reduce, rails ($halves)"
    HETCCL_ISLANDS=$halves $PY -m hetccl run -n "$n" -- build-dev/tools/perf/hetccl-perf all_reduce \
      --mem_type cuda -c 1 -n 20 -w 5 -b 16M -e 1G -f 4 || echo "FAIL: per process"
  fi
  ! grep -q "^FAIL" "$OUT/21-hier.log"
}
do_memop() { $PY tools/device/memop_gap.py --peer 1 --watchdog 180 ${MEMOP_ARGS-}; }
do_cupy() { $PY tools/device/cupy_api_check.py --ranks 2; }
do_torch3() {
  $PY tools/device/torch_backend_check.py --devices cuda:0,cuda:1,cpu --json "$OUT/torch3.json"
}
do_torch3trace() {
  T_TRACE=1 $PY tools/device/torch_backend_check.py --devices cuda:0,cuda:1,cpu --steps 5
}
do_torch3san() { # only where torch3trace ran and failed
  grep -q "FAIL torch3trace" "$OUT/summary.txt" || { echo "torch3trace did not fail: skipped"; return 0; }
  $PY tools/device/torch_backend_check.py --devices cuda:0,cuda:1,cpu --parts collectives \
    --sanitize 0 --timeout 180
}
# PYTEST_FILES: the test files (default tests/test_cuda_engine.py; the GPU
# programs: PYTEST_FILES=tests/test_programs.py PYTEST_K=cuda);
# PYTEST_K: a pytest -k expression (default: all but the bandwidth reports);
# PYTEST_ENV: VAR=VALUE[,VAR=VALUE] for its ranks (e.g. HETCCL_PLANE_WIDE_MIN=1M);
# PYTEST_ARGS: more pytest arguments (-s: the bandwidth reports' figures)
# PYTEST_LIMIT: the stage's bound in seconds (default 240)
PYTEST_K=${PYTEST_K-not bandwidth}
PYTEST_FILES=${PYTEST_FILES-tests/test_cuda_engine.py}
do_pytest() {
  local vars=${PYTEST_ENV-}
  env ${vars//,/ } $PY -m pytest -q $PYTEST_FILES -p no:cacheprovider -rs -k "$PYTEST_K" \
    ${PYTEST_ARGS-}
}
# TRAIN_VARIANTS: space-separated NAME:VAR=VALUE[,VAR=VALUE] for train_bench's --variant;
# TRAIN_ARGS: more of its arguments (e.g. "--alternate 2").
TRAIN_VARIANTS=${TRAIN_VARIANTS-mapped:HETCCL_PLANE_REDUCE_READ=mapped maxconn:CUDA_DEVICE_MAX_CONNECTIONS=32}
do_train() {
  local v args=()
  for v in $TRAIN_VARIANTS; do args+=(--variant "$v"); done
  $PY tools/device/train_bench.py "$OUT/train.json" "${args[@]}" ${TRAIN_ARGS-}
}

export ROOT OUT PY LIB REAL_NCCL NT NTM MPICH COLLS HIER_COLLS A2A_COLLS HIER_AR TRAIN_VARIANTS TRAIN_ARGS NT_VARIANTS NT_VARIANT_MIN NT_VARIANT_FACTOR NT_VARIANT_COLLS PERF_COLLS HOSTS_COLLS HOSTS4_COLLS PYTEST_K PYTEST_FILES PYTEST_ENV PYTEST_ARGS MEMOP_ARGS
export -f note bounded halves ntg_turns nt nt_table nt_make mpi_home ntm do_ntmpibuild do_ntmpi do_profile do_host do_build do_ntbuild do_limit do_nt do_perf do_train do_big do_readpath \
  do_variants do_numa ntg do_hier do_near do_p2p do_hosts do_hosts4 hosts_perf do_a2a do_memop do_cupy do_torch3 do_torch3trace do_torch3san do_pytest
export PYTHONPATH=$ROOT/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
STAGES=${STAGES:-ntbuild limit nt pytest train variants perf big readpath cupy torch3}
stage 01 build 240 do_build
if [ -f "$LIB" ]; then
  want ntbuild && stage 02 ntbuild 150 do_ntbuild
  want ntmpibuild && stage 19 ntmpibuild 150 do_ntmpibuild
  want limit && stage 03 limit 40 do_limit
  want ntmpi && stage 18 ntmpi 240 do_ntmpi
  want nt && stage 04 nt 200 do_nt
  want pytest && stage 12 pytest "${PYTEST_LIMIT:-240}" do_pytest
  want train && stage 06 train 420 do_train
  want perf && stage 05 perf 120 do_perf
  want big && stage 07 big 150 do_big
  want readpath && stage 08 readpath 90 do_readpath
  want variants && stage 09 variants 300 do_variants
  want host && stage 13 host 20 do_host
  want profile && stage 14 profile 150 do_profile
  want memop && stage 15 memop 200 do_memop
  want numa && stage 20 numa 120 do_numa
  want near && stage 22 near 20 do_near
  want hosts && stage 25 hosts 500 do_hosts
  want hosts4 && stage 26 hosts4 420 do_hosts4
  want p2p && stage 23 p2p 240 do_p2p
  want a2a && stage 24 a2a 300 do_a2a
  want hier && stage 21 hier 540 do_hier
  want cupy && stage 10 cupy 120 do_cupy
  want torch3 && stage 11 torch3 180 do_torch3
  want torch3trace && stage 16 torch3trace 180 do_torch3trace
  want torch3san && stage 17 torch3san 200 do_torch3san
fi
note "overall: $([ $STATUS -eq 0 ] && echo PASS || echo FAIL)"
exit $STATUS
