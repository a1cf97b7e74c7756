#!/usr/bin/env bash
# Generation's cache and speed (measures, never fails): `relay generate` from the small DeepSeek-V3
# (configs/deepseek-v3-small-bytes.toml: multi-head latent attention, whose cache holds per token and layer the
# kv_lora_rank latent + the qk_rope_head_dim rotary key, decoded in the absorbed form) against a GQA Llama of the same
# width (configs/llama-small-bytes.toml made 2 layers of n_embd 64, 4 heads sharing 2 key/value heads of 16, SwiGLU
# 176: the DeepSeek model's dense layer), both given a context of T positions, each trained 1 step on random bytes.
# cache B/token: the line relay generate prints (DeepSeek-V3: layers x (r + dr) x 4 bytes; Llama: layers x 2 x KV x hd x
# 4 bytes); "standard B/token": the DeepSeek model's heads' keys and values as a standard cache would hold them
# (layers x heads x (qk_nope + qk_rope + v_head_dim) x 4 bytes); MLA/GQA: the two models' cache bytes per token.
# tokens/s = new tokens / (wall time of generating them - wall time of the same command with 0 new tokens: loading the
# checkpoint), the best of ROUNDS; check: ok when relay's printed total = bytes per token x the tokens the run held.
# Usage: bench/bench_generate_cache.sh [relay binary (build/relay)] [T (256)] [threads (1)] [rounds (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/cpu_info.sh
source bench/random_tokens.sh
RELAY=$(realpath "${1:-build/relay}")
T=${2:-256}
THREADS=${3:-1}
ROUNDS=${4:-3}
PROMPT=16
NEW=$((T - PROMPT))  # the whole context: every new token attends over all the cached ones before it
work=$(mktemp -d /tmp/relay-bench-generate-XXXXXX)
trap 'rm -rf "$work"' EXIT

printf "# Relay generation cache benchmark: context %d (prompt %d + %d new tokens), %d thread(s), best of %d\n" \
  "$T" "$PROMPT" "$NEW" "$THREADS" "$ROUNDS"
cpu_info
random_byte_tokens "$work/tokens.h5" 200000
seq 1 $PROMPT | tr '\n' ' ' >"$work/prompt.txt"

train() {  # name config [--set ...]
  local name=$1 config=$2
  shift 2
  OMP_NUM_THREADS=$THREADS "$RELAY" train --config "$config" --set "run.dir=\"$work/$name\"" \
    --set "data.train=\"$work/tokens.h5\"" --set 'data.eval=""' --set train.steps=1 --set lr_schedule.warmup_steps=0 \
    --set train.batch_size=2 --set train.micro_batches=1 --set train.threads="$THREADS" --set model.block_size="$T" \
    "$@" >"$work/$name.train" 2>&1 || { echo "# $name: training failed: $(tail -n1 "$work/$name.train")"; return 1; }
}
seconds() {  # checkpoint new-tokens -> wall seconds of relay generate (its output in $work/gen.out)
  local t0 t1
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=$THREADS "$RELAY" generate --checkpoint "$1" --prompt-tokens "$work/prompt.txt" \
    --max-new-tokens "$2" --temperature 0 >"$work/gen.out" 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
measure() {  # name -> "bytes_per_token standard_per_token total held tokens_per_s"
  local ck="$work/$1/checkpoints/step_00000001.h5" best="" base="" s
  for ((i = 0; i < ROUNDS; ++i)); do
    s=$(seconds "$ck" 0)
    [[ -z $base ]] || (($(echo "$s < $base" | bc -l))) && base=$s
    s=$(seconds "$ck" "$NEW")
    [[ -z $best ]] || (($(echo "$s < $best" | bc -l))) && best=$s
  done
  python3 - "$work/gen.out" "$best" "$base" "$NEW" <<'PY'
import re, sys
line = next(l for l in open(sys.argv[1], encoding="latin-1") if l.startswith("cache: "))
per = int(re.search(r"cache: (\d+) bytes per token", line).group(1))
total, held = map(int, re.search(r"; (\d+) bytes for the (\d+) tokens", line).groups())
std = re.search(r"standard key-value cache of the same heads: (\d+) bytes per token", line)
gen = float(sys.argv[2]) - float(sys.argv[3])
print(per, std.group(1) if std else per, total, held, "%.1f" % (int(sys.argv[4]) / gen if gen > 0 else 0))
PY
}

train dsv3 configs/deepseek-v3-small-bytes.toml
train llama configs/llama-small-bytes.toml --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 \
  --set model.n_kv_head=2 --set model.ffn_hidden=176
read -r d_per d_std d_total d_held d_tps <<<"$(measure dsv3)"
read -r l_per l_std l_total l_held l_tps <<<"$(measure llama)"
check() { (($1 * $2 == $3)) && echo ok || echo "BAD ($1 x $2 != $3)"; }
printf "\n%-28s %14s %18s %14s %12s %10s  %s\n" model "cache B/token" "standard B/token" "run's cache B" tokens/s \
  "vs llama" check
printf "%-28s %14d %18d %14d %12s %10s  %s\n" "deepseek-v3-small (MLA)" "$d_per" "$d_std" "$d_total" "$d_tps" \
  "$(printf %.2f "$(echo "$d_tps / $l_tps" | bc -l)")" "$(check "$d_per" "$d_held" "$d_total")"
printf "%-28s %14d %18d %14d %12s %10s  %s\n" "llama 2 x 64, GQA 4q/2kv" "$l_per" "$l_std" "$l_total" "$l_tps" "1.00" \
  "$(check "$l_per" "$l_held" "$l_total")"
printf "# MLA / GQA cache bytes per token: %.3f (MLA's against its own heads' standard cache: %.3f)\n" \
  "$(echo "$d_per / $l_per" | bc -l)" "$(echo "$d_per / $d_std" | bc -l)"
load_at_end
