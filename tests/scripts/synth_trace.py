#!/usr/bin/python3
"""Writes a synthetic trace.json in the format of Relay's tracer (Chrome trace events, see docs/operations.md
"Timelines") for tests of scripts/plot_run.py: dp x pp ranks running 1F1B (Narayanan et al.,
arXiv:2104.04473) or a ZB-H1-like variant (arXiv:2401.10241: backward split into B and W, the W's
of the cool-down deferred to fill its bubbles), timed by list scheduling with jittered costs.

Usage: synth_trace.py OUT.json [--dp 1] [--pp 4] [--micro-batches 8] [--steps 2] [--zb] [--seed 1]
"""
import argparse
import json
import random

COST_MS = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
LINK_MS = 0.05  # one point-to-point hop


def stage_actions(pp, m, s, zb):
    """This stage's compute actions in order: warm-up forwards, steady 1F1B, cool-down backwards."""
    warm = min(pp - s - 1, m)
    acts = [("forward", i) for i in range(warm)]
    for i in range(m - warm):  # steady state: one forward, one backward
        acts += [("forward", warm + i), ("backward", i)]
    cool = [("backward", i) for i in range(m - warm, m)]
    if not zb:
        return acts + cool
    split = lambda a: [("backward_input", a[1]), ("backward_weight", a[1])]  # noqa: E731
    acts = [x for a in acts for x in (split(a) if a[0] == "backward" else [a])]
    return acts + [("backward_input", i) for _, i in cool] + [("backward_weight", i) for _, i in cool]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--zb", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    o = ap.parse_args()
    rng = random.Random(o.seed)
    events = []
    ranks = [(s, r) for s in range(o.pp) for r in range(o.dp)]  # world rank = stage * dp + replica
    for pid, (s, r) in enumerate(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"rank {pid} (stage {s}, replica {r})"}})
        for tid, name in enumerate(("compute", "communication", "input")):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": name}})

    def span(pid, tid, cat, name, op, step, start_ms, dur_ms, mb=-1):
        events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                       "ts": round(1e6 + start_ms * 1000, 3), "dur": round(dur_ms * 1000, 3),
                       "args": {"step": step, "micro_batch": mb, "chunk": 0 if mb >= 0 else -1,
                                "op": op}})

    t = 0.0
    letter = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}
    for step in range(1, o.steps + 1):
        step_end = t
        for r in range(o.dp):
            free = {s: t for s in range(o.pp)}
            todo = {s: stage_actions(o.pp, o.micro_batches, s, o.zb) for s in range(o.pp)}
            done = {}  # (op kind, stage, micro-batch) -> end time
            while any(todo.values()):
                progressed = False
                for s in range(o.pp):
                    if not todo[s]:
                        continue
                    op, mb = todo[s][0]
                    pid = s * o.dp + r
                    if op == "forward":
                        dep = ("F", s - 1, mb) if s > 0 else None
                    elif op == "backward_weight":
                        dep = ("B", s, mb)
                    else:
                        dep = ("B", s + 1, mb) if s < o.pp - 1 else ("F", s, mb)
                    if dep and dep not in done:
                        continue
                    ready = done[dep] + (LINK_MS if dep and dep[1] != s else 0) if dep else free[s]
                    if op == "forward" and s == 0:  # the input thread hands over the micro-batch
                        span(pid, 2, "input", "data", "data_wait", step, free[s], 0.08, mb)
                        ready = free[s] + 0.08
                    elif dep and dep[1] != s:  # a receive: its wait is drawn on the comm thread
                        recv = "recv_activation" if op == "forward" else "recv_grad"
                        wait = max(ready - free[s], 0.03)
                        span(pid, 1, "comm", f"recv {'act' if op == 'forward' else 'grad'} {mb}",
                             recv, step, free[s], wait, mb)
                        ready = free[s] + wait
                    start = max(ready, free[s])
                    dur = COST_MS[op] * rng.uniform(0.9, 1.15)
                    span(pid, 0, "compute", f"{letter[op]}{mb}", op, step, start, dur, mb)
                    free[s] = start + dur
                    if op != "backward_weight":
                        done[(letter[op] if op != "backward_input" else "B", s, mb)] = free[s]
                    todo[s].pop(0)
                    progressed = True
                assert progressed, "the synthetic schedule deadlocked"
            for s in range(o.pp):
                pid, at = s * o.dp + r, free[s]
                if o.dp > 1:
                    span(pid, 1, "comm", "allreduce c0", "allreduce_grads", step, at, 0.4)
                    at += 0.4
                span(pid, 0, "compute", "optimizer", "optimizer_step", step, at, 0.3)
                step_end = max(step_end, at + 0.3)
        t = step_end + 0.2
    with open(o.out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


if __name__ == "__main__":
    main()
