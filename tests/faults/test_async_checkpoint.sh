#!/usr/bin/env bash
# checkpoint.async = true: training goes on while rank 0's writer thread writes (slowed to 0.2 s per
# tensor: 30 tensors = ~6 s a file, so the step-50 file lands after later steps were logged, and the
# step-100 save waits ~6 s, twice parallel.timeout = 3 s, for the write in flight without the watchdog
# firing); every file equals the synchronous run's, dataset for dataset and attribute for
# attribute (h5dump; the stored config differs only in run.dir and checkpoint.async); the end of
# training waits for the last write; a resume from an async checkpoint continues the synchronous
# run's loss curve exactly; `relay plan` and the log report the host copy it costs.
STEPS=150
source "$(dirname "$0")/lib.sh" "$1"
command -v h5dump > /dev/null || { echo "SKIPPED: h5dump (hdf5-tools) is not installed"; exit 77; }
reference
RELAY_FAULT_SLOW_CHECKPOINT=0.2 job --set "run.dir=\"$WORK/run\"" --set checkpoint.async=true > "$WORK/run.log" 2>&1 ||
  { tail -20 "$WORK/run.log"; fail "the async run failed"; }
grep -q "made no progress" "$WORK/run.log" && fail "the watchdog fired while the writer thread wrote"
# Training went on during the write: step 52's line comes before the step-50 checkpoint's.
after=$(grep -n "^step \+52 " "$WORK/run.log" | cut -d: -f1)
landed=$(grep -n "^checkpoint step 50:" "$WORK/run.log" | cut -d: -f1)
[ -n "$after" ] && [ -n "$landed" ] && [ "$after" -lt "$landed" ] ||
  fail "step 52 was not logged before the step-50 checkpoint landed (line ${after:-none} vs ${landed:-none})"
expect_in_output "written in the background"
expect_in_output "checkpoint.async: rank 0 keeps a"
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "the async run's losses differ from the sync run's"
n=0
for f in "$WORK"/ref/checkpoints/step_*.h5; do
  b=$(basename "$f")
  [ -f "$WORK/run/checkpoints/$b" ] || fail "the async run has no $b"
  h5dump "$f" | sed "s|$WORK/ref|DIR|g; 1d" > "$WORK/sync.dump"
  h5dump "$WORK/run/checkpoints/$b" | sed "s|$WORK/run|DIR|g; s|async = true|async = false|; 1d" > "$WORK/async.dump"
  diff -q "$WORK/sync.dump" "$WORK/async.dump" > /dev/null || { diff "$WORK/sync.dump" "$WORK/async.dump" | head; fail "$b differs"; }
  n=$((n + 1))
done
[ "$n" -eq 3 ] || fail "expected 3 checkpoints, compared $n"
[ "$(cat "$WORK/run/checkpoints/latest")" == "step_00000150.h5" ] || fail "latest is not the final step"
# Resume from the async step-100 checkpoint: the losses continue the synchronous run's exactly.
echo "step_00000100.h5" > "$WORK/run/checkpoints/latest"
rm "$WORK"/run/checkpoints/step_00000150.h5
resume_matches
grep -q "resumed from .*step_00000100.h5 at step 100" "$WORK/resume.log" || fail "the resume did not start at step 100"
"$RELAY" plan --config "$WORK/config.toml" --set checkpoint.async=true > "$WORK/plan.log" 2>&1 || fail "relay plan"
grep -q "checkpoint.async = true: rank 0 keeps a host copy" "$WORK/plan.log" || { cat "$WORK/plan.log"; fail "relay plan does not report the host copy"; }
pass "async checkpoints: training logged step 52 before the step-50 file landed; $n files equal the sync run's (h5dump); resume from step 100 reproduces all $STEPS losses"
