#!/usr/bin/env bash
# The working tree's tensor-core flash attention kernels against a base commit's (default HEAD), bit for bit, on a
# CPU model of their warp-level PTX (compare.cpp says what is checked). Needs g++ and the CUDA headers (cuda_bf16.h)
# only; about a minute on 2 cores (one OS thread per CUDA thread).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:-HEAD}
work=$(mktemp -d /tmp/relay-mma-model-XXXXXX)
trap 'rm -rf "$work"' EXIT
git show "$base:kernels/cuda/flash_attention_mma.cu" >"$work/base.cu"
python3 scripts/mma_model/extract.py "$work/base.cu" kernels/cuda/flash_attention_mma.cu "$work/base_kernels.inc" \
  "$work/tree_kernels.inc"
g++ -std=c++20 -O2 -w -I/usr/local/cuda/include -Iscripts/mma_model -I"$work" scripts/mma_model/compare.cpp \
  -o "$work/compare" -lpthread
"$work/compare"
