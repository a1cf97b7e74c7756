#!/usr/bin/env bash
# Packs what a GPU call runs (relay, the CUDA tests, the benchmarks' binaries), stripped, into .gpu-bundle/ by way of
# ../shared/gpu/bundle.sh: every test binary links the CUDA kernels (14 MB each), and the whole build/ packs to more
# than the device tool's 64 MiB carry. On the GPU machine the staged tree is moved to build/ (the tests' paths):
#   eval "$(bash .gpu-bundle/setup.sh)" && rm -rf build && mv /opt/relay-root/work/main/build-gpu build && bench/gpu_check.sh
# Usage (from the checkout root, after cmake --build --preset release): bench/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=build-gpu
rm -rf "$STAGE" && mkdir -p "$STAGE/tests" "$STAGE/bench"
cp build/relay "$STAGE/"
for t in test_gpu_peaks test_backend_ops test_gpu_training_mpi; do cp "build/tests/$t" "$STAGE/tests/"; done
find build/bench -maxdepth 1 -type f -perm -u+x -exec cp {} "$STAGE/bench/" \;
find "$STAGE" -type f -perm -u+x -exec strip --strip-debug {} \;
../shared/gpu/bundle.sh "$PWD/$STAGE"
