#!/usr/bin/env python3
"""`[log] tensorboard = true`: Relay's own TensorBoard event writer (io/tfevents.cpp) read back by
TensorBoard's reader.

Relay trains an MLP on 2 ranks (dp 2, with an eval set) and a small GPT on 2 ranks (pp 2) with
log.tensorboard = true. TensorBoard's EventAccumulator (tensorboard.backend.event_processing, the
tensorboard package from PyPI in a cached venv; it checks every record's two CRCs) loads <run.dir>/tb,
and every scalar must equal the metrics.jsonl value of the same step and key (as float32, the type of
simple_value): train loss, lr, gradient norm, samples/s, tokens/s (GPT), FLOP/s, resident memory,
skipped steps, eval loss and accuracy. Only rank 0 writes: one event file. Without the key, no tb/.

Usage: test_tensorboard_events.py <relay binary>. Exits 77 (skipped) when PyPI is out of reach.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from pypi_venv import tensorboard_python, VenvError

RELAY = os.path.abspath(sys.argv[1])
try:
    PY = tensorboard_python()
except VenvError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)

READ = r'''
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})  # 0: keep every event
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
'''
MPI = ["mpirun", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(f"FAIL: {' '.join(cmd[:6])}... exited {r.returncode}")
    return r.stdout


def f32(v):  # simple_value is a float: compare what float32 keeps
    import struct
    return struct.unpack("f", struct.pack("f", v))[0]


def compare(run_dir, expect_tags):
    files = os.listdir(os.path.join(run_dir, "tb"))
    check(len(files) == 1 and files[0].startswith("events.out.tfevents."), f"one event file from rank 0: {files}")
    scalars = json.loads(run([PY, "-c", READ, os.path.join(run_dir, "tb")]))
    check(set(expect_tags) <= set(scalars), f"tags {sorted(scalars)} hold {sorted(expect_tags)}")
    records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    n = 0
    for tag, key in expect_tags.items():
        section = "eval" if tag.startswith("eval/") else "train"
        want = [(r["step"], r[key]) for r in records if ("eval_loss" in r) == (section == "eval")]
        got = [(s, v) for s, v in scalars.get(tag, [])]
        same = len(got) == len(want) and all(
            gs == ws and (math.isclose(gv, f32(wv), rel_tol=1e-6, abs_tol=1e-30)) for (gs, gv), (ws, wv) in zip(got, want))
        check(same and len(want) > 0, f"{tag}: {len(got)} events equal metrics.jsonl's {key} ({len(want)} records)")
        n += len(got)
    return n


with tempfile.TemporaryDirectory(prefix="relay-tb-") as d:
    train, ev = os.path.join(d, "train.h5"), os.path.join(d, "eval.h5")
    run([RELAY, "data", "synth", "--out", train, "--samples", "512", "--features", "16", "--classes", "5", "--seed", "1"])
    run([RELAY, "data", "synth", "--out", ev, "--samples", "128", "--features", "16", "--classes", "5", "--seed", "2"])
    cfg = os.path.join(d, "mlp.toml")
    open(cfg, "w").write(f'''
[model]
layers = [ {{ type = "linear", out = 32 }}, {{ type = "gelu" }}, {{ type = "linear", out = 5 }} ]
[data]
train = "{train}"
eval = "{ev}"
[train]
steps = 30
batch_size = 64
log_every = 3
eval_every = 10
[lr_schedule]
name = "cosine"
warmup_steps = 5
[parallel]
dp = 2
[log]
tensorboard = true
''')
    mlp = os.path.join(d, "mlp")
    run(MPI + ["-np", "2", RELAY, "train", "--config", cfg, "--set", f'run.dir="{mlp}"'])
    n = compare(mlp, {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
                      "train/samples_per_s": "samples_per_s", "train/flops_per_s": "flops_per_s",
                      "train/rss_mib": "rss_mib", "train/rss_max_mib": "rss_max_mib",
                      "train/skipped_steps": "skipped_steps", "eval/loss": "eval_loss",
                      "eval/accuracy": "eval_accuracy"})
    print(f"MLP, dp 2: {n} scalars read back by EventAccumulator, all equal to metrics.jsonl")

    # A GPT run (tokens/s) on two pipeline stages, from a byte-level token file.
    text = os.path.join(d, "text.txt")
    open(text, "w").write("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    tokens = os.path.join(d, "tokens.h5")
    run([RELAY, "data", "tokenize", "--in", text, "--out", tokens, "--tokenizer", "bytes"])
    gcfg = os.path.join(d, "gpt.toml")
    open(gcfg, "w").write(f'''
[model]
type = "gpt"
vocab_size = 256
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
[data]
train = "{tokens}"
[train]
steps = 12
batch_size = 8
micro_batches = 2
log_every = 2
[parallel]
pp = 2
[log]
tensorboard = true
''')
    gpt = os.path.join(d, "gpt")
    run(MPI + ["-np", "2", RELAY, "train", "--config", gcfg, "--set", f'run.dir="{gpt}"'])
    n = compare(gpt, {"train/loss": "loss", "train/tokens_per_s": "tokens_per_s", "train/lr": "lr",
                      "train/grad_norm": "grad_norm", "train/skipped_steps": "skipped_steps"})
    print(f"GPT, pp 2: {n} scalars read back, all equal to metrics.jsonl")

    off = os.path.join(d, "off")
    run([RELAY, "train", "--config", cfg, "--set", f'run.dir="{off}"', "--set", "train.steps=5",
         "--set", "parallel.dp=1", "--set", "log.tensorboard=false"])
    check(not os.path.exists(os.path.join(off, "tb")), "log.tensorboard = false writes no tb/")

if failures:
    sys.exit(f"{len(failures)} failed: {failures}")
print("1 passed, 0 failed")
