#!/usr/bin/env bash
# Document-masked attention benchmark (measures, never fails): configs/llama-small-bytes.toml at T 8192 (one
# sequence a step) on documents of mean length 512 (lengths drawn from a geometric distribution, each ended by the
# end-of-text token), trained with data.document_mask = true against the same run with full causal attention,
# back to back. With a document mask the attention kernels skip every key tile before a query's document, so the
# attention's work falls from T^2 / 2 to about T x 512 per head.
# tokens/s: mean of metrics.jsonl's tokens_per_s after the first 2 steps. Usage:
#   bench/bench_document_mask.sh [relay binary (build/relay)] [steps (6)] [T (8192)] [mean document length (512)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-6}
T=${3:-8192}
DOC=${4:-512}
work=$(mktemp -d /tmp/relay-bench-docs-XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/docs.h5" $((T * (STEPS + 1) + 1)) "$DOC" <<'PY'
import sys, h5py, numpy as np
path, n, mean = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(1)
tokens = rng.integers(1, 256, n, dtype=np.int32)  # 0 is the end-of-text token
at, docs = 0, 0
while True:
    at += int(rng.geometric(1.0 / mean))
    if at > n:
        break
    tokens[at - 1] = 0
    docs += 1
with h5py.File(path, "w") as f:
    f["tokens"] = tokens.astype(np.uint16)
    f.attrs["vocab_size"], f.attrs["tokenizer"], f.attrs["eot_id"], f.attrs["documents"] = 256, "bytes", 0, docs + 1
print(f"# {n} tokens, {docs + 1} documents (mean length {n / (docs + 1):.0f})")
PY
printf "# Document-mask benchmark: llama-small-bytes at T %d, batch 1, %d steps, %d threads\n" "$T" "$STEPS" "$(nproc)"
cpu_info
declare -A tps
for mask in false true; do
  dir="$work/run-$mask"
  "$RELAY" train --config configs/llama-small-bytes.toml --set "run.dir=\"$dir\"" --set "data.train=\"$work/docs.h5\"" \
    --set 'data.eval=""' --set model.block_size="$T" --set train.batch_size=1 --set train.micro_batches=1 \
    --set train.steps="$STEPS" --set train.log_every=1 --set lr_schedule.warmup_steps=0 \
    --set data.document_mask="$mask" >"$dir.out" 2>&1 || { tail -n 5 "$dir.out"; exit 1; }
  tps[$mask]=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["tokens_per_s"] for x in r if x["step"] > 2]
print("%.1f" % (sum(w) / len(w)))
PY
)
  printf "%-32s %10s tokens/s\n" "document_mask = $mask" "${tps[$mask]}"
done
python3 -c "print('# document-masked / full causal: %.2fx' % (${tps[true]} / ${tps[false]}))"
load_at_end
