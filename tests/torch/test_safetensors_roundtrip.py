#!/usr/bin/env python3
"""Checkpoints into PyTorch and back, through safetensors (the real `safetensors` library).

Export: Relay trains (a GPT with tied embeddings, and an MLP), `relay ckpt export` writes the step's
weights; `model.load_state_dict(safetensors.torch.load_file(...))` loads them with strict=True into the
nanoGPT-style module of tests/torch/nanogpt_ref.py and into a torch.nn.Sequential, and PyTorch's eval
loss on the eval file equals the one Relay logged for that step.
Import: PyTorch initialises the modules, saves their state_dict with safetensors.torch.save_file, and
Relay starts from it (model.init_from), serially and on dp 2 x pp 2: its step-0 checkpoint holds
exactly PyTorch's tensors, and after one step with lr = 0 its eval loss equals PyTorch's.

safetensors is not packaged by Debian: it comes from PyPI into a venv (with the system's torch and
h5py) under the user's cache directory. Usage: test_safetensors_roundtrip.py <relay binary>; exit 77 =
skipped (no torch, h5py or PyPI).
"""
import json
import os
import subprocess
import sys
import tempfile

RELAY = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    try:
        import h5py  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e} (scripts/setup.sh --with-torch)")
        sys.exit(77)
    sys.path.insert(0, HERE)
    from pypi_venv import rerun_in_venv, safetensors_python

    rerun_in_venv(safetensors_python, __file__, RELAY)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, HERE)
from nanogpt_ref import GPT, GPTConfig  # noqa: E402

torch.set_num_threads(1)
TOL = 2e-6  # relative: one fp32 forward pass in two libraries


def relay(args, ranks=1):
    cmd = ([RELAY] if ranks == 1 else ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), RELAY]) + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        print(r.stdout[-3000:] + r.stderr[-3000:])
        sys.exit(f"FAILED: {' '.join(cmd)} exited {r.returncode}")
    return r.stdout


def eval_losses(run_dir):
    return {j["step"]: j["eval_loss"] for j in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
            if "eval_loss" in j}


