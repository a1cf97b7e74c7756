#!/usr/bin/env python3
"""PyTorch twin of Relay's CPU benchmark: 1024 -> 4 x 4096 GELU -> 10, batch 256, AdamW.

Prints samples/s and GFLOP/s = 6 x parameters x samples/s. Usage: torch_mlp.py [steps] [threads] [mode]:
mode fp32 (default) or bf16 (torch.autocast("cpu", dtype=torch.bfloat16) around the forward and loss).
"""
import contextlib
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
mode = sys.argv[3] if len(sys.argv) > 3 else "fp32"
if mode not in ("fp32", "bf16"):
    sys.exit(f"torch_mlp.py: mode must be fp32 or bf16, not {mode!r}")
autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()
torch.set_num_threads(threads)
torch.manual_seed(0)
layers, w = [], 1024
for _ in range(4):
    layers += [torch.nn.Linear(w, 4096), torch.nn.GELU()]
    w = 4096
layers.append(torch.nn.Linear(w, 10))
model = torch.nn.Sequential(*layers)
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad()
    with autocast:
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(3):  # warm-up
    step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dt = time.perf_counter() - t0
sps = steps * 256 / dt
print(f"torch {torch.__version__} threads {threads} params {params} steps {steps} "
      f"samples_per_s {sps:.1f} gflops {6 * params * sps / 1e9:.1f}" + ("" if len(sys.argv) <= 3 else f" mode {mode}"))
