#!/usr/bin/env bash
# Memory stays flat: a long run (3000 steps on 4 ranks with a checkpoint every 250 steps and an eval
# every 100) records each logged step's resident memory in metrics.jsonl (rss_mib: rank 0;
# rss_max_mib: the largest rank). After warm-up (step 500) neither may grow by more than 4 MiB.
STEPS=3000
source "$(dirname "$0")/lib.sh" "$1"
job --set "run.dir=\"$WORK/run\"" --set train.log_every=50 --set train.eval_every=100 --set checkpoint.every=250 \
  --set checkpoint.keep=2 > "$WORK/run.log" 2>&1 || { tail -20 "$WORK/run.log"; fail "the long run failed"; }
python3 - "$WORK/run/metrics.jsonl" <<'PY' || fail "resident memory grew"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"rss_mib"' in l]
assert len(r) >= 50, f"only {len(r)} records"
for key in ("rss_mib", "rss_max_mib"):
    base = next(x[key] for x in r if x["step"] >= 500)
    late = [x[key] for x in r if x["step"] >= 500]
    growth = max(late) - base
    print(f"{key}: {base:.1f} MiB at step 500, at most {max(late):.1f} MiB to step {r[-1]['step']} (growth {growth:.2f} MiB)")
    assert growth <= 4.0, f"{key} grew by {growth:.2f} MiB after warm-up"
PY
pass "resident memory flat over 3000 steps with 12 checkpoints and 30 evals"
