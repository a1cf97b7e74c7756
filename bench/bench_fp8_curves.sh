#!/usr/bin/env bash
# FP8 training's loss curves against bf16 over the issue's 300 steps (measures, never fails; issue 43's "the fp8 loss
# curve within 1% of the bf16 one at the end for tensorwise and within 0.5% for blockwise") on real text: Debian's
# fortunes, byte-level. The suite checks the same bounds on tiny models (tests/test_fp8_training_mpi.cpp).
#   setting "config" (default): configs/gpt-small-bytes.toml and configs/llama-small-bytes.toml at their own widths
#           (128 wide, 4 layers, 4 heads; the Llama's 2 key/value heads and SwiGLU 352), lr 1e-3 with 30 warmup steps,
#           cosine to 1e-4: a setting where fp32 and bf16 end within 0.3% of each other, so a difference is the recipe's;
#   setting "narrow": the same models cut to 32 wide (SwiGLU 96) at lr 3e-3, 10 warmup steps, cosine to 3e-4: a
#           trajectory-sensitive setting (fp32 ends 0.9% from bf16, two bf16 seeds 2-3% apart; changing how one bias
#           add rounds moved the GPT's blockwise result from 0.7% to 2.9%), kept to show why it cannot judge a recipe.
# T 64, batch 16. Per model: the loss every 50 steps in bf16, fp32, fp8 tensorwise and fp8 blockwise, and two more
# bf16 runs with other seeds (model.seed and data.seed): the spread of one precision's final loss. "At the end" is
# the mean loss over the last 30 steps (the same batches in every run of one seed); the relative difference of that
# mean from bf16's is what the issue's bounds apply to; the mean of the per-step relative differences is beside it.
# Usage: bench/bench_fp8_curves.sh [relay binary (build/relay)] [steps (300)] [threads (all cores)] [config|narrow]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-300}
THREADS=${3:-$(nproc)}
SETTING=${4:-config}
work=$(mktemp -d /tmp/relay-bench-fp8c-XXXXXX)
trap 'rm -rf "$work"' EXIT

texts=()
for f in /usr/share/games/fortunes/*; do [[ -f $f && $f != *.* ]] && texts+=("$f"); done
if [[ ${#texts[@]} -eq 0 ]]; then echo "# no fortunes (apt-get install fortunes): nothing to measure"; exit 0; fi
"$RELAY" data tokenize --in "${texts[@]}" --out "$work/text.h5" --tokenizer bytes >/dev/null

printf "# Relay FP8 loss curves against bf16: %d steps, %d threads, Debian's fortunes (bytes), T 64, batch 16, setting %s\n" \
  "$STEPS" "$THREADS" "$SETTING"
cpu_info
if [[ $SETTING == narrow ]]; then
  declare -A MODEL=(
    [gpt]="configs/gpt-small-bytes.toml --set model.n_embd=32"
    [llama]="configs/llama-small-bytes.toml --set model.n_embd=32 --set model.ffn_hidden=96"
  )
  schedule=(--set optimizer.lr=3e-3 --set lr_schedule.warmup_steps=$((STEPS < 10 ? STEPS : 10)) --set lr_schedule.min_lr=3e-4)
else
  declare -A MODEL=([gpt]="configs/gpt-small-bytes.toml" [llama]="configs/llama-small-bytes.toml")
  schedule=(--set optimizer.lr=1e-3 --set lr_schedule.warmup_steps=$((STEPS < 30 ? STEPS : 30)) --set lr_schedule.min_lr=1e-4)
fi
for model in gpt llama; do
  read -r -a args <<< "${MODEL[$model]}"
  for run in bf16 fp32 fp8:tensorwise fp8:blockwise bf16:seed2 bf16:seed3; do
    prec=${run%%:*} recipe=""
    [[ $run == *:* ]] && recipe=${run#*:}
    dir="$work/$model-${run/:/-}"
    extra=()
    case $recipe in
      seed2) extra=(--set model.seed=2 --set data.seed=3) ;;
      seed3) extra=(--set model.seed=3 --set data.seed=4) ;;
      ?*) extra=(--set "train.fp8_recipe=\"$recipe\"") ;;
    esac
    OMP_NUM_THREADS=$THREADS "$RELAY" train --config "${args[0]}" "${args[@]:1}" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/text.h5\"" --set 'data.eval=""' --set "train.precision=\"$prec\"" "${extra[@]}" \
      --set train.steps="$STEPS" --set train.log_every=1 --set train.micro_batches=1 --set train.eval_every=0 \
      --set train.batch_size=16 "${schedule[@]}" --set train.threads="$THREADS" --set checkpoint.every=0 \
      >"$dir.out" 2>&1 \
      || { printf "# %s %s failed: %s\n" "$model" "$run" "$(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"; }
  done
  python3 - "$work" "$model" "$STEPS" <<'PY'
import json, os, sys
work, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(run):
    p = os.path.join(work, f"{model}-{run}", "metrics.jsonl")
    l = [json.loads(x)["loss"] for x in open(p) if '"loss"' in x] if os.path.exists(p) else []
    return l if len(l) == steps else None
ref = losses("bf16")
runs = {r: losses(r) for r in ("fp32", "fp8-tensorwise", "fp8-blockwise", "bf16-seed2", "bf16-seed3")}
print(f"# {model}: loss at step (bf16, fp32, fp8 tensorwise, fp8 blockwise, bf16 seed 2, bf16 seed 3)")
for s in [1] + list(range(50, steps + 1, 50)):
    print(f"  step {s:5d}  " + "  ".join(f"{l[s - 1]:8.4f}" if l else "     n/a" for l in [ref] + list(runs.values())))
last = min(30, steps)
end = lambda l: sum(l[-last:]) / last
for r, l in runs.items():
    if not l or not ref:
        print(f"  {model} {r}: incomplete")
        continue
    per_step = sum(abs(a - b) / b for a, b in zip(l[-last:], ref[-last:])) / last
    print(f"  {model} {r:15s} mean loss of the last {last} steps {end(l):.4f} vs bf16 {end(ref):.4f}: "
          f"{(end(l) - end(ref)) / end(ref):+.2%} (mean per-step |difference| {per_step:.2%})")
PY
done
printf "# the issue's bounds at the end: tensorwise within 1%%, blockwise within 0.5%%; fp32's difference from bf16 is the\n"
printf "# spread two precisions' trajectories reach anyway (the same data, init and schedule), the seeds' that of one precision\n"
