#!/usr/bin/env bash
# Expert parallelism on one machine (measures, never fails): the same MoE model on 2 ranks of 1 thread each, as
# dp 2 with every expert on both ranks (ep 1) and as dp 2 x ep 2 (each rank holds half of every layer's experts and
# the tokens' rows travel to them and back in all-to-alls), back to back. Per run: tokens/s (mean over the steps
# after the first 2), the step time, and where a step's time goes on rank 0, from the trace of two steps before the
# last (whose end-of-run checkpoint would count): forward and backward compute, the expert all-to-alls ("ep all-to-all"
# spans: the row exchange, waits for the peer included), the gradient all-reduce waits; plus metrics.jsonl's
# ep_alltoall_s (the slowest rank's time in all-to-alls per step, the count exchange included) and ep_rows_sent.
# Models: configs/mixtral-small-bytes.toml (8 experts of 176 units, top 2, C 128, T 64) and
# configs/qwen3-moe-a3b-shape.toml (Qwen3-30B-A3B's layer: 128 experts of 768 units, top 8, C 2048; T 128, batch 4,
# SGD so that ep 1's two full copies of the 0.6 B parameters fit in this machine's memory).
# Usage: bench/bench_moe_ep.sh [relay binary (build/relay)] [steps (8)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-8}
((STEPS >= 5)) || { echo "bench_moe_ep.sh: steps must be >= 5 (got $STEPS)" >&2; exit 2; }
work=$(mktemp -d /tmp/relay-bench-moe-ep-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# Relay expert-parallelism benchmark: 2 ranks x 1 thread, $STEPS steps (the first 2 skipped)"
cpu_info
/usr/bin/python3 - "$work/tokens.h5" 2000000 <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(1).integers(0, 256, int(sys.argv[2]), dtype=np.int32))
    f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
PY

run() {  # name config ep extra-sets...
  local name=$1 cfg=$2 ep=$3; shift 3
  local dir="$work/$name-ep$ep"
  if ! mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train --config "$cfg" --set "run.dir=\"$dir\"" \
      --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps="$STEPS" --set train.log_every=1 \
      --set lr_schedule.warmup_steps=0 --set train.threads=1 --set parallel.dp=2 --set parallel.ep="$ep" \
      --set checkpoint.every=0 --set "trace.steps=[$((STEPS - 2)), $((STEPS - 1))]" "$@" >"$dir.out" 2>&1; then
    printf "%-14s ep %d: failed: %s\n" "$name" "$ep" "$(grep -m1 -i error "$dir.out" || tail -n1 "$dir.out")"
    return
  fi
  /usr/bin/python3 - "$dir" "$name" "$ep" <<'PY'
import collections, json, sys
d, name, ep = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l]
late = [r for r in recs if r["step"] > 2]
tps = sum(r["tokens_per_s"] for r in late) / len(late)
step = sum(r["step_time_s"] for r in late) / len(late)
a2a = sum(r.get("ep_alltoall_s", 0) for r in late) / len(late)
rows = sum(r.get("ep_rows_sent", 0) for r in late) / len(late)
t = json.load(open(d + "/trace.json"))
ev = t["traceEvents"] if isinstance(t, dict) else t
spans = collections.defaultdict(float)  # rank 0, both traced steps, ms
for e in ev:
    if e.get("ph") != "X" or e.get("pid") != 0:
        continue
    n = e["name"]
    key = ("forward" if n.startswith("F") else "backward" if n.startswith(("B", "W")) else
           "ep all-to-all" if n.startswith("ep all") else "all-reduce" if "allreduce" in n else n)
    spans[key] += e["dur"] / 1e3 / 2
where = ", ".join(f"{k} {v:.1f}" for k, v in sorted(spans.items(), key=lambda kv: -kv[1]) if v >= 0.05)
print(f"{name:<14} ep {ep}: {tps:9.1f} tokens/s, step {1e3 * step:8.1f} ms, loss {recs[-1]['loss']:.4f}; "
      f"all-to-all {1e3 * a2a:7.1f} ms/step (slowest rank), {rows:.0f} rows sent/step; rank 0 per step, ms: {where}")
PY
}

for ep in 1 2; do run mixtral-small configs/mixtral-small-bytes.toml "$ep"; done
for ep in 1 2; do
  run qwen3-a3b-shape configs/qwen3-moe-a3b-shape.toml "$ep" --set model.block_size=128 --set train.batch_size=4 \
    --set train.micro_batches=1 --set 'optimizer.name="sgd"' --set optimizer.momentum=0 \
    --set optimizer.weight_decay=0
done
load_at_end
