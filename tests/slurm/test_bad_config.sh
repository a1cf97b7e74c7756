#!/usr/bin/env bash
# A job whose config is wrong must fail once, with Relay's error in its output, and not be requeued:
# only exit code 75 (stopped early, resumable) requeues. Two mistakes: a value out of range
# (train.steps = -1) and a key Relay does not know (train.stepz).
#   bash tests/slurm/test_bad_config.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"

slurm_start
make_data "$WORK_DIR/data"
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" 64

n=0
for bad in train.steps=-1 train.stepz=5; do
  key=${bad%%=*} out=$WORK_DIR/bad-$((++n)).out
  id=$(RELAY_BIN=$RELAY slurm_submit --ntasks=4 --time=10 --output="$out" "$REPO_ROOT/jobscripts/relay-cpu.sbatch" \
       "$WORK_DIR/test.toml" --set run.dir="$WORK_DIR/run-$n" --set "$bad") || fail "sbatch failed"
  wait_job_done "$id" 120
  log "--set $bad: job $id $JOB_STATE, exit code $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts)"
  [[ $JOB_STATE == FAILED ]] || { show "$out"; fail "--set $bad: job $id ended $JOB_STATE, expected FAILED"; }
  [[ $(job_field "$id" ExitCode) == 1:0 ]] || { show "$out"; fail "--set $bad: exit code $(job_field "$id" ExitCode), expected Relay's 1:0"; }
  [[ $(job_field "$id" Restarts) == 0 ]] || { show "$out"; fail "--set $bad: the failed job was requeued"; }
  # Relay prints a user mistake once, from one rank, naming the key.
  errors=$(grep -Ec "^\[rank [0-9]+\] error: .*${key//./\\.}" "$out")
  [[ $errors == 1 ]] || { show "$out"; fail "--set $bad: expected Relay's error naming $key once in the job output, found it $errors times"; }
  [[ $(grep -c 'relay-cpu.sbatch: job .* restart 0 of' "$out") == 1 ]] || { show "$out"; fail "--set $bad: the job ran more than once"; }
  grep -q 'relay failed (exit 1); not requeued' "$out" || { show "$out"; fail "--set $bad: the script did not report the failure"; }
done
log "PASS: bad configs fail once with Relay's error and are not requeued"
