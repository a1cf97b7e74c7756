#!/usr/bin/env bash
# GPT CPU benchmark (measures, never fails): tokens/s of Relay and of its PyTorch twin
# (bench/torch_gpt.py: the same architecture, batch, AdamW and threads) in the same run, for
#   small:   configs/gpt-small-bytes.toml's model (4 layers, 128 wide, 64 tokens, vocab 256), batch 16
#   124M:    a GPT-2 124M-shaped block stack (768 wide, 12 heads, 256 tokens, vocab 50257), 2 layers, batch 4
# GFLOP/s = (6 x parameters + 12 x n_layer x n_embd x T) x tokens/s (training FLOPs per token, as
# nanoGPT's MFU estimate counts them).
# Usage: bench/bench_gpt_cpu.sh [relay binary (build/relay)] [steps (20)] [threads (all cores)]
set -euo pipefail
cd "$(dirname "$0")/.."
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
THREADS=${3:-$(nproc)}
work=$(mktemp -d /tmp/relay-bench-gpt-XXXXXX)
trap 'rm -rf "$work"' EXIT
printf "# Relay GPT CPU benchmark: %s, %d threads, %d steps (mean tokens/s over the steps after the first %d)\n" \
  "$(lscpu | sed -n 's/^Model name: *//p')" "$THREADS" "$STEPS" "$((STEPS / 4))"
printf "%-8s %-34s %12s %9s %12s %9s %7s\n" "model" "shape (V, T, L, H, C, batch)" "relay tok/s" "GFLOP/s" "torch tok/s" \
  "GFLOP/s" "ratio"
bench() {  # name V T L H C B
  local name=$1 V=$2 T=$3 L=$4 H=$5 C=$6 B=$7
  /usr/bin/python3 - "$work/$name.h5" "$V" $((B * T * (STEPS + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
path, V, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with h5py.File(path, "w") as f:
    d = f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, V, n, dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = V, "bytes" if V <= 256 else "gpt2"
PY
  local dir="$work/run-$name"
  OMP_NUM_THREADS=$THREADS "$RELAY" train --config configs/gpt-small-bytes.toml --set "run.dir=\"$dir\"" \
    --set "data.train=\"$work/$name.h5\"" --set 'data.eval=""' --set train.steps=$STEPS --set train.log_every=1 \
    --set train.batch_size=$B --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 --set train.threads=$THREADS --set model.vocab_size=$V \
    --set model.block_size=$T --set model.n_layer=$L --set model.n_head=$H --set model.n_embd=$C >/dev/null
  local relay_tps params
  relay_tps=$(python3 -c "
import json
r=[json.loads(l) for l in open('$dir/metrics.jsonl') if '\"loss\"' in l]
w=[x['tokens_per_s'] for x in r if x['step']>$((STEPS / 4))]
print('%.1f'%(sum(w)/len(w)))")
  local torch_out torch_tps="n/a" tparams
  if torch_out=$(/usr/bin/python3 bench/torch_gpt.py "$STEPS" "$THREADS" "$V" "$T" "$L" "$H" "$C" "$B" 2>/dev/null); then
    torch_tps=$(echo "$torch_out" | sed -n 's/.*tokens_per_s \([0-9.]*\).*/\1/p')
    tparams=$(echo "$torch_out" | sed -n 's/.*params \([0-9]*\).*/\1/p')
  fi
  params=${tparams:-0}
  python3 - "$name" "$V $T $L $H $C $B" "$relay_tps" "$torch_tps" "$params" "$L" "$C" "$T" <<'PY'
import sys
name, shape, r, t, params, L, C, T = sys.argv[1:]
fpt = 6 * int(params) + 12 * int(L) * int(C) * int(T)
r = float(r)
tt = float(t) if t != "n/a" else None
print("%-8s %-34s %12.1f %9.1f %12s %9s %7s" % (name, "(" + ", ".join(shape.split()) + ")", r, fpt * r / 1e9,
      "%.1f" % tt if tt else "n/a", "%.1f" % (fpt * tt / 1e9) if tt else "n/a", "%.2fx" % (r / tt) if tt else "n/a"))
PY
}
bench small 256 64 4 4 128 16
bench 124M 50257 256 2 12 768 4
