#!/usr/bin/env bash
# Preemption on a real (private, single-node) Slurm: SIGUSR1 to the batch shell mid-run, as
# `#SBATCH --signal=B:USR1@120` sends it, must make Relay checkpoint and exit 75, the job requeue
# itself and resume from `latest`, and the resumed run finish with every step in metrics.jsonl once
# and the same losses, bit for bit, as an uninterrupted run of the same config and layout.
# Under srun --mpi=pmix and under mpirun.
# The three jobs (the uninterrupted reference, the srun one and the mpirun one) run at the same time,
# so that one job's requeue (its credential's 5 s expiry, then scheduling) overlaps the others' steps.
#   bash tests/slurm/test_preempt_requeue.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
# RELAY_TEST_PREEMPT_STEPS (default 10000) and RELAY_TEST_PREEMPT_HIDDEN (4096) set the run's length:
# each job is signalled once it has logged 100 steps (steps/30 for shorter runs), far from done. The
# signal's way (scancel -> slurmctld -> slurmd -> the batch shell's trap -> the launcher -> every rank)
# took 0.5-1.2 s on an idle 2-core machine but ~6.5 s in a CI run with the three jobs' 12 ranks busy:
# with 3000 steps the srun job there finished its last ~2900 steps (6.6 s) before USR1 reached it.
# 10000 steps leave ~3x that delay after the signal at CI's fastest rate.
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"

slurm_start 12  # three jobs of four tasks side by side
make_data "$WORK_DIR/data"
steps=${RELAY_TEST_PREEMPT_STEPS:-10000}
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" "${RELAY_TEST_PREEMPT_HIDDEN:-4096}"

# submit LAUNCHER NAME: sbatch relay-cpu.sbatch; sets JOB[NAME], RUN_DIR[NAME] and OUT[NAME].
declare -A JOB RUN_DIR OUT T_SIGNAL SIG_AT
submit() {
  RUN_DIR[$2]=$WORK_DIR/run-$2 OUT[$2]=$WORK_DIR/$2.out
  # RELAY_BIND=none: the node claims 12 CPUs on 2 cores, and Open MPI will not bind 4 ranks to 2 cores.
  JOB[$2]=$(RELAY_BIN=$RELAY RELAY_LAUNCHER=$1 RELAY_BIND=none \
        slurm_submit --ntasks=4 --time=30 --output="${OUT[$2]}" "$REPO_ROOT/jobscripts/relay-cpu.sbatch" \
        "$WORK_DIR/test.toml" --set run.dir="${RUN_DIR[$2]}" --set train.steps="$steps" \
        --set checkpoint.every=$((steps / 4))) || fail "sbatch failed"
}
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# The reference: the same config, launcher srun, no signal. Beside it, the two jobs to preempt.
t=$(date +%s.%N)
submit srun reference
for launcher in srun mpirun; do submit "$launcher" "$launcher"; done

# Signal each job once 100 of its steps are logged (steps/30 if fewer): Relay is up, its handlers installed, far
# from done.
first=$(( steps / 30 < 1 ? 1 : steps / 30 < 100 ? steps / 30 : 100 ))
_signal_at_third() {
  local l done=0
  for l in srun mpirun; do
    [[ -n ${T_SIGNAL[$l]:-} ]] && { done=$((done + 1)); continue; }
    local n; n=$(metrics_steps "${RUN_DIR[$l]}")
    if (( n >= first )); then
      [[ $(job_field "${JOB[$l]}" JobState) == RUNNING ]] || { show "${OUT[$l]}"; fail "$l: job ${JOB[$l]} ended before the signal"; }
      # --batch: only the batch shell, exactly what --signal=B:USR1@120 does.
      scancel --batch --signal=USR1 "${JOB[$l]}" || fail "scancel --batch --signal=USR1 ${JOB[$l]} failed"
      T_SIGNAL[$l]=$(date +%s.%N) SIG_AT[$l]=$n done=$((done + 1))
    elif ! [[ $(job_field "${JOB[$l]}" JobState) =~ ^(PENDING|RUNNING)$ ]]; then
      show "${OUT[$l]}"; fail "$l: job ${JOB[$l]} ended before the signal"
    fi
  done
  (( done == 2 ))
}
wait_until 300 _signal_at_third \
  || { for l in srun mpirun; do show "${OUT[$l]}"; done; fail "a job did not log $first steps in 300 s"; }

