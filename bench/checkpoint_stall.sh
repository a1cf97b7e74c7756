#!/usr/bin/env bash
# The training stall per checkpoint of GPT-2 124M (configs/gpt2-124m.toml; a 1424 MiB checkpoint with
# AdamW's moments), synchronous against checkpoint.async = true: one rank, fp32, batch 1 x 1024 tokens
# (bytes-tokenized text; model.vocab_size stays 50257), 6 steps with a checkpoint every 2 into a
# directory under /tmp (a real disk, not tmpfs). A step's time is 1 / samples_per_s of its
# metrics.jsonl line (log_every = 1: the time since the previous step's line; a checkpoint runs after
# its step is logged, so its stall lands in the next step); stall = mean time of the steps after a checkpoint (3, 5) minus that of the others
# (2, 4, 6; step 1 warms up). The last checkpoint (step 6) is waited for at the end, outside the
# steps. Also prints each checkpoint's own line (sync: the whole write; async: the copy) and the
# machine's load, which these figures depend on. Measures; does not pass or fail.
# Usage: bench/checkpoint_stall.sh [build/relay] [threads]
set -euo pipefail
cd "$(dirname "$0")/.."
RELAY=$(realpath "${1:-build/relay}")
THREADS=${2:-2}
work=$(mktemp -d /tmp/relay-ckstall-XXXXXX)
trap 'rm -rf "$work"' EXIT
for _ in $(seq 1 40); do cat README.md; done > "$work/text.txt"
"$RELAY" data tokenize --in "$work/text.txt" --out "$work/tokens.h5" --tokenizer bytes > /dev/null
echo "# GPT-2 124M checkpoint stall, 1 rank, $THREADS threads, fp32, batch 1 x 1024, checkpoint every 2 steps"
echo "# load before: $(uptime)"
for mode in false true; do
  dir="$work/run-$mode"
  OMP_NUM_THREADS=$THREADS "$RELAY" train --config configs/gpt2-124m.toml --set "run.dir=\"$dir\"" \
    --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=6 --set train.log_every=1 \
    --set train.batch_size=1 --set train.micro_batches=1 --set lr_schedule.warmup_steps=0 \
    --set checkpoint.every=2 --set checkpoint.keep=1 --set 'checkpoint.resume="none"' \
    --set "checkpoint.dir=\"$dir/ckpt\"" --set checkpoint.async=$mode > "$dir.log" 2>&1 ||
    { echo "checkpoint.async = $mode failed:"; tail -5 "$dir.log"; continue; }
  python3 - "$dir/metrics.jsonl" "$mode" <<'PY'
import json, sys
# batch 1: a step's wall time (from the previous step's log line, checkpoint included) is 1 / samples_per_s
dt = {r["step"]: 1.0 / r["samples_per_s"] for r in map(json.loads, open(sys.argv[1])) if "samples_per_s" in r}
after = [dt[s] for s in (3, 5)]
other = [dt[s] for s in (2, 4, 6)]
mean = lambda v: sum(v) / len(v)
print(f"checkpoint.async = {sys.argv[2]:5s}: steps 2..6 {' '.join(f'{dt[s]:.2f}' for s in range(2, 7))} s; "
      f"after a checkpoint {mean(after):.2f} s, others {mean(other):.2f} s: stall {mean(after) - mean(other):.2f} s per checkpoint")
PY
  grep "^checkpoint step\|checkpoint.async:" "$dir.log" | sed 's/^/    /'
done
echo "# load after: $(uptime)"
