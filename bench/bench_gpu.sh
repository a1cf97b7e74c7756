#!/usr/bin/env bash
# GPU benchmark (measures, never fails): 8192 -> 4 x 8192 GELU -> 10, batch 8192, AdamW, in fp32, tf32 and
# bf16, next to PyTorch on the same GPU (bench/torch_gpu_mlp.py). TFLOP/s = 6 x params x samples/s. Relay's inputs
# are preloaded on the GPU (data.preload = "auto"), as the PyTorch twin keeps its batch there.
# Usage: bench/bench_gpu.sh [relay binary (build/relay)] [steps (30)]
set -euo pipefail
cd "$(dirname "$0")/.."
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-30}
work=$(mktemp -d /tmp/relay-gpubench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$RELAY" data synth --out "$work/train.h5" --samples 16384 --features 8192 --classes 10 --seed 1 >/dev/null
PARAMS=$((8192*8192+8192 + 3*(8192*8192+8192) + 8192*10+10))
LOG=$((STEPS / 3))
printf "# Relay GPU benchmark: %s, %d steps, %d parameters; samples/s over the log windows after the first\n" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" "$STEPS" "$PARAMS"
printf "%-12s %11s %9s %10s %13s\n" "precision" "samples/s" "TFLOP/s" "final_loss" "input_wait_s"
for prec in fp32 tf32 bf16; do
  dir="$work/$prec"
  "$RELAY" train --config configs/bench_gpu_mlp.toml --set "data.train=\"$work/train.h5\"" --set train.steps=$STEPS \
    --set train.log_every=$LOG --set "train.precision=\"$prec\"" --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 || { tail "$dir.log"; continue; }
  python3 - "$dir/metrics.jsonl" "$prec" "$PARAMS" "$LOG" <<'PY'
import json, sys
path, prec, params, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = [json.loads(l) for l in open(path) if '"loss"' in l]
w = [x["samples_per_s"] for x in r if x["step"] > log]
sps = sum(w) / len(w)
wait = [x.get("input_wait_s", 0) for x in r if x["step"] > log]  # per log window: time the step waited for its batch
print("%-12s %11.1f %9.1f %10.6f %13.3f" % (prec, sps, 6 * params * sps / 1e12, r[-1]["loss"], sum(wait) / len(wait)))
PY
done
python3 bench/torch_gpu_mlp.py || true
