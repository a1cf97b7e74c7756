#!/usr/bin/env bash
# The demo on a fresh Debian 12 machine: installs dependencies, builds, makes a synthetic dataset,
# trains serially, trains on 4 ranks (dp = 2, pp = 2, 1F1B) to the same accuracy, then resumes the
# 4-rank run's mid-point checkpoint on another layout (dp = 1, pp = 4, ZB-H1) and finishes it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
RELAY=$(./scripts/build.sh --relay)  # the relay binary only; CPU-only unless a GPU is visible
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p data
[ -f data/train.h5 ] || $RELAY data synth --out data/train.h5 --samples 16384 --features 64 --classes 16 --seed 1
[ -f data/eval.h5 ] || $RELAY data synth --out data/eval.h5 --samples 4096 --features 64 --classes 16 --seed 2
$RELAY data inspect data/train.h5
MPIRUN="mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1"

echo; echo "=== 1. serial run (runs/demo-serial)"
$RELAY train --config configs/demo.toml --set run.dir=runs/demo-serial
echo; echo "=== 2. 4 ranks: dp = 2 x pp = 2, 1F1B (runs/demo-4ranks)"
$MPIRUN -np 4 $RELAY train --config configs/demo.toml --set run.dir=runs/demo-4ranks \
  --set parallel.dp=2 --set parallel.pp=2 --set parallel.schedule=1f1b
echo; echo "=== 3. resume step 400 of the 4-rank run on dp = 1 x pp = 4, ZB-H1 (runs/demo-resumed)"
$MPIRUN -np 4 $RELAY train --config configs/demo.toml --set run.dir=runs/demo-resumed \
  --set parallel.pp=4 --set parallel.schedule=zb-h1 \
  --set checkpoint.resume=runs/demo-4ranks/checkpoints/step_00000400.h5
$RELAY ckpt inspect runs/demo-resumed/checkpoints/step_00000600.h5 | head -4

acc() { grep eval_accuracy "$1/metrics.jsonl" | tail -1 | sed "s/.*\"eval_accuracy\": *\([0-9.]*\).*/\1/"; }
echo
echo "final eval accuracy: serial $(acc runs/demo-serial), 4 ranks $(acc runs/demo-4ranks), resumed on another layout $(acc runs/demo-resumed)"
echo "results: runs/demo-*/metrics.jsonl, config.toml and checkpoints/ (h5py-readable; docs/operations.md and io/README.md)"
python3 - "$(acc runs/demo-serial)" "$(acc runs/demo-4ranks)" "$(acc runs/demo-resumed)" <<'PY'
import sys
s, p, r = map(float, sys.argv[1:])
ok = s >= 0.90 and abs(s - p) <= 0.01 and abs(s - r) <= 0.01
print("demo %s: serial accuracy >= 0.90 and the parallel and resumed runs within 0.01 of it" % ("PASSED" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
