#!/usr/bin/env bash
# SIGSTOP of one rank (a wedged process, as a swapping node or a dead link look to the others): the
# progress watchdog (parallel.timeout = 3 s) ends the job with one line naming the stopped rank and
# exit code 74.
source "$(dirname "$0")/lib.sh" "$1"
reference
start
wait_steps 120
victim=$(rank_pid 2)
kill -STOP "$victim"; fault_now
expect_end_within 20  # the timeout (3 s) + the answer period (2 s) + MPI_Abort
kill -CONT "$victim" 2>/dev/null
[ "$RC" -eq 74 ] || fail "exit code $RC, expected 74 (a stalled rank: the job scripts restart on it)"
expect_in_output "rank 2 (stage 1, replica 0) made no progress for"
[ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || { cat "$WORK/run.log" | grep error; fail "not exactly one error line"; }
resume_matches
pass "SIGSTOP of rank 2: the watchdog ended the job in ${ENDED} s: $(grep -o 'rank 2 (stage.*at step [0-9]*' "$WORK/run.log")"
