#!/usr/bin/env bash
# kill -9 of a non-zero rank (world rank 3, the last stage) mid-run: Open MPI ends the job within
# seconds; the newest checkpoint is intact and the resume continues the loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
start
wait_steps 120
kill -KILL "$(rank_pid 3)"; fault_now
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit code 0 after a rank was killed"
expect_in_output "signal 9"
resume_matches
pass "kill -9 of rank 3: ended in ${ENDED} s"
