#!/usr/bin/env bash
# Relay on two "nodes" of this machine: two network namespaces, each with its own host name (a UTS
# namespace: node1, node2) and its own address on a private bridge (10.77.x.1 and .2, the bridge in a
# third namespace), Open MPI's TCP transport between them, and mpirun reaching node2 through
# plm_rsh_agent = a script that runs the command with `ip netns exec` instead of ssh. Checks:
#   - local rank, threads and device are computed per host (the placement table: 2 ranks per node);
#   - dp 2 x pp 2 spans both nodes (stage 0 on node1, stage 1 on node2) and matches the same run on
#     one host bitwise;
#   - the step-20 checkpoint (written by rank 0 on node1) resumes with the ranks placed round-robin
#     (stage 0 and stage 1 on both nodes) and continues the one-host run's losses exactly.
#   - run.dir ownership across nodes: while a job whose rank 0 is on node1 holds a run.dir, a job
#     started on node2 on the same directory (this machine's filesystem, seen by both) is refused with
#     one line naming node1's owner, and the holder is not disturbed;
#   - relay plan --measure --calibrate over both nodes (2 ranks each), the link between them shaped to 1 Gbit/s,
#     measures the links through the communicator within a node (node1's pair) and between the nodes (their first
#     ranks) and writes both: the shaped one's all-reduce near the tc rate; the plan of dp 4
#     over both nodes on that file predicts overlap on shorter than off, by no more than the exposed time it hides.
#   - overlap over a shaped link (issue 40): the link between the nodes capped by tc tbf, a GPT on dp 2 across them
#     (one rank a node, real TCP), parallel.overlap on and off: the same losses bit for bit, and each rank's trace
#     shows its first bucket all-reduce begun before its last backward ended (on) and after it (off). Event order,
#     not durations: speed over shaped links is measured in bench/bench_overlap_shaped.sh.
# Root only; exits 77 (skipped) with the reason where namespaces cannot be made.
set -uo pipefail
RELAY=$(realpath "$1")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null && command -v unshare >/dev/null || skip "needs ip (iproute2) and unshare"
WORK=$(mktemp -d /tmp/relay-2node-XXXXXX)
source "$(dirname "$0")/namespaces.sh"
cleanup() { remove_two_nodes; rm -rf "$WORK"; }
trap cleanup EXIT
make_two_nodes "$WORK" 2>"$WORK/namespaces.err" || skip "$(cat "$WORK/namespaces.err")"

"$RELAY" data synth --out "$WORK/train.h5" --samples 512 --features 16 --classes 5 --seed 11 >/dev/null || fail "data synth"
cat > "$WORK/config.toml" <<TOML
[model]
seed = 3
layers = [ { type = "linear", out = 32 }, { type = "gelu" }, { type = "linear", out = 32 }, { type = "tanh" },
           { type = "linear", out = 32 }, { type = "layernorm" }, { type = "linear", out = 5 } ]
