#!/usr/bin/env bash
# Configures and builds Relay.
#   scripts/build.sh [cmake -D options]          everything (relay, tests, benches) in build/ (CMake preset "release":
#                                                the CUDA backend too when /usr/local/cuda and NCCL are there; sm_90
#                                                only when no GPU is visible); test.sh
#   scripts/build.sh --relay [cmake -D options]  only the relay binary, for the demos: CPU-only in build-cpu/ (preset
#                                                "cpu"), unless a GPU is visible (nvidia-smi -L lists one) or
#                                                RELAY_CUDA=ON is set, then with CUDA in build/. Build output goes to
#                                                stderr; the binary's path is the one line on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu_visible() { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
if [ "${1:-}" != "--relay" ]; then
  # CUDA code for A100 and H100 plus PTX where a GPU is visible; without one it is compiled to be checked and for the
  # lent H100/H200 (bench/gpu_bundle.sh) only: sm_90, two fifths less nvcc time. RELAY_CUDA_ARCHS overrides both.
  archs="80-real;90-real;90-virtual"
  gpu_visible || archs="90-real"
  cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="${RELAY_CUDA_ARCHS:-$archs}" "$@" >/dev/null
  cmake --build --preset release
  exit 0
fi
shift
preset=cpu dir=build-cpu
if [ "${RELAY_CUDA:-}" = ON ] || { [ "${RELAY_CUDA:-}" != OFF ] && gpu_visible; }; then
  preset=release dir=build
  echo "build.sh: a GPU is visible (or RELAY_CUDA=ON): building relay with the CUDA backend in $dir/" >&2
else
  echo "build.sh: no GPU visible: building relay for the CPU in $dir/ (RELAY_CUDA=ON scripts/build.sh --relay adds CUDA)" >&2
fi
cmake --preset "$preset" "$@" >/dev/null
cmake --build --preset "$preset" --target relay >&2
echo "$dir/relay"
