#!/usr/bin/env bash
# jobscripts/relay-{cpu,gpu}.sbatch on a real (private) Slurm, with tests/slurm/fake_relay.sh standing
# in for Relay so that what is checked is the scripts alone: finding the binary, SIGUSR1 reaching every
# rank exactly once, Slurm's own --signal=B:USR1@N, requeue, the cap on requeues, and the GPU script.
# Relay's side of the same flow is tested by test_preempt_requeue.sh with the real binary.
#   bash tests/slurm/test_jobscripts.sh [ignored]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
FAKE=$HARNESS_DIR/fake_relay.sh
CPU=$REPO_ROOT/jobscripts/relay-cpu.sbatch GPU=$REPO_ROOT/jobscripts/relay-gpu.sbatch

# Checks that need no Slurm.
diff <(sed -n '/^# ---- common/,$p' "$CPU") <(sed -n '/^# ---- common/,$p' "$GPU") >/dev/null \
  || fail "the common parts of relay-cpu.sbatch and relay-gpu.sbatch differ: $(diff <(sed -n '/^# ---- common/,$p' "$CPU") <(sed -n '/^# ---- common/,$p' "$GPU") | head -5)"
out=$(env -u SLURM_JOB_ID bash "$CPU" x.toml 2>&1); rc=$?
[[ $rc == 2 && $out == *"not inside a Slurm job"* ]] || fail "relay-cpu.sbatch outside a job: exit $rc, '$out'"
for s in "$CPU" "$GPU"; do
  for d in '--signal=B:USR1@120' '--requeue' '--open-mode=append'; do
    grep -q "^#SBATCH $d\$" "$s" || fail "$(basename "$s") lacks #SBATCH $d"
  done
done

# 16 CPUs: case 4's job (4 tasks) runs beside the others (at most 4 tasks x 2 CPUs).
slurm_start 16
export FAKE_RELAY_STEP_SECONDS=0.02
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" 64
mkdir -p "$WORK_DIR/elsewhere" "$WORK_DIR/repo/jobscripts" "$WORK_DIR/repo/build" "$WORK_DIR/norepo/jobscripts"
cp "$CPU" "$WORK_DIR/repo/jobscripts/"; cp "$FAKE" "$WORK_DIR/repo/build/relay"
cp "$CPU" "$WORK_DIR/norepo/jobscripts/"
# ranks_signalled OUT N: each of ranks 0..3 reported SIGUSR1 N times.
ranks_signalled() {
  local r
  for r in 0 1 2 3; do [[ $(grep -c "^\[rank $r\] got SIGUSR1" "$1") == "$2" ]] || return 1; done
}

# 4 (started first, checked last). mpirun, with Slurm's own --signal=B:USR1@50 on a 1-minute limit and
#    RELAY_MAX_REQUEUES=1: stopped twice, requeued once, then the cap. slurmctld sends --signal's USR1
#    from a check it makes every 30 s from its start (so up to a minute early), which made this case
#    wait for two of those checks (~60 s). Now the first run is stopped at once by the same USR1 to the
#    batch shell (scancel --batch, as in case 3); the requeued run, up again ~10 s in, takes Slurm's own
#    signal at the first check (~30 s), while cases 1-3 and 5 run beside it.
cd "$WORK_DIR" || fail "cd"
run4=$WORK_DIR/run-mpirun
id4=$(RELAY_BIN=$FAKE RELAY_LAUNCHER=mpirun RELAY_BIND=none RELAY_MAX_REQUEUES=1 \
      slurm_submit --ntasks=4 --time=1 --signal=B:USR1@50 --output=mpirun.out "$CPU" "$WORK_DIR/test.toml" \
      --set run.dir="$run4" --set train.steps=6000 --set checkpoint.every=1000) || fail "sbatch failed"
_started4() { (( $(metrics_steps "$run4") >= 50 )); }
wait_until 60 _started4 || { show mpirun.out; fail "mpirun job $id4 did not get going"; }
scancel --batch --signal=USR1 "$id4" || fail "scancel failed"

# 1. No RELAY_BIN: the script finds build/relay next to its own jobscripts/ through the job record,
#    although sbatch runs a copy and the job was submitted from another directory.
cd "$WORK_DIR/elsewhere" || fail "cd"
id=$(env -u RELAY_BIN sbatch --parsable --ntasks=4 --output=lookup.out "$WORK_DIR/repo/jobscripts/relay-cpu.sbatch" \
     "$WORK_DIR/test.toml" --set run.dir="$WORK_DIR/run-lookup" --set train.steps=20) || fail "sbatch failed"
