#!/usr/bin/env bash
# Configures and builds Relay in build/ (CMake preset "release": the CUDA backend is compiled too
# when /usr/local/cuda and NCCL are there). Usage: scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release "$@" >/dev/null
cmake --build --preset release
