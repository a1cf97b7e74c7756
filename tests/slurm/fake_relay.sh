#!/usr/bin/env bash
# tests/slurm/fake_relay.sh: a stand-in for the relay binary that keeps only its contract with the job
# scripts (CLI, exit codes 0/75/1, checkpoint/latest, metrics.jsonl, SIGUSR1/SIGTERM handling), so that
# the harness and jobscripts/ can be tested without a build. It trains nothing; its "loss" is a
# function of the step. Each rank is a plain process (no MPI): rank 0 writes every file.
#   fake_relay.sh train --config FILE [--set section.key=value ...]
#   fake_relay.sh data synth --out FILE [...]
# FAKE_RELAY_STEP_SECONDS (default 0.05) sets the time per step.
set -uo pipefail

rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}
world=${OMPI_COMM_WORLD_SIZE:-${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}}}
error() { [[ $rank == 0 ]] && echo "[rank $rank] error: $*" >&2; exit 1; }

if [[ ${1:-} == data && ${2:-} == synth ]]; then
  shift 2; out=""
  while (( $# )); do [[ $1 == --out ]] && out=$2; shift 2 || break; done
  [[ -n $out ]] || error "data synth: --out is required"
  echo "fake dataset" >"$out"; exit 0
fi
[[ ${1:-} == train ]] || error "unknown command '${1:-}' (fake relay knows: train, data synth)"
shift

# Config: [section] headers and key = value lines of a flat TOML file, then --set overrides.
declare -A cfg=([train.log_every]=1 [checkpoint.every]=0 [checkpoint.resume]=none [parallel.dp]=1 [parallel.pp]=1)
config=""; sets=()
while (( $# )); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    *) error "unknown option '$1'" ;;
  esac
done
[[ -r $config ]] || error "cannot read config '$config'"
section=""
while IFS= read -r line; do
  line=${line%%#*}
  if [[ $line =~ ^[[:space:]]*\[([A-Za-z_]+)\] ]]; then section=${BASH_REMATCH[1]}
  elif [[ $line =~ ^[[:space:]]*([A-Za-z_]+)[[:space:]]*=[[:space:]]*\"?([^\"]*)\"?[[:space:]]*$ ]]; then
    cfg[$section.${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
  fi
done <"$config"
for s in "${sets[@]}"; do
  [[ $s == *.*=* ]] || error "--set '$s': expected section.key=value"
  cfg[${s%%=*}]=${s#*=}
done
for k in "${!cfg[@]}"; do  # like Relay, refuse keys it does not know (checked for [train] only)
  [[ $k != train.* || $k =~ ^train\.(steps|batch_size|micro_batches|log_every|eval_every|clip_grad_norm|device|precision|threads|time_limit)$ ]] \
    || error "$config: $k: unknown key"
done
steps=${cfg[train.steps]:-}
[[ $steps =~ ^[0-9]+$ && $steps -gt 0 ]] || error "$config: train.steps: must be a positive integer, got '${steps}'"
(( ${cfg[parallel.dp]} * ${cfg[parallel.pp]} == world )) \
  || error "world size $world != parallel.dp x parallel.pp = ${cfg[parallel.dp]} x ${cfg[parallel.pp]}"
run_dir=${cfg[run.dir]:?run.dir missing}
ckpt_dir=${cfg[checkpoint.dir]:-$run_dir/checkpoints}
every=${cfg[checkpoint.every]}
metrics=$run_dir/metrics.jsonl

stop=""
trap 'stop=10; echo "[rank $rank] got SIGUSR1"' USR1
trap 'stop=15; echo "[rank $rank] got SIGTERM"' TERM

checkpoint() {  # rank 0 writes step_%08d.h5 and points latest at it
  [[ $rank == 0 ]] || return 0
  local f; printf -v f 'step_%08d.h5' "$1"
  echo "fake checkpoint at step $1" >"$ckpt_dir/$f"; echo "$f" >"$ckpt_dir/latest"
}

start=0
if [[ ${cfg[checkpoint.resume]} == auto && -r $ckpt_dir/latest ]]; then
  latest=$(<"$ckpt_dir/latest")
  [[ $latest =~ step_([0-9]+) ]] || error "$ckpt_dir/latest: no step in '$latest'"
  start=$((10#${BASH_REMATCH[1]}))
  # Records after the checkpoint belong to the run that is being replaced.
  [[ $rank == 0 && -e $metrics ]] && python3 -c '
import json, sys
path, start = sys.argv[1], int(sys.argv[2])
keep = [l for l in open(path) if l.strip() and json.loads(l)["step"] <= start]
open(path, "w").writelines(keep)' "$metrics" "$start"
  [[ $rank == 0 ]] && echo "relay: resumed from $ckpt_dir/$latest at step $start"
fi
[[ $rank == 0 ]] && mkdir -p "$run_dir" "$ckpt_dir"
# Relay's ranks agree to stop and pass a barrier before any exits (mpirun aborts the others when one
# exits non-zero); a file per rank stands in for it. Each rank clears its own from an earlier run.
barrier=$run_dir/.fake-stopped; mkdir -p "$barrier"; rm -f "$barrier/$rank"

for (( step = start + 1; step <= steps; step++ )); do
  sleep "${FAKE_RELAY_STEP_SECONDS:-0.05}"
  if [[ $rank == 0 ]] && (( step % ${cfg[train.log_every]} == 0 )); then
    # 2 / (1 + step / 100), in integer micro-units: no command substitution for a signal to land in.
    micro=$(( 200000000 / (100 + step) )); printf -v loss '%d.%06d' $((micro / 1000000)) $((micro % 1000000))
    echo "step $step/$steps loss $loss"
    printf '{"step": %d, "loss": %s, "lr": 0.001, "grad_norm": 1.0, "samples_per_s": 1000.0}\n' "$step" "$loss" >>"$metrics"
  fi
  (( every > 0 && step % every == 0 && step < steps )) && checkpoint "$step"
  if [[ -n $stop ]]; then
    checkpoint "$step"
    [[ $rank == 0 ]] && echo "relay: stopping at step $step on signal $stop; checkpoint written, exit code 75 (resumable)"
    touch "$barrier/$rank"
    for (( i = 0; i < 300; i++ )); do
      arrived=("$barrier"/*); (( ${#arrived[@]} >= world )) && break
      sleep 0.1
    done
    exit 75
  fi
done
checkpoint "$steps"
[[ $rank == 0 ]] && echo "training done: $steps steps"
exit 0
