#!/usr/bin/env bash
# In-job restart: kill -9 of one rank mid-run under `relay-mpirun.sh --restarts 2` starts the run again
# from its newest checkpoint, in the same command; it finishes with exit 0, metrics.jsonl holds every
# step once with the uninterrupted run's losses bit for bit, and the restart is recorded with its cause.
# Prints the seconds of the uninterrupted and of the interrupted + restarted run. Then the same for a
# stalled rank (SIGSTOP: the watchdog ends the run with exit 74, which is restarted too).
source "$(dirname "$0")/lib.sh" "$1"
MPIRUN_SH=$(dirname "$0")/../../jobscripts/relay-mpirun.sh
t0=$(date +%s.%N); reference; t_ref=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $t0))")

RELAY_BIN=$RELAY "$MPIRUN_SH" -n 4 --threads 1 --bind none --restarts 2 -- train --config "$WORK/config.toml" \
  --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1 &
JOB=$!
T_START=$(date +%s.%N)
wait_steps 120
kill -KILL "$(rank_pid 3)"; fault_now
expect_end_within 240
t_run=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_START))")
[ "$RC" -eq 0 ] || { grep -v '^step' "$WORK/run.log" | tail -30; fail "exit code $RC, expected 0 after a restart"; }
expect_in_output "relay-mpirun.sh: restart 1 of 2: a rank was lost: exit 137, SIGKILL; starting again from the newest checkpoint"
[ "$(grep -c 'relay-mpirun.sh: restart' "$WORK/run.log")" -eq 1 ] || fail "not exactly one restart: $(grep 'relay-mpirun.sh: restart' "$WORK/run.log")"
python3 - "$WORK/run/metrics.jsonl" "$STEPS" <<'PY' || fail "metrics.jsonl: steps or the restart record are wrong"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step"] for r in recs if "loss" in r]
assert steps == list(range(1, int(sys.argv[2]) + 1)), f"training steps are not 1..{sys.argv[2]} once each"
restarts = [r for r in recs if "restart" in r]
assert len(restarts) == 1 and restarts[0]["restart"] == 1 and "SIGKILL" in restarts[0]["cause"], restarts
k = restarts[0]["step"]
assert k % 50 == 0 and 0 < k <= restarts[0]["failed_after_step"], restarts[0]
assert all(r.get("restarts", 0) == (1 if r["step"] > k else 0) for r in recs if "loss" in r), "restarts count"
print(f"restart 1 resumed at step {k} after the killed run had logged step {restarts[0]['failed_after_step']}")
PY
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "the restarted run's losses differ from the uninterrupted run's"
echo "timings: uninterrupted run ${t_ref} s; interrupted + restarted run ${t_run} s (the job ended ${ENDED} s after the kill)"

# A stalled rank: SIGSTOP; the watchdog (parallel.timeout = 3 s) ends the run with 74; restarted.
rm -rf "$WORK/run"
RELAY_BIN=$RELAY "$MPIRUN_SH" -n 4 --threads 1 --bind none --restarts 2 -- train --config "$WORK/config.toml" \
  --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1 &
JOB=$!
T_START=$(date +%s.%N)
wait_steps 120
kill -STOP "$(rank_pid 2)"; fault_now
expect_end_within 240
t_stall=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_START))")
[ "$RC" -eq 0 ] || { grep -v '^step' "$WORK/run.log" | tail -30; fail "stalled rank: exit code $RC, expected 0 after a restart"; }
expect_in_output "relay-mpirun.sh: restart 1 of 2: a rank stalled: the progress watchdog ended the run, exit 74"
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "stalled rank: the restarted run's losses differ from the uninterrupted run's"
echo "timings: stalled + restarted run ${t_stall} s"
pass "kill -9 of rank 3 and SIGSTOP of rank 2 under --restarts 2: restarted, all $STEPS losses equal to the uninterrupted run's"
