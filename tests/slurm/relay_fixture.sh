# shellcheck shell=bash
# tests/slurm/relay_fixture.sh: what the Slurm tests need around a Relay run: the binary, a synthetic
# dataset, a small config, and checks on metrics.jsonl and checkpoints. Sourced after harness.sh.

# use_relay_binary ARG: sets RELAY to the binary the test was given (ctest passes
# $<TARGET_FILE:relay>), else <repo>/build/relay. Skips the test when there is none.
use_relay_binary() {
  RELAY=${1:-$REPO_ROOT/build/relay}
  [[ -x $RELAY && -f $RELAY ]] || skip "relay binary '$RELAY' not built (give its path as the first argument)"
  RELAY=$(realpath "$RELAY")
}

# make_data DIR: train.h5 (2048 x 32, 4 classes) and eval.h5 (512 rows) from `relay data synth`.
make_data() {
  mkdir -p "$1"
  "$RELAY" data synth --out "$1/train.h5" --samples 2048 --features 32 --classes 4 --seed 1 >/dev/null \
    && "$RELAY" data synth --out "$1/eval.h5" --samples 512 --features 32 --classes 4 --seed 2 >/dev/null \
    || fail "relay data synth failed"
}

# write_config FILE DATA_DIR HIDDEN: a 32 -> HIDDEN -> gelu -> 4 MLP on dp = 2 x pp = 2 (four tasks),
# 1F1B over 2 micro-batches of a 64-sample batch. Tests change steps, run.dir, ... with --set.
write_config() {
  cat >"$1" <<EOF
# Written by tests/slurm/relay_fixture.sh
[run]
dir = "runs/slurm-test"

[model]
seed = 1
loss = "cross_entropy"
layers = [ { type = "linear", out = $3 }, { type = "gelu" }, { type = "linear", out = 4 } ]

[data]
train = "$2/train.h5"
seed = 2

[train]
steps = 60
batch_size = 64
micro_batches = 2
log_every = 1

[optimizer]
name = "adamw"
lr = 1e-3

[parallel]
dp = 2
pp = 2
schedule = "1f1b"

[checkpoint]
every = 20
keep = 0
resume = "none"
EOF
}

# check_train_steps RUN_DIR STEPS: metrics.jsonl holds one training record for each step 1..STEPS,
# in order, none twice (eval records, which carry no "loss", are ignored).
check_train_steps() {
  python3 - "$1/metrics.jsonl" "$2" <<'PY' || fail "$1/metrics.jsonl: training records are not steps 1..$2, each once"
import json, sys
path, steps = sys.argv[1], int(sys.argv[2])
got = [json.loads(l)["step"] for l in open(path) if l.strip() and "loss" in json.loads(l)]
if got != list(range(1, steps + 1)):
    dup = sorted({s for s in got if got.count(s) > 1})
    missing = sorted(set(range(1, steps + 1)) - set(got))
    print(f"{path}: {len(got)} training records; duplicated steps {dup[:10]}, missing {missing[:10]}")
    sys.exit(1)
PY
}

# same_losses RUN_A RUN_B: the training losses of two runs are equal step by step, bit for bit.
same_losses() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY' || fail "losses of $1 and $2 differ"
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, open(p))) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
diff = [(s, a.get(s), b.get(s)) for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
for s, x, y in diff[:5]:
    print(f"step {s}: {x} vs {y}")
print(f"{len(a)} steps compared, {len(diff)} differ")
sys.exit(1 if diff or not a else 0)
PY
}

# check_final_checkpoint RUN_DIR STEPS: checkpoints/latest names step_<STEPS>.h5, and it exists.
check_final_checkpoint() {
  local dir=$1/checkpoints want; want=$(printf 'step_%08d.h5' "$2")
  [[ -r $dir/latest ]] || fail "$dir/latest missing"
  [[ $(tr -d '[:space:]' <"$dir/latest") == "$want" ]] || fail "$dir/latest names '$(<"$dir/latest")', expected $want"
  [[ -s $dir/$want ]] || fail "$dir/$want missing or empty"
}

# show FILE: a job's output for a failure report, without the per-step log lines.
show() { echo "----- $1 (last 60 lines that are not per-step log lines)"; grep -v '^step ' "$1" | tail -n 60; }

# metrics_steps RUN_DIR: how many training records metrics.jsonl holds (0 before it exists).
metrics_steps() { [[ -e $1/metrics.jsonl ]] && awk '/"loss"/ { n++ } END { print n + 0 }' "$1/metrics.jsonl" || echo 0; }
