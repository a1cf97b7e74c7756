#!/usr/bin/env bash
# Runs the Slurm tests outside ctest, one after another, and prints a table.
#   bash tests/slurm/run_tests.sh [--fake | RELAY_BINARY] [NAME ...]
# RELAY_BINARY defaults to <repo>/build/relay. --fake runs them against tests/slurm/fake_relay.sh,
# which keeps Relay's contract with the job scripts but trains nothing: it checks the harness, the
# scripts and the tests themselves before (or without) a build. NAME: harness, sbatch_cpu, ...
# Exit 0 when nothing failed (skips allowed), 1 otherwise. Logs stay in the directory it prints.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
relay=$here/../../build/relay
if [[ ${1:-} == --fake ]]; then
  relay=$here/fake_relay.sh; shift
  export FAKE_RELAY_STEP_SECONDS=${FAKE_RELAY_STEP_SECONDS:-0.02} RELAY_TEST_PREEMPT_STEPS=${RELAY_TEST_PREEMPT_STEPS:-600}
elif [[ -n ${1:-} && ( $1 == */* || -x $1 ) ]]; then
  relay=$1; shift
fi
tests=()
if (( $# )); then for n in "$@"; do tests+=("$here/test_${n#test_}"); tests[-1]=${tests[-1]%.sh}.sh; done
else tests=("$here"/test_*.sh); fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/relay-slurm-tests.XXXXXX")
echo "relay: $relay"; echo "logs:  $logs"
printf '%-24s %-8s %8s  %s\n' "test" "result" "time (s)" "detail"
failed=0
for t in "${tests[@]}"; do
  name=$(basename "$t" .sh) log=$logs/$name.log
  start=$(date +%s)
  timeout 900 bash "$t" "$relay" >"$log" 2>&1; rc=$?
  case $rc in 0) result=PASS ;; 77) result=SKIP ;; *) result="FAIL($rc)"; failed=1 ;; esac
  detail=$(grep -E '^(FAIL|SKIPPED):' "$log" | head -n 1 | cut -c1-100)
  printf '%-24s %-8s %8d  %s\n' "$name" "$result" $(( $(date +%s) - start )) "$detail"
done
exit $failed
