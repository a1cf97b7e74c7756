#!/usr/bin/env bash
# CPU benchmark (measures, never fails): the 1024 -> 4 x 4096 GELU -> 10 MLP, batch 256, AdamW, run
#   serially (all cores), data-parallel (dp = 2, one thread per rank), pipeline-parallel (pp = 2, one
#   thread per rank) under each schedule, and PyTorch's twin. GFLOP/s = 6 x parameters x samples/s.
#   Idle = the time each stage waited in receives and final waits, measured by the executor, per step,
#   beside the simulator's bubble for the same schedule with equal F/B/W costs.
#   Every run once more with train.precision = "bf16" (bf16 samples/s, its final loss, and bf16/fp32 =
#   bf16 samples/s / samples/s; n/a where Relay refuses it, with its reason below the table).
#   PyTorch's twin: Debian's torch 1.13 (if python3-torch is installed) and PyTorch 2.x from PyPI (fp32 and
#   bf16 autocast; its venv is made once by tests/torch/pypi_venv.py torch2, ~2 GB of wheels).
# Usage: bench/bench_cpu.sh [relay binary (build/relay)] [steps (30)] [micro-batches for pp (8)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-30}
M=${3:-8}
CORES=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/relay-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$RELAY" data synth --out "$work/train.h5" --samples 2048 --features 1024 --classes 10 --seed 1 >/dev/null
PARAMS=$((1024*4096+4096 + 3*(4096*4096+4096) + 4096*10+10))
LOG=$((STEPS / 3))
common=(--config configs/bench_mlp.toml --set "data.train=\"$work/train.h5\"" --set train.steps=$STEPS --set train.log_every=$LOG)

printf "# Relay CPU benchmark: %s, %d cores, %d steps, %d parameters\n" "$(lscpu | sed -n 's/^Model name: *//p')" "$CORES" "$STEPS" "$PARAMS"
cpu_info
printf "# samples/s: mean over the log windows after the first; GFLOP/s = 6 x params x samples/s\n"
printf "# final loss must equal the serial run's to 1e-4 (the 'ok' column)\n"
printf "# bf16: the same run with train.precision = \"bf16\"; bf16/fp32 = bf16 samples/s / samples/s\n"
printf "%-26s %6s %8s %11s %9s %10s  %-2s %14s %9s %10s  %s\n" "run" "ranks" "threads" "samples/s" "GFLOP/s" "final_loss" \
  "ok" "bf16 samples/s" "bf16/fp32" "bf16_loss" "idle per stage (measured | simulated)"

train() {  # dir ranks threads overrides... -> Relay's output; the exit status is Relay's
  local dir=$1 ranks=$2 threads=$3; shift 3
  if [[ $ranks == 1 ]]; then
    OMP_NUM_THREADS=$threads RELAY_STAGE_STATS=1 "$RELAY" train "${common[@]}" --set "run.dir=\"$dir\"" "$@" 2>&1
  else
    mpirun --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS=$threads -x RELAY_STAGE_STATS=1 \
      "$RELAY" train "${common[@]}" --set "run.dir=\"$dir\"" "$@" 2>&1
  fi
}
metrics() {  # dir -> "samples/s final_loss": mean samples/s over the log windows after the first
  python3 - "$1/metrics.jsonl" "$LOG" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = [x["samples_per_s"] for x in r if x["step"] > int(sys.argv[2])]
print("%.1f %.6f" % (sum(w) / len(w), r[-1]["loss"]))
PY
}

serial_loss=""
run() {  # name ranks threads schedule-overrides...
  local name=$1 ranks=$2 threads=$3; shift 3
  local dir="$work/$name" out
  out=$(train "$dir" "$ranks" "$threads" "$@")
  local sps loss idle sim
  read -r sps loss < <(metrics "$dir")
  [[ -z $serial_loss ]] && serial_loss=$loss
  local ok; ok=$(python3 -c "print('ok' if abs($loss-$serial_loss)<=1e-4*abs($serial_loss) else 'BAD')")
  idle=$(echo "$out" | awk '/^stage-stats/ {printf "pp%s/dp%s %.0f%% ", $5, $7, 100*$11/$13}')
  sim=$(echo "$out" | sed -n 's/.*simulated pipeline bubble \([0-9.]*%\).*/\1/p')
  # The simulator again, with every layer's F, B and W timed here (relay plan --measure): unequal stages.
  local measured=""
  if [[ $name == pp* ]]; then
    measured=$("$RELAY" plan --measure "${common[@]}" "$@" 2>/dev/null | sed -n '/measured costs/,$p' |
      awk '/makespan/ {ms=$NF} /pp rank/ {gsub(",","",$6); printf "pp%s %.0f%% ", substr($3,1,length($3)-1), 100*$7/ms}')
  fi
  local bf16_out sps16=n/a loss16=n/a ratio=n/a
  if bf16_out=$(train "$dir-bf16" "$ranks" "$threads" "$@" --set 'train.precision="bf16"'); then
    read -r sps16 loss16 < <(metrics "$dir-bf16")
    ratio=$(python3 -c "print('%.2fx' % ($sps16 / $sps))")
  else
    echo "# bf16 n/a: $(grep -m1 -i error <<<"$bf16_out" || tail -n1 <<<"$bf16_out")" |
      sed 's/\[rank [0-9]* on [^]]*\] //' >>"$work/notes"
  fi
  printf "%-26s %6d %8d %11s %9.1f %10s  %-2s %14s %9s %10s  %s| sim equal costs %s%s\n" "$name" "$ranks" "$threads" "$sps" \
    "$(python3 -c "print(6*$PARAMS*$sps/1e9)")" "$loss" "$ok" "$sps16" "$ratio" "$loss16" "$idle" "$sim" \
    "${measured:+, measured costs $measured}"
}

run serial 1 $CORES
run serial_1thread 1 1
run dp2 2 1 --set parallel.dp=2
for s in gpipe 1f1b zb-h1; do
  run "pp2_${s}_m$M" 2 1 --set parallel.pp=2 --set "parallel.schedule=\"$s\"" --set train.micro_batches=$M
done
run "pp2_interleaved_v2_m$M" 2 1 --set parallel.pp=2 --set 'parallel.schedule="interleaved"' --set parallel.virtual_stages=2 \
  --set train.micro_batches=$M --set 'parallel.balance=[2, 2, 2, 3]'
[[ -f $work/notes ]] && sort -u "$work/notes"  # -u: a refusal common to every run, once
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "# PyTorch twin (same model, batch and optimizer):"
  /usr/bin/python3 bench/torch_mlp.py "$STEPS" "$CORES"
  /usr/bin/python3 bench/torch_mlp.py "$STEPS" 1
else
  echo "# PyTorch not installed (scripts/setup.sh --with-torch): no comparison"
fi
if torch2=$(/usr/bin/python3 tests/torch/pypi_venv.py torch2); then
  echo "# PyTorch 2.x twin from PyPI (tests/torch/pypi_venv.py torch2), fp32 and bf16 autocast:"
  "$torch2" bench/torch_mlp.py "$STEPS" "$CORES" fp32 2>/dev/null | tail -n1 || echo "# torch2 fp32 failed"
  "$torch2" bench/torch_mlp.py "$STEPS" "$CORES" bf16 2>/dev/null | tail -n1 || echo "# torch2 bf16 failed"
else
  echo "# PyTorch 2.x from PyPI not available (reason above): no comparison"
fi
load_at_end
