#!/usr/bin/env bash
# train.skip_nonfinite: NaN feature rows in the training set (written into a real HDF5 file's /inputs)
# make every step whose batch holds one non-finite. With skip_nonfinite = 3 the 4-rank run (dp 2 x pp 2,
# and again with ZeRO-1) finishes, skips exactly those steps, counts them as skipped_steps in
# metrics.jsonl, leaves weights and optimizer state of a skipped step bitwise unchanged, and writes
# no non-finite value into any checkpoint; with the default 0 it stops at the first one as before; more
# than 3 in a row stop it with the same message.
STEPS=${STEPS:-40}
source "$(dirname "$0")/lib.sh" "$1"
# /inputs is (512, 16) float32, contiguous: NaN goes straight into the file at the dataset's offset.
OFFSET=$(h5dump -p -H -d /inputs "$WORK/train.h5" | awk '/OFFSET/ {print $2; exit}')
[ -n "$OFFSET" ] || fail "cannot find the storage offset of /inputs (h5dump -p -H)"
poison() {  # out.h5 rows... : a copy of train.h5 with feature 3 of each row set to NaN
  local out=$1; shift
  cp "$WORK/train.h5" "$out"
  for row in "$@"; do
    printf '\x00\x00\xc0\x7f' | dd of="$out" bs=1 seek=$((OFFSET + (row * 16 + 3) * 4)) conv=notrunc status=none
  done
}
# No shuffle and 64-row batches: rows 70, 71 and 100 are in the second batch of each 8-step epoch, so
# steps 2, 10, 18, 26 and 34 hold NaN; rows 70, 130, 200, 260 put one in steps 2, 3, 4 and 5.
poison "$WORK/nan.h5" 70 71 100
poison "$WORK/nan4.h5" 70 130 200 260
"$RELAY" data inspect "$WORK/nan.h5" > /dev/null || fail "the poisoned file is not a valid dataset"
SET=(--set data.shuffle=false --set "data.train=\"$WORK/nan.h5\"" --set checkpoint.every=1)

check_run() {  # run dir, label
  local dir=$1
  python3 - "$dir/metrics.jsonl" <<'PY' || fail "$2: skipped steps not as expected"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
bad = {2, 10, 18, 26, 34}
assert [r["step"] for r in recs] == list(range(1, 41))
for r in recs:
    assert r["skipped_steps"] == sum(1 for b in bad if b <= r["step"]), r
    assert (r["loss"] is None) == (r["step"] in bad), r
print(f"  skipped_steps by step: {[(r['step'], r['skipped_steps']) for r in recs if r['step'] in bad]}")
PY
  for s in 2 10 18 26 34; do grep -q "relay: step $s skipped: the loss is -\?nan" "$WORK/$2.log" || fail "$2: no line for step $s"; done
  for f in "$dir/checkpoints/"step_*.h5; do
    "$RELAY" ckpt inspect "$f" > "$WORK/inspect.log" 2>&1 || { cat "$WORK/inspect.log"; fail "$f does not read back"; }
    grep -q "all readable, all finite" "$WORK/inspect.log" || { grep non-finite "$WORK/inspect.log"; fail "non-finite values in $f"; }
  done
  grep -q "optimizer adamw, 35 updates" "$WORK/inspect.log" || { cat "$WORK/inspect.log"; fail "$2: not 35 updates in 40 steps"; }
  # A skipped step changes nothing: step 10's tensors equal step 9's bit for bit.
  h5diff "$dir/checkpoints/step_00000009.h5" "$dir/checkpoints/step_00000010.h5" /model /model > /dev/null &&
    h5diff "$dir/checkpoints/step_00000009.h5" "$dir/checkpoints/step_00000010.h5" /optimizer /optimizer > /dev/null ||
    fail "$2: the skipped step 10 changed the weights or optimizer state"
  h5diff -q "$dir/checkpoints/step_00000010.h5" "$dir/checkpoints/step_00000011.h5" /model /model > /dev/null &&
    fail "$2: step 11 did not update the weights"
  echo "$2: 40 steps, 5 skipped (2, 10, 18, 26, 34), 35 updates, all 40 checkpoints finite, skipped step 10 bitwise a no-op"
}

job "${SET[@]}" --set train.skip_nonfinite=3 --set "run.dir=\"$WORK/skip\"" > "$WORK/skip.log" 2>&1 ||
  { tail -20 "$WORK/skip.log"; fail "the run with skip_nonfinite = 3 failed"; }
check_run "$WORK/skip" skip
job "${SET[@]}" --set train.skip_nonfinite=3 --set optimizer.zero=true --set "run.dir=\"$WORK/zero\"" > "$WORK/zero.log" 2>&1 ||
  { tail -20 "$WORK/zero.log"; fail "the ZeRO-1 run with skip_nonfinite = 3 failed"; }
check_run "$WORK/zero" zero

# The default (0): stops at step 2 with today's message, on every rank.
start "${SET[@]}"
fault_now
expect_end_within 60
[ "$RC" -eq 1 ] || fail "skip_nonfinite = 0: exit $RC"
expect_in_output "error: the loss is -\?nan (gradient norm -\?nan) at step 2; training stopped (hint: lower optimizer.lr"
[ "$(grep -c "error:" "$WORK/run.log")" -eq 1 ] || fail "skip_nonfinite = 0: not one error line"
grep -q "skipped" "$WORK/run.log" && fail "skip_nonfinite = 0 skipped a step"
echo "skip_nonfinite = 0: stopped at step 2 with exit 1, as before"

# Four in a row with a limit of 3: steps 2-4 skipped, step 5 stops the job.
start "${SET[@]}" --set "data.train=\"$WORK/nan4.h5\"" --set train.skip_nonfinite=3 --set "run.dir=\"$WORK/run4\""
fault_now
expect_end_within 60
[ "$RC" -eq 1 ] || fail "four in a row: exit $RC"
expect_in_output "relay: step 4 skipped: the loss is -\?nan (gradient norm -\?nan); 3 of at most 3 in a row"
expect_in_output "error: the loss is -\?nan (gradient norm -\?nan) at step 5; training stopped (hint: .*after 3 consecutive skipped steps"
echo "four non-finite steps in a row with skip_nonfinite = 3: steps 2-4 skipped, stopped at step 5 with exit 1"
pass "train.skip_nonfinite: skips counted, checkpoints finite, limit enforced"
