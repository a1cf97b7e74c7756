#!/usr/bin/env bash
# FP8 on one GPU against bf16 (issue 43's GPU targets; measures, never fails), ready for a GPU session:
#   1. bench_fp8_gemm: cuBLASLt FP8 GEMM rate at 8192^3 against bf16, tensorwise and blockwise, the three
#      orientations of a linear layer's GEMMs (target: >= 1.7x bf16 on an H100);
#   2. a Llama with Llama 3 8B's layer shape (hidden 4096, 32 query / 8 key-value heads of 128, SwiGLU 14336,
#      vocabulary 128256, rope_theta 500000) cut to 4 layers, T 8192, micro-batch 1, AdamW, random tokens: tokens/s
#      in bf16, fp8 tensorwise and fp8 blockwise (targets: tensorwise >= 1.3x bf16, blockwise >= 1.15x). tokens/s:
#      mean of metrics.jsonl's tokens_per_s over the steps after the first 3; loss: the last step's (random tokens:
#      a sanity figure, ln 128256 = 11.76 at the start).
# Usage: bench/bench_gpu_fp8.sh [relay binary (build/relay)] [steps (10)] [gemm size (8192)]
# BENCH_FP8_PARTS="gemm llama" (default both); RELAY_FP8_GEMM=plain runs the FP8 GEMMs on Relay's plain kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-10}
SIZE=${3:-8192}
PARTS=${BENCH_FP8_PARTS:-gemm llama}
BIN=$(dirname "$RELAY")
work=${BENCH_WORK:-$(mktemp -d /tmp/relay-gpufp8-XXXXXX)}
mkdir -p "$work"
cpu_info
printf "# GPU: %s\n" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

if [[ " $PARTS " == *" gemm "* ]]; then
  if [[ -x $BIN/bench/bench_fp8_gemm ]]; then "$BIN/bench/bench_fp8_gemm" "$SIZE" 20
  else echo "bench_fp8_gemm: not built ($BIN/bench/bench_fp8_gemm)"; fi
fi

if [[ " $PARTS " == *" llama "* ]]; then
  T=8192
  python3 - "$work/tokens.h5" $((T * (STEPS + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 128256, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 128256, "hf"
PY
  printf "# Llama 3 8B layer shape, 4 layers, T %d, micro-batch 1, %d steps\n" "$T" "$STEPS"
  printf "%-22s %12s %9s %10s %9s\n" run tokens/s "x bf16" peak_MiB loss
  bf16_tps=""
  for run in bf16 tensorwise blockwise; do
    prec=fp8; recipe=(--set "train.fp8_recipe=\"$run\"")
    [[ $run == bf16 ]] && { prec=bf16; recipe=(); }
    dir="$work/llama8b-$run"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$dir.mem" 2>/dev/null & w=$!
    "$RELAY" train --config configs/smollm2-135m.toml --set model.n_layer=4 --set model.n_embd=4096 \
      --set model.n_head=32 --set model.n_kv_head=8 --set model.ffn_hidden=14336 --set model.vocab_size=128256 \
      --set model.block_size=$T --set model.rope_theta=500000.0 --set model.tie_embeddings=false \
      --set model.init_std=0.02 --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' \
      --set 'train.device="cuda"' --set "train.precision=\"$prec\"" "${recipe[@]}" --set train.steps="$STEPS" \
      --set train.log_every=1 --set train.batch_size=1 --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 \
      --set optimizer.lr=3e-4 --set 'checkpoint.resume="none"' --set checkpoint.every=0 >"$dir.out" 2>&1
    rc=$?
    kill $w 2>/dev/null; wait $w 2>/dev/null
    if [[ $rc != 0 ]]; then echo "$run: exit $rc"; tail -n 12 "$dir.out"; continue; fi
    line=$(python3 - "$dir/metrics.jsonl" "$(sort -n "$dir.mem" | tail -1)" "$run" "${bf16_tps:-0}" <<'PY'
import json, sys
path, mem, run, ref = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
r = [json.loads(l) for l in open(path) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > 3] or [x["tokens_per_s"] for x in r]
tps = sum(w) / len(w)
print("%.1f %-22s %12.0f %9s %10s %9.4f" % (tps, run, tps, "%.2f" % (tps / ref) if ref else "1.00", mem, r[-1]["loss"]))
PY
)
    [[ $run == bf16 ]] && bf16_tps=${line%% *}
    echo "${line#* }"
  done
fi
load_at_end
