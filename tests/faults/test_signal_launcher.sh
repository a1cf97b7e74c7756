#!/usr/bin/env bash
# SIGUSR1 to the launcher (mpirun forwards it to every rank): a checkpoint at the step boundary and
# exit 75 (resumable); then SIGTERM to the launcher (Open MPI kills the ranks about a second later):
# the job ends, and what is on disk is complete. Both resume to the uninterrupted loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
start
wait_steps 120
kill -USR1 "$JOB"; fault_now
expect_end_within 30
[ "$RC" -eq 75 ] || { tail "$WORK/run.log"; fail "exit $RC after SIGUSR1, expected 75"; }
expect_in_output "stopping at step"
usr1=$ENDED
resume_matches
rm -rf "$WORK/run"
start
wait_steps 120
kill -TERM "$JOB"; fault_now
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit 0 after SIGTERM to mpirun"
term=$ENDED
resume_matches
pass "SIGUSR1 to mpirun: checkpoint + exit 75 in ${usr1} s; SIGTERM to mpirun: ended in ${term} s (exit $RC), nothing lost"