[data]
train = "$WORK/train.h5"
[train]
steps = 40
batch_size = 64
micro_batches = 2
log_every = 1
[parallel]
dp = 2
pp = 2
timeout = "30s"
[checkpoint]
every = 20
TOML
# mpirun runs on node1; ranks go to node1 and node2 by the host list and mapping given.
on_two_nodes() {  # mapping args... -- relay args...
  local map=()
  while [ "$1" != "--" ]; do map+=("$1"); shift; done; shift
  on_node1 timeout 300 mpirun --host "${SUB}1:2,${SUB}2:2" "${MCA[@]}" "${map[@]}" -np 4 -x OMP_NUM_THREADS \
    "$RELAY" train --config "$WORK/config.toml" "$@"
}
losses() { python3 -c "
import json,sys
print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1/metrics.jsonl"; }

# The same job on one host, for reference.
mpirun --oversubscribe --bind-to none -np 4 "$RELAY" train --config "$WORK/config.toml" --set "run.dir=\"$WORK/one\"" \
  > "$WORK/one.log" 2>&1 || { tail "$WORK/one.log"; fail "the one-host run failed"; }

# 1. By slot: ranks 0, 1 (stage 0) on node1 and ranks 2, 3 (stage 1) on node2.
on_two_nodes --map-by slot -- --set "run.dir=\"$WORK/two\"" > "$WORK/two.log" 2>&1 || { tail -30 "$WORK/two.log"; fail "the two-node run failed"; }
grep -A4 "relay: placement" "$WORK/two.log"
for r in "rank 0 (stage 0, replica 0) on node1: local rank 0 of 2" "rank 1 (stage 0, replica 1) on node1: local rank 1 of 2" \
         "rank 2 (stage 1, replica 0) on node2: local rank 0 of 2" "rank 3 (stage 1, replica 1) on node2: local rank 1 of 2"; do
  grep -q "$r" "$WORK/two.log" || fail "placement: no line '$r'"
done
grep -q "on node2: local rank 0 of 2, cpu (oneDNN, 1 thread)" "$WORK/two.log" || fail "threads per rank on node2"
[ "$(losses "$WORK/two")" == "$(losses "$WORK/one")" ] || fail "two-node losses differ from the one-host run"
echo "dp 2 x pp 2 across node1 (stage 0) and node2 (stage 1): all 40 losses equal the one-host run's"

# 2. Resume node1's step-20 checkpoint with the ranks placed round-robin (each stage on both nodes).
on_two_nodes --map-by node -- --set "run.dir=\"$WORK/moved\"" \
  --set "checkpoint.resume=\"$WORK/two/checkpoints/step_00000020.h5\"" > "$WORK/moved.log" 2>&1 ||
  { tail -30 "$WORK/moved.log"; fail "the resume with ranks moved failed"; }
grep -A4 "relay: placement" "$WORK/moved.log"
grep -q "rank 1 (stage 0, replica 1) on node2" "$WORK/moved.log" || fail "the ranks were not moved"
ref=$(losses "$WORK/one" | cut -d' ' -f21-)
[ "$(losses "$WORK/moved")" == "$ref" ] || fail "the resumed run's losses (steps 21-40) differ from the one-host run's"
echo "step-20 checkpoint from node1 resumed with ranks round-robin over node1 and node2: steps 21-40 equal"

# 3. A job spanning both nodes (rank 0 on node1) holds run.dir until train.time_limit stops it; a job
#    started on node2 meanwhile, on the same directory, is refused naming node1. The limit (14 s) is
#    waited out in full; node2's refusal (time printed below) came 6 s after the holder started on a
#    2-core machine running a parallel build, 9 s at a load of 20; should the holder end first, the
#    test fails, it does not hang.
t_held=$(date +%s.%N)
on_two_nodes --map-by slot -- --set "run.dir=\"$WORK/held\"" --set train.steps=1000000 --set 'train.time_limit="14s"' \
  > "$WORK/held.log" 2>&1 &
HELD=$!
for _ in $(seq 1 600); do
  [ -f "$WORK/held/metrics.jsonl" ] && [ "$(wc -l < "$WORK/held/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
[ -s "$WORK/held/metrics.jsonl" ] || { tail "$WORK/held.log"; fail "the holding job never logged a step"; }
timeout 120 ip netns exec "$NS2" unshare --uts bash -c 'hostname node2; exec "$@"' _ \
  mpirun --oversubscribe --bind-to none -np 2 "$RELAY" train --config "$WORK/config.toml" --set parallel.dp=1 \
  --set "run.dir=\"$WORK/held\"" > "$WORK/node2.log" 2>&1 && fail "the job on node2 was not refused"
grep "error:" "$WORK/node2.log"
grep -q "^\[rank 0\] error: run.dir $WORK/held is in use by another job: host node1, pid [0-9]*, started " \
  "$WORK/node2.log" || { cat "$WORK/node2.log"; fail "node2's job does not name node1's owner"; }
[ "$(grep -c "error:" "$WORK/node2.log")" -eq 1 ] || fail "not one error line on node2"
kill -0 "$HELD" 2>/dev/null || { tail "$WORK/held.log"; fail "the holding job ended before node2's was refused"; }
echo "node2's job refused $(python3 -c "print('%.1f' % ($(date +%s.%N) - $t_held))") s after the holder was started"
wait "$HELD"; rc=$?
[ "$rc" -eq 75 ] || { tail "$WORK/held.log"; fail "the holding job exited $rc, not 75 (time limit)"; }
python3 - "$WORK/held/metrics.jsonl" <<'PY' || fail "the holding job's metrics.jsonl is not intact"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
assert steps == list(range(1, len(steps) + 1)), steps[:10]
PY
echo "run.dir held by node1's job: node2's job refused naming node1; the holder ran on to its time limit (exit 75)"

# 4. The planner's calibration across the nodes, the link between them shaped to 1 Gbit/s: every rank times the
#    collectives within its node, the nodes' first ranks between them; rank 0 writes both links.
shape_link 1gbit 2>"$WORK/shape.err" || fail "$(cat "$WORK/shape.err")"
on_node1 timeout 300 mpirun --host "${SUB}1:2,${SUB}2:2" "${MCA[@]}" --map-by slot -np 4 -x OMP_NUM_THREADS \
  "$RELAY" plan --config "$(dirname "$0")/../../configs/gpt-small-bytes.toml" --measure --calibrate "$WORK/cal.toml" \
  > "$WORK/cal.log" 2>&1 || { tail -30 "$WORK/cal.log"; fail "the calibration across two nodes failed"; }
grep -q "^# Measured through the communicator: 2 ranks on one host (mpi, 4 ranks on 2 host(s))" "$WORK/cal.toml" ||
  { cat "$WORK/cal.toml"; fail "no link measured within a node"; }
grep -q "^# Measured through the communicator: one rank on each of 2 hosts (mpi, 4 ranks on 2 host(s))" "$WORK/cal.toml" ||
  { cat "$WORK/cal.toml"; fail "no link measured between the nodes"; }
grep -E "^(devices|async_progress|bandwidth|latency|[a-z_]*_bandwidth|overlap_compute_share) =" "$WORK/cal.toml"
# The shaped link as measured: its all-reduce near the tc rate (125 MB/s; 0.07-0.12 GB/s of bus bandwidth under loads
# of 2 to 10 here; an unshaped link, loopback TCP within node1 included, measures 0.3 GB/s and more); then the plan of dp 4 over both nodes on that file: overlap on
# shorter than off, by no more than the exposed communication it hides.
python3 - "$WORK/cal.toml" <<'PY' || fail "the calibrated links are not the shaped ones"
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
inter, intra = c["inter_node"]["all_reduce_bandwidth"], c["intra_node"]["bandwidth"]
print(f"inter-node all-reduce busbw {inter / 1e9:.3f} GB/s (tc rate 0.125), intra-node busbw {intra / 1e9:.3f} GB/s")
assert 0.02e9 < inter < 0.15e9, inter
assert c["node"]["async_progress"] is False and c["node"]["devices"] == 2
assert 0 <= c["inter_node"]["overlap_compute_share"] <= 1
PY
for ov in true false; do
  "$RELAY" plan --cluster "$WORK/cal.toml" --nodes 2 --layout --json --config "$(dirname "$0")/../../configs/gpt-small-bytes.toml" \
    --set parallel.dp=4 --set train.batch_size=8 --set parallel.overlap=$ov > "$WORK/plan-$ov.json" || fail "plan with overlap $ov"
done
python3 - "$WORK/plan-true.json" "$WORK/plan-false.json" <<'PY' || fail "the plan does not predict the overlap"
import json, sys
on, off = (json.loads(open(f).readline()) for f in sys.argv[1:])
print(f"plan dp 4 over the shaped link: step {off['step_time_s']:.4f} s -> {on['step_time_s']:.4f} s, exposed comm "
      f"{off['exposed_comm_s']:.4f} -> {on['exposed_comm_s']:.4f} s (overlap off -> on)")
assert on["exposed_comm_s"] < off["exposed_comm_s"]
assert on["step_time_s"] < off["step_time_s"]
assert off["step_time_s"] - on["step_time_s"] <= off["exposed_comm_s"] - on["exposed_comm_s"] + 1e-6
PY
echo "calibration over two nodes: the links within node1 and between node1 and node2 measured, the shaped one as shaped"

# 5. Overlap over a shaped link: 100 Mbit/s both ways (3.2 MB of gradients a step, in buckets of ~0.25 MB).
shape_link 100mbit 2>"$WORK/shape.err" || fail "$(cat "$WORK/shape.err")"
"$RELAY" data tokenize --in "$(dirname "$0")/../../README.md" --out "$WORK/text.h5" --tokenizer bytes >/dev/null 2>&1 ||
  fail "data tokenize"
for ov in true false; do
  on_node1 timeout 300 mpirun --host "${SUB}1:1,${SUB}2:1" "${MCA[@]}" --map-by node -np 2 -x OMP_NUM_THREADS=1 \
    "$RELAY" train --config "$(dirname "$0")/../../configs/gpt-small-bytes.toml" --set "run.dir=\"$WORK/ov-$ov\"" \
    --set "data.train=\"$WORK/text.h5\"" --set 'data.eval=""' --set parallel.dp=2 --set parallel.overlap=$ov \
    --set parallel.bucket_mb=0.25 --set parallel.first_bucket_mb=0.25 --set train.steps=3 --set lr_schedule.warmup_steps=0 --set train.log_every=1 \
    --set train.batch_size=8 --set 'trace.steps=[2, 2]' --set checkpoint.every=0 --set train.threads=1 \
    > "$WORK/ov-$ov.log" 2>&1 || { tail -30 "$WORK/ov-$ov.log"; fail "the shaped-link run with overlap $ov failed"; }
done
[ "$(losses "$WORK/ov-true")" == "$(losses "$WORK/ov-false")" ] || fail "overlap on and off give different losses"
python3 - "$WORK" <<'PY' || fail "the traces do not show the overlap"
import json, sys
def order(run):  # per rank: (end of its last backward span, begin of its first bucket all-reduce), us
    last, first = {}, {}
    for e in json.load(open(f"{sys.argv[1]}/{run}/trace.json"))["traceEvents"]:
        r, op = e.get("pid"), e.get("args", {}).get("op")
        if e["ph"] == "X" and op in ("backward", "backward_weight"):
            last[r] = max(last.get(r, 0), e["ts"] + e["dur"])
        if e["ph"] == "b" and op == "allreduce_grads":
            first[r] = min(first.get(r, float("inf")), e["ts"])
    assert sorted(first) == [0, 1], f"{run}: bucket all-reduces traced on ranks {sorted(first)}"
    return {r: (last[r], first[r]) for r in first}
for run, on in (("ov-true", True), ("ov-false", False)):
    for r, (end, begin) in order(run).items():
        print(f"{run}: rank {r} last backward ends {end:.0f} us, first bucket all-reduce begins {begin:.0f} us")
        assert (begin < end) if on else (begin >= end), f"{run}: rank {r}"
PY
for ov in true false; do echo "overlap $ov:"; grep -A3 "exposed comm ms" "$WORK/ov-$ov.log" | tail -n +2; done
echo "overlap across the shaped link: losses equal on and off; with it, the bucket all-reduces began inside the backward"
echo "1 passed, 0 failed"
