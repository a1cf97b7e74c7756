#!/usr/bin/env bash
# Context-parallel communication overlap on the CPU (parallel.overlap; measures, never fails): configs/llama-small-bytes
# .toml at T tokens (4096), one sequence a step, cp 2 on 2 ranks of 1 thread, overlap off and on back to back.
# step s: the mean of metrics.jsonl's step_time_s after the first 2 steps; exposed comm s: rank 0's mean wait per step
# on its cp key/value exchanges (exposed_comm_s; dp is 1): with overlap what the own rows' attention (1/cp of the
# rank's attention work) did not hide of the gathers, plus the key/value gradients' reduce-scatters.
# On one machine the "link" is shared memory, and the gather's copies take the same cores as the compute.
# Usage: bench/bench_overlap_cp.sh [relay binary (build/relay)] [steps (6)] [T (4096)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-6}
T=${3:-4096}
work=$(mktemp -d /tmp/relay-bench-overlap-cp-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_byte_tokens "$work/tokens.h5" $((T * (STEPS + 1) + 1))
printf "# cp overlap benchmark: llama-small-bytes at T %d, batch 1, cp 2 (2 ranks x 1 thread), %d steps\n" "$T" "$STEPS"
cpu_info
printf "%-8s %10s %16s %10s\n" "overlap" "step s" "exposed comm s" "loss"
for overlap in false true; do
  dir="$work/run-$overlap"
  mpirun --oversubscribe -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train --config configs/llama-small-bytes.toml \
    --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set model.block_size="$T" \
    --set train.batch_size=1 --set train.micro_batches=1 --set train.steps="$STEPS" --set train.log_every=1 \
    --set lr_schedule.warmup_steps=0 --set parallel.cp=2 --set train.threads=1 --set parallel.overlap=$overlap \
    >"$dir.log" 2>&1 || { echo "overlap $overlap failed:"; tail -5 "$dir.log"; continue; }
  /usr/bin/python3 - "$dir" "$overlap" <<'PY'
import json, sys
d, overlap = sys.argv[1:3]
recs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][2:]
mean = lambda k: sum(r[k] for r in recs) / len(recs)
print("%-8s %10.3f %16.4f %10.5f" % (overlap, mean("step_time_s"), mean("exposed_comm_s"), recs[-1]["loss"]))
PY
done
load_at_end
