#!/usr/bin/env bash
# GPU language-model benchmark (measures, never fails), one GPU, bf16, T 1024, back to back:
#   gpt:   GPT-2 124M (configs/gpt2-124m.toml) against nanoGPT's module (bench/torch_gpu_lm.py gpt)
#   llama: SmolLM2-135M's shape at T 1024 (configs/smollm2-135m.toml) against transformers' LlamaForCausalLM
# PyTorch: SDPA (flash) attention, bf16 autocast, fused AdamW, eager and torch.compile. Same batch
# (micro-batch x micro-batches x 1024 tokens), same optimizer settings, random tokens.
# tokens/s: mean over the steps after the first 3 (Relay: metrics.jsonl's tokens_per_s; PyTorch: CUDA-synchronised
# step times). TFLOP/s and MFU by nanoGPT's count, (6 x parameters + 12 x n_layer x n_embd x T) per token, against
# the H100/H200 SXM dense bf16 peak of 989.4 TFLOP/s. GPU memory: the peak of nvidia-smi's memory.used while the
# run lasts (CUDA context and library workspaces included, for both), and PyTorch's max_memory_allocated.
# Usage: bench/bench_gpu_lm.sh [relay binary (build/relay)] [steps (20)] [micro-batch (16)] [micro-batches (4)]
#        [models ("gpt llama")] [torch modes ("eager compile"; "none": Relay alone)]
# RELAY_TRACE=1 also records steps [10, 12] into <run>/trace.json and prints the top kernels' share.
# RELAY_SETS="key=value ...": more --set overrides for Relay's runs (e.g. model.vocab_size=50304, nanoGPT's padding).
set -uo pipefail
cd "$(dirname "$0")/.."
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
MB=${3:-16}
M=${4:-4}
MODELS=${5:-gpt llama}
MODES=${6:-eager compile}
work=${BENCH_WORK:-$(mktemp -d /tmp/relay-gpulm-XXXXXX)}
mkdir -p "$work"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
printf "# Relay GPU LM benchmark: %s; %d steps, batch %d x %d x 1024 tokens, bf16\n" "$gpu" "$STEPS" "$MB" "$M"

mem_watch() {  # file: samples memory.used (MiB) every 100 ms until killed
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$1" 2>/dev/null
}
peak_of() { sort -n "$1" | tail -1; }

python3 - "$work/tokens.h5" $((MB * M * 1024 * (STEPS + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 49152, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 49152, "gpt2"
PY

printf "%-6s %-22s %12s %9s %7s %12s %12s %9s\n" model run tokens/s TFLOP/s MFU gpu_mem_MiB torch_alloc loss
for model in $MODELS; do
  case $model in
    gpt) config=configs/gpt2-124m.toml; extra=() ;;
    llama) config=configs/smollm2-135m.toml; extra=(--set model.block_size=1024) ;;
  esac
  dir="$work/relay-$model"
  trace=()
  [[ ${RELAY_TRACE:-0} == 1 ]] && trace=(--set "trace.steps=[10, 12]")
  for kv in ${RELAY_SETS:-}; do trace+=(--set "$kv"); done
  mem_watch "$dir.mem" & w=$!
  "$RELAY" train --config "$config" "${extra[@]}" "${trace[@]}" --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" \
    --set 'data.eval=""' --set 'train.device="cuda"' --set 'train.precision="bf16"' --set train.steps="$STEPS" \
    --set train.log_every=1 --set train.batch_size=$((MB * M)) --set train.micro_batches="$M" \
    --set lr_schedule.warmup_steps=0 --set 'checkpoint.resume="none"' --set checkpoint.every=0 >"$dir.out" 2>&1
  rc=$?
  kill $w 2>/dev/null; wait $w 2>/dev/null
  if [[ $rc != 0 ]]; then
    echo "$model relay: exit $rc"; tail -n 15 "$dir.out"
  else
    python3 - "$dir/metrics.jsonl" "$(sed -n 's/.*model [a-z]*, \([0-9]*\) parameters.*/\1/p' "$dir.out" | head -1)" \
      "$(peak_of "$dir.mem")" "$model" <<'PY'
import json, sys
path, params, mem, model = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
r = [json.loads(l) for l in open(path) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > 3]
tps = sum(w) / len(w)
L, C = (12, 768) if model == "gpt" else (30, 576)
fpt = 6 * int(params or 0) + 12 * L * C * 1024
print("%-6s %-22s %12.0f %9.1f %6.1f%% %12s %12s %9.4f" % (model, "relay bf16 (%s params)" % params, tps, fpt * tps / 1e12,
      100 * fpt * tps / 1e12 / 989.4, mem, "-", r[-1]["loss"]))
PY
    [[ ${RELAY_TRACE:-0} == 1 && -f $dir/trace.json ]] && python3 scripts/trace_summary.py "$dir/trace.json" 2>/dev/null | head -40
  fi
  for mode in $MODES; do
    [[ $mode == none ]] && continue
    mem_watch "$work/torch-$model-$mode.mem" & w=$!
    out=$(python3 bench/torch_gpu_lm.py "$model" "$mode" "$STEPS" "$MB" "$M" 2>"$work/torch-$model-$mode.err")
    rc=$?
    kill $w 2>/dev/null; wait $w 2>/dev/null
    if [[ $rc != 0 ]]; then echo "$model torch $mode: exit $rc"; tail -n 8 "$work/torch-$model-$mode.err"; continue; fi
    echo "$out" >>"$work/torch.lines"
    set -- $(echo "$out" | sed -n 's/^torch \([^ ]*\) .*tokens_per_s \([0-9]*\) tflops \([0-9.]*\) mfu \([0-9.]*%\) peak_mem_gib \([0-9.]*\) .*loss \([0-9.]*\)$/\1 \2 \3 \4 \5 \6/p')
    printf "%-6s %-22s %12s %9s %7s %12s %12s %9s\n" "$model" "torch $1 $mode" "$2" "$3" "$4" \
      "$(peak_of "$work/torch-$model-$mode.mem")" "$(python3 -c "print(int($5 * 1024))")" "$6"
  done
done
[[ -f $work/torch.lines ]] && { echo; cat "$work/torch.lines"; }
