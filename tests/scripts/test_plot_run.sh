#!/usr/bin/env bash
# scripts/plot_run.py on real runs: a serial MLP run with eval, and a GPT run on 4 ranks (dp 2 x pp 2,
# 1F1B) given a synthetic trace.json of the same layout (tests/scripts/synth_trace.py, the tracer's
# format). Plots each run, then both together, and checks that every expected PNG is a real PNG of
# more than 20 kB with a drawing in it: many colours, not mostly blank, and the colours that must be
# there (each run's line colour; F and B boxes in the Gantt chart).
# Usage: test_plot_run.sh <relay binary>. Exit codes: 0 pass, 1 fail, 77 skip (no matplotlib).
set -uo pipefail
RELAY=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3
fail() { echo "FAIL: $*"; exit 1; }
$PY -c "import matplotlib" 2>/dev/null ||
  { echo "SKIP: /usr/bin/python3 has no matplotlib (apt-get install python3-matplotlib, or scripts/setup.sh)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d /tmp/relay-plot-XXXXXX)
# KEEP=1 keeps the runs and PNGs to look at.
if [ -n "${KEEP:-}" ]; then echo "keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

# A serial MLP run with an eval every 50 steps.
"$RELAY" data synth --out "$WORK/train.h5" --samples 512 --features 16 --classes 5 --seed 1 >/dev/null || fail "data synth"
"$RELAY" data synth --out "$WORK/eval.h5" --samples 128 --features 16 --classes 5 --seed 2 >/dev/null || fail "data synth"
cat > "$WORK/mlp.toml" <<TOML
[run]
dir = "$WORK/mlp"
[model]
seed = 3
layers = [ { type = "linear", out = 32 }, { type = "gelu" }, { type = "linear", out = 5 } ]
[data]
train = "$WORK/train.h5"
eval = "$WORK/eval.h5"
[train]
steps = 200
batch_size = 64
log_every = 5
eval_every = 50
[optimizer]
lr = 0.003
[lr_schedule]
name = "cosine"
warmup_steps = 20
TOML
OMP_NUM_THREADS=1 "$RELAY" train --config "$WORK/mlp.toml" > "$WORK/mlp.log" 2>&1 || { tail "$WORK/mlp.log"; fail "the MLP run"; }

# A tiny byte-level GPT on this README's bytes, on dp 2 x pp 2.
"$RELAY" data tokenize --in "$SRC/README.md" --out "$WORK/tokens.h5" --tokenizer bytes --eval-fraction 0.1 \
  --eval-out "$WORK/tokens_eval.h5" >/dev/null || fail "data tokenize"
cat > "$WORK/gpt.toml" <<TOML
[run]
dir = "$WORK/gpt"
[model]
type = "gpt"
vocab_size = 256
block_size = 16
n_layer = 2
n_head = 2
n_embd = 16
[data]
train = "$WORK/tokens.h5"
eval = "$WORK/tokens_eval.h5"
[train]
steps = 60
batch_size = 8
micro_batches = 4
log_every = 2
eval_every = 20
clip_grad_norm = 1.0
[optimizer]
lr = 0.003
[lr_schedule]
name = "cosine"
warmup_steps = 5
[parallel]
dp = 2
pp = 2
schedule = "1f1b"
TOML
mpirun --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 "$RELAY" train --config "$WORK/gpt.toml" \
  > "$WORK/gpt.log" 2>&1 || { tail "$WORK/gpt.log"; fail "the GPT run"; }
grep -q tokens_per_s "$WORK/gpt/metrics.jsonl" || fail "the GPT run logged no tokens_per_s"
$PY "$HERE/synth_trace.py" "$WORK/gpt/trace.json" --dp 2 --pp 2 --micro-batches 4 --steps 2 || fail "synth_trace.py"

plot() { $PY "$SRC/scripts/plot_run.py" "$@" > "$WORK/plot.log" 2>&1 || { cat "$WORK/plot.log"; fail "plot_run.py $*"; }; }
plot "$WORK/mlp"
plot "$WORK/gpt"
plot "$WORK/mlp" "$WORK/gpt" --out "$WORK/both"
[ ! -e "$WORK/mlp/pipeline.png" ] || fail "pipeline.png drawn for a run without trace.json"

# Each PNG, the colours that must be in it and the least share of its pixels each must cover: a
# run's line in metrics.png (0.03%, some 600 pixels), F and B boxes in pipeline.png (1%: the legend's
# swatches alone cover 0.03%).
$PY - "$WORK" <<'PY' || fail "a PNG is missing, too small or blank"
import os, sys
import numpy as np
import matplotlib.image as mpimg
work = sys.argv[1]
BLUE, ORANGE = "#1f77b4", "#ff7f0e"  # tab10's first two: run 1 and run 2
F, B = "#4a7fc1", "#3f9b4f"          # plot_run.py's forward and backward boxes
expected = {"mlp/metrics.png": ([BLUE], 0.0003), "gpt/metrics.png": ([BLUE], 0.0003),
            "both/metrics.png": ([BLUE, ORANGE], 0.0003), "gpt/pipeline.png": ([F, B], 0.01),
            "both/pipeline-gpt.png": ([F, B], 0.01)}
for rel, (colours, least) in expected.items():
    path = os.path.join(work, rel)
    assert os.path.isfile(path), f"{rel} was not written"
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{rel} is not a PNG"
    size = os.path.getsize(path)
    assert size > 20_000, f"{rel} is only {size} bytes"
    px = (mpimg.imread(path)[..., :3] * 255).round().astype(np.int32).reshape(-1, 3)
    distinct = len(np.unique(px[:, 0] << 16 | px[:, 1] << 8 | px[:, 2]))
    inked = float(np.mean(px.min(axis=1) < 240))
    found = {c: float(np.mean(np.all(np.abs(px - [int(c[i:i + 2], 16) for i in (1, 3, 5)]) <= 2, axis=1)))
             for c in colours}
    print(f"{rel}: {size} bytes, {distinct} colours, {100 * inked:.1f}% inked, "
          + ", ".join(f"{c} {100 * v:.2f}%" for c, v in found.items()))
    assert distinct > 100, f"{rel} has only {distinct} colours"
    assert inked > 0.03, f"{rel} is mostly blank ({100 * inked:.1f}% inked)"
    for c, v in found.items():
        assert v > least, f"{rel}: colour {c} covers only {100 * v:.3f}% of the image"
PY

# A directory that is not a run: a clear error, non-zero exit.
mkdir -p "$WORK/empty"
if $PY "$SRC/scripts/plot_run.py" "$WORK/empty" > "$WORK/err.log" 2>&1; then fail "plot_run.py accepted a directory without metrics.jsonl"; fi
grep -q "metrics.jsonl" "$WORK/err.log" || { cat "$WORK/err.log"; fail "the error does not name metrics.jsonl"; }
echo "PASS: metrics.png for an MLP run, a GPT run and both; pipeline.png from a 4-rank trace"
