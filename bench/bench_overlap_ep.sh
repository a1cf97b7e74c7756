#!/usr/bin/env bash
# Expert-parallel communication overlap (parallel.overlap; measures, never fails): a MoE model on dp 2 x ep 2, one
# rank of one thread each, overlap off and on back to back. With overlap each MoE layer exchanges its rows in two parts
# (each rank's first half of its experts, then the rest: model/moe.cpp), one part's all-to-all travelling on the
# progress thread while the other part's experts compute. Per run, the means after the first 2 steps of metrics.jsonl's
# step_time_s, ep_alltoall_s (the slowest rank's time waiting on (and starting) its all-to-alls per step, the count
# exchange included: all of their time without overlap) and rank 0's exposed_comm_s (its data-parallel waits plus its
# ep waits), and the last loss (the same bits on and off).
# Where: "local" runs both ranks on this machine (the all-to-alls go through shared memory, their copies on the same
# cores as the compute); with SHAPED=RATE (root) also across the two namespace nodes of tests/multinode/namespaces.sh,
# the link between them capped by tc tbf at RATE both ways (Open MPI's TCP transport), as bench_overlap_shaped.sh does.
# Model: configs/mixtral-small-bytes.toml (8 experts of 176 units, top 2, C 128) at T 256 and SEQS sequences a rank
# and step (micro-batches of one sequence).
# Usage: [SHAPED=1gbit] bench/bench_overlap_ep.sh [relay binary (build/relay)] [steps (6)] [SEQS (4)] [T (256)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STEPS=${2:-6} SEQS=${3:-4} T=${4:-256}
work=$(mktemp -d /tmp/relay-bench-overlap-ep-XXXXXX)
cleanup() { [ -n "${SHAPED:-}" ] && remove_two_nodes; rm -rf "$work"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_byte_tokens "$work/tokens.h5" $((2 * SEQS * T * (STEPS + 1) + 1))
printf "# ep overlap benchmark: mixtral-small-bytes at T %d, %d sequences a rank and step, dp 2 x ep 2 (2 ranks x 1 thread), %d steps\n" \
  "$T" "$SEQS" "$STEPS"
cpu_info
args() {  # run dir, overlap
  echo --config configs/mixtral-small-bytes.toml --set "run.dir=\"$1\"" --set "data.train=\"$work/tokens.h5\"" \
    --set 'data.eval=""' --set model.block_size=$T --set train.batch_size=$((2 * SEQS)) --set train.micro_batches=$SEQS \
    --set train.steps=$STEPS --set train.log_every=1 --set lr_schedule.warmup_steps=0 --set train.threads=1 \
    --set parallel.dp=2 --set parallel.ep=2 --set parallel.overlap=$2 --set checkpoint.every=0 \
    --set "checkpoint.dir=\"$1/ckpt\"" --set 'parallel.timeout="300s"'
}
means() {  # run dir -> "step_s ep_alltoall_s exposed_s loss"
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l][2:]
mean = lambda k: sum(r.get(k, 0.0) for r in recs) / len(recs)
print("%.3f %.4f %.4f %.9f" % (mean("step_time_s"), mean("ep_alltoall_s"), mean("exposed_comm_s"), recs[-1]["loss"]))
PY
}
printf "%-16s %-8s %9s %16s %16s %14s\n" "where" "overlap" "step s" "ep all-to-all s" "exposed comm s" "loss"
row() {  # where, overlap, run dir
  read -r step a2a exposed loss <<<"$(means "$3")"
  printf "%-16s %-8s %9.3f %16.4f %16.4f %14s\n" "$1" "$2" "$step" "$a2a" "$exposed" "$loss"
}
for overlap in false true; do
  dir="$work/local-$overlap"
  mpirun --oversubscribe -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$RELAY" train $(args "$dir" $overlap) \
    >"$dir.log" 2>&1 || { echo "local overlap $overlap failed:"; tail -5 "$dir.log"; continue; }
  row local $overlap "$dir"
done
if [ -n "${SHAPED:-}" ]; then
  source tests/multinode/namespaces.sh
  make_two_nodes "$work"
  shape_link "$SHAPED"
  for overlap in false true; do
    dir="$work/shaped-$overlap"
    on_node1 timeout 900 mpirun --host "${SUB}1:1,${SUB}2:1" "${MCA[@]}" -np 2 --bind-to none -x OMP_NUM_THREADS=1 \
      "$RELAY" train $(args "$dir" $overlap) >"$dir.log" 2>&1 ||
      { echo "shaped overlap $overlap failed:"; tail -5 "$dir.log"; continue; }
    row "link $SHAPED" $overlap "$dir"
  done
fi
load_at_end
