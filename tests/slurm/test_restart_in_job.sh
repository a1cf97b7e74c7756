#!/usr/bin/env bash
# In-job restarts on a real (private, single-node) Slurm, through relay-cpu.sbatch:
#  1. kill -9 of one rank mid-run, under srun and under mpirun: the batch script starts the run again
#     inside the same allocation (RELAY_RESTARTS defaults to 2) from the newest checkpoint; the job
#     COMPLETES with exit 0, is not requeued, and its losses equal an uninterrupted job's bit for bit.
#     Prints the jobs' seconds.
#  2. a fault that repeats at one step (RELAY_TEST_KILL_RANK/STEP) ends the job FAILED with exit 76
#     after 2 in-job restarts, and the job is not requeued.
#   bash tests/slurm/test_restart_in_job.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"

slurm_start
make_data "$WORK_DIR/data"
steps=${RELAY_TEST_RESTART_STEPS:-600}
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" "${RELAY_TEST_RESTART_HIDDEN:-1024}"

# submit NAME [VAR=VALUE ...]: sbatch relay-cpu.sbatch (srun unless RELAY_LAUNCHER=mpirun is among
# the variables); sets JOB, RUN_DIR, OUT.
submit() {
  local name=$1; shift
  RUN_DIR=$WORK_DIR/run-$name OUT=$WORK_DIR/$name.out
  JOB=$(export RELAY_BIN="$RELAY" RELAY_LAUNCHER=srun RELAY_BIND=none "$@"
        slurm_submit --ntasks=4 --time=30 --output="$OUT" "$REPO_ROOT/jobscripts/relay-cpu.sbatch" \
        "$WORK_DIR/test.toml" --set run.dir="$RUN_DIR" --set train.steps="$steps" \
        --set checkpoint.every=$((steps / 6)) --set parallel.timeout='"5s"') || fail "sbatch failed"
}
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# rank_pid R: the pid of task R of the job whose run directory is $RUN_DIR.
rank_pid() {
  local p
  for p in $(pgrep -x relay); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -Eqx "(SLURM_PROCID|OMPI_COMM_WORLD_RANK)=$1" &&
      tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "run.dir=$RUN_DIR " && { echo "$p"; return 0; }
  done
  return 1
}

# The reference: the same config, no fault.
submit reference
t=$(date +%s.%N)
wait_job_done "$JOB" 600
[[ $JOB_STATE == COMPLETED ]] || { show "$OUT"; fail "reference job $JOB ended $JOB_STATE"; }
t_ref=$(seconds_since "$t")
log "reference run: $steps steps in $t_ref s (job $JOB)"

# 1. kill -9 of rank 3 once a third of the steps are logged.
# Rank 0 sleeps 4 ms in every forward (RELAY_TEST_SLOW_*; losses unchanged) so that the run lasts seconds,
# not the ~1 s in which an idle machine can finish all of it before the victim's pid is found.
for launcher in srun mpirun; do
  submit "killed-$launcher" RELAY_LAUNCHER=$launcher RELAY_TEST_SLOW_RANK=0 RELAY_TEST_SLOW_MS=4
  t=$(date +%s.%N)
  _third_done() { (( $(metrics_steps "$RUN_DIR") >= steps / 3 )) || ! [[ $(job_field "$JOB" JobState) =~ ^(PENDING|RUNNING)$ ]]; }
  wait_until 300 _third_done || { show "$OUT"; fail "job $JOB logged $(metrics_steps "$RUN_DIR") steps in 300 s"; }
  victim=$(rank_pid 3) || { show "$OUT"; fail "no process for task 3 of job $JOB"; }
  kill -KILL "$victim"
  t_kill=$(date +%s.%N)
  wait_job_done "$JOB" 600
  t_killed=$(seconds_since "$t")
  log "$launcher: killed job $JOB: $JOB_STATE, exit code $(job_field "$JOB" ExitCode), requeues $(job_field "$JOB" Restarts); kill -> end $(seconds_since "$t_kill") s"
  [[ $JOB_STATE == COMPLETED && $(job_field "$JOB" ExitCode) == 0:0 ]] || { show "$OUT"; fail "job $JOB ended $JOB_STATE"; }
  [[ $(job_field "$JOB" Restarts) == 0 ]] || { show "$OUT"; fail "job $JOB was requeued; the restart should stay in the allocation"; }
  grep -q 'in-job restart 1 of 2: a rank was lost: exit [0-9]*, SIG' "$OUT" || { show "$OUT"; fail "no in-job restart in the job output"; }
  [[ $(grep -c 'in-job restart [0-9]* of ' "$OUT") == 1 ]] || { show "$OUT"; fail "not exactly one in-job restart"; }
  grep -q '"restart": *1\|"restart":1' "$RUN_DIR/metrics.jsonl" || fail "metrics.jsonl holds no restart record"
  log "$(grep -o 'in-job restart 1 of 2: [^;]*' "$OUT")"
  check_train_steps "$RUN_DIR" "$steps"
  check_final_checkpoint "$RUN_DIR" "$steps"
  same_losses "$WORK_DIR/run-reference" "$RUN_DIR"
  log "$launcher: timings: uninterrupted job ${t_ref} s; killed + restarted job ${t_killed} s"
done

# 2. A fault at the same step in every run: exit 76 after 2 restarts, not requeued.
submit repeating RELAY_TEST_KILL_RANK=1 RELAY_TEST_KILL_STEP=$((steps / 3 + 5))
wait_job_done "$JOB" 600
log "repeating fault: job $JOB $JOB_STATE, exit code $(job_field "$JOB" ExitCode), requeues $(job_field "$JOB" Restarts)"
[[ $JOB_STATE == FAILED && $(job_field "$JOB" ExitCode) == 76:0 ]] || { show "$OUT"; fail "job $JOB ended $JOB_STATE $(job_field "$JOB" ExitCode), expected FAILED 76:0"; }
[[ $(job_field "$JOB" Restarts) == 0 ]] || { show "$OUT"; fail "job $JOB was requeued after exit 76"; }
[[ $(grep -c 'in-job restart [0-9]* of ' "$OUT") == 2 ]] || { show "$OUT"; fail "expected 2 in-job restarts"; }
grep -q 'error: restart 2 would repeat restart 1' "$OUT" || { show "$OUT"; fail "Relay did not say why it stopped"; }
grep -q '(exit 76); not requeued' "$OUT" || { show "$OUT"; fail "the batch script did not say it does not requeue"; }
log "PASS: kill -9 -> in-job restart -> same losses; a repeating fault -> exit 76, not requeued"
