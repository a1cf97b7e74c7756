#!/usr/bin/env bash
# The planner against this machine: calibrates (mpirun -np 2 relay plan --measure --calibrate: compute and links), then trains each layout a few steps
# with --plan-cluster and prints predicted vs measured step time (the run's own end-of-run table). GPT- and
# Llama-shaped models; dp, tp, pp with each schedule, ZeRO, recomputation, micro-batch counts, bf16; a Mixtral-shaped
# one (8 experts of 384 units, top 2) serially, on dp 2 and on dp 2 x ep 2.
# Usage: bench/plan_accuracy.sh [relay binary] (from the checkout root; ~4 minutes on 2 cores). Measures; never fails.
set -uo pipefail
cd "$(dirname "$0")/.."
RELAY=${1:-build-cpu/relay}
W=$(mktemp -d /tmp/relay-plan-accuracy.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cat README.md src/*/*.cpp > "$W/corpus.txt"
"$RELAY" data tokenize --tokenizer bytes --in "$W/corpus.txt" --out "$W/train.h5" > /dev/null
head -c 40000 "$W/corpus.txt" > "$W/eval.txt"
"$RELAY" data tokenize --tokenizer bytes --in "$W/eval.txt" --out "$W/eval.h5" > /dev/null

common="--set data.train=$W/train.h5 --set data.eval=$W/eval.h5 --set train.eval_every=1000 --set train.steps=5
        --set lr_schedule.warmup_steps=0 --set train.log_every=5 --set train.threads=1 --set checkpoint.every=0"
gpt="-c configs/gpt-small-bytes.toml --set model.n_embd=256 --set model.block_size=256 --set model.n_layer=4"
llama="-c configs/llama-small-bytes.toml --set model.n_embd=256 --set model.block_size=256 --set model.n_layer=4"
llama+=" --set model.n_head=4 --set model.n_kv_head=2 --set model.ffn_hidden=768"
calibrate() {  # name, model flags...
  local name=$1; shift
  # shellcheck disable=SC2086
  # two ranks: the links measured through the communicator (rank 0 alone then measures the compute)
  mpirun -np 2 --bind-to none -x OMP_NUM_THREADS "$RELAY" plan "$@" $common --measure --calibrate "$W/$name.toml" \
    > /dev/null || echo "calibration $name failed"
}
calibrate gpt $gpt
calibrate gpt-bf16 $gpt --set train.precision='"bf16"'
calibrate llama $llama
mixtral="-c configs/mixtral-small-bytes.toml --set model.n_embd=256 --set model.block_size=256 --set model.moe_ffn_hidden=384"
calibrate mixtral $mixtral

printf "%-44s %6s %12s %12s %8s\n" "layout" "ranks" "predicted_s" "measured_s" "error"
run() {  # label, ranks, calibration, flags...
  local label=$1 ranks=$2 cal=$3; shift 3
  local out
  # shellcheck disable=SC2086
  out=$(mpirun --oversubscribe -np "$ranks" --bind-to none -x OMP_NUM_THREADS "$RELAY" train "$@" $common \
        --set run.dir="$W/run" --plan-cluster "$W/$cal.toml" 2>&1)
  local row
  row=$(grep -E '^  step ' <<< "$out" | head -1)
  if [[ -z $row ]]; then printf "%-44s %6s %s\n" "$label" "$ranks" "failed: $(tail -1 <<< "$out")"; return; fi
  read -r _ pred meas err _ <<< "$row"
  printf "%-44s %6s %12s %12s %8s\n" "$label" "$ranks" "$pred" "$meas" "$err"
}
run "gpt serial, 2 micro-batches"               1 gpt       $gpt
run "gpt serial, recompute"                     1 gpt       $gpt --set train.recompute='"blocks"'
run "gpt serial, bf16"                          1 gpt-bf16  $gpt --set train.precision='"bf16"'
run "gpt dp 2"                                  2 gpt       $gpt --set parallel.dp=2
run "gpt dp 2, ZeRO-1"                          2 gpt       $gpt --set parallel.dp=2 --set optimizer.zero=1
run "gpt dp 2, ZeRO-3"                          2 gpt       $gpt --set parallel.dp=2 --set optimizer.zero=3
run "gpt tp 2"                                  2 gpt       $gpt --set parallel.tp=2
run "gpt pp 2, 1f1b, 4 micro-batches"           2 gpt       $gpt --set parallel.pp=2 --set train.micro_batches=4
run "gpt pp 2, gpipe, 4 micro-batches"          2 gpt       $gpt --set parallel.pp=2 --set train.micro_batches=4 --set parallel.schedule='"gpipe"'
run "gpt pp 2, zb-h1, 4 micro-batches"          2 gpt       $gpt --set parallel.pp=2 --set train.micro_batches=4 --set parallel.schedule='"zb-h1"'
run "gpt pp 2, interleaved v2, 4 micro-batches" 2 gpt       $gpt --set parallel.pp=2 --set train.micro_batches=4 --set parallel.schedule='"interleaved"' --set parallel.virtual_stages=2
run "llama serial"                              1 llama     $llama
run "llama pp 2, 1f1b, 4 micro-batches"         2 llama     $llama --set parallel.pp=2 --set train.micro_batches=4
run "llama dp 2, ZeRO-2"                        2 llama     $llama --set parallel.dp=2 --set optimizer.zero=2
run "mixtral serial"                            1 mixtral   $mixtral
run "mixtral dp 2"                              2 mixtral   $mixtral --set parallel.dp=2
run "mixtral dp 2 x ep 2"                       2 mixtral   $mixtral --set parallel.dp=2 --set parallel.ep=2
