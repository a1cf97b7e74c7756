#!/usr/bin/env bash
# Run-directory ownership (<run.dir>/relay.lock):
#   1. a second job on a run.dir that a running job holds fails at once, on every rank, with one line
#      naming the owner (host, pid, Slurm job, start time), and writes nothing there; the first job
#      finishes with every step logged once and its losses and checkpoints equal to an undisturbed run's;
#   2. a lock left by a dead pid on this host is taken over, with a message;
#   3. a record from another host with a fresh lease is refused; with a lease older than 120 s, or
#      written by an earlier run of the same Slurm job, it is taken over.
STEPS=${STEPS:-4000}  # long enough (several seconds) for a second job to start while it runs
source "$(dirname "$0")/lib.sh" "$1"
# Each rank's own exit code, printed by a wrapper (mpirun alone reports only that one rank failed).
per_rank() {
  timeout 60 mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 bash -c \
    '"$0" "$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?"' "$RELAY" train --config "$WORK/config.toml" "$@"
}
record() {  # host pid lease -> a lock record as a job on that host would have left it
  printf '{"host": "%s", "pid": %s, "job": "", "start": "2026-01-01T00:00:00Z", "lease": %s}\n' "$1" "$2" "$3"
}
reference

# 1. Two jobs on one run.dir.
mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 env SLURM_JOB_ID=4242 "$RELAY" train \
  --config "$WORK/config.toml" --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1 &
JOB=$!
wait_steps 5
OWNER_PID=$(python3 -c "import json; print(json.load(open('$WORK/run/relay.lock'))['pid'])") || fail "no owner record"
cp "$WORK/run/config.toml" "$WORK/config.before"
fault_now
per_rank --set "run.dir=\"$WORK/run\"" > "$WORK/second.log" 2>&1
T2=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_FAULT))")
kill -0 "$JOB" 2>/dev/null || { tail "$WORK/run.log"; fail "the first job ended before the second was refused (make STEPS larger)"; }
grep "error:" "$WORK/second.log"
[ "$(grep -c "error:" "$WORK/second.log")" -eq 1 ] || { cat "$WORK/second.log"; fail "not one error line"; }
grep -q "error: run.dir $WORK/run is in use by another job: host $(hostname), pid $OWNER_PID, Slurm job 4242, started 20" \
  "$WORK/second.log" || { cat "$WORK/second.log"; fail "the line does not name the owner"; }
for r in 0 1 2 3; do
  grep -q "rank $r exit 1" "$WORK/second.log" || { cat "$WORK/second.log"; fail "rank $r did not exit 1"; }
done
cmp -s "$WORK/run/config.toml" "$WORK/config.before" || fail "the second job rewrote config.toml"
wait "$JOB"; RC=$?
[ "$RC" -eq 0 ] || { tail "$WORK/run.log"; fail "the first job exited $RC"; }
python3 - "$WORK/run/metrics.jsonl" "$STEPS" <<'PY' || fail "metrics.jsonl of the first job is not intact"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps[:20]
PY
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "the first job's losses differ from the undisturbed run's"
[ "$(ls "$WORK/run/checkpoints")" == "$(ls "$WORK/ref/checkpoints")" ] || fail "not the undisturbed run's checkpoint files"
for s in 00000050 00002000 $(printf %08d "$STEPS"); do
  for g in /model /optimizer; do  # (the root's config attribute names the run.dir, so it differs)
    h5diff "$WORK/ref/checkpoints/step_$s.h5" "$WORK/run/checkpoints/step_$s.h5" $g $g > /dev/null ||
      fail "checkpoint step_$s.h5 differs from the undisturbed run's in $g"
  done
done
[ ! -s "$WORK/run/relay.lock" ] || fail "the lock record was not cleared at the end: $(cat "$WORK/run/relay.lock")"
echo "second job refused in ${T2} s on all 4 ranks; first job: $STEPS steps logged once, losses and checkpoints equal an undisturbed run's"

# 2. A lock left by a dead process on this host.
mkdir -p "$WORK/dead"
bash -c 'exit 0' & DEAD=$!; wait $DEAD
record "$(hostname)" "$DEAD" "$(date +%s)" > "$WORK/dead/relay.lock"
job --set "run.dir=\"$WORK/dead\"" --set train.steps=5 > "$WORK/dead.log" 2>&1 || { grep -v "^step" "$WORK/dead.log" | tail -40; fail "no takeover from a dead pid"; }
grep -q "relay: taking over $WORK/dead/relay.lock from host $(hostname), pid $DEAD, started 2026-01-01T00:00:00Z: pid $DEAD is not running on this host" \
  "$WORK/dead.log" || { grep relay: "$WORK/dead.log" | head; fail "no takeover message"; }
echo "stale lock of dead pid $DEAD taken over"

# 3. Another host: a fresh lease is refused, an expired one taken over.
mkdir -p "$WORK/far"
record far-node7 1 "$(date +%s)" > "$WORK/far/relay.lock"
job --set "run.dir=\"$WORK/far\"" --set train.steps=5 > "$WORK/far.log" 2>&1 && fail "a fresh lease from another host was not refused"
grep -q "error: run.dir $WORK/far is in use by another job: host far-node7, pid 1, started 2026-01-01T00:00:00Z (its lease was renewed" \
  "$WORK/far.log" || { cat "$WORK/far.log"; fail "the refusal does not name far-node7"; }
[ "$(ls "$WORK/far")" == "relay.lock" ] || fail "the refused job wrote into the run dir: $(ls "$WORK/far")"
record far-node7 1 "$(($(date +%s) - 600))" > "$WORK/far/relay.lock"
job --set "run.dir=\"$WORK/far\"" --set train.steps=5 > "$WORK/far.log" 2>&1 || { tail "$WORK/far.log"; fail "no takeover of an expired lease"; }
grep -q "relay: taking over $WORK/far/relay.lock from host far-node7, pid 1, started 2026-01-01T00:00:00Z: its lease was last renewed 60[0-9] s ago, more than 120 s" \
  "$WORK/far.log" || { grep relay: "$WORK/far.log" | head; fail "no takeover message for the expired lease"; }
# The same Slurm job id (a requeue or in-job restart landing on another node): taken over at once.
printf '{"host": "far-node7", "pid": 1, "job": "777", "start": "2026-01-01T00:00:00Z", "lease": %s}\n' "$(date +%s)" \
  > "$WORK/far/relay.lock"
mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 env SLURM_JOB_ID=777 "$RELAY" train \
  --config "$WORK/config.toml" --set "run.dir=\"$WORK/far\"" --set train.steps=5 > "$WORK/far.log" 2>&1 ||
  { grep -v "^step" "$WORK/far.log" | tail -20; fail "an earlier run of the same Slurm job was not taken over"; }
grep -q "relay: taking over $WORK/far/relay.lock from host far-node7, pid 1, Slurm job 777, .*: an earlier run of this Slurm job" \
  "$WORK/far.log" || { grep relay: "$WORK/far.log" | head; fail "no takeover message for the same Slurm job"; }
echo "another host's record: fresh lease refused, 600 s old lease taken over, the same Slurm job's taken over"
pass "run.dir ownership: concurrent job refused on every rank, stale locks taken over"
