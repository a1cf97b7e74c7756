#!/usr/bin/env python3
"""PyTorch twin of Relay's GPT CPU benchmark: nanoGPT's GPT-2 module (github.com/karpathy/nanoGPT,
model.py; the architecture of Relay's GPT: pre-LayerNorm blocks, fused c_attn, GELU tanh, tied head,
biases, no dropout; weights N(0, 0.02), c_proj weights N(0, 0.02 / sqrt(2 n_layer)), biases 0,
layernorms 1 and 0), with Relay's batch, AdamW (PyTorch's default implementation on CPU), gradient
clipping at 1.0 and threads.

Modes: fp32  attention through F.scaled_dot_product_attention(is_causal=True) (PyTorch >= 2.0; on an
             older torch, such as Debian's 1.13, the explicit masked softmax, and the output says so)
       bf16  the same under torch.autocast("cpu", dtype=torch.bfloat16): matmuls in bf16, weights,
             gradients, optimizer and layernorm/softmax/loss in fp32 (nanoGPT's train.py)
Prints one line: the first and the last step's loss, tokens/s = batch x block / step time (the mean
over the steps after the first SKIP) and GFLOP/s = (6 x parameters + 12 x n_layer x n_embd x T) x tokens/s (nanoGPT's MFU count).

Usage: torch_gpt.py STEPS THREADS VOCAB BLOCK N_LAYER N_HEAD N_EMBD BATCH [MODE (fp32)] [SKIP (STEPS/4)]
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_twin import autocast, default_adamw, report, time_steps

if len(sys.argv) < 9:
    sys.exit(__doc__)
steps, threads, V, T, L, H, C, B = (int(a) for a in sys.argv[1:9])
mode = sys.argv[9] if len(sys.argv) > 9 else "fp32"
skip = int(sys.argv[10]) if len(sys.argv) > 10 else steps // 4
if mode not in ("fp32", "bf16") or not 0 <= skip < steps:
    sys.exit(f"torch_gpt.py: mode must be fp32 or bf16 (got {mode!r}), 0 <= SKIP < STEPS (got {skip}, {steps})")
torch.set_num_threads(threads)
torch.manual_seed(0)
SDPA = hasattr(F, "scaled_dot_product_attention")


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)  # weight (3C, C): q, k, v stacked
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):  # x (B, T, C)
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # each (B, T, C)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hd)
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // H))  # (B, nh, T, T)
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            y = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(C), CausalSelfAttention(), nn.LayerNorm(C), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)  # (V, C), (T, C); wte is the head too
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif "ln_" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx):  # idx (B, T) -> logits (B, T, V)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


model = GPT()
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
adamw = default_adamw(model.parameters())
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))  # (B, T) inputs and targets


def step():
    opt.zero_grad(set_to_none=True)
    with autocast(mode):
        loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


tps, losses = time_steps(step, steps, skip, B * T)
report(mode, "sdpa" if SDPA else "manual", adamw, threads, params, steps, skip, tps, 6 * params + 12 * L * C * T,
       losses)
