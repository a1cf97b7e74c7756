#!/usr/bin/env bash
# Context parallelism on the CPU (measures, never fails): configs/llama-small-bytes.toml at T 16384, one sequence a
# step, full causal attention: the serial run on every core against parallel.cp = 2 on 2 ranks of 1 thread each
# (so both use the same cores), back to back. tokens/s: the mean of metrics.jsonl's tokens_per_s after the first 2
# steps; activations: rank 0's measured activation bytes after the first step (<run>/memory.json), beside what
# relay plan predicted.
# Usage: bench/bench_context_parallel.sh [relay binary (build/relay)] [steps (5)] [T (16384)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-5}
T=${3:-16384}
THREADS=$(nproc)
work=$(mktemp -d /tmp/relay-bench-cp-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_byte_tokens "$work/tokens.h5" $((T * (STEPS + 1) + 1))
printf "# Context-parallel benchmark: llama-small-bytes at T %d, batch 1, %d steps\n" "$T" "$STEPS"
cpu_info
printf "%-34s %12s %16s %16s\n" "run" "tokens/s" "activations MiB" "(predicted)"
declare -A tps act
for cp in 1 2; do
  dir="$work/run-cp$cp"
  args=(train --config configs/llama-small-bytes.toml --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\""
        --set 'data.eval=""' --set model.block_size="$T" --set train.batch_size=1 --set train.micro_batches=1
        --set train.steps="$STEPS" --set train.log_every=1 --set lr_schedule.warmup_steps=0 --set parallel.cp=$cp)
  if [[ $cp == 1 ]]; then
    OMP_NUM_THREADS=$THREADS "$RELAY" "${args[@]}" --set train.threads="$THREADS" >"$dir.out" 2>&1 || { tail "$dir.out"; exit 1; }
    label="serial, $THREADS threads"
  else
    mpirun --oversubscribe -np $cp --bind-to none -x OMP_NUM_THREADS=$((THREADS / cp)) "$RELAY" "${args[@]}" \
      --set train.threads=$((THREADS / cp)) >"$dir.out" 2>&1 || { tail "$dir.out"; exit 1; }
    label="cp $cp, $cp ranks x $((THREADS / cp)) thread(s)"
  fi
  read -r tps[$cp] act[$cp] pred < <(python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
r = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > 2]
m = json.load(open(d + "/memory.json"))["bytes_per_rank"][0]
print("%.1f %.1f %.1f" % (sum(w) / len(w), m["measured"]["activations"] / 2**20, m["predicted"]["activations"] / 2**20))
PY
)
  printf "%-34s %12s %16s %16s\n" "$label" "${tps[$cp]}" "${act[$cp]}" "($pred)"
done
python3 -c "print('# cp 2 / serial: %.2fx the tokens/s, %.2fx the activation memory per rank' % (${tps[2]} / ${tps[1]}, ${act[2]} / ${act[1]}))"
load_at_end
