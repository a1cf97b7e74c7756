#!/usr/bin/env bash
# ZeRO stages on the CPU (measures, never fails): GPT-2 124M (configs/gpt2-124m.toml, T = 1024) on 2 ranks of 1
# thread each, dp 2, one 1024-token sequence per rank and step, train.precision as given (fp32 where the CPU has no
# bf16 matmul), optimizer.zero = 1, 2 and 3 back to back. tokens/s: the mean of metrics.jsonl's tokens_per_s after
# the first 2 steps; memory: rank 0's measured parameter + gradient + optimizer bytes after the first step, and the
# step's peak of parameter bytes (ZeRO-3's gathered blocks), beside relay plan's prediction (memory.json).
# Usage: bench/bench_zero.sh [relay binary (build/relay)] [steps (6)] [precision (fp32)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-6}
PRECISION=${3:-fp32}
work=$(mktemp -d /tmp/relay-bench-zero-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_gpt2_tokens "$work/tokens.h5" $((2 * 1024 * (STEPS + 1) + 1))
printf "# ZeRO benchmark: GPT-2 124M, %s, dp 2 (2 ranks x 1 thread), 1 sequence of 1024 per rank, %d steps\n" \
  "$PRECISION" "$STEPS"
cpu_info
printf "%-10s %10s %26s %26s\n" "zero" "tokens/s" "states MiB (predicted)" "peak params MiB (pred.)"
for zero in 1 2 3; do
  dir="$work/zero$zero"
  mpirun --oversubscribe -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train --config configs/gpt2-124m.toml \
    --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=$STEPS \
    --set train.log_every=1 --set lr_schedule.warmup_steps=0 --set train.batch_size=2 --set train.micro_batches=1 \
    --set parallel.dp=2 --set optimizer.zero=$zero --set "train.precision=\"$PRECISION\"" --set checkpoint.every=0 \
    --set "checkpoint.dir=\"$dir/ckpt\"" >"$dir.log" 2>&1 || { echo "zero $zero failed:"; tail -5 "$dir.log"; continue; }
  /usr/bin/python3 - "$dir" "$zero" <<'PY'
import json, sys
d, zero = sys.argv[1], sys.argv[2]
tps = [json.loads(l).get("tokens_per_s") for l in open(d + "/metrics.jsonl") if '"loss"' in l]
tps = [t for t in tps[2:] if t]
r = json.load(open(d + "/memory.json"))["bytes_per_rank"][0]
mib = lambda b: b / 2**20
states = lambda x: sum(x[k] for k in ("params", "grads", "optimizer"))
print(f"{zero:<10} {sum(tps) / len(tps):10.1f} {mib(states(r['measured'])):14.1f} ({mib(states(r['predicted'])):8.1f}) "
      f"{mib(r['measured']['peak_params']):14.1f} ({mib(r['predicted']['peak_params']):8.1f})")
PY
done
load_at_end