for launcher in srun mpirun; do
  id=${JOB[$launcher]} out=${OUT[$launcher]}
  _requeued() { [[ $(job_field "$id" Restarts) -ge 1 || $(job_field "$id" JobState) =~ ^(COMPLETED|FAILED|CANCELLED)$ ]]; }
  wait_until 120 _requeued || { show "$out"; fail "$launcher: job $id neither requeued nor ended within 120 s of SIGUSR1"; }
  (( $(job_field "$id" Restarts) >= 1 )) \
    || { show "$out"; fail "$launcher: job $id was not requeued (state $(job_field "$id" JobState); did the run finish before the signal? raise RELAY_TEST_PREEMPT_STEPS)"; }
  log "$launcher: signal -> checkpoint, exit 75, requeue: within $(seconds_since "${T_SIGNAL[$launcher]}") s"
done

wait_job_done "${JOB[reference]}" 600
[[ $JOB_STATE == COMPLETED && $(job_field "${JOB[reference]}" Restarts) == 0 ]] \
  || { show "${OUT[reference]}"; fail "reference job ${JOB[reference]} ended $JOB_STATE"; }
check_train_steps "${RUN_DIR[reference]}" "$steps"
log "reference run: $steps steps in $(seconds_since "$t") s (job ${JOB[reference]}), beside the other two"

for launcher in srun mpirun; do
  id=${JOB[$launcher]} out=${OUT[$launcher]} run=${RUN_DIR[$launcher]}
  wait_job_done "$id" 600
  log "$launcher: job $id $JOB_STATE, exit code $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts)"

  [[ $JOB_STATE == COMPLETED && $(job_field "$id" ExitCode) == 0:0 ]] || { show "$out"; fail "$launcher: job $id ended $JOB_STATE"; }
  [[ $(job_field "$id" Restarts) == 1 ]] || { show "$out"; fail "$launcher: job $id restarted $(job_field "$id" Restarts) times, expected 1"; }
  [[ $(grep -c 'SIGUSR1: asking the ranks to checkpoint' "$out") == 1 ]] || { show "$out"; fail "$launcher: the batch script did not take SIGUSR1 exactly once"; }
  grep -q 'stopped early with a checkpoint (exit 75); requeueing' "$out" || { show "$out"; fail "$launcher: no exit 75 and requeue in the job output"; }
  # Relay's "resumed from .../step_<K>.h5 at step K": the second run started where the first stopped.
  resumed=$(grep -Eo 'resumed from [^ ]*step_[0-9]+\.h5 at step [0-9]+' "$out" | head -n 1)
  [[ $resumed =~ step_0*([0-9]+)\.h5\ at\ step\ ([0-9]+)$ ]] || { show "$out"; fail "$launcher: the requeued run did not resume from a checkpoint"; }
  k=${BASH_REMATCH[2]}
  (( BASH_REMATCH[1] == k && k >= first && k < steps )) || { show "$out"; fail "$launcher: resumed at step $k, expected in [$first, $steps)"; }
  grep -Eq "stopping at step $k on signal 10\b" "$out" || { show "$out"; fail "$launcher: Relay did not report stopping at step $k on SIGUSR1"; }
  [[ -s $run/checkpoints/$(printf 'step_%08d.h5' "$k") ]] || fail "$launcher: the stop checkpoint of step $k is missing"
  log "$launcher: signalled with $((SIG_AT[$launcher])) steps logged, stopped at step $k of $steps, resumed there"
  check_train_steps "$run" "$steps"
  check_final_checkpoint "$run" "$steps"
  same_losses "${RUN_DIR[reference]}" "$run"
done
log "PASS: SIGUSR1 -> checkpoint -> exit 75 -> requeue -> resume -> same losses, under srun and mpirun ($(seconds_since "$t") s for the three jobs)"
