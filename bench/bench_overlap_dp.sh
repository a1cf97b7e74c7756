#!/usr/bin/env bash
# Data-parallel communication overlap on the CPU (parallel.overlap; measures, never fails): a GPT-2-small-wide model cut
# to 4 layers (n_embd 768, vocabulary 50257: 85 M parameters, 340 MB of f32 gradients a step) on dp 2 (2 ranks x 1
# thread), one 128-token sequence per rank and step, 25 MB buckets, ZeRO 0 and 1, overlap off and on back to back.
# step s: the mean of metrics.jsonl's step_time_s after the first 2 steps; exposed comm s: rank 0's mean wait on its
# data-parallel collectives per step (exposed_comm_s), the part of the gradient reduction the backward did not hide.
# On one machine the "link" is shared memory and the all-reduce's copies and sums take the same 2 cores as the
# compute: what overlap can hide here is the waiting, not those cycles.
# Usage: bench/bench_overlap_dp.sh [relay binary (build/relay)] [steps (8)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-8}
work=$(mktemp -d /tmp/relay-bench-overlap-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_gpt2_tokens "$work/tokens.h5" $((2 * 128 * (STEPS + 1) + 1))
printf "# overlap benchmark: GPT 4 x 768, vocabulary 50257, dp 2 (2 ranks x 1 thread), 1 sequence of 128 per rank\n"
cpu_info
printf "%-6s %-8s %10s %16s %10s\n" "zero" "overlap" "step s" "exposed comm s" "loss"
for zero in 0 1; do
  for overlap in false true; do
    dir="$work/z${zero}_$overlap"
    mpirun --oversubscribe -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train --config configs/gpt2-124m.toml \
      --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=$STEPS \
      --set model.n_layer=4 --set model.block_size=128 --set train.log_every=1 --set lr_schedule.warmup_steps=0 \
      --set train.batch_size=2 --set train.micro_batches=1 --set parallel.dp=2 --set optimizer.zero=$zero \
      --set parallel.overlap=$overlap --set checkpoint.every=0 --set "checkpoint.dir=\"$dir/ckpt\"" \
      >"$dir.log" 2>&1 || { echo "zero $zero overlap $overlap failed:"; tail -5 "$dir.log"; continue; }
    /usr/bin/python3 - "$dir" "$zero" "$overlap" <<'PY'
import json, sys
d, zero, overlap = sys.argv[1:4]
recs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][2:]
mean = lambda k: sum(r[k] for r in recs) / len(recs)
print("%-6s %-8s %10.3f %16.3f %10.5f" % (zero, overlap, mean("step_time_s"), mean("exposed_comm_s"), recs[-1]["loss"]))
PY
  done
done
load_at_end
