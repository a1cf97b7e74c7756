#!/usr/bin/env bash
# Relay on one machine (a workstation, or a node you are logged in to) under Open MPI's mpirun.
#   jobscripts/relay-mpirun.sh -n 4 [--threads T] [--bind core|none] [--restarts N] [--dry-run] -- train --config configs/demo.toml [--set ...]
# Threads per rank default to cores / ranks (OMP_NUM_THREADS, passed with -x); more ranks than cores
# adds --oversubscribe. SIGUSR1 and SIGTERM reach the ranks as SIGUSR1: Relay checkpoints and exits 75.
# --restarts N starts a run that lost or stalled a rank again from its newest checkpoint, N times at most.
# Details: jobscripts/README.md.
set -uo pipefail

usage() {
  cat >&2 <<EOF
usage: $0 -n RANKS [--threads T] [--bind core|none] [--restarts N] [--dry-run] -- RELAY_ARGS...
  -n RANKS      MPI ranks (= parallel.dp x parallel.pp)
  --threads T   OpenMP threads per rank (default: cores / RANKS, at least 1)
  --bind MODE   core: each rank bound to its T cores (default when RANKS x T <= cores); none
  --restarts N  relay train only: when a rank is lost (killed by a signal) or stalls (exit 74), start
                again from the newest checkpoint, at most N times (default 0); exit 76 when a restart
                failed again no further than the run before it
  --dry-run     print the mpirun command and exit
  RELAY_BIN     the relay binary (default: <repo>/build/relay, else relay on PATH)
  RELAY_MPIRUN_ARGS  extra mpirun options, e.g. "--mca btl ^openib"
EOF
  exit 2
}
die() { echo "relay-mpirun.sh: error: $*" >&2; exit 2; }

ranks="" threads="" bind="" dry_run=0 max_restarts=0
while (( $# )); do
  case $1 in
    -n|-np|--ranks) [[ $# -ge 2 ]] || usage; ranks=$2; shift 2 ;;
    --threads) [[ $# -ge 2 ]] || usage; threads=$2; shift 2 ;;
    --bind) [[ $# -ge 2 ]] || usage; bind=$2; shift 2 ;;
    --restarts) [[ $# -ge 2 ]] || usage; max_restarts=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "relay-mpirun.sh: unknown option '$1' (relay's own arguments go after --)" >&2; usage ;;
  esac
done
[[ $ranks =~ ^[1-9][0-9]*$ ]] || die "-n RANKS: expected a positive integer, got '$ranks'"
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] || die "--threads: expected a positive integer, got '$threads'"
[[ -z $bind || $bind == core || $bind == none ]] || die "--bind: expected core or none, got '$bind'"
[[ $max_restarts =~ ^[0-9]+$ ]] || die "--restarts: expected a non-negative integer, got '$max_restarts'"
(( $# )) || die "no relay arguments after --; e.g. -- train --config configs/demo.toml"
(( max_restarts == 0 )) || [[ $1 == train ]] || die "--restarts: only for relay train, not '$1'"

if [[ -n ${RELAY_BIN:-} ]]; then
  [[ -x $RELAY_BIN ]] || die "RELAY_BIN=$RELAY_BIN is not an executable file"
  relay=$RELAY_BIN
elif [[ -x $(dirname "${BASH_SOURCE[0]}")/../build/relay ]]; then
  relay=$(realpath "$(dirname "${BASH_SOURCE[0]}")/../build/relay")
else
  relay=$(command -v relay) || die "relay binary not found: set RELAY_BIN, build <repo>/build/relay, or put relay on PATH"
fi

# Cores: the CPUs this process may run on (nproc honours affinity and cpusets), counted once per
# physical core when hyperthreads share one; OpenMP threads gain little from a core's second thread.
cpus=$(nproc)
physical=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
cores=$(( physical > 0 && physical < cpus ? physical : cpus ))
threads=${threads:-$(( cores / ranks > 0 ? cores / ranks : 1 ))}
bind=${bind:-$( (( ranks * threads <= cores )) && echo core || echo none )}

cmd=(mpirun -np "$ranks")
(( ranks > cores )) && cmd+=(--oversubscribe)
if [[ $bind == core ]]; then cmd+=(--map-by "slot:PE=$threads" --bind-to core)
else cmd+=(--bind-to none); fi
cmd+=(-x "OMP_NUM_THREADS=$threads" -x RELAY_RESTART_COUNT -x RELAY_RESTART_CAUSE)
read -r -a extra <<<"${RELAY_MPIRUN_ARGS:-}"
cmd+=("${extra[@]}" "$relay" "$@")
# Open MPI refuses to start as root unless told twice.
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The restart count and cause reach Relay's metrics.jsonl (and its check that a restart made progress).
export RELAY_RESTART_COUNT=0 RELAY_RESTART_CAUSE=""

echo "relay-mpirun.sh: $ranks ranks x $threads threads on $cores cores, bind $bind" >&2
echo "relay-mpirun.sh: ${cmd[*]}" >&2
(( dry_run )) && exit 0

# mpirun forwards SIGUSR1 to every rank, but answers SIGTERM by killing the ranks about a second
# later, too soon for a checkpoint; so TERM is passed on as USR1 (Relay treats both alike).
# SIGINT (Ctrl-C) is passed on as it is: mpirun then aborts the run.
mpirun_pid="" signalled=0
forward() {
  in_trap=1 signalled=1
  echo "relay-mpirun.sh: SIG$1: passing SIG$2 to mpirun" >&2
  [[ -n $mpirun_pid ]] && kill -"$2" "$mpirun_pid" 2>/dev/null
}
trap 'forward USR1 USR1' USR1
trap 'forward TERM USR1' TERM
trap 'forward INT INT' INT

# restart_cause RC: why a run that ended with RC may be started again, or nothing (status 1) when it
# may not: done (0), stopped with a checkpoint (75), an error that would repeat (1), no progress (76).
restart_cause() {
  if (( $1 == 74 )); then echo "a rank stalled: the progress watchdog ended the run, exit 74"
  elif (( $1 > 128 )); then echo "a rank was lost: exit $1, SIG$(kill -l $(( $1 - 128 )) 2>/dev/null || echo "$(( $1 - 128 ))")"
  else return 1; fi
}

restart=0
while :; do
  "${cmd[@]}" &
  mpirun_pid=$!
  while :; do
    in_trap=0
    wait "$mpirun_pid"; rc=$?
    (( in_trap )) || break
  done
  # A run we were asked to stop is never restarted; nor are errors, nor a run without restarts left.
  (( ! signalled )) && cause=$(restart_cause "$rc") || break
  if (( restart >= max_restarts )); then
    (( max_restarts > 0 )) && echo "relay-mpirun.sh: $cause; no restarts left (--restarts $max_restarts)" >&2
    break
  fi
  restart=$(( restart + 1 ))
  export RELAY_RESTART_COUNT=$restart RELAY_RESTART_CAUSE=$cause
  # From the newest checkpoint, whatever the first run resumed from.
  (( restart == 1 )) && cmd+=(--set checkpoint.resume=auto)
  echo "relay-mpirun.sh: restart $restart of $max_restarts: $cause; starting again from the newest checkpoint" >&2
done
(( rc == 76 )) && echo "relay-mpirun.sh: relay exit 76: the last restart got no further than the run before it; not restarting" >&2
exit "$rc"
