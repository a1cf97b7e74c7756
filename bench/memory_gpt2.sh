#!/usr/bin/env bash
# Memory per rank of GPT-2 124M (configs/gpt2-124m.toml: 12 layers, 12 heads, 768 wide, T = 1024,
# V = 50257) at several 3D layouts: one training step each on random tokens, then every rank's
# measured bytes of parameters, gradients, optimizer state and activations beside relay plan's
# prediction (the run's memory.json). 8 micro-batches of one 1024-token sequence per replica, schedule
# 1f1b (one zb-h1 beside it): the layouts of docs/parallelism.md's worked example. Measures; does not pass or fail.
# Usage: bench/memory_gpt2.sh [build/relay]
set -euo pipefail
cd "$(dirname "$0")/.."
RELAY=$(realpath "${1:-build/relay}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/relay-mem-XXXXXX)
trap 'rm -rf "$work"' EXIT
source bench/random_tokens.sh
random_gpt2_tokens "$work/tokens.h5" $((32 * 1024 + 1))
printf "# GPT-2 124M, fp32, one step; MiB per rank: measured (predicted)\n"
run() {  # name dp tp pp micro_batches zero recompute schedule
  local name=$1 dp=$2 tp=$3 pp=$4 m=$5 zero=$6 rec=$7 sched=${8:-1f1b}
  local n=$((dp * tp * pp)) dir="$work/$name"
  mpirun --oversubscribe -np $n --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train --config configs/gpt2-124m.toml \
    --set "run.dir=\"$dir\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=1 \
    --set lr_schedule.warmup_steps=0 --set train.batch_size=$((dp * m)) --set train.micro_batches=$m \
    --set parallel.dp=$dp --set parallel.tp=$tp --set parallel.pp=$pp --set "parallel.schedule=\"$sched\"" \
    --set optimizer.zero=$zero --set "train.recompute=\"$rec\"" --set checkpoint.every=0 \
    --set "checkpoint.dir=\"$dir/ckpt\"" >"$dir.log" 2>&1 || { echo "$name failed:"; tail -5 "$dir.log"; return; }
  /usr/bin/python3 - "$dir/memory.json" "$name (dp $dp, tp $tp, pp $pp, m $m, zero $zero, recompute $rec)" <<'PY'
import json, sys
ranks = json.load(open(sys.argv[1]))["bytes_per_rank"]
print(sys.argv[2])
mib = lambda b: b / 2**20
seen = set()
for r in ranks:
    key = (r["pp"], r["tp"])
    if key in seen: continue  # replicas hold the same
    seen.add(key)
    m, p = r["measured"], r["predicted"]
    cells = "  ".join(f"{k} {mib(m[k]):8.1f} ({mib(p[k]):8.1f})" for k in ("params", "grads", "optimizer", "activations"))
    print(f"  rank {r['rank']:2d} (pp {r['pp']}, tp {r['tp']}): {cells}  total {mib(sum(m[k] for k in ('params', 'grads', 'optimizer', 'activations'))):8.1f}")
PY
}
run serial 1 1 1 8 false none
run pp2 1 1 2 8 false none
run pp2_zb_h1 1 1 2 8 false none zb-h1  # B and W apart: every block keeps its backward buffers per slot
run pp2_recompute 1 1 2 8 false blocks
run tp2_pp2 1 2 2 8 false none
run tp2_pp2_recompute 1 2 2 8 false blocks
run dp2_tp2_pp2_zero_recompute 2 2 2 8 true blocks
run dp2_zero 2 1 1 8 true none
