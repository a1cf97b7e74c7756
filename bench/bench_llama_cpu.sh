#!/usr/bin/env bash
# Llama CPU benchmark (measures, never fails): tokens/s of Relay's model.type = "llama" (fp32; bf16 with
# train.precision = "bf16") and of its PyTorch twin bench/torch_llama.py (transformers' LlamaForCausalLM
# built from the same config with random weights, SDPA attention; the same shapes, batch, AdamW,
# clipping and threads) under PyTorch 2.x from PyPI (fp32; bf16 autocast), back to back per model:
#   llama-small:  configs/llama-small-bytes.toml (V 256, T 64, 4 layers, 4 heads, 2 kv heads, 128 wide,
#                 SwiGLU 352, untied), batch 16
#   smollm2-135m: configs/smollm2-135m.toml (V 49152, 30 layers, 9 heads, 3 kv heads, 576 wide, SwiGLU
#                 1536, tied) with T 1024 (the config's 2048 halved), batch 2, 1 micro-batch: many
#                 seconds a step on 2 cores, hence its own, small step count
# Every other config key (init_std, rope_theta, norm_eps, AdamW's hyperparameters, clipping) is the
# config's, for Relay and the twin alike. Tokens: random, in an HDF5 token file.
# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) steps (at most steps - 1).
# GFLOP/s = (6 x matmul parameters + 12 x n_layer x n_embd x T) x tokens/s; matmul parameters: all but an
# untied embedding table (nanoGPT's count, with the lookup table left out as it does no matmul).
# PyTorch 2.x + transformers: tests/torch/pypi_venv.py hf makes their venv once (~2 GB of wheels from
# PyPI, cached in ${XDG_CACHE_HOME:-~/.cache}/relay-torch2) and reuses it.
# Usage: bench/bench_llama_cpu.sh [relay binary (build/relay)] [steps (20)] [threads (all cores)]
#                                 [smollm2-135m steps (6)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
THREADS=${3:-$(nproc)}
STEPS_SMOL=${4:-6}
work=$(mktemp -d /tmp/relay-bench-llama-XXXXXX)
trap 'rm -rf "$work"' EXIT
skip_of() { local k=$(($1 / 4 > 2 ? $1 / 4 : 2)); echo $((k < $1 ? k : $1 - 1)); }  # at least 1 step measured
((STEPS >= 2 && STEPS_SMOL >= 2)) || { echo "bench_llama_cpu.sh: steps must be >= 2 (got $STEPS, $STEPS_SMOL)" >&2; exit 2; }

torch2=""
if torch2=$(/usr/bin/python3 tests/torch/pypi_venv.py hf 2> >(tee "$work/venv.err" >&2)); then
  torch2_v=$("$torch2" -c "import torch, transformers as t; print(torch.__version__.split('+')[0], 'transformers',
    t.__version__)" 2>/dev/null) || torch2=""
fi
[[ -z $torch2 ]] && torch2_v="2.x"

printf "# Relay Llama CPU benchmark: %d threads; Relay and PyTorch back to back per model\n" "$THREADS"
cpu_info
printf "# torch2: PyTorch %s from PyPI (%s); LlamaForCausalLM, attn_implementation sdpa\n" "$torch2_v" \
  "${torch2:-not available: $(tail -c 300 "$work/venv.err" | tr '\n' ' ')}"
printf "# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) (< steps) steps (the 'skip' column)\n"
printf "# check: ok when Relay's parameter count and the twin's equal the formula's and every run's first loss is\n"
printf "#        within 5%% of ln(V) (a small-init model starts near uniform); n/a: that run failed (notes below)\n"
printf "#%-12s %-42s %5s %4s %11s %11s %11s %13s %7s %7s %6s\n" "" "" "" "" "relay" "relay" "torch2" "torch2" \
  "relay /" "torch2" ""
printf "#%-12s %-42s %5s %4s %11s %11s %11s %13s %7s %7s %6s\n" "model" "shape (V, T, L, H, KV, C, F, batch)" \
  "steps" "skip" "fp32" "bf16" "fp32 sdpa" "bf16 autocast" "fp32" "bf16" "check"
printf "#%-12s %-42s %5s %4s %11s %11s %11s %13s %7s %7s %6s\n" "" "" "" "" "(tok/s)" "(tok/s)" "(tok/s)" \
  "(tok/s)" "" "" ""

note() { echo "$*" >>"$work/notes"; }

relay_run() {  # name config precision T B steps skip -> "tokens/s params loss1" or "n/a"
  local name=$1 config=$2 prec=$3 T=$4 B=$5 steps=$6 skip=$7
  local dir="$work/run-$name-$prec"
  if ! OMP_NUM_THREADS=$THREADS "$RELAY" train --config "$config" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/$name.h5\"" --set 'data.eval=""' --set 'train.device="cpu"' \
      --set "train.precision=\"$prec\"" --set train.steps="$steps" --set train.log_every=1 --set train.batch_size="$B" \
      --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 --set train.threads="$THREADS" \
      --set model.block_size="$T" --set 'checkpoint.resume="none"' >"$dir.out" 2>&1; then
    note "# $name relay $prec: n/a: $(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"
    echo n/a; return
  fi
  python3 - "$dir/metrics.jsonl" "$skip" "$(sed -n 's/.*model llama, \([0-9]*\) parameters.*/\1/p' "$dir.out")" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > int(sys.argv[2])]
print("%.1f %s %.4f" % (sum(w) / len(w), sys.argv[3] or 0, r[0]["loss"]))
PY
}

