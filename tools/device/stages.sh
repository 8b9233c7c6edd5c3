# Sourced by the device scripts (run.sh, plane_run.sh): a summary line per
# stage in $OUT/summary.txt and a log per stage in $OUT. Needs OUT set;
# sets STATUS=1 when a stage fails.
STATUS=0
: >"$OUT/summary.txt"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# stage NUMBER NAME TIMEOUT_S FUNCTION: run FUNCTION with its output in the
# stage's log, under a time limit (timeout signals the whole process group,
# spawned ranks included), and record PASS/FAIL.
stage() {
  local num=$1 name=$2 limit=$3 fn=$4 log="$OUT/$1-$2.log" t0=$SECONDS rc
  echo "== stage $name (limit ${limit}s)" >"$log"
  timeout -k 15 "$limit" bash -c "$fn" >>"$log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "FAIL: timed out after ${limit}s" >>"$log"
  if [ $rc -eq 0 ]; then
    note "PASS $name ($((SECONDS - t0)) s)"
  else
    STATUS=1
    note "FAIL $name (rc $rc, $((SECONDS - t0)) s): $(grep -E 'FAIL|Error' "$log" | tail -1 | cut -c1-200)"
  fi
}

# want NAME: is NAME among $STAGES (space-separated)?
want() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

# bounded PID LIMIT_S LOG: wait up to LIMIT_S for PID; if it is still
# running, print every thread's name, state and kernel wait point, the
# GPUs' load and LOG's last lines, kill it and return 1.
bounded() {
  local pid=$1 limit=$2 log=$3 t=0
  while kill -0 "$pid" 2>/dev/null && [ $t -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
  if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; local rc=$?; echo "finished in ${t} s, status $rc"; return $rc; fi
  echo "still running after ${t} s: threads (name state wait point)"
  for task in /proc/"$pid"/task/*; do
    echo "$(cat "$task"/comm) $(awk '{print $3}' "$task"/stat) $(cat "$task"/wchan 2>/dev/null)"
  done
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv 2>/dev/null
  kill -9 "$pid"
  echo "--- last log lines"; tail -60 "$log"
  return 1
}

# do_build: the wheels the machine lacks (.whl, into /tmp/site), then
# libhetccl, hetccl-perf and the C tests into build-dev (release). Needs PY.
do_build() {
  set -e
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  fi
  [ -d build-dev ] || meson setup build-dev --buildtype=release -Dtests=true
  ninja -C build-dev
  nvidia-smi -L
}
