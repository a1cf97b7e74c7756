#!/usr/bin/env bash
# kill -9 of rank 0 (the checkpoint writer) mid-run.
source "$(dirname "$0")/lib.sh" "$1"
reference
start
wait_steps 120
kill -KILL "$(rank_pid 0)"; fault_now
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit code 0 after rank 0 was killed"
expect_in_output "signal 9"
resume_matches
pass "kill -9 of rank 0: ended in ${ENDED} s"
