#!/usr/bin/env bash
# The largest GPT that trains on dp 4 within 4 GiB per rank, by ZeRO stage (measures, never fails). A GPT-2-shaped
# model (vocabulary 50257, T 256, 1024 wide, 16 heads, one sequence per replica, recomputation, fp32) grows by
# layers until relay plan's step peak per rank passes 4 GiB; the largest that fits is then trained for 2 steps on 4
# ranks, each in a memory cgroup (v1) of 4 GiB, and the cgroup's peak usage is reported beside the plan.
# The plan counts Relay's tensors; the process holds more (libraries, MPI's shared memory, oneDNN's scratch, the
# host copies of a step's data): RESERVE MiB (default 600, measured: see bench/RESULTS.md) are kept for it, so the
# search's budget is 4096 - RESERVE MiB of planned peak.
# Usage: bench/zero_4gib.sh [relay binary (build/relay)] [stages ("0 1 2 3")] [reserve MiB (600)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
STAGES=${2:-"0 1 2 3"}
RESERVE=${3:-600}
BUDGET=$((4096 - RESERVE))
LIMIT=$((4 * 1024 * 1024 * 1024))
CG=/sys/fs/cgroup/memory
[ -w "$CG" ] || { echo "no writable cgroup v1 memory controller at $CG"; exit 0; }
work=$(mktemp -d /tmp/relay-bench-4g-XXXXXX)
trap 'rm -rf "$work"; for d in $CG/relay-4g-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done; true' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
random_gpt2_tokens "$work/tokens.h5" $((4 * 256 * 4 + 1))
cat > "$work/in_cgroup.sh" <<'SH'
#!/usr/bin/env bash
# One rank in its own memory cgroup of $LIMIT bytes, then the command.
cg=/sys/fs/cgroup/memory/relay-4g-$OMPI_COMM_WORLD_RANK
mkdir -p "$cg"
echo "$LIMIT" > "$cg/memory.limit_in_bytes"
echo $$ > "$cg/cgroup.procs"
exec "$@"
SH
chmod +x "$work/in_cgroup.sh"
model=(--set parallel.dp=4 --set train.batch_size=4 --set train.micro_batches=1 --set model.block_size=256
       --set model.n_embd=1024 --set model.n_head=16 --set 'train.recompute="blocks"' --set checkpoint.every=0)
peak_of() {  # zero n_layer -> planned step peak per rank, MiB (the larger pp rank: one here)
  local out; out=$("$RELAY" plan --config configs/gpt2-124m.toml "${model[@]}" --set optimizer.zero=$1 --set model.n_layer=$2)
  local p; p=$(echo "$out" | grep -o "the step's peak [0-9.]*" | awk '{print $4}' | head -1)
  [ -n "$p" ] && echo "$p" || echo "$out" | grep -A1 "  pp  tp" | tail -1 | awk '{print $7}'
}
printf "# 4 GiB per rank, dp 4: GPT-2 shape (V 50257, T 256, C 1024, 16 heads), fp32, recomputation; planned peak <= %d MiB\n" $BUDGET
cpu_info
for zero in $STAGES; do
  L=1
  while [ "$(awk -v p="$(peak_of $zero $((L + 1)))" -v b=$BUDGET 'BEGIN{print (p <= b)}')" = 1 ]; do L=$((L + 1)); done
  params=$("$RELAY" plan --config configs/gpt2-124m.toml "${model[@]}" --set optimizer.zero=$zero --set model.n_layer=$L |
           grep -o "[0-9]* parameters" | head -1)
  for r in 0 1 2 3; do [ -d $CG/relay-4g-$r ] && rmdir $CG/relay-4g-$r; done
  t0=$(date +%s)
  if mpirun --oversubscribe -np 4 --bind-to none -x OMP_NUM_THREADS=1 -x LIMIT=$LIMIT "$work/in_cgroup.sh" "$RELAY" train \
      --config configs/gpt2-124m.toml "${model[@]}" --set optimizer.zero=$zero --set model.n_layer=$L \
      --set "run.dir=\"$work/z$zero\"" --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=2 \
      --set lr_schedule.warmup_steps=0 --set "checkpoint.dir=\"$work/z$zero/ckpt\"" > "$work/z$zero.log" 2>&1; then
    result="trained 2 steps in $(( $(date +%s) - t0 )) s; $(grep -m1 -o "checkpoint step [0-9]*: .*" "$work/z$zero.log" | sed "s|$work/||")"
  else
    result="FAILED: $(grep -m1 -i "error\|killed\|signal" "$work/z$zero.log" | cut -c1-120)"
  fi
  used=""
  for r in 0 1 2 3; do
    used+=" $(awk '{printf "%.0f", $1 / 1048576}' $CG/relay-4g-$r/memory.max_usage_in_bytes)"
  done
  printf "zero %d: n_layer %d, %s; planned step peak %s MiB; cgroup peak per rank (MiB):%s; %s\n" \
    "$zero" "$L" "$params" "$(peak_of $zero $L)" "$used" "$result"
done
load_at_end
