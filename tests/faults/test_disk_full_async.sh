#!/usr/bin/env bash
# checkpoint.async = true into a full filesystem (a 320 KiB tmpfs: it fills mid-run): the writer
# thread's failure ends every rank at a step boundary soon after, before the end of training, with exit 1 and rank 0's one line naming
# the file, the tensor and "No space left on device"; the temporary file is removed; the previous
# checkpoint and `latest` are untouched and resume the loss curve.
source "$(dirname "$0")/lib.sh" "$1"
mkdir -p "$WORK/full"
mount -t tmpfs -o size=320k tmpfs "$WORK/full" 2>/dev/null || { echo "SKIPPED: cannot mount a tmpfs (needs root)"; exit 77; }
reference
fault_now
"${JOB_CMD[@]}" --set "run.dir=\"$WORK/run\"" --set "checkpoint.dir=\"$WORK/full/ck\"" --set checkpoint.async=true \
  > "$WORK/run.log" 2>&1 &
JOB=$!
expect_end_within 120
[ "$RC" -eq 1 ] || { tail -30 "$WORK/run.log"; fail "exit code $RC, expected 1"; }
grep -q "Segmentation\|signal 11\|terminate called" "$WORK/run.log" && fail "a crash on the way out"
expect_in_output "No space left on device"
expect_in_output "the partial file was removed"
expect_in_output "written in the background"  # the checkpoints before the full one were async
failed=$(grep -o 'step_[0-9]*.h5.tmp' "$WORK/run.log" | head -1 | grep -o '[1-9][0-9]*' | head -1)
[ -n "$failed" ] && [ "$failed" -lt "$STEPS" ] || fail "the disk did not fill mid-run (failed at step ${failed:-none})"
grep -q "relay: done" "$WORK/run.log" && fail "training went on to the end after the failed write"
[ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || { grep "error:" "$WORK/run.log"; fail "not exactly one error line"; }
ck="$WORK/full/ck"
ls "$ck" | grep -q tmp- && fail "a temporary file was left: $(ls "$ck")"
latest=$(cat "$ck/latest")
"$RELAY" ckpt inspect "$ck/$latest" > /dev/null || fail "$latest does not read back"
mkdir -p "$WORK/run/checkpoints" && cp "$ck"/* "$WORK/run/checkpoints/"
resume_matches
pass "async write of step $failed into a full disk: exit 1 on every rank in ${ENDED} s, one error line, latest = $latest intact"
