#!/usr/bin/env bash
# A checkpoint write into a full filesystem (a 1 MiB tmpfs that holds a few checkpoints): every rank
# exits 1 with rank 0's one line naming the file, the tensor and "No space left on device"; the
# temporary file is removed; the previous checkpoint and `latest` are untouched. No crash (exit 139).
source "$(dirname "$0")/lib.sh" "$1"
mkdir -p "$WORK/full"
mount -t tmpfs -o size=640k tmpfs "$WORK/full" 2>/dev/null || { echo "SKIPPED: cannot mount a tmpfs (needs root)"; exit 77; }
reference
size=$(stat -c %s "$WORK/ref/checkpoints/step_00000050.h5")
fault_now
"${JOB_CMD[@]}" --set "run.dir=\"$WORK/run\"" --set "checkpoint.dir=\"$WORK/full/ck\"" > "$WORK/run.log" 2>&1 &
JOB=$!
expect_end_within 120
[ "$RC" -eq 1 ] || { tail -30 "$WORK/run.log"; fail "exit code $RC, expected 1 (139 is the old crash)"; }
grep -q "Segmentation\|signal 11" "$WORK/run.log" && fail "a crash on the way out"
expect_in_output "No space left on device"
expect_in_output "the partial file was removed"
[ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || fail "not exactly one error line"
ck="$WORK/full/ck"
ls "$ck" | grep -q tmp- && fail "a temporary file was left: $(ls "$ck")"
latest=$(cat "$ck/latest")
"$RELAY" ckpt inspect "$ck/$latest" > /dev/null || fail "$latest does not read back"
# Resume into a directory with room: copy what survived, then continue the loss curve.
mkdir -p "$WORK/run/checkpoints" && cp "$ck"/* "$WORK/run/checkpoints/"
resume_matches
pass "disk full at $(grep -o 'step_[0-9]*.h5.tmp' "$WORK/run.log" | head -1) (checkpoints of $size bytes in a 640 KiB tmpfs): exit 1 in ${ENDED} s, latest = $latest intact"
