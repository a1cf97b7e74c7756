#!/usr/bin/env bash
# jobscripts/relay-mpirun.sh, the workstation launcher (no Slurm involved): threads per rank from the
# cores, --oversubscribe past them; SIGUSR1 and SIGTERM to the wrapper make Relay checkpoint and exit
# 75 (TERM arrives as USR1: mpirun would kill the ranks a second after passing TERM on); rerunning
# with checkpoint.resume=auto finishes the run with every step logged once.
#   bash tests/slurm/test_relay_mpirun.sh [path/to/relay]     exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
source "$(dirname "$0")/harness.sh"
source "$(dirname "$0")/relay_fixture.sh"
use_relay_binary "${1:-}"
command -v mpirun >/dev/null || skip "mpirun not found (install openmpi-bin)"
WRAP=$REPO_ROOT/jobscripts/relay-mpirun.sh
export RELAY_BIN=$RELAY OMPI_MCA_mpi_yield_when_idle=1
WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/relay-mpirun-test.XXXXXX") || fail "mktemp"
trap 'rm -rf "$WORK_DIR"' EXIT

# 1. Sizing, from the command it prints: T = max(1, cores / ranks), --oversubscribe iff ranks > cores.
for n in 1 2 4 16; do
  out=$("$WRAP" -n "$n" --dry-run -- train --config x.toml 2>&1) || fail "-n $n --dry-run failed: $out"
  [[ $out =~ ([0-9]+)\ ranks\ x\ ([0-9]+)\ threads\ on\ ([0-9]+)\ cores ]] || fail "-n $n: no sizing line in '$out'"
  t=${BASH_REMATCH[2]} c=${BASH_REMATCH[3]}
  (( c >= 1 && c <= $(nproc) )) || fail "-n $n: $c cores, but nproc says $(nproc)"
  (( t == (c / n > 0 ? c / n : 1) )) || fail "-n $n on $c cores: $t threads per rank"
  [[ $out == *"-x OMP_NUM_THREADS=$t "* && $out == *"mpirun -np $n "* ]] || fail "-n $n: wrong command: $out"
  if (( n > c )); then [[ $out == *--oversubscribe*"--bind-to none"* ]] || fail "-n $n > $c cores: expected --oversubscribe and --bind-to none: $out"
  else [[ $out != *--oversubscribe* && $out == *"--map-by slot:PE=$t --bind-to core"* ]] || fail "-n $n <= $c cores: expected binding to cores: $out"; fi
done
out=$("$WRAP" -n 2 --threads 3 --bind none --dry-run -- train 2>&1)
[[ $out == *"-x OMP_NUM_THREADS=3 "* && $out == *"--bind-to none"* ]] || fail "--threads 3 --bind none ignored: $out"
"$WRAP" --dry-run -- train >/dev/null 2>&1; [[ $? == 2 ]] || fail "no -n: expected exit 2"
"$WRAP" -n 2 --bind socket -- train >/dev/null 2>&1; [[ $? == 2 ]] || fail "--bind socket: expected exit 2"
log "sizing: threads = cores / ranks, --oversubscribe past the cores, usage errors exit 2"

# 2. Stop with a signal mid-run, then resume and finish. Four ranks, dp = 2 x pp = 2.
make_data "$WORK_DIR/data"
write_config "$WORK_DIR/test.toml" "$WORK_DIR/data" 4096
steps=${RELAY_TEST_PREEMPT_STEPS:-2000}
for sig in USR1 TERM; do
  run=$WORK_DIR/run-$sig out=$WORK_DIR/$sig.out
  args=(-n 4 -- train --config "$WORK_DIR/test.toml" --set run.dir="$run" --set train.steps="$steps"
        --set checkpoint.resume=auto --set checkpoint.every=$((steps / 4)))
  "$WRAP" "${args[@]}" >"$out" 2>&1 &
  pid=$!
  _third() { (( $(metrics_steps "$run") >= steps / 3 )) || ! kill -0 "$pid" 2>/dev/null; }
  wait_until 300 _third || { kill -KILL "$pid"; show "$out"; fail "SIG$sig: no progress in 300 s"; }
  kill -0 "$pid" 2>/dev/null || { show "$out"; fail "SIG$sig: the run ended before the signal; raise RELAY_TEST_PREEMPT_STEPS"; }
  kill -"$sig" "$pid"
  _ended() { ! kill -0 "$pid" 2>/dev/null; }
  wait_until 120 _ended || { kill -KILL "$pid"; show "$out"; fail "SIG$sig: still running 120 s after the signal"; }
  wait "$pid"; rc=$?
  [[ $rc == 75 ]] || { show "$out"; fail "SIG$sig: exit $rc, expected 75"; }
  # Relay names the signal that stopped it: USR1 (10) in both cases.
  grep -Eq 'stopping at step [0-9]+ on signal 10\b' "$out" || { show "$out"; fail "SIG$sig: Relay did not stop on SIGUSR1"; }
  "$WRAP" "${args[@]}" >>"$out" 2>&1 || { show "$out"; fail "SIG$sig: the resumed run failed"; }
  grep -q 'resumed from' "$out" || { show "$out"; fail "SIG$sig: the second run did not resume"; }
  check_train_steps "$run" "$steps"
  check_final_checkpoint "$run" "$steps"
  log "SIG$sig to the wrapper: exit 75 after a checkpoint; the rerun resumed and finished"
done
same_losses "$WORK_DIR/run-USR1" "$WORK_DIR/run-TERM"
log "PASS: relay-mpirun.sh sizes the ranks and turns USR1/TERM into a checkpoint and exit 75"
