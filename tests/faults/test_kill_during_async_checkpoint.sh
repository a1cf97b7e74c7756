#!/usr/bin/env bash
# checkpoint.async = true: kill -9 of rank 0 while its writer thread writes the step-100 checkpoint
# (slowed to 0.15 s per tensor so the kill lands inside it, with training going on beside it):
# `latest` still names the previous complete checkpoint, which reads back, and the next run removes
# the dead writer's temporary file and resumes the loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
export RELAY_FAULT_SLOW_CHECKPOINT=0.15
start --set checkpoint.async=true
wait_partial_checkpoint 100
sleep 0.5  # a few tensors into the file, training past step 100
kill -KILL "$(rank_pid 0)"; fault_now
unset RELAY_FAULT_SLOW_CHECKPOINT
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit code 0"
[ "$(cat "$WORK/run/checkpoints/latest")" == "step_00000050.h5" ] || fail "latest is $(cat "$WORK/run/checkpoints/latest")"
left=$(ls "$WORK/run/checkpoints" | tr '\n' ' ')
resume_matches
pass "rank 0 killed while its writer thread wrote step 100: ended in ${ENDED} s; left $left; latest = step 50, resumed exactly"
