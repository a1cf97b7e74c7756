#!/usr/bin/env bash
# A slow checkpoint that still makes progress (0.4 s per tensor: 16 tensors = 6.4 s a checkpoint,
# twice parallel.timeout = 3 s) must not trip the watchdog: while rank 0 writes, the others wait at
# the end of the checkpoint and rank 0 answers their questions "working" after every tensor.
STEPS=120
source "$(dirname "$0")/lib.sh" "$1"
reference
fault_now
RELAY_FAULT_SLOW_CHECKPOINT=0.4 job --set "run.dir=\"$WORK/run\"" > "$WORK/run.log" 2>&1
RC=$?
took=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $T_FAULT))")
[ "$RC" -eq 0 ] || { tail -20 "$WORK/run.log"; fail "a slow but progressing checkpoint ended the job (exit $RC)"; }
grep -q "made no progress" "$WORK/run.log" && fail "the watchdog fired on a slow checkpoint"
[ "$(losses "$WORK/run")" == "$(losses "$WORK/ref")" ] || fail "losses differ from the reference"
pass "3 checkpoints of ~6.4 s each under parallel.timeout = 3 s: no false alarm, run completed in ${took} s"
