#!/usr/bin/env bash
# A slow checkpoint that still makes progress must not trip the watchdog: 0.2 s per tensor (30 tensors:
# 10 parameters and AdamW's two moments = ~6 s a checkpoint, twice parallel.timeout = 3 s). While
# rank 0 writes, the others wait at the end of the checkpoint and rank 0 answers their questions
# "working" after every tensor. Two such checkpoints: step 50 mid-run, step 60 at the end.
STEPS=60
source "$(dirname "$0")/lib.sh" "$1"
reference
fault_now
RELAY_FAULT_SLOW_CHECKPOINT=0.2 job --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1
RC=$?
took=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_FAULT))")
[ "$RC" -eq 0 ] || { tail -20 "$WORK/run.log"; fail "a slow but progressing checkpoint ended the job (exit $RC)"; }
grep -q "made no progress" "$WORK/run.log" && fail "the watchdog fired on a slow checkpoint"
# The premise: each checkpoint took well over parallel.timeout (3 s).
secs=$(sed -n 's/^checkpoint step \(50\|60\): .* in \([0-9.]*\) s)$/\2/p' "$WORK/run.log" | paste -sd' ')
python3 -c "import sys; t = [float(x) for x in sys.argv[1:]]; sys.exit(not (len(t) == 2 and min(t) >= 4.5))" $secs ||
  { grep "^checkpoint step" "$WORK/run.log"; fail "expected checkpoints at steps 50 and 60 of at least 4.5 s each, got: ${secs:-none}"; }
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "losses differ from the reference"
pass "2 checkpoints (steps 50 and 60) of ${secs// /, } s under parallel.timeout = 3 s: no false alarm, run completed in ${took} s"
