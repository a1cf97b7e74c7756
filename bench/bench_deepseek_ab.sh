#!/usr/bin/env bash
# A/B of two relay binaries on the small DeepSeek-V3 (configs/deepseek-v3-small-bytes.toml) and its dense twin
# llama-ds (configs/llama-small-bytes.toml cut to 2 layers 64 wide, SwiGLU 208: the same active parameters; see
# bench/bench_moe_cpu.sh), bf16, T 64, batch 16, one micro-batch, on random bytes (measures, never fails).
# Every (binary, model, threads) run that many rounds, alternated A, B within each round so that a machine's load
# hits both alike. Per run: tokens/s (mean of the steps after the first max(2, steps / 4)) and CPU ms per step
# (user + sys, /usr/bin/time): the CPU time of a run of `steps` steps minus that of a run of the first max(2, steps / 4)
# alone, over the difference in steps, so that start-up (loading, the bf16 GEMM probe, first-touch page faults) stays
# out. OMP_WAIT_POLICY (default passive here): on a 2-core machine loaded by
# other work, libgomp's spinning waits (active, its default) cost a waiting thread its core and the working one its
# partner, and the CPU time then counts spinning, not work; passive makes CPU time the work done.
# Usage: bench/bench_deepseek_ab.sh A_relay B_relay [steps (40)] [rounds (3)] [threads list ("1 2")]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
A=$(realpath "$1"); B=$(realpath "$2")
STEPS=${3:-40}; ROUNDS=${4:-3}; THREADS=${5:-"1 2"}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
SKIP=$((STEPS / 4 > 2 ? STEPS / 4 : 2))
work=$(mktemp -d /tmp/relay-bench-dsab-XXXXXX)
trap 'rm -rf "$work"' EXIT
printf "# DeepSeek-V3 small A/B: A %s, B %s; %d steps (first %d skipped), %d rounds, OMP_WAIT_POLICY=%s\n" \
  "$A" "$B" "$STEPS" "$SKIP" "$ROUNDS" "$OMP_WAIT_POLICY"
cpu_info
/usr/bin/python3 - "$work/tokens.h5" $((16 * 64 * (STEPS + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 256, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
PY
train() {  # binary model threads steps dir: one run, its CPU seconds (user + sys) on stdout
  local bin=$1 model=$2 th=$3 steps=$4 dir=$5 cfg
  if [[ $model == ds ]]; then cfg=(--config configs/deepseek-v3-small-bytes.toml)
  else cfg=(--config configs/llama-small-bytes.toml --set model.n_layer=2 --set model.n_embd=64 --set model.ffn_hidden=208); fi
  rm -rf "$dir"
  OMP_NUM_THREADS=$th /usr/bin/time -f "%U %S" -o "$dir.time" "$bin" train "${cfg[@]}" \
    --set run.dir=\""$dir"\" --set data.train=\""$work/tokens.h5"\" --set 'data.eval=""' \
    --set train.precision=\"bf16\" --set train.steps="$steps" --set train.log_every=1 --set train.batch_size=16 \
    --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 --set train.threads="$th" \
    --set model.block_size=64 --set train.eval_every=0 >"$dir.out" 2>&1 || return 1
  awk '{s = $1 + $2} END {print s}' "$dir.time"
}
run() {  # binary model threads -> "tokens/s cpu_ms_per_step"
  local long short
  long=$(train "$1" "$2" "$3" "$STEPS" "$work/run") && short=$(train "$1" "$2" "$3" "$SKIP" "$work/short") ||
    { echo "n/a n/a"; return; }
  /usr/bin/python3 - "$work/run/metrics.jsonl" "$SKIP" "$STEPS" "$long" "$short" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > int(sys.argv[2])]
cpu = (float(sys.argv[4]) - float(sys.argv[5])) / (int(sys.argv[3]) - int(sys.argv[2]))
print("%.0f %.1f" % (sum(w) / len(w), 1000 * cpu))
PY
}
printf "%-6s %-5s %-3s %s\n" round model thr "A tok/s  A cpu ms/step | B tok/s  B cpu ms/step"
for ((r = 1; r <= ROUNDS; ++r)); do
  for th in $THREADS; do
    for m in ds llama; do
      a=$(run "$A" $m "$th"); b=$(run "$B" $m "$th")
      printf "%-6s %-5s %-3s %s | %s\n" "$r" "$m" "$th" "$a" "$b"
    done
  done
done
load_at_end
