#!/usr/bin/env bash
# A truncated dataset and a truncated or corrupted checkpoint: one clear line naming the file, exit 1
# on every rank, no step trained, nothing written over.
source "$(dirname "$0")/lib.sh" "$1"
cp "$WORK/train.h5" "$WORK/cut.h5" && truncate -s 3000 "$WORK/cut.h5"
fault_now
"${JOB_CMD[@]}" --set "run.dir=\"$WORK/run\"" --set "data.train=\"$WORK/cut.h5\"" > "$WORK/run.log" 2>&1 & JOB=$!
expect_end_within 30
[ "$RC" -eq 1 ] || fail "exit $RC for a truncated dataset"
expect_in_output "cut.h5"
[ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || fail "not one error line"
d1=$ENDED
reference
for kind in truncated corrupted; do
  cp "$WORK/ref/checkpoints/step_00000300.h5" "$WORK/$kind.h5"
  if [ $kind == truncated ]; then truncate -s 20000 "$WORK/$kind.h5"
  else dd if=/dev/urandom of="$WORK/$kind.h5" bs=1 count=4096 seek=2048 conv=notrunc 2>/dev/null; fi
  fault_now
  "${JOB_CMD[@]}" --set "run.dir=\"$WORK/run_$kind\"" --set "checkpoint.resume=\"$WORK/$kind.h5\"" > "$WORK/run.log" 2>&1 & JOB=$!
  expect_end_within 30
  [ "$RC" -eq 1 ] || { tail "$WORK/run.log"; fail "exit $RC for a $kind checkpoint"; }
  expect_in_output "$kind.h5"
  [ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || { grep error "$WORK/run.log"; fail "not one error line ($kind)"; }
  [ -f "$WORK/run_$kind/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run_$kind/metrics.jsonl")" -gt 0 ] && fail "trained a step from a $kind checkpoint"
  echo "$kind checkpoint: $(grep -o 'error: .*' "$WORK/run.log" | cut -c1-160)"
done
pass "truncated dataset (${d1} s), truncated and corrupted checkpoints: exit 1 with the file named"
