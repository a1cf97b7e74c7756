#!/usr/bin/env bash
# The GPT demo on a fresh Debian 12 machine (about 5 minutes on 2 cores): installs dependencies,
# builds, tokenizes Debian's fortunes (2.6 MB of English, byte-level), trains the small GPT of
# configs/gpt-small-bytes.toml on 4 ranks (dp = 2 x pp = 2, 1F1B, tied embeddings split across the
# two stages), resumes its step-1000 checkpoint on another layout (dp = 1 x pp = 4, ZB-H1) to the
# end, prints a generated sample, and draws the runs (scripts/plot_run.py; the 4-rank run traces steps
# 1201-1202 into trace.json for the pipeline picture). Checks: the eval loss falls below 2.3 nats per byte (from
# ln 256 = 5.55) and the resumed run ends within 0.01 of it.
# The same steps for Llama: RELAY_DEMO_CONFIG=configs/llama-small-bytes.toml scripts/demo_gpt.sh
# (runs/llama-4ranks, runs/llama-resumed, runs/llama-plots); for the mixtures of experts,
# RELAY_DEMO_CONFIG=configs/mixtral-small-bytes.toml or configs/qwen3-moe-small-bytes.toml: the 4-rank run is then
# dp 2 x ep 2 x pp 2 (each dp rank holds half of every layer's experts; tokens reach them in all-to-alls), and a
# last step exports the final checkpoint for Hugging Face and loads it in transformers (PyTorch 2.x and transformers
# from PyPI in the tests' cached venv; skipped without network), whose greedy continuation must equal relay's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --with-extras
RELAY=$(./scripts/build.sh --relay)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p data
if [ ! -f data/fortunes_train.h5 ]; then
  texts=()
  for f in /usr/share/games/fortunes/*; do [[ -f $f && $f != *.* ]] && texts+=("$f"); done
  $RELAY data tokenize --in "${texts[@]}" --out data/fortunes_train.h5 --tokenizer bytes \
    --eval-fraction 0.05 --eval-out data/fortunes_eval.h5
fi
$RELAY data inspect data/fortunes_train.h5
MPIRUN="mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1"
CFG=${RELAY_DEMO_CONFIG:-configs/gpt-small-bytes.toml}
P=$(sed -n 's/^type = "\(.*\)"/\1/p' "$CFG" | head -1)  # run directories runs/$P-*: gpt, llama, mixtral, qwen3_moe, deepseek_v3
EP=()  # mixtures of experts: the experts split over the 2 dp ranks
case $P in mixtral|qwen3_moe|deepseek_v3) EP=(--set parallel.ep=2) ;; esac

echo; echo "=== 1. 4 ranks: dp = 2 x pp = 2${EP:+ with ep = 2}, 1F1B (runs/$P-4ranks)"
start=$(date +%s)
$MPIRUN -np 4 $RELAY train --config $CFG --set run.dir=runs/$P-4ranks --set parallel.dp=2 --set parallel.pp=2 \
  "${EP[@]}" --set checkpoint.keep=0 --set 'trace.steps=[1201, 1202]'
took=$(( $(date +%s) - start ))
echo; echo "=== 2. resume step 1000 of the 4-rank run on dp = 1 x pp = 4, ZB-H1 (runs/$P-resumed)"
$MPIRUN -np 4 $RELAY train --config $CFG --set run.dir=runs/$P-resumed --set parallel.pp=4 \
  --set parallel.schedule=zb-h1 --set train.micro_batches=4 \
  --set checkpoint.resume=runs/$P-4ranks/checkpoints/step_00001000.h5
echo; echo "=== 3. a sample from the final checkpoint (temperature 0.8, top-k 40)"
$RELAY generate --checkpoint runs/$P-4ranks/checkpoints/step_00002000.h5 --prompt "The meaning of life is" \
  --max-new-tokens 300 --temperature 0.8 --top-k 40 --seed 7

echo; echo "=== 4. pictures of the two runs (runs/$P-plots: metrics.png, pipeline.png from the 4-rank run's trace)"
/usr/bin/python3 scripts/plot_run.py runs/$P-4ranks runs/$P-resumed --out runs/$P-plots
/usr/bin/python3 scripts/plot_run.py runs/$P-4ranks --out runs/$P-plots/4ranks

if [ ${#EP[@]} -gt 0 ]; then
  echo; echo "=== 5. export for Hugging Face (runs/$P-hf) and load it in transformers"
  $RELAY ckpt export runs/$P-4ranks/checkpoints/step_00002000.h5 --format hf --out runs/$P-hf
  want=$($RELAY generate --checkpoint runs/$P-4ranks/checkpoints/step_00002000.h5 --prompt "The meaning of" \
    --max-new-tokens 40 --temperature 0)
  if PY=$(/usr/bin/python3 tests/torch/pypi_venv.py hf); then
    "$PY" - "runs/$P-hf" "$want" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
out = m.generate(torch.tensor([list(b"The meaning of")]), max_new_tokens=40, do_sample=False)
got = bytes(out[0].tolist()).decode("utf-8", "replace")
print(f"transformers' {type(m).__name__}: {got!r}")
sys.exit(0 if got in sys.argv[2] else f"transformers continues differently from relay generate: {sys.argv[2]!r}")
PY
  else
    echo "skipped: no transformers venv (needs network once)"
  fi
fi

loss() { grep eval_loss "$1/metrics.jsonl" | tail -1 | sed "s/.*\"eval_loss\": *\([0-9.]*\).*/\1/"; }
echo
echo "final eval loss: 4 ranks $(loss runs/$P-4ranks) (training took ${took} s), resumed on another layout $(loss runs/$P-resumed)"
python3 - "$(loss runs/$P-4ranks)" "$(loss runs/$P-resumed)" <<'PY'
import sys
a, b = map(float, sys.argv[1:])
ok = a < 2.3 and abs(a - b) <= 0.01
print("demo %s: eval loss below 2.3 and the resumed run within 0.01 of it" % ("PASSED" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
