#!/usr/bin/env bash
# Every shipped config (configs/*.toml) is valid: `relay plan` accepts it (the MLP configs with
# --input-dim, as their data is made by the user), and the real-model shapes have the parameter counts of
# the models they copy: GPT-2 124M 124,439,808 (nanoGPT's count, wpe included), SmolLM2-135M 134,515,008
# (transformers' LlamaForCausalLM of its config.json, tied embeddings).
# Usage: test_configs.sh <relay binary>
set -euo pipefail
RELAY=$(realpath "$1")
cd "$(dirname "$0")/../.."
declare -A want=([configs/gpt2-124m.toml]=124439808 [configs/smollm2-135m.toml]=134515008)
fail=0
for f in configs/*.toml; do
  if ! out=$("$RELAY" plan --config "$f" --input-dim 16 2>&1); then
    echo "FAIL $f: relay plan exited non-zero: $(echo "$out" | grep -m1 error)"
    fail=1
    continue
  fi
  n=$(echo "$out" | sed -n 's/^model: [a-z]*, \([0-9]*\) parameters.*/\1/p')
  if [[ -n ${want[$f]:-} && $n != "${want[$f]}" ]]; then
    echo "FAIL $f: $n parameters, expected ${want[$f]}"
    fail=1
    continue
  fi
  echo "ok   $f: $n parameters"
done
exit $fail
