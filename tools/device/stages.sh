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
