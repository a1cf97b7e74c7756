#!/usr/bin/env bash
# Mixture-of-experts CPU benchmark (measures, never fails): tokens/s of Relay's model.type = "mixtral",
# "qwen3_moe" and "deepseek_v3" against a dense Llama with the same active parameters per token, and against
# transformers' MixtralForCausalLM / Qwen3MoeForCausalLM / DeepseekV3ForCausalLM (bench/torch_moe.py, PyTorch 2.x
# from PyPI; fp32 and bf16 autocast), back to back per model, on the small byte-level configs:
#   llama-small   configs/llama-small-bytes.toml    (dense: SwiGLU 352)
#   mixtral-small configs/mixtral-small-bytes.toml  (8 experts of 176, top 2: 352 active SwiGLU units)
#   qwen3-small   configs/qwen3-moe-small-bytes.toml (layer 0 dense 352, then 8 experts of 176, top 2)
# every one V 256, T 64, 4 layers, 4 heads sharing 2 kv heads, 128 wide, batch 16, 1 micro-batch; and
#   deepseek-small configs/deepseek-v3-small-bytes.toml (2 MLA layers 64 wide, 4 heads; layer 0 dense SwiGLU 176,
#                  layer 1 8 routed experts of 48 in 2 groups, top 2 of 1 group, 1 shared expert of 48)
#   llama-ds       llama-small-bytes.toml cut to deepseek-small's active parameters (2 layers 64 wide, 4 heads
#                  sharing 2, SwiGLU 208: 104,448 matmul weights a token uses against deepseek-small's 103,936)
# "vs dense" of deepseek-small is against llama-ds, of the others against llama-small.
# tokens/s: mean of the per-step tokens/s after the first max(2, steps / 4) steps.
# "vs dense": relay tokens/s / relay's dense Llama's (llama-small or llama-ds) at the same precision (the issues' target: >= 0.75 in bf16);
#   with rounds > 1 also paired by round (each round's ratio, and their median) below the table;
# "vs torch": relay / torch2 at the same precision (target: >= 2 in bf16 for qwen3_moe and deepseek_v3).
# check: ok when every run's first loss is within 5% of ln(V) (a small-init model starts near uniform).
# Rounds: every run that many times, rounds in turn; cells are medians over the rounds (their values are printed).
# Usage: [TORCH2_PYTHON=python3] bench/bench_moe_cpu.sh [relay binary (build/relay)] [steps (20)] [threads (all cores)]
#        [rounds (1)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-20}
THREADS=${3:-$(nproc)}
ROUNDS=${4:-1}
((STEPS >= 3)) || { echo "bench_moe_cpu.sh: steps must be >= 3 (got $STEPS)" >&2; exit 2; }
((ROUNDS >= 1)) || { echo "bench_moe_cpu.sh: rounds must be >= 1 (got $ROUNDS)" >&2; exit 2; }
work=$(mktemp -d /tmp/relay-bench-moe-XXXXXX)
trap 'rm -rf "$work"' EXIT
SKIP=$((STEPS / 4 > 2 ? STEPS / 4 : 2))
T=64
B=16

# TORCH2_PYTHON: a python with PyTorch 2.x and transformers already installed (a machine without network, such as
# the GPU machine, whose host CPU has AVX512_BF16: bench/gpu_check.sh moe-cpu); otherwise the tests' cached venv.
torch2=${TORCH2_PYTHON:-}
if [[ -z $torch2 ]] && ! torch2=$(/usr/bin/python3 tests/torch/pypi_venv.py hf 2>"$work/venv.err"); then torch2=""; fi

printf "# Relay MoE CPU benchmark: %d threads, %d steps (the first %d skipped), T %d, batch %d, %d round(s)\n" \
  "$THREADS" "$STEPS" "$SKIP" "$T" "$B" "$ROUNDS"
cpu_info
if [[ -n $torch2 ]]; then
  printf "# torch2: %s (%s)\n" "$torch2" "$("$torch2" -c 'import torch, transformers; print("PyTorch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -n1)"
else
  printf "# torch2: not available: %s\n" "$(tail -c 300 "$work/venv.err" | tr '\n' ' ')"
fi
h5python=/usr/bin/python3  # the token file: whichever python has h5py (Debian's here; PATH's on the GPU machine)
/usr/bin/python3 -c 'import h5py' 2>/dev/null || h5python=python3
"$h5python" - "$work/tokens.h5" $((B * T * (STEPS + 2) + 1)) <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 256, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
PY

relay_run() {  # config precision [--set overrides...] -> "tokens/s loss1" or "n/a"
  local config=$1 precision=$2
  shift 2
  local dir="$work/run-$(basename "$config" .toml)-$precision-$round-$#"
  set -- "$config" "$precision" "$@"
  if ! OMP_NUM_THREADS=$THREADS "$RELAY" train --config "$1" "${@:3}" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set "train.precision=\"$2\"" \
      --set train.steps="$STEPS" --set train.log_every=1 --set train.batch_size=$B --set train.micro_batches=1 \
      --set lr_schedule.warmup_steps=0 --set train.threads="$THREADS" --set model.block_size=$T >"$dir.out" 2>&1; then
    echo "# relay $(basename "$1") $2: n/a: $(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")" >>"$work/notes"
    echo n/a; return
  fi
  # how the bf16 GEMMs ran (train.cpu_bf16_gemm = "auto": the backend's choice), once
  if [[ $2 == bf16 && ! -e $work/bf16-noted ]]; then
    touch "$work/bf16-noted"
    grep -m1 -o 'bf16 GEMMs[^)]*' "$dir.out" | sed 's/^/# relay bf16: /' >>"$work/notes" || true
  fi
  python3 - "$dir/metrics.jsonl" "$SKIP" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > int(sys.argv[2])]
