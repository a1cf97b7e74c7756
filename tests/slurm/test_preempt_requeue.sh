#!/usr/bin/env bash
# Preemption on a real (private, single-node) Slurm: SIGUSR1 to the batch shell mid-run, as
# `#SBATCH --signal=B:USR1@120` sends it, must make Relay checkpoint and exit 75, the job requeue
# itself and resume from `latest`, and the resumed run finish with every step in metrics.jsonl once
# and the same losses, bit for bit, as an uninterrupted run of the same config and layout.
# Under srun --mpi=pmix and under mpirun.
#   bash tests/slurm/test_preempt_requeue.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
# RELAY_TEST_PREEMPT_STEPS (default 10000) and RELAY_TEST_PREEMPT_HIDDEN (4096) set the run's length.
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"

slurm_start
make_data "$WORK_DIR/data"
steps=${RELAY_TEST_PREEMPT_STEPS:-10000}
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" "${RELAY_TEST_PREEMPT_HIDDEN:-4096}"

# submit LAUNCHER NAME: sbatch relay-cpu.sbatch; sets JOB, RUN_DIR and OUT.
submit() {
  RUN_DIR=$WORK_DIR/run-$2 OUT=$WORK_DIR/$2.out
  # RELAY_BIND=none: the node claims 8 CPUs on 2 cores, and Open MPI will not bind 4 ranks to 2 cores.
  JOB=$(RELAY_BIN=$RELAY RELAY_LAUNCHER=$1 RELAY_BIND=none \
        slurm_submit --ntasks=4 --time=30 --output="$OUT" "$REPO_ROOT/jobscripts/relay-cpu.sbatch" \
        "$WORK_DIR/test.toml" --set run.dir="$RUN_DIR" --set train.steps="$steps" \
        --set checkpoint.every=$((steps / 4))) || fail "sbatch failed"
}
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# The reference: the same config, launcher srun, no signal.
submit srun reference
t=$(date +%s.%N)
wait_job_done "$JOB" 600
[[ $JOB_STATE == COMPLETED && $(job_field "$JOB" Restarts) == 0 ]] || { show "$OUT"; fail "reference job $JOB ended $JOB_STATE"; }
check_train_steps "$RUN_DIR" "$steps"
log "reference run: $steps steps in $(seconds_since "$t") s (job $JOB)"

for launcher in srun mpirun; do
  submit "$launcher" "preempted-$launcher"
  # Signal once a third of the steps are logged: Relay is up, its handlers installed, far from done.
  _third_done() { (( $(metrics_steps "$RUN_DIR") >= steps / 3 )) || ! [[ $(job_field "$JOB" JobState) =~ ^(PENDING|RUNNING)$ ]]; }
  wait_until 300 _third_done || { show "$OUT"; fail "$launcher: job $JOB logged $(metrics_steps "$RUN_DIR") steps in 300 s"; }
  [[ $(job_field "$JOB" JobState) == RUNNING ]] || { show "$OUT"; fail "$launcher: job $JOB ended before the signal"; }
  # --batch: only the batch shell, exactly what --signal=B:USR1@120 does.
  scancel --batch --signal=USR1 "$JOB" || fail "scancel --batch --signal=USR1 $JOB failed"
  t_signal=$(date +%s.%N)
  _requeued() { [[ $(job_field "$JOB" Restarts) -ge 1 || $(job_field "$JOB" JobState) =~ ^(COMPLETED|FAILED|CANCELLED)$ ]]; }
  wait_until 120 _requeued || { show "$OUT"; fail "$launcher: job $JOB neither requeued nor ended within 120 s of SIGUSR1"; }
  (( $(job_field "$JOB" Restarts) >= 1 )) \
    || { show "$OUT"; fail "$launcher: job $JOB was not requeued (state $(job_field "$JOB" JobState); did the run finish before the signal? raise RELAY_TEST_PREEMPT_STEPS)"; }
  stop_s=$(seconds_since "$t_signal") t_requeued=$(date +%s.%N)
  wait_job_state "$JOB" 300 RUNNING || { show "$OUT"; fail "$launcher: requeued job $JOB did not start again within 300 s"; }
  log "$launcher: signal -> checkpoint, exit 75, requeue: $stop_s s; requeue -> running again: $(seconds_since "$t_requeued") s"
  wait_job_done "$JOB" 600
  log "$launcher: job $JOB $JOB_STATE, exit code $(job_field "$JOB" ExitCode), restarts $(job_field "$JOB" Restarts)"

  [[ $JOB_STATE == COMPLETED && $(job_field "$JOB" ExitCode) == 0:0 ]] || { show "$OUT"; fail "$launcher: job $JOB ended $JOB_STATE"; }
  [[ $(job_field "$JOB" Restarts) == 1 ]] || { show "$OUT"; fail "$launcher: job $JOB restarted $(job_field "$JOB" Restarts) times, expected 1"; }
  [[ $(grep -c 'SIGUSR1: asking the ranks to checkpoint' "$OUT") == 1 ]] || { show "$OUT"; fail "$launcher: the batch script did not take SIGUSR1 exactly once"; }
  grep -q 'stopped early with a checkpoint (exit 75); requeueing' "$OUT" || { show "$OUT"; fail "$launcher: no exit 75 and requeue in the job output"; }
  # Relay's "resumed from .../step_<K>.h5 at step K": the second run started where the first stopped.
  resumed=$(grep -Eo 'resumed from [^ ]*step_[0-9]+\.h5 at step [0-9]+' "$OUT" | head -n 1)
  [[ $resumed =~ step_0*([0-9]+)\.h5\ at\ step\ ([0-9]+)$ ]] || { show "$OUT"; fail "$launcher: the requeued run did not resume from a checkpoint"; }
  k=${BASH_REMATCH[2]}
  (( BASH_REMATCH[1] == k && k >= steps / 3 && k < steps )) || { show "$OUT"; fail "$launcher: resumed at step $k, expected in [$((steps / 3)), $steps)"; }
  grep -Eq "stopping at step $k on signal 10\b" "$OUT" || { show "$OUT"; fail "$launcher: Relay did not report stopping at step $k on SIGUSR1"; }
  [[ -s $RUN_DIR/checkpoints/$(printf 'step_%08d.h5' "$k") ]] || fail "$launcher: the stop checkpoint of step $k is missing"
  log "$launcher: stopped at step $k of $steps, resumed there"
  check_train_steps "$RUN_DIR" "$steps"
  check_final_checkpoint "$RUN_DIR" "$steps"
  same_losses "$WORK_DIR/run-reference" "$RUN_DIR"
done
log "PASS: SIGUSR1 -> checkpoint -> exit 75 -> requeue -> resume -> same losses, under srun and mpirun"
