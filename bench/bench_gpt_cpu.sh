#!/usr/bin/env bash
# GPT CPU benchmark (measures, never fails): tokens/s of Relay (fp32; bf16 with train.precision = "bf16")
# and of its PyTorch twin bench/torch_gpt.py (nanoGPT's module: the same architecture, init, batch,
# AdamW, clipping and threads) under PyTorch 2.x from PyPI (fp32 with SDPA attention; bf16 autocast) and
# Debian's torch 1.13 (fp32, explicit attention; only if python3-torch is installed), back to back per model:
#   small: configs/gpt-small-bytes.toml (V 256, T 64, 4 layers, 4 heads, 128 wide), batch 16
#   124M:  configs/gpt2-124m.toml, GPT-2 124M (V 50257, T 1024, 12 layers, 12 heads, 768 wide), batch 2,
#          1 micro-batch: ~10 s a step on 2 cores, hence its own, small step count
# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) steps.
# GFLOP/s = (6 x parameters + 12 x n_layer x n_embd x T) x tokens/s (nanoGPT's training FLOPs per token).
# PyTorch 2.x: tests/torch/pypi_venv.py torch2 makes its venv once (~2 GB of wheels from PyPI, cached in
# ${XDG_CACHE_HOME:-~/.cache}/relay-torch2) and reuses it.
# Usage: bench/bench_gpt_cpu.sh [relay binary (build/relay)] [steps (20)] [threads (all cores)] [124M steps (6)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
THREADS=${3:-$(nproc)}
STEPS_124M=${4:-6}
work=$(mktemp -d /tmp/relay-bench-gpt-XXXXXX)
trap 'rm -rf "$work"' EXIT
skip_of() { echo $(($1 / 4 > 2 ? $1 / 4 : 2)); }

torch2=""
if torch2=$(/usr/bin/python3 tests/torch/pypi_venv.py torch2 2> >(tee "$work/venv.err" >&2)); then
  torch2_v=$("$torch2" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null) || torch2=""
fi
[[ -z $torch2 ]] && torch2_v="2.x"
torch1_v=$(/usr/bin/python3 -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null) || torch1_v=""

printf "# Relay GPT CPU benchmark: %d threads; Relay and PyTorch back to back per model\n" "$THREADS"
cpu_info
printf "# torch2: PyTorch %s from PyPI (%s); torch1: Debian's python3-torch %s\n" "$torch2_v" \
  "${torch2:-not available: $(tail -c 300 "$work/venv.err" | tr '\n' ' ')}" "${torch1_v:-not installed}"
printf "# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) steps (the 'skip' column)\n"
printf "# check: ok when Relay's parameter count and the twin's equal the formula's and every run's first loss is\n"
printf "#        within 5%% of ln(V) (a 0.02-init GPT starts near uniform); n/a: that run failed (notes below)\n"
printf "#%49s %13s %13s %13s %13s %13s %15s\n" "" "relay" "relay" "torch2" "torch2" "torch1" "relay / torch2"
printf "#%-6s %-31s %5s %4s %13s %13s %13s %13s %13s %7s %7s %6s\n" "model" "shape (V, T, L, H, C, batch)" "steps" \
  "skip" "fp32" "bf16" "fp32 sdpa" "bf16 autocast" "fp32" "fp32" "bf16" "check"
printf "#%-6s %-31s %5s %4s %13s %13s %13s %13s %13s %7s %7s %6s\n" "" "" "" "" "(tok/s)" "(tok/s)" "(tok/s)" \
  "(tok/s)" "(tok/s)" "" "" ""

note() { echo "$*" >>"$work/notes"; }

relay_run() {  # name config precision V T L H C B steps skip -> "tokens/s params loss1" or "n/a"
  local name=$1 config=$2 prec=$3 V=$4 T=$5 L=$6 H=$7 C=$8 B=$9 steps=${10} skip=${11}
  local dir="$work/run-$name-$prec"
  if ! OMP_NUM_THREADS=$THREADS "$RELAY" train --config "$config" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/$name.h5\"" --set 'data.eval=""' --set 'train.device="cpu"' \
      --set "train.precision=\"$prec\"" --set train.steps="$steps" --set train.log_every=1 --set train.batch_size="$B" \
      --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 --set train.threads="$THREADS" \
      --set model.vocab_size="$V" --set model.block_size="$T" --set model.n_layer="$L" --set model.n_head="$H" \
      --set model.n_embd="$C" >"$dir.out" 2>&1; then
    note "# $name relay $prec: n/a: $(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"
    echo n/a; return
  fi
  python3 - "$dir/metrics.jsonl" "$skip" "$(sed -n 's/.*model gpt, \([0-9]*\) parameters.*/\1/p' "$dir.out")" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > int(sys.argv[2])]
