#!/usr/bin/env bash
# FP8 training's loss curves against bf16 over the issue's 300 steps (measures, never fails; issue 43's "the fp8 loss
# curve within 1% of the bf16 one at the end for tensorwise and within 0.5% for blockwise"). The suite checks 60 steps
# of smaller models (tests/test_fp8_training_mpi.cpp: 300 steps cost minutes there); this runs the long form on real
# text: Debian's fortunes, byte-level.
#   models: configs/gpt-small-bytes.toml and configs/llama-small-bytes.toml cut to 32 wide (4 layers, 4 heads; the
#           Llama's 2 key/value heads and SwiGLU 96) so that the CPU's exact FP8 emulation runs 300 steps in about a
#           minute a run; T 64, batch 16, lr 3e-3 with 10 warmup steps, cosine to 3e-4.
# Per model and recipe: the loss every 50 steps, bf16's (and fp32's, the spread between two precisions) beside it, and the final loss's relative difference from
# bf16's as the mean over the last 30 steps (one step's batch noise does not decide) and at the last step.
# Usage: bench/bench_fp8_curves.sh [relay binary (build/relay)] [steps (300)] [threads (all cores)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-300}
THREADS=${3:-$(nproc)}
work=$(mktemp -d /tmp/relay-bench-fp8c-XXXXXX)
trap 'rm -rf "$work"' EXIT

texts=()
for f in /usr/share/games/fortunes/*; do [[ -f $f && $f != *.* ]] && texts+=("$f"); done
if [[ ${#texts[@]} -eq 0 ]]; then echo "# no fortunes (apt-get install fortunes): nothing to measure"; exit 0; fi
"$RELAY" data tokenize --in "${texts[@]}" --out "$work/text.h5" --tokenizer bytes >/dev/null

printf "# Relay FP8 loss curves against bf16: %d steps, %d threads, Debian's fortunes (bytes), T 64, batch 16\n" \
  "$STEPS" "$THREADS"
cpu_info
declare -A MODEL=(
  [gpt]="configs/gpt-small-bytes.toml --set model.n_embd=32"
  [llama]="configs/llama-small-bytes.toml --set model.n_embd=32 --set model.ffn_hidden=96"
)
for model in gpt llama; do
  read -r -a args <<< "${MODEL[$model]}"
  for run in bf16 fp32 fp8:tensorwise fp8:blockwise; do
    prec=${run%%:*} recipe=""
    [[ $run == *:* ]] && recipe=${run#*:}
    dir="$work/$model-${run/:/-}"
    extra=()
    [[ -n $recipe ]] && extra=(--set "train.fp8_recipe=\"$recipe\"")
    OMP_NUM_THREADS=$THREADS "$RELAY" train --config "${args[0]}" "${args[@]:1}" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/text.h5\"" --set 'data.eval=""' --set "train.precision=\"$prec\"" "${extra[@]}" \
      --set train.steps="$STEPS" --set train.log_every=1 --set train.micro_batches=1 --set train.eval_every=0 \
      --set train.batch_size=16 --set optimizer.lr=3e-3 --set lr_schedule.warmup_steps=10 \
      --set lr_schedule.min_lr=3e-4 --set train.threads="$THREADS" --set checkpoint.every=0 >"$dir.out" 2>&1 \
      || { printf "# %s %s failed: %s\n" "$model" "$run" "$(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"; }
  done
  python3 - "$work" "$model" "$STEPS" <<'PY'
import json, os, sys
work, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(run):
    p = os.path.join(work, f"{model}-{run}", "metrics.jsonl")
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
ref = losses("bf16")
print(f"# {model}: loss at step (bf16, fp32, fp8 tensorwise, fp8 blockwise)")
runs = {r: losses(r) for r in ("fp32", "fp8-tensorwise", "fp8-blockwise")}
for s in [1] + list(range(50, steps + 1, 50)):
    row = [f"{l[s - 1]:.4f}" if len(l) >= s else "n/a" for l in [ref] + list(runs.values())]
    print(f"  step {s:5d}  " + "  ".join(f"{x:>8}" for x in row))
last = min(30, steps)
for r, l in runs.items():
    if len(l) != steps or len(ref) != steps:
        print(f"  {model} {r}: incomplete ({len(l)} of {steps} steps)")
        continue
    mean = sum(abs(a - b) / b for a, b in zip(l[-last:], ref[-last:])) / last
    print(f"  {model} {r:15s} final loss vs bf16: mean relative difference over the last {last} steps {mean:.2e}, "
          f"last step {abs(l[-1] - ref[-1]) / ref[-1]:.2e} ({l[-1]:.4f} vs {ref[-1]:.4f})")
PY
done
printf "# the issue's bounds at the end: tensorwise within 1e-2, blockwise within 5e-3; fp32's difference from bf16 is\n"
printf "# the spread two precisions' trajectories reach anyway (the same data, init and schedule)\n"