def checkpoint(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["model"].visititems(lambda n, d: out.__setitem__(n, d[()]) if isinstance(d, h5py.Dataset) else None)
    return out


def close(a, b, what):
    rel = abs(a - b) / max(1e-12, abs(b))
    if rel > TOL:
        sys.exit(f"FAILED {what}: {a!r} vs {b!r} (relative {rel:.2e} > {TOL})")
    return rel


def gpt_eval_loss(model, tokens, T):
    n = (len(tokens) - 1) // T
    x = torch.tensor(np.stack([tokens[s * T:s * T + T] for s in range(n)]).astype(np.int64))
    y = torch.tensor(np.stack([tokens[s * T + 1:s * T + T + 1] for s in range(n)]).astype(np.int64))
    with torch.no_grad():
        return F.cross_entropy(model(x).reshape(-1, model.config.vocab_size).double(), y.reshape(-1)).item()


with tempfile.TemporaryDirectory() as tmp:
    # ---- GPT -------------------------------------------------------------------------------------------
    text = open(os.path.join(HERE, "..", "..", "README.md"), "rb").read()
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    for name, part in (("train", tokens[: len(tokens) * 9 // 10]), ("eval", tokens[len(tokens) * 9 // 10:])):
        with h5py.File(os.path.join(tmp, f"{name}.h5"), "w") as f:
            f["tokens"] = part
            f.attrs["vocab_size"], f.attrs["tokenizer"] = 256, "bytes"
    T = 16
    cfg = GPTConfig(vocab_size=256, block_size=T, n_layer=2, n_head=2, n_embd=32)
    gpt_toml = os.path.join(tmp, "gpt.toml")
    open(gpt_toml, "w").write(f"""[model]
type = "gpt"
vocab_size = 256
block_size = {T}
n_layer = 2
n_head = 2
n_embd = 32
[data]
train = "{tmp}/train.h5"
eval = "{tmp}/eval.h5"
[train]
steps = 20
batch_size = 8
micro_batches = 2
eval_every = 10
""")
    relay(["train", "--config", gpt_toml, "--set", f'run.dir="{tmp}/gpt"'])
    st = os.path.join(tmp, "gpt.safetensors")
    relay(["ckpt", "export", f"{tmp}/gpt/checkpoints/step_00000020.h5", "--out", st])
    model = GPT(cfg)
    model.load_state_dict(load_file(st), strict=True)  # no renaming
    eval_tokens = h5py.File(os.path.join(tmp, "eval.h5"), "r")["tokens"][()]
    rel = close(gpt_eval_loss(model, eval_tokens, T), eval_losses(f"{tmp}/gpt")[20], "GPT export: eval loss")
    print(f"GPT export: load_state_dict(load_file(...)) strict; PyTorch's eval loss = Relay's at step 20 "
          f"(relative difference {rel:.1e})")

    torch.manual_seed(5)
    fresh = GPT(cfg)
    fresh.init_like_nanogpt(seed=5)
    init = os.path.join(tmp, "init.safetensors")
    save_file({k: v.contiguous() for k, v in fresh.state_dict().items()}, init)
    want = gpt_eval_loss(fresh, eval_tokens, T)
    for ranks, layout in ((1, []), (4, ["--set", "parallel.dp=2", "--set", "parallel.pp=2"])):
        run = os.path.join(tmp, f"gpt_init_{ranks}")
        relay(["train", "--config", gpt_toml, "--set", f'run.dir="{run}"', "--set", f'model.init_from="{init}"',
               "--set", "checkpoint.save_initial=true", "--set", "train.steps=1", "--set", "optimizer.lr=0.0",
               "--set", "optimizer.weight_decay=0.0"] + layout, ranks)
        step0 = checkpoint(f"{run}/checkpoints/step_00000000.h5")
        for k, v in fresh.state_dict().items():
            if not np.array_equal(step0[k], v.numpy()):
                sys.exit(f"FAILED GPT import on {ranks} rank(s): tensor {k} differs from PyTorch's")
        rel = close(eval_losses(run)[1], want, f"GPT import on {ranks} rank(s): eval loss")
        print(f"GPT import on {ranks} rank(s): step-0 checkpoint = PyTorch's {len(step0)} tensors bitwise; "
              f"eval loss equals PyTorch's (relative {rel:.1e})")

    # ---- MLP -------------------------------------------------------------------------------------------
    relay(["data", "synth", "--out", f"{tmp}/m.h5", "--samples", "256", "--features", "12", "--classes", "4", "--seed", "1"])
    relay(["data", "synth", "--out", f"{tmp}/me.h5", "--samples", "64", "--features", "12", "--classes", "4", "--seed", "2"])
    mlp_toml = os.path.join(tmp, "mlp.toml")
    open(mlp_toml, "w").write(f"""[model]
layers = [ {{ type = "linear", out = 16 }}, {{ type = "gelu" }}, {{ type = "layernorm" }}, {{ type = "linear", out = 4 }} ]
[data]
train = "{tmp}/m.h5"
eval = "{tmp}/me.h5"
[train]
steps = 10
batch_size = 32
eval_every = 10
""")
    relay(["train", "--config", mlp_toml, "--set", f'run.dir="{tmp}/mlp"'])
    relay(["ckpt", "export", f"{tmp}/mlp/checkpoints/step_00000010.h5", "--out", f"{tmp}/mlp.safetensors"])

    def sequential():
        return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))

    def mlp_eval(m):
        with h5py.File(f"{tmp}/me.h5", "r") as f:
            x, y = torch.tensor(f["inputs"][()]), torch.tensor(f["targets"][()].astype(np.int64))
        with torch.no_grad():
            return F.cross_entropy(m(x).double(), y).item()

    m = sequential()
    m.load_state_dict(load_file(f"{tmp}/mlp.safetensors"), strict=True)
    rel = close(mlp_eval(m), eval_losses(f"{tmp}/mlp")[10], "MLP export: eval loss")
    print(f"MLP export: torch.nn.Sequential loads it strict; eval loss equals Relay's (relative {rel:.1e})")
    torch.manual_seed(9)
    m = sequential()
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, f"{tmp}/mlp_init.safetensors")
    relay(["train", "--config", mlp_toml, "--set", f'run.dir="{tmp}/mlp_init"', "--set",
           f'model.init_from="{tmp}/mlp_init.safetensors"', "--set", "train.steps=1", "--set", "optimizer.lr=0.0",
           "--set", "optimizer.weight_decay=0.0", "--set", "train.eval_every=1"])
    rel = close(eval_losses(f"{tmp}/mlp_init")[1], mlp_eval(m), "MLP import: eval loss")
    print(f"MLP import: Relay from PyTorch's initialisation gives PyTorch's eval loss (relative {rel:.1e})")
    print("1 passed, 0 failed")
