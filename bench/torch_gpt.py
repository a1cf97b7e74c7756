#!/usr/bin/env python3
"""PyTorch twin of Relay's GPT CPU benchmark: the same GPT-2 architecture (nanoGPT's module, no
dropout, tied embeddings, GELU tanh), batch, AdamW and threads. Prints tokens/s and
GFLOP/s = 6 x parameters x tokens/s (+ attention: 12 x n_layer x n_embd x T per token).

Usage: torch_gpt.py STEPS THREADS VOCAB BLOCK N_LAYER N_HEAD N_EMBD BATCH
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

steps, threads, V, T, L, H, C, B = (int(a) for a in sys.argv[1:9])
torch.set_num_threads(threads)
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.m_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
        att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.m_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


model = GPT()
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))


def step():
    opt.zero_grad()
    loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(2):  # warm-up
    step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dt = time.perf_counter() - t0
tps = steps * B * T / dt
flops_per_token = 6 * params + 12 * L * C * T
print(f"torch {torch.__version__} threads {threads} params {params} steps {steps} "
      f"tokens_per_s {tps:.1f} gflops {flops_per_token * tps / 1e9:.1f}")