print("%.1f %.4f" % (sum(w) / len(w), r[0]["loss"]))
PY
}
torch_run() {  # config mode -> "tokens/s loss1" or "n/a"
  local out
  [[ -z $torch2 ]] && { echo n/a; return; }
  if ! out=$(OMP_NUM_THREADS=$THREADS "$torch2" bench/torch_moe.py "$1" "$STEPS" "$THREADS" $T $B "$2" "$SKIP" 2>&1); then
    echo "# torch2 $(basename "$1") $2: n/a: $(echo "$out" | tail -n1)" >>"$work/notes"
    echo n/a; return
  fi
  echo "$out" | tail -n1 | sed -n 's/.*tokens_per_s \([0-9.]*\) .*loss1 \([0-9.na]*\).*/\1 \2/p'
}

printf "#%-14s %11s %11s %11s %13s %9s %9s %9s %9s %6s\n" "model" "relay fp32" "relay bf16" "torch2 fp32" \
  "torch2 bf16" "vs dense" "vs dense" "vs torch" "vs torch" "check"
printf "#%-14s %11s %11s %11s %13s %9s %9s %9s %9s %6s\n" "" "(tok/s)" "(tok/s)" "(tok/s)" "(tok/s autocast)" "fp32" \
  "bf16" "fp32" "bf16" ""
# Every run ROUNDS times, the rounds one after another (each round all models and columns in the same order), so
# that a slow spell on a shared machine hits one round of every column; each cell is the median over the rounds,
# and the ratios are of medians.
for ((round = 1; round <= ROUNDS; ++round)); do
  for row in "llama-small llama-small configs/llama-small-bytes.toml" \
             "mixtral-small llama-small configs/mixtral-small-bytes.toml" \
             "qwen3-small llama-small configs/qwen3-moe-small-bytes.toml" \
             "llama-ds llama-ds configs/llama-small-bytes.toml --set model.n_layer=2 --set model.n_embd=64 --set model.ffn_hidden=208" \
             "deepseek-small llama-ds configs/deepseek-v3-small-bytes.toml"; do
    read -r name dense config overrides <<<"$row"
    read -ra sets <<<"${overrides:-}"
    r32=$(relay_run "$config" fp32 "${sets[@]}"); r16=$(relay_run "$config" bf16 "${sets[@]}")
    if [[ $name == "$dense" ]]; then t32=n/a t16=n/a
    else t32=$(torch_run "$config" fp32); t16=$(torch_run "$config" bf16); fi
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$round" "$name" "$dense" "$r32" "$r16" "$t32" "$t16" >>"$work/rounds"
  done
done
python3 - "$work/rounds" "$ROUNDS" <<'PY'
import math, statistics, sys
rows, dense_of, rounds = {}, {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    rnd, name, dense_of[name], *cells = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append([None if c in ("n/a", "") else [float(v) for v in c.split()] for c in cells])
def median(runs, i):
    got = [r[i] for r in runs if r[i] is not None]
    return None if not got else [statistics.median(g[0] for g in got), got[0][1]]
tps = lambda x: "n/a" if x is None else "%.1f" % x[0]
ratio = lambda a, b: "n/a" if a is None or b is None else "%.2fx" % (a[0] / b[0])
for name, runs in rows.items():
    r = [median(runs, i) for i in range(4)]
    dense = [median(rows[dense_of[name]], i) for i in range(4)]
    ok = all(abs(x[1] - math.log(256)) <= 0.05 * math.log(256) for run in runs for x in run if x is not None)
    print(" %-14s %11s %11s %11s %13s %9s %9s %9s %9s %6s" % (name, tps(r[0]), tps(r[1]), tps(r[2]), tps(r[3]),
          ratio(r[0], dense[0]), ratio(r[1], dense[1]), ratio(r[0], r[2]), ratio(r[1], r[3]), "ok" if ok else "BAD"))
if rounds > 1:
    # The same ratio paired by round: a model's run against its dense twin's of the same round (two runs apart in
    # time), whose median a slow spell of the machine moves less than it moves the ratio of two medians.
    print("# vs dense paired by round (relay fp32, relay bf16: each round's ratio; their median):")
    for name, runs in rows.items():
        if dense_of[name] == name:
            continue
        cols = []
        for i in (0, 1):
            pairs = [a[i][0] / b[i][0] for a, b in zip(runs, rows[dense_of[name]]) if a[i] is not None and b[i] is not None]
            cols.append(("median %.2fx (" % statistics.median(pairs) + " ".join("%.2f" % x for x in pairs) + ")")
                        if pairs else "n/a")
        print("#  %-14s fp32 %s  |  bf16 %s" % (name, cols[0], cols[1]))
    print("# each round's tok/s (relay fp32, relay bf16, torch2 fp32, torch2 bf16):")
    for name, runs in rows.items():
        print("#  %-14s " % name + "  |  ".join(" ".join(tps(c) for c in run) for run in runs))
PY
[[ -s $work/notes ]] && { echo; cat "$work/notes"; }
load_at_end
