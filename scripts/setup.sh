#!/usr/bin/env bash
# Installs everything Relay needs from Debian 12's packages. Idempotent: a second run installs nothing.
# Usage: scripts/setup.sh [--with-slurm] [--with-torch] [--with-extras]
# Without options: what building and running relay needs (demo.sh). --with-extras: English text for the language-model
# demo and tests, matplotlib for scripts/plot_run.py (demo_gpt.sh). test.sh asks for all three.
set -euo pipefail
pkgs=(cmake g++ make pkg-config python3 libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libcli11-dev
      libtomlplusplus-dev libdnnl-dev libgtest-dev libpcre2-dev nlohmann-json3-dev libzstd-dev zstd)
for a in "$@"; do
  case "$a" in
    --with-slurm) pkgs+=(slurm-wlm slurm-wlm-basic-plugins munge libpmix2 openmpi-bin iproute2) ;;  # iproute2: the two-node test
    --with-torch) pkgs+=(python3-torch python3-h5py python3-numpy libopenblas0-pthread python3-venv) ;;  # venv: tiktoken for the tokenizer test  # torch uses libblas.so.3: OpenBLAS, not the reference BLAS
    --with-extras) pkgs+=(python3-matplotlib  # scripts/plot_run.py
                          fortunes) ;;  # offline English text for the GPT demo and tests (/usr/share/games/fortunes)
    *) echo "setup.sh: unknown option '$a' (known: --with-slurm, --with-torch, --with-extras)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
