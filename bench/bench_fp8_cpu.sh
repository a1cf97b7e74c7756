#!/usr/bin/env bash
# FP8 training's CPU cost (measures, never fails): tokens/s of train.precision = "fp8" (tensorwise and blockwise)
# against "bf16" on the same GPT, back to back. On the CPU FP8 is an exact emulation (kernels/cpu/fp8_gemm.*: each
# activation and gradient quantised per use, each weight once a step, its codes widened to f32 and multiplied by sgemm), so it is correct, not fast: the
# column to read is the ratio, the cost of the emulation's extra passes. A weight's codes are made once per optimizer
# step (model/param.hpp's Fp8WeightCache), so more micro-batches a step quantise the weights less often per token.
#   model: configs/gpt-small-bytes.toml's shape (V 256, T 64, 4 layers, 4 heads, 128 wide), batch 16 in 4
#          micro-batches, on uniformly random byte tokens (throughput does not depend on the text)
# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) steps.
# check: ok when every run's first loss is within 5% of ln(256) and its last loss is finite.
# Usage: bench/bench_fp8_cpu.sh [relay binary (build/relay)] [steps (20)] [threads (all cores)] [micro-batches (4)]
#        [a second relay binary, e.g. an older build: its three rows follow, back to back, each against its own bf16]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
THREADS=${3:-$(nproc)}
MICRO=${4:-4}
BINARIES=("$RELAY")
[[ -n ${5:-} ]] && BINARIES+=("$(realpath "$5")")
work=$(mktemp -d /tmp/relay-bench-fp8-XXXXXX)
trap 'rm -rf "$work"' EXIT
skip=$((STEPS / 4 > 2 ? STEPS / 4 : 2))
/usr/bin/python3 - "$work/bytes.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 256, 200000, dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
PY

printf "# Relay FP8 CPU cost: GPT V 256, T 64, 4 layers, 4 heads, 128 wide, batch 16 in %d micro-batches; %d steps, %d threads\n" \
  "$MICRO" "$STEPS" "$THREADS"
cpu_info
printf "#%-22s %-8s %12s %10s %10s %10s %6s\n" "precision" "binary" "tokens/s" "vs bf16" "loss 1" "loss last" "check"
for bi in "${!BINARIES[@]}"; do
RELAY=${BINARIES[$bi]}
tag=$([[ $bi == 0 ]] && echo "first" || echo "second")
bf16_rate=""
for run in bf16 fp8:tensorwise fp8:blockwise; do
  prec=${run%%:*}
  recipe=""
  [[ $run == *:* ]] && recipe=${run#*:}
  dir="$work/run-$bi-${run/:/-}"
  extra=()
  [[ -n $recipe ]] && extra=(--set "train.fp8_recipe=\"$recipe\"")
  if ! OMP_NUM_THREADS=$THREADS "$RELAY" train --config configs/gpt-small-bytes.toml --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/bytes.h5\"" --set 'data.eval=""' --set "train.precision=\"$prec\"" "${extra[@]}" \
      --set train.steps="$STEPS" --set train.log_every=1 --set train.micro_batches="$MICRO" --set train.eval_every=0 \
      --set lr_schedule.warmup_steps=0 --set train.threads="$THREADS" >"$dir.out" 2>&1; then
    printf " %-22s %-8s %12s (%s)\n" "$run" "$tag" "n/a" "$(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"
    continue
  fi
  read -r rate l1 ll ok < <(python3 - "$dir/metrics.jsonl" "$skip" <<'PY'
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > int(sys.argv[2])]
l1, ll = r[0]["loss"], r[-1]["loss"]
ok = abs(l1 - math.log(256)) < 0.05 * math.log(256) and ll is not None and math.isfinite(ll)
print("%.1f %.4f %.4f %s" % (sum(w) / len(w), l1, ll, "ok" if ok else "FAIL"))
PY
)
  [[ $run == bf16 ]] && bf16_rate=$rate
  ratio=$(python3 -c "print('%.2fx' % ($rate / $bf16_rate))" 2>/dev/null || echo n/a)
  printf " %-22s %-8s %12s %10s %10s %10s %6s\n" "$run" "$tag" "$rate" "$ratio" "$l1" "$ll" "$ok"
done
done
printf "# binary: first = %s, second = %s\n" "${BINARIES[0]}" "${BINARIES[1]:-none}"
printf "# vs bf16 = tokens/s / bf16's tokens/s (below 1: FP8's emulation costs that much more per token)\n"
