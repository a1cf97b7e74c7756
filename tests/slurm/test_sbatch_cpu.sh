#!/usr/bin/env bash
# jobscripts/relay-cpu.sbatch on a real (private, single-node) Slurm: four tasks, dp = 2 x pp = 2, 1F1B,
# once launched with srun --mpi=pmix and once with mpirun inside the allocation. Each job must
# complete, show the training log in its output, and leave the final checkpoint.
#   bash tests/slurm/test_sbatch_cpu.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"

slurm_start
make_data "$WORK_DIR/data"
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" 64
steps=60

for launcher in srun mpirun; do
  run_dir=$WORK_DIR/run-$launcher out=$WORK_DIR/$launcher.out
  # RELAY_BIND=none: the node claims 8 CPUs on 2 cores, and Open MPI will not bind 4 ranks to 2 cores.
  id=$(RELAY_BIN=$RELAY RELAY_LAUNCHER=$launcher RELAY_BIND=none \
       slurm_submit --ntasks=4 --time=10 --output="$out" "$REPO_ROOT/jobscripts/relay-cpu.sbatch" \
       "$WORK_DIR/test.toml" --set run.dir="$run_dir" --set train.steps=$steps \
       --set data.eval="$WORK_DIR/data/eval.h5" --set train.eval_every=30) || fail "sbatch failed"
  wait_job_done "$id" 300; state=$JOB_STATE
  log "$launcher: job $id $state, exit code $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts)"
  [[ $state == COMPLETED && $(job_field "$id" ExitCode) == 0:0 ]] || { show "$out"; fail "$launcher: job $id ended $state"; }
  [[ $(job_field "$id" Restarts) == 0 ]] || { show "$out"; fail "$launcher: a finished run was requeued"; }
  grep -q "running: $launcher " "$out" || { show "$out"; fail "$launcher: the job did not launch with $launcher"; }
  grep -Eq "^step +$steps\b.*loss" "$out" || { show "$out"; fail "$launcher: no training log line for step $steps in the job output"; }
  check_train_steps "$run_dir" "$steps"
  check_final_checkpoint "$run_dir" "$steps"
done
same_losses "$WORK_DIR/run-srun" "$WORK_DIR/run-mpirun"
log "PASS: relay-cpu.sbatch ran dp=2 x pp=2 to completion under srun --mpi=pmix and under mpirun"
