#!/usr/bin/env bash
# Communication overlap over a real, slow link (issue 40; measures, never fails): two namespace nodes of this machine
# (tests/multinode/namespaces.sh) whose link is capped by tc tbf at RATE both ways, one rank of one thread on each,
# Open MPI's TCP transport between them. A GPT-2-small-wide model cut to LAYERS layers (n_embd 768, vocabulary 50257)
# on dp 2 across the nodes, SEQS sequences of 128 tokens per rank and step, ZeRO 0, 1 and 3, parallel.overlap off and
# on back to back. Per run, the means after the first 2 steps of metrics.jsonl's step_time_s and rank 0's
# exposed_comm_s (the time it waited on its data-parallel collectives). "compute alone" is the same rank's step at
# dp 1 on node1 (no link); "comm alone" is the overlap-off run's exposed communication (its collectives start after
# the backward and nothing runs beside them). The issue's target: overlapped step <= 1.15 x max(compute, comm).
# VOCAB (default 50257, GPT-2's): a smaller vocabulary puts more of the gradient in the blocks, whose buckets the
# backward fills as it goes (the tied embedding's gradient is complete only when the backward ends, so with GPT-2's
# 38.6 M-parameter embedding most of a 2-layer model's gradient cannot overlap anything).
# TP=2: tensor parallelism across the two nodes instead (dp 1, no sequence parallelism, ZeRO 0): with overlap each
# column-parallel input gradient's all-reduce travels behind that layer's weight-gradient GEMM (the forward's two
# all-reduces per block stay exposed); exposed comm is rank 0's wait on the tp collectives, "compute alone" the same
# tp 2 run with both ranks on node1 (shared memory, no shaped link). SP=true with TP=2: sequence parallelism, whose
# forward all-gathers before c_attn and c_fc run as collective matmuls with overlap (model/collective_matmul.hpp).
# Root only. Usage: [TP=2 [SP=true]] [ZEROS="0 1 3"] [VOCAB=N] bench/bench_overlap_shaped.sh [relay (build/relay)] [RATE (1gbit)] [LAYERS (4)] [SEQS (4)] [steps (6)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
source tests/multinode/namespaces.sh
RELAY=$(realpath "${1:-build/relay}")
RATE=${2:-1gbit} LAYERS=${3:-4} SEQS=${4:-4} STEPS=${5:-6}
TP=${TP:-1}
[ "$TP" -gt 1 ] && ZEROS=${ZEROS:-0}
work=$(mktemp -d /tmp/relay-bench-shaped-XXXXXX)
trap 'remove_two_nodes; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_two_nodes "$work"
shape_link "$RATE"
VOCAB=${VOCAB:-50257}
random_gpt2_tokens "$work/tokens.h5" $((2 * SEQS * 128 * (STEPS + 1) + 1)) "$VOCAB"
layout="dp 2"
[ "$TP" -gt 1 ] && layout="tp $TP"
SP=${SP:-false}
[ "$SP" = true ] && layout="$layout (sequence parallel)"
printf "# shaped-link overlap: GPT %d x 768, vocabulary %d, %d x 128 tokens per replica; %s over two namespace nodes, link %s (tc tbf) both ways, 1 rank x 1 thread per node\n" "$LAYERS" "$VOCAB" "$SEQS" "$layout" "$RATE"
cpu_info
args() {  # run dir, dp, zero, overlap[, tp]
  echo --config configs/gpt2-124m.toml --set "run.dir=\"$1\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' \
    --set train.steps=$STEPS --set model.n_layer=$LAYERS --set model.vocab_size=$VOCAB --set model.block_size=128 --set train.log_every=1 \
    --set lr_schedule.warmup_steps=0 --set train.batch_size=$(($2 * SEQS)) --set train.micro_batches=$SEQS \
    --set parallel.dp=$2 --set parallel.tp=${5:-1} --set parallel.sequence_parallel=$([ "${5:-1}" -gt 1 ] && echo "$SP" || echo false) --set optimizer.zero=$3 --set parallel.overlap=$4 --set checkpoint.every=0 \
    --set "checkpoint.dir=\"$1/ckpt\"" --set 'parallel.timeout="300s"'
}
means() {  # run dir -> "step_s exposed_s loss"
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l][2:]
mean = lambda k: sum(r.get(k, 0.0) for r in recs) / len(recs)
print("%.3f %.3f %.5f" % (mean("step_time_s"), mean("exposed_comm_s"), recs[-1]["loss"]))
PY
}
# Compute alone: dp 2's rank alone (one rank, one thread, on node1), or tp's two ranks both on node1 (no shaped link).
if [ "$TP" -gt 1 ]; then
  on_node1 timeout 900 mpirun --host "${SUB}1:2" "${MCA[@]}" -np 2 --bind-to none -x OMP_NUM_THREADS=1 \
    "$RELAY" train $(args "$work/alone" 1 0 false "$TP") >"$work/alone.log" 2>&1 || { tail -5 "$work/alone.log"; exit 1; }
  where="tp $TP, both ranks on node1"
else
  on_node1 env OMP_NUM_THREADS=1 "$RELAY" train $(args "$work/alone" 1 0 false) >"$work/alone.log" 2>&1 ||
    { tail -5 "$work/alone.log"; exit 1; }
  where="dp 1, one rank on node1"
fi
read -r compute _ _ <<<"$(means "$work/alone")"
printf "compute alone (%s): %.3f s a step\n\n" "$where" "$compute"
printf "%-6s %-8s %9s %16s %14s %12s %10s\n" "zero" "overlap" "step s" "exposed comm s" "comm alone s" "step/max" "loss"
for zero in ${ZEROS:-0 1 3}; do
  comm=0
  for overlap in false true; do
    dir="$work/z${zero}_$overlap"
    on_node1 timeout 900 mpirun --host "${SUB}1:1,${SUB}2:1" "${MCA[@]}" -np 2 --bind-to none -x OMP_NUM_THREADS=1 \
      "$RELAY" train $(args "$dir" $((TP > 1 ? 1 : 2)) $zero $overlap "$TP") >"$dir.log" 2>&1 ||
      { echo "zero $zero overlap $overlap failed:"; tail -5 "$dir.log"; continue; }
    read -r step exposed loss <<<"$(means "$dir")"
    [ "$overlap" = false ] && comm=$exposed
    printf "%-6s %-8s %9.3f %16.3f %14.3f %12.2f %10s\n" "$zero" "$overlap" "$step" "$exposed" "$comm" \
      "$(/usr/bin/python3 -c "print($step / max($compute, $comm))")" "$loss"
  done
done
load_at_end