print("%.1f %s %.4f" % (sum(w) / len(w), sys.argv[3] or 0, r[0]["loss"]))
PY
}

torch_run() {  # label python mode V T L H C B steps skip -> "tokens/s params loss1" or "n/a"
  local label=$1 py=$2 mode=$3; shift 3
  local out
  if [[ -z $py ]]; then echo n/a; return; fi
  if ! out=$(OMP_NUM_THREADS=$THREADS "$py" bench/torch_gpt.py "$7" "$THREADS" "$1" "$2" "$3" "$4" "$5" "$6" "$mode" "$8" 2>&1); then
    note "# $label $mode: n/a: $(echo "$out" | tail -n1)"
    echo n/a; return
  fi
  echo "$out" | tail -n1 | sed -n 's/.*params \([0-9]*\) .*tokens_per_s \([0-9.]*\) .*loss1 \([0-9.na]*\).*/\2 \1 \3/p'
}

bench() {  # name config V T L H C B steps
  local name=$1 config=$2 V=$3 T=$4 L=$5 H=$6 C=$7 B=$8 steps=$9
  local skip; skip=$(skip_of "$steps")
  /usr/bin/python3 - "$work/$name.h5" "$V" $((B * T * (steps + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
path, V, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with h5py.File(path, "w") as f:
    d = f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, V, n, dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = V, "bytes" if V <= 256 else "gpt2"
PY
  local args=("$V" "$T" "$L" "$H" "$C" "$B" "$steps" "$skip")
  local r32 r16 t32 t16 t1
  r32=$(relay_run "$name" "$config" fp32 "${args[@]}")
  r16=$(relay_run "$name" "$config" bf16 "${args[@]}")
  t32=$(torch_run "$name torch2" "$torch2" fp32 "${args[@]}")
  t16=$(torch_run "$name torch2" "$torch2" bf16 "${args[@]}")
  t1=n/a
  [[ -n $torch1_v ]] && t1=$(torch_run "$name torch1" /usr/bin/python3 fp32 "${args[@]}")
  python3 - "$name" "${args[*]}" "$r32" "$r16" "$t32" "$t16" "$t1" >>"$work/rows" <<'PY'
import math, sys
name, args, *runs = sys.argv[1:]
V, T, L, H, C, B, steps, skip = (int(a) for a in args.split())
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # wte (tied head), wpe, blocks, ln_f
flop_per_token = 6 * params + 12 * L * C * T
runs = [r.split() if r != "n/a" else None for r in runs]
ok = all(r is None or ((int(r[1]) == params or r[1] == "0") and abs(float(r[2]) - math.log(V)) <= 0.05 * math.log(V))
         for r in runs)
tps = [float(r[0]) if r else None for r in runs]
print(name, "(%d, %d, %d, %d, %d, %d)" % (V, T, L, H, C, B), steps, skip, flop_per_token,
      *["n/a" if t is None else "%.1f" % t for t in tps], "ok" if ok else "BAD", sep="|")
PY
  IFS='|' read -r n shape s k fpt a b c d e chk < <(tail -n1 "$work/rows")
  ratio() { [[ $1 == n/a || $2 == n/a ]] && echo n/a || python3 -c "print('%.2fx' % ($1 / $2))"; }
  printf " %-6s %-31s %5s %4s %13s %13s %13s %13s %13s %7s %7s %6s\n" "$n" "$shape" "$s" "$k" "$a" "$b" "$c" "$d" "$e" \
    "$(ratio "$a" "$c")" "$(ratio "$b" "$d")" "$chk"
}

bench small configs/gpt-small-bytes.toml 256 64 4 4 128 16 "$STEPS"
bench 124M configs/gpt2-124m.toml 50257 1024 12 12 768 2 "$STEPS_124M"

echo
printf "# GFLOP/s = GFLOP/token x tokens/s, GFLOP/token = (6 x parameters + 12 x n_layer x n_embd x T) / 1e9\n"
printf "#%-6s %12s %11s %11s %11s %11s %11s\n" "model" "GFLOP/token" "relay fp32" "relay bf16" "torch2 fp32" \
  "torch2 bf16" "torch1 fp32"
while IFS='|' read -r n shape s k fpt a b c d e chk; do
  python3 - "$n" "$fpt" "$a" "$b" "$c" "$d" "$e" <<'PY'
import sys
n, fpt, *tps = sys.argv[1:]
g = int(fpt) / 1e9
print(" %-6s %12.4g" % (n, g), *["%11s" % ("n/a" if t == "n/a" else "%.1f" % (g * float(t))) for t in tps])
PY
done <"$work/rows"
[[ -f $work/notes ]] && { echo; cat "$work/notes"; }
load_at_end