torch_run() {  # label mode config T B steps skip -> "tokens/s params loss1" or "n/a"
  local label=$1 mode=$2 config=$3 T=$4 B=$5 steps=$6 skip=$7
  local out
  if [[ -z $torch2 ]]; then echo n/a; return; fi
  if ! out=$(OMP_NUM_THREADS=$THREADS "$torch2" bench/torch_llama.py "$config" "$steps" "$THREADS" "$T" "$B" \
      "$mode" "$skip" 2>&1); then
    note "# $label $mode: n/a: $(echo "$out" | tail -n1)"
    echo n/a; return
  fi
  echo "$out" | tail -n1 | sed -n 's/.*params \([0-9]*\) .*tokens_per_s \([0-9.]*\) .*loss1 \([0-9.na]*\).*/\2 \1 \3/p'
}

shape_of() {  # config T B -> "V T L H KV C F B tied" (the model's shape with the bench's T and batch)
  python3 - "$@" <<'PY'
import sys, tomllib
m = tomllib.load(open(sys.argv[1], "rb"))["model"]
print(m["vocab_size"], sys.argv[2], m["n_layer"], m["n_head"], m.get("n_kv_head", m["n_head"]), m["n_embd"],
      m["ffn_hidden"], sys.argv[3], int(m.get("tie_embeddings", False)))
PY
}

bench() {  # name config T B steps
  local name=$1 config=$2 T=$3 B=$4 steps=$5
  local skip shape V; skip=$(skip_of "$steps")
  shape=$(shape_of "$config" "$T" "$B"); V=${shape%% *}
  /usr/bin/python3 - "$work/$name.h5" "$V" $((B * T * (steps + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
path, V, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with h5py.File(path, "w") as f:
    d = f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, V, n, dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = V, "bytes" if V <= 256 else "gpt2"  # a name Relay knows; the tokens are random
PY
  local args=("$config" "$T" "$B" "$steps" "$skip")
  local r32 r16 t32 t16
  r32=$(relay_run "$name" "$config" fp32 "$T" "$B" "$steps" "$skip")
  r16=$(relay_run "$name" "$config" bf16 "$T" "$B" "$steps" "$skip")
  t32=$(torch_run "$name torch2" fp32 "${args[@]}")
  t16=$(torch_run "$name torch2" bf16 "${args[@]}")
  python3 - "$name" "$shape $steps $skip" "$r32" "$r16" "$t32" "$t16" >>"$work/rows" <<'PY'
import math, sys
name, args, *runs = sys.argv[1:]
V, T, L, H, KV, C, F, B, tied, steps, skip = (int(a) for a in args.split())
hd = C // H
layer = C * H * hd + 2 * C * KV * hd + H * hd * C + 3 * C * F + 2 * C  # q, k, v, o, gate/up/down, 2 RMSNorms
params = V * C * (1 if tied else 2) + L * layer + C  # embedding (+ untied lm_head), blocks, final norm
flop_per_token = 6 * (params - (0 if tied else V * C)) + 12 * L * H * hd * T
runs = [r.split() if r != "n/a" else None for r in runs]
ok = all(r is None or (int(r[1]) == params and abs(float(r[2]) - math.log(V)) <= 0.05 * math.log(V))
         for r in runs)
tps = [float(r[0]) if r else None for r in runs]
ok = "n/a" if all(r is None for r in runs) else "ok" if ok else "BAD"
print(name, "(%d, %d, %d, %d, %d, %d, %d, %d)" % (V, T, L, H, KV, C, F, B), steps, skip, flop_per_token,
      *["n/a" if t is None else "%.1f" % t for t in tps], ok, sep="|")
for label, r in zip(("relay fp32", "relay bf16", "torch2 fp32", "torch2 bf16"), runs):
    if r is not None and (int(r[1]) != params or abs(float(r[2]) - math.log(V)) > 0.05 * math.log(V)):
        print("# %s %s: %s parameters (formula %d), first loss %s (ln V %.4f)" % (name, label, r[1], params, r[2],
              math.log(V)), file=sys.stderr)
PY
  IFS='|' read -r n shp s k fpt a b c d chk < <(tail -n1 "$work/rows")
  ratio() { [[ $1 == n/a || $2 == n/a ]] && echo n/a || python3 -c "print('%.2fx' % ($1 / $2))"; }
  printf " %-12s %-42s %5s %4s %11s %11s %11s %13s %7s %7s %6s\n" "$n" "$shp" "$s" "$k" "$a" "$b" "$c" "$d" \
    "$(ratio "$a" "$c")" "$(ratio "$b" "$d")" "$chk"
}

bench llama-small configs/llama-small-bytes.toml 64 16 "$STEPS" 2>>"$work/notes"
bench smollm2-135m configs/smollm2-135m.toml 1024 2 "$STEPS_SMOL" 2>>"$work/notes"

echo
printf "# GFLOP/s = GFLOP/token x tokens/s, GFLOP/token = (6 x matmul parameters + 12 x n_layer x n_embd x T) / 1e9\n"
printf "#%-12s %12s %11s %11s %11s %11s\n" "model" "GFLOP/token" "relay fp32" "relay bf16" "torch2 fp32" "torch2 bf16"
while IFS='|' read -r n shp s k fpt a b c d chk; do
  python3 - "$n" "$fpt" "$a" "$b" "$c" "$d" <<'PY'
import sys
n, fpt, *tps = sys.argv[1:]
g = int(fpt) / 1e9
print(" %-12s %12.4g" % (n, g), *["%11s" % ("n/a" if t == "n/a" else "%.1f" % (g * float(t))) for t in tps])
PY
done <"$work/rows"
[[ -s $work/notes ]] && { echo; cat "$work/notes"; }
load_at_end
