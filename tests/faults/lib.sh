# Shared by tests/faults/test_*.sh: a small real training job on 4 ranks (dp 2 x pp 2, 1F1B) with
# periodic checkpoints, its uninterrupted reference run, and the three checks every fault case makes:
#   1. the job ends, within a stated time (expect_end_within);
#   2. the message names the cause (expect_in_output);
#   3. nothing is lost: the newest complete checkpoint reads back (relay ckpt inspect) and a resume
#      with checkpoint.resume = "auto" continues the uninterrupted run's loss curve exactly (resume_matches).
# Usage: source lib.sh <relay binary>. Exit codes: 0 pass, 1 fail, 77 skip.
set -uo pipefail
RELAY=$(realpath "$1")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d /tmp/relay-fault-XXXXXX)
cleanup_dirs=("$WORK")
trap 'for d in "${cleanup_dirs[@]}"; do umount -l "$d/full" 2>/dev/null; rm -rf "$d"; done' EXIT
STEPS=${STEPS:-600}
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "PASS: $*"; echo "1 passed, 0 failed"; exit 0; }

"$RELAY" data synth --out "$WORK/train.h5" --samples 512 --features 16 --classes 5 --seed 11 >/dev/null || fail "data synth"
"$RELAY" data synth --out "$WORK/eval.h5" --samples 128 --features 16 --classes 5 --seed 12 >/dev/null || fail "data synth"
cat > "$WORK/config.toml" <<TOML
[model]
seed = 3
layers = [ { type = "linear", out = 32 }, { type = "gelu" }, { type = "linear", out = 32 }, { type = "tanh" },
           { type = "linear", out = 32 }, { type = "layernorm" }, { type = "linear", out = 5 } ]
[data]
train = "$WORK/train.h5"
eval = "$WORK/eval.h5"
[train]
steps = $STEPS
batch_size = 64
micro_batches = 2
log_every = 1
eval_every = 200
clip_grad_norm = 1.0
[optimizer]
lr = 0.003
[parallel]
dp = 2
pp = 2
timeout = "3s"
[checkpoint]
every = 50
TOML

# relay train on 4 ranks; extra arguments are --set overrides.
JOB_CMD=(mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$RELAY" train --config "$WORK/config.toml")
job() { "${JOB_CMD[@]}" "$@"; }
losses() { python3 -c "
import json,sys
print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1/metrics.jsonl"; }

# The uninterrupted run every case compares with.
reference() {
  job --set "run.dir=\"$WORK/ref\"" > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; fail "the reference run failed"; }
}

# Starts the faulty run in the background (run dir $WORK/run), output in $WORK/run.log.
start() {
  "${JOB_CMD[@]}" --set "run.dir=\"$WORK/run\"" "$@" > "$WORK/run.log" 2>&1 &
  JOB=$!  # mpirun itself (a simple command is exec'ed), so signals reach the launcher
  T_START=$(date +%s.%N)
}
# Waits until the run has logged at least N steps (at most 120 s).
wait_steps() {
  for _ in $(seq 1 1200); do
    [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run/metrics.jsonl")" -ge "$1" ] && return 0
    sleep 0.1
  done
  fail "the run never reached step $1"
}
# The pid of world rank R of the faulty run.
# Waits (up to 30 s) until checkpoint step S's temporary file exists: rank 0 is writing it.
wait_partial_checkpoint() {
  local f; f=$(printf 'step_%08d.h5.tmp-' "$1")
  for _ in $(seq 1 600); do ls "$WORK/run/checkpoints" 2>/dev/null | grep -q "$f" && return; sleep 0.05; done
  fail "never saw the step-$1 checkpoint being written"
}
rank_pid() {
  for p in $(pgrep -x relay); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" &&
       tr '\0' ' ' < "/proc/$p/cmdline" | grep -q "$WORK/run\""; then echo "$p"; return 0; fi
  done
  fail "no process for rank $1"
}
# After the fault (at time T_FAULT): the job must end within S seconds; sets RC and ENDED (seconds).
expect_end_within() {
  local s=$1
  for _ in $(seq 1 $((s * 10))); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$JOB" 2>/dev/null; then
    pkill -KILL -f "$WORK/run\"" ; kill -KILL "$JOB" 2>/dev/null
    cat "$WORK/run.log" | tail -20
    fail "the job was still running ${s} s after the fault (a hang)"
  fi
  wait "$JOB"; RC=$?
  ENDED=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_FAULT))")
  echo "job ended ${ENDED} s after the fault, exit code $RC"
}
fault_now() { T_FAULT=$(date +%s.%N); }
expect_in_output() { grep -q -- "$1" "$WORK/run.log" || { tail -30 "$WORK/run.log"; fail "the output does not say: $1"; }; }
# The newest complete checkpoint reads back, and a resume from it reproduces the reference's losses.
resume_matches() {
  local dir="$WORK/run/checkpoints" latest
  latest=$(cat "$dir/latest" 2>/dev/null) || fail "no 'latest' in $dir"
  local before
  before=$(ls "$dir" | tr '\n' ' ')
  "$RELAY" ckpt inspect "$dir/$latest" > "$WORK/inspect.log" 2>&1 || { cat "$WORK/inspect.log"; fail "$latest does not read back"; }
  job --set "run.dir=\"$WORK/run\"" --set 'checkpoint.resume="auto"' "$@" > "$WORK/resume.log" 2>&1 ||
    { tail -20 "$WORK/resume.log"; fail "the resume failed"; }
  ls "$dir" | grep -q "tmp-" && fail "a temporary file is still in $dir after the resume: $(ls "$dir")"
  [ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "the resumed run's losses differ from the uninterrupted run's"
  echo "left on disk: ${before}(latest = $latest, readable); resume from it reproduces all $STEPS losses"
}
