#!/usr/bin/env bash
# kill -9 of rank 0 in the middle of a checkpoint write (slowed to 0.15 s per tensor so the kill lands
# inside it): `latest` still names the previous complete checkpoint, which reads back, and the next
# run removes the dead writer's temporary file and resumes the loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
export RELAY_FAULT_SLOW_CHECKPOINT=0.15
start
wait_partial_checkpoint 100
kill -KILL "$(rank_pid 0)"; fault_now
unset RELAY_FAULT_SLOW_CHECKPOINT
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit code 0"
[ "$(cat "$WORK/run/checkpoints/latest")" == "step_00000050.h5" ] || fail "latest is $(cat "$WORK/run/checkpoints/latest")"
left=$(ls "$WORK/run/checkpoints" | tr '\n' ' ')
resume_matches
pass "rank 0 killed while writing step 100: ended in ${ENDED} s; left $left; latest = step 50, resumed exactly"
