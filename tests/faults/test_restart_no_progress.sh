#!/usr/bin/env bash
# A fault that repeats at the same step (RELAY_TEST_KILL_RANK/STEP: rank 1 kills itself as step 120
# begins, in every run) under `relay-mpirun.sh --restarts 3`: restart 1 dies at the same step from the
# same checkpoint, so restart 2 stops at once with exit code 76 and one line saying why; no third
# restart, no loop, and metrics.jsonl is left as the last run wrote it (steps 1-119). Errors are not
# restarted: a config mistake (exit 1) ends at once, with no restart.
source "$(dirname "$0")/lib.sh" "$1"
MPIRUN_SH=$(dirname "$0")/../../jobscripts/relay-mpirun.sh
export RELAY_BIN=$RELAY

RELAY_TEST_KILL_RANK=1 RELAY_TEST_KILL_STEP=120 "$MPIRUN_SH" -n 4 --threads 1 --bind none --restarts 3 -- \
  train --config "$WORK/config.toml" --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1 &
JOB=$!; fault_now
expect_end_within 180
[ "$RC" -eq 76 ] || { grep -v '^step' "$WORK/run.log" | tail -30; fail "exit code $RC, expected 76"; }
[ "$(grep -c 'relay-mpirun.sh: restart' "$WORK/run.log")" -eq 2 ] || fail "expected exactly 2 restarts: $(grep 'relay-mpirun.sh: restart' "$WORK/run.log")"
expect_in_output "error: restart 2 would repeat restart 1: that run failed (a rank was lost: exit 137, SIGKILL) after logging step 119, no further than the run before it (step 119), and the newest checkpoint is still step 100; stopping with exit code 76"
[ "$(grep -c 'error:' "$WORK/run.log")" -eq 1 ] || fail "not exactly one error line: $(grep 'error:' "$WORK/run.log")"
expect_in_output "relay-mpirun.sh: relay exit 76"
python3 -c "
import json, sys
steps = [json.loads(l)['step'] for l in open(sys.argv[1]) if '\"loss\"' in l]
sys.exit(steps != list(range(1, 120)))" "$WORK/run/metrics.jsonl" || fail "metrics.jsonl does not hold steps 1-119 once each"
echo "repeating fault: 2 restarts, then exit 76 in ${ENDED} s"

# A config error (an unknown key) exits 1 and is not restarted.
"$MPIRUN_SH" -n 4 --threads 1 --bind none --restarts 3 -- train --config "$WORK/config.toml" \
  --set "run.dir=\"$WORK/bad\"" --set train.no_such_key=1 > "$WORK/bad.log" 2>&1; rc=$?
[ "$rc" -eq 1 ] || { tail -20 "$WORK/bad.log"; fail "config error: exit code $rc, expected 1"; }
grep -q 'no_such_key' "$WORK/bad.log" || fail "config error: the message does not name the key"
! grep -q 'relay-mpirun.sh: restart' "$WORK/bad.log" || fail "a config error was restarted"
pass "a fault repeating at step 120 ends with exit 76 after 2 restarts; a config error is not restarted"
