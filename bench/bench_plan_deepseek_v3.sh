#!/bin/bash
# DeepSeek-V3 671B (configs/models/deepseek-v3.toml) on NODES H100 nodes: `relay plan --cluster --layout` over a grid
# of layouts (tp 1/2/4/8 x pp 4/8/16/32 x ep 8/16/32/64 dividing dp x 1 or 2 sequences a micro-batch x ZeRO-1/3,
# recomputation, 1F1B), one line each, the fitting ones sorted by tokens/s per device at the end. The full search
# (`relay plan --cluster ... --nodes NODES` without --layout) covers more: about a minute of CPU at 256 nodes since
# it builds each layout shape once (src/plan/layout_cache.hpp); this grid stays to evaluate layouts the search skips.
# Usage: bench/bench_plan_deepseek_v3.sh NODES [RELAY]   (docs/planning.md "DeepSeek-V3 671B")
set -euo pipefail
N=${1:?usage: $0 NODES [RELAY]}
RELAY=${2:-build/relay}
cd "$(dirname "$0")/.."
B=15360  # train.batch_size of the config
out=$(mktemp)
for tp in 1 2 4 8; do for pp in 4 8 16 32; do
  world=$((N * 8)); dp=$((world / (tp * pp)))
  [ "$dp" -ge 1 ] || continue
  for ep in 8 16 32 64; do
    [ $((dp % ep)) -eq 0 ] || continue
    for mbs in 1 2; do
      [ $((B % (dp * mbs))) -eq 0 ] || continue
      for zero in 1 3; do
        "$RELAY" plan --cluster configs/clusters/h100-80gb-sxm-ndr.toml --nodes "$N" \
          --config configs/models/deepseek-v3.toml --layout --set parallel.dp=$dp --set parallel.ep=$ep \
          --set parallel.pp=$pp --set parallel.tp=$tp --set train.micro_batches=$((B / dp / mbs)) \
          --set optimizer.zero=$zero --set train.recompute='"blocks"' 2>&1 | grep -E "^  1 |error" | tee -a "$out"
      done
    done
  done
done; done
echo "fitting layouts (mem <= 77.6 GiB, the preset's 79.6 less the runtime's 2.0), fastest first:"
awk '$(NF-3) + 0 <= 77.6 {print $(NF-6) "\t" $0}' "$out" | sort -rn | cut -f2-
rm -f "$out"
