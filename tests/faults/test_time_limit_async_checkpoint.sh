#!/usr/bin/env bash
# checkpoint.async = true under train.time_limit = "13s", with writes slowed to 0.1 s per tensor (30
# tensors: 3 s a checkpoint, so one is always in flight; the limit is about 4 writes, as 25 s was for
# 6 s writes): the job stops on the time limit with exit 75
# after waiting for the write in flight and writing its stop checkpoint, ends within the limit (plus
# mpirun's start), and `latest` names the stop step's complete file, from which the resume continues
# the uninterrupted loss curve.
source "$(dirname "$0")/lib.sh" "$1"
reference
export RELAY_FAULT_SLOW_CHECKPOINT=0.1
t0=$(date +%s.%N)
job --set "run.dir=\"$WORK/run\"" --set checkpoint.async=true --set 'train.time_limit="13s"' > "$WORK/run.log" 2>&1
RC=$?
took=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $t0))")
unset RELAY_FAULT_SLOW_CHECKPOINT
[ "$RC" -eq 75 ] || { tail "$WORK/run.log"; fail "exit $RC on the time limit, expected 75"; }
stop=$(grep -o "stopping at step [0-9]* on train.time_limit" "$WORK/run.log" | grep -o "step [0-9]*" | grep -o "[0-9]*")
[ -n "$stop" ] || { tail "$WORK/run.log"; fail "no 'stopping at step N on train.time_limit' line"; }
python3 -c "import sys; sys.exit(0 if $took < 16 else 1)" || fail "the job took $took s under a 13 s time limit"
want=$(printf "step_%08d.h5" "$stop")
[ "$(cat "$WORK/run/checkpoints/latest")" == "$want" ] || fail "latest is $(cat "$WORK/run/checkpoints/latest"), expected $want"
ls "$WORK/run/checkpoints" | grep -q tmp- && fail "a temporary file was left"
resume_matches
pass "time limit 13 s with async writes of ~3 s: stopped at step $stop, exit 75 after $took s, latest = $want, resumed exactly"
