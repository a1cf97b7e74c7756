#!/usr/bin/env bash
# checkpoint.async = true and a stop request (SIGUSR1 to the launcher) while the writer thread is
# still writing (0.15 s per tensor): the job writes its stop checkpoint after the one in flight and
# waits for it before exiting 75 (resumable); `latest` names the stop step's complete file and the
# resume continues the uninterrupted loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
export RELAY_FAULT_SLOW_CHECKPOINT=0.15
start --set checkpoint.async=true
wait_partial_checkpoint 50
kill -USR1 "$JOB"; fault_now
expect_end_within 60
unset RELAY_FAULT_SLOW_CHECKPOINT
[ "$RC" -eq 75 ] || { tail "$WORK/run.log"; fail "exit $RC after SIGUSR1, expected 75"; }
stop=$(grep -o "stopping at step [0-9]*" "$WORK/run.log" | grep -o "[0-9]*$")
[ -n "$stop" ] || fail "no 'stopping at step' line"
expect_in_output "checkpoint step 50:"
expect_in_output "checkpoint step $stop:"
want=$(printf "step_%08d.h5" "$stop")
[ "$(cat "$WORK/run/checkpoints/latest")" == "$want" ] || fail "latest is $(cat "$WORK/run/checkpoints/latest"), expected $want"
ls "$WORK/run/checkpoints" | grep -q tmp- && fail "a temporary file was left"
resume_matches
pass "SIGUSR1 during the async step-50 write: stopped at step $stop in ${ENDED} s with both files in place, exit 75, resumed exactly"