wait_job_done "$id" 60
[[ $JOB_STATE == COMPLETED ]] || { show lookup.out; fail "lookup job $id $JOB_STATE"; }
grep -q "running: srun .* $WORK_DIR/repo/build/relay train" lookup.out || { show lookup.out; fail "did not run <repo>/build/relay"; }
log "binary lookup: <repo>/build/relay found from the job record"

# 2. No binary anywhere: a clear error, exit 2, no requeue.
id=$(env -u RELAY_BIN PATH=/usr/bin:/bin sbatch --parsable --ntasks=4 --output=missing.out \
     "$WORK_DIR/norepo/jobscripts/relay-cpu.sbatch" "$WORK_DIR/test.toml") || fail "sbatch failed"
wait_job_done "$id" 60
[[ $JOB_STATE == FAILED && $(job_field "$id" ExitCode) == 2:0 && $(job_field "$id" Restarts) == 0 ]] \
  || { show missing.out; fail "missing binary: job $id $JOB_STATE $(job_field "$id" ExitCode)"; }
grep -q 'error: relay binary not found' missing.out || { show missing.out; fail "missing binary: no clear error"; }
log "binary lookup: a missing binary fails the job with exit 2 and says so"
cd "$WORK_DIR" || fail "cd"

# 3. srun: SIGUSR1 to the batch shell (as --signal=B:USR1 sends it) reaches every rank once;
#    exit 75, requeue, resume, finish.
export RELAY_BIN=$FAKE
run=$WORK_DIR/run-srun
id=$(RELAY_LAUNCHER=srun slurm_submit --ntasks=4 --output=srun.out "$CPU" "$WORK_DIR/test.toml" \
     --set run.dir="$run" --set train.steps=400 --set checkpoint.every=100) || fail "sbatch failed"
_started() { (( $(metrics_steps "$run") >= 50 )); }
wait_until 60 _started || { show srun.out; fail "srun job $id did not get going"; }
scancel --batch --signal=USR1 "$id" || fail "scancel failed"
wait_job_done "$id" 120
[[ $JOB_STATE == COMPLETED && $(job_field "$id" Restarts) == 1 ]] \
  || { show srun.out; fail "srun: job $id $JOB_STATE after $(job_field "$id" Restarts) restarts, expected COMPLETED after 1"; }
ranks_signalled srun.out 1 || { show srun.out; fail "srun: SIGUSR1 did not reach each rank exactly once"; }
check_train_steps "$run" 400
log "srun: USR1 reached each rank once; exit 75, requeued, resumed, finished"

# 5. relay-gpu.sbatch on four pretend GPUs: one task per GPU, train.device=cuda.
id=$(slurm_submit --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=2 --output=gpu.out "$GPU" \
     "$WORK_DIR/test.toml" --set run.dir="$WORK_DIR/run-gpu" --set train.steps=20) || fail "sbatch failed"
wait_job_done "$id" 60
[[ $JOB_STATE == COMPLETED ]] || { show gpu.out; fail "gpu job $id $JOB_STATE"; }
grep -q "running: srun --mpi=pmix --ntasks=4 --cpus-per-task=2 .* --set checkpoint.resume=auto --set train.device=cuda" gpu.out \
  || { show gpu.out; fail "relay-gpu.sbatch: unexpected command"; }
check_train_steps "$WORK_DIR/run-gpu" 20
# 4, checked: the first run stopped by scancel's USR1, the requeued one by Slurm's own, then the cap.
wait_job_done "$id4" 240
log "mpirun: job $id4 $JOB_STATE, exit code $(job_field "$id4" ExitCode), restarts $(job_field "$id4" Restarts)"
[[ $JOB_STATE == FAILED && $(job_field "$id4" ExitCode) == 75:0 && $(job_field "$id4" Restarts) == 1 ]] \
  || { show mpirun.out; fail "mpirun: expected FAILED with exit code 75 after 1 restart"; }
ranks_signalled mpirun.out 2 || { show mpirun.out; fail "mpirun: SIGUSR1 did not reach each rank exactly once per run"; }
grep -q 'not requeued: already restarted 1 times (RELAY_MAX_REQUEUES=1)' mpirun.out \
  || { show mpirun.out; fail "mpirun: the cap on requeues was not reported"; }
log "mpirun: USR1 reached each rank in both runs (scancel's, then Slurm's own --signal=B:USR1 after the requeue); requeued once, then capped"
log "PASS: job scripts find the binary, pass SIGUSR1 on once per rank, requeue up to the cap; GPU script runs"
