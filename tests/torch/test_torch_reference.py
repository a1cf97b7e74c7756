#!/usr/bin/env python3
"""Golden reference: Relay against PyTorch, an independent implementation of the same math.

Relay trains from its own initialisation (step-0 checkpoint, written with checkpoint.save_initial);
PyTorch loads those weights from the HDF5 file into a torch.nn.Sequential and trains with the same
data order, optimizer, clipping and learning-rate schedule. Every step's loss and every final
parameter and optimizer-state tensor must agree (rtol 1e-4, atol 1e-5: two GEMM libraries).
Cases: cross_entropy + AdamW + cosine, mse + SGD with momentum + constant, both with clipping,
serial and on 4 ranks (dp = 2, pp = 2, 1F1B).

Usage: test_torch_reference.py <relay binary>. Exits 77 (skipped) without torch or h5py.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e} (install python3-torch and python3-h5py: scripts/setup.sh --with-torch)")
    sys.exit(77)

RELAY = os.path.abspath(sys.argv[1])
RTOL, ATOL = 1e-4, 1e-5
STEPS, BATCH = 8, 32
torch.set_num_threads(1)

LAYERS = [("linear", 24), ("gelu", None), ("linear", 24), ("tanh", None), ("layernorm", None),
          ("linear", 24), ("relu", None), ("linear", 5)]


def toml_layers():
    items = []
    for t, out in LAYERS:
        items.append(f'{{ type = "{t}", out = {out} }}' if out else f'{{ type = "{t}" }}')
    return "[ " + ", ".join(items) + " ]"


def torch_model(d_in):
    mods, w = [], d_in
    for t, out in LAYERS:
        if t == "linear":
            mods.append(torch.nn.Linear(w, out)); w = out
        elif t == "gelu":
            mods.append(torch.nn.GELU())
        elif t == "tanh":
            mods.append(torch.nn.Tanh())
        elif t == "relu":
            mods.append(torch.nn.ReLU())
        elif t == "layernorm":
            mods.append(torch.nn.LayerNorm(w))
    return torch.nn.Sequential(*mods)


def lr_at(cfg, step):
    base, sched = cfg["lr"], cfg["schedule"]
    if sched == "constant":
        return base
    warm, mn = cfg["warmup"], cfg["min_lr"]
    if warm > 0 and step <= warm:
        return base * step / warm
    p = (step - warm) / (STEPS - warm)
    return mn + 0.5 * (base - mn) * (1 + math.cos(math.pi * p))


def run_case(tmp, name, cfg, ranks, layout):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    data = os.path.join(d, "train.h5")
    rng = np.random.default_rng(3)
    n, d_in = 200, 12
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    with h5py.File(data, "w") as f:
        f["inputs"] = x
        if cfg["loss"] == "cross_entropy":
            f["targets"] = rng.integers(0, 5, n).astype(np.int64)
        else:
            f["targets"] = rng.standard_normal((n, 5)).astype(np.float32)
    opt = cfg["opt"]
    conf = f"""
[run]
dir = "{d}/run"
[model]
seed = 9
loss = "{cfg['loss']}"
layers = {toml_layers()}
[data]
train = "{data}"
shuffle = false
[train]
steps = {STEPS}
batch_size = {BATCH}
micro_batches = {layout.get('m', 1)}
log_every = 1
clip_grad_norm = {cfg['clip']}
[optimizer]
name = "{opt}"
lr = {cfg['lr']}
weight_decay = {cfg['wd']}
momentum = {cfg.get('momentum', 0.0)}
[lr_schedule]
name = "{cfg['schedule']}"
warmup_steps = {cfg.get('warmup', 0)}
min_lr = {cfg.get('min_lr', 0.0)}
[parallel]
dp = {layout.get('dp', 1)}
pp = {layout.get('pp', 1)}
[checkpoint]
save_initial = true
"""
    cpath = os.path.join(d, "c.toml")
    open(cpath, "w").write(conf)
    cmd = [RELAY, "train", "--config", cpath]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "OMP_NUM_THREADS=1"] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"{name}: relay failed\n{r.stdout}\n{r.stderr}")
    relay_losses = [json.loads(l)["loss"] for l in open(f"{d}/run/metrics.jsonl") if '"loss"' in l]

    # PyTorch from Relay's initial weights (io/README.md's h5py recipe).
    model = torch_model(d_in)
    with h5py.File(f"{d}/run/checkpoints/step_00000000.h5", "r") as f:
        assert f.attrs["format"] == "relay-checkpoint" and f.attrs["version"] == 1
        state = {k: torch.from_numpy(f["model"][k][()]) for k in f["model"]}
    model.load_state_dict(state)
    if opt == "adamw":
        o = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
    else:
        o = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["wd"])
    with h5py.File(data, "r") as f:
        xs, ys = torch.from_numpy(f["inputs"][()]), torch.from_numpy(f["targets"][()])
    loss_fn = torch.nn.CrossEntropyLoss() if cfg["loss"] == "cross_entropy" else torch.nn.MSELoss()
    torch_losses = []
    for step in range(1, STEPS + 1):
        idx = torch.tensor([((step - 1) * BATCH + j) % n for j in range(BATCH)])
        for g in o.param_groups:
            g["lr"] = lr_at(cfg, step)
        o.zero_grad()
        loss = loss_fn(model(xs[idx]), ys[idx])
        loss.backward()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        o.step()
        torch_losses.append(loss.item())

    np.testing.assert_allclose(relay_losses, torch_losses, rtol=RTOL, atol=ATOL, err_msg=f"{name}: losses")
    names = dict(model.named_parameters())
    with h5py.File(f"{d}/run/checkpoints/step_{STEPS:08d}.h5", "r") as f:
        for k, p in names.items():
            np.testing.assert_allclose(f["model"][k][()], p.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: model/{k}")
            st = o.state[p]
            kinds = ["exp_avg", "exp_avg_sq"] if opt == "adamw" else ["momentum_buffer"]
            for kind in kinds:
                np.testing.assert_allclose(f["optimizer"][kind][k][()], st[kind].numpy(), rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name}: optimizer/{kind}/{k}")
        assert f["optimizer"].attrs["step"] == STEPS
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(relay_losses, torch_losses))
    print(f"{name}: {STEPS} steps, losses agree (worst relative difference {worst:.2e}), "
          f"{len(names)} parameters and their optimizer state agree")


CASES = [
    ("ce_adamw_cosine", dict(loss="cross_entropy", opt="adamw", lr=0.01, wd=0.01, clip=0.5, schedule="cosine",
                             warmup=2, min_lr=0.001)),
    ("mse_sgd_momentum", dict(loss="mse", opt="sgd", lr=0.05, wd=0.001, momentum=0.9, clip=1.0,
                              schedule="constant")),
]
with tempfile.TemporaryDirectory() as tmp:
    failures = 0
    for name, cfg in CASES:
        for ranks, layout in [(1, {}), (4, {"dp": 2, "pp": 2, "m": 2})]:
            label = f"{name}_{ranks}rank"
            try:
                run_case(tmp, label, cfg, ranks, layout)
            except AssertionError as e:
                failures += 1
                print(f"FAILED {label}: {e}")
    total = len(CASES) * 2
    print(f"{total - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)
