#!/usr/bin/env bash
# A rank slowed on purpose (RELAY_TEST_SLOW_RANK=2 RELAY_TEST_SLOW_MS=30: world rank 2 sleeps 30 ms in
# each of its 2 forwards per step) is named: in every logging window's slowest rank (metrics.jsonl and
# the log line), in the straggler warning (over 20% above the median of its stage's other ranks for
# 3 windows in a row), and at the top of the end-of-run table of compute per rank.
STEPS=60 source "$(dirname "$0")/lib.sh" "$1"
RELAY_TEST_SLOW_RANK=2 RELAY_TEST_SLOW_MS=30 job --set "run.dir=\"$WORK/run\"" --set train.log_every=5 \
  > "$WORK/run.log" 2>&1 || { tail -20 "$WORK/run.log"; fail "the run failed"; }
expect_in_output "relay: warning: rank 2 (stage 1, replica 0) is a straggler: "
grep -Eq "^relay: warning: rank 2 \(stage 1, replica 0\) is a straggler: [0-9.]+ ms of compute per step, [0-9.]+x the median [0-9.]+ ms of the other ranks of its stage, in 3 logging windows in a row up to step (15|20|25) \(margin 20% and 1 ms\)$" "$WORK/run.log" ||
  { grep warning "$WORK/run.log"; fail "no straggler warning for rank 2 within the first 5 windows"; }
grep warning "$WORK/run.log" | head -3
grep -q '^step     60 | .* | slowest rank 2 [0-9.]* ms (median [0-9.]*) | elapsed' "$WORK/run.log" || fail "the log line of step 60 does not name rank 2"
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "metrics.jsonl does not name rank 2 as the slowest"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(recs) == 12, len(recs)
for r in recs[1:]:  # the first window holds every rank's start-up (first-touch, oneDNN primitives)
    # 2 forwards x 30 ms of sleep per step on rank 2; the others compute a tiny MLP.
    assert r["slowest_rank"] == 2 and r["slowest_compute_s"] >= 0.06 and r["median_compute_s"] < 0.03, r
print("every window: slowest rank 2, %.1f ms vs median %.2f ms per step (last window)"
      % (1e3 * recs[-1]["slowest_compute_s"], 1e3 * recs[-1]["median_compute_s"]))
PY
table=$(sed -n '/^relay: time per step by rank/,$p' "$WORK/run.log" | grep '^  rank [0-9]')
[ "$(echo "$table" | wc -l)" -eq 4 ] || fail "the end-of-run table does not list 4 ranks: $table"
slowest=$(echo "$table" | sort -k7 -g | tail -1)
[[ $slowest == "  rank 2 "* ]] || fail "the end-of-run table's largest compute is not rank 2's: $table"
echo "$table"
pass "the slowed rank 2 is named in the warning, in every window's slowest_rank and in the end table"
