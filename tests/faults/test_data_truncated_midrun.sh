#!/usr/bin/env bash
# The training file is truncated while the job runs (a quota, a copy in progress): HDF5 would read the
# missing rows as zeros, so the next read checks the file's size and the job ends with one line naming
# the file; the checkpoint before it is intact and a resume (with the file restored) continues the
# loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
cp "$WORK/train.h5" "$WORK/train.orig"
start
wait_steps 120
truncate -s $(( $(stat -c %s "$WORK/train.h5") / 3 )) "$WORK/train.h5"; fault_now
expect_end_within 30
[ "$RC" -ne 0 ] || fail "exit 0 with a truncated training file (it trained on zeros)"
expect_in_output "train.h5: the file shrank from"
cp "$WORK/train.orig" "$WORK/train.h5"
resume_matches
pass "training file truncated mid-run: ended in ${ENDED} s (exit $RC) naming it; resumed exactly"
