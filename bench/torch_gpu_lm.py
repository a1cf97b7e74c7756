#!/usr/bin/env python3
"""PyTorch twin of Relay's GPU language-model benchmark (bench/bench_gpu_lm.sh), on one CUDA GPU.

Models: gpt    nanoGPT's GPT-2 module (github.com/karpathy/nanoGPT, model.py: pre-LayerNorm, fused c_attn,
               GELU tanh, tied head, biases), attention through F.scaled_dot_product_attention(is_causal=True)
               (flash attention on an H100)
        llama  transformers' LlamaForCausalLM with attn_implementation="sdpa" and tied embeddings
What users run: bf16 autocast on fp32 weights, fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1), gradient
clipping at 1.0, micro-batches accumulated into one optimizer step. Mode "eager" or "compile" (torch.compile of
the model). The data are random tokens (as Relay's run), which changes nothing in the time of a step.

Prints one line: tokens/s (mean over the steps after the first SKIP, timed with CUDA synchronisation around each
step), model TFLOP/s by nanoGPT's count ((6 x parameters + 12 x n_layer x n_embd x T) per token, embeddings
included in the parameters as Relay counts them), MFU against PEAK_TFLOPS, and torch.cuda.max_memory_allocated.

Usage: torch_gpu_lm.py gpt|llama eager|compile STEPS MICRO_BATCH MICRO_BATCHES [PEAK_TFLOPS (989.4)] [SKIP (3)]
  gpt:   GPT-2 124M: V 50257 (or $GPT_VOCAB), T 1024, 12 layers, 12 heads, 768 wide
  llama: SmolLM2-135M's shape: V 49152, T 1024, 30 layers, 9 heads (3 key-value), 576 wide, 1536 SwiGLU
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

if len(sys.argv) < 6:
    sys.exit(__doc__)
family, mode = sys.argv[1], sys.argv[2]
steps, B, M = (int(a) for a in sys.argv[3:6])
peak = float(sys.argv[6]) if len(sys.argv) > 6 else 989.4
skip = int(sys.argv[7]) if len(sys.argv) > 7 else 3
if family not in ("gpt", "llama") or mode not in ("eager", "compile") or not 0 <= skip < steps:
    sys.exit(__doc__)
torch.manual_seed(0)
dev = "cuda"
T = 1024


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H, self.C = H, C
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)  # (3C, C), (C, C)

    def forward(self, x):  # x (B, T, C)
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.H, c // self.H).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), CausalSelfAttention(C, H), nn.LayerNorm(C)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, L, H, C):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):  # idx, targets (B, T)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V), tied head
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


if family == "gpt":
    V, L, C = int(os.environ.get("GPT_VOCAB", 50257)), 12, 768  # GPT_VOCAB=50304: nanoGPT's padded vocabulary
    model = GPT(V, L, 12, C).to(dev)
    what = "nanoGPT GPT-2 124M, SDPA"
else:
    from transformers import LlamaConfig, LlamaForCausalLM
    V, L, C = 49152, 30, 576
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=1536, num_hidden_layers=L,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=T,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    hf = LlamaForCausalLM(cfg).to(dev)

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx, targets):
            logits = self.m(input_ids=idx).logits  # (B, T, V)
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

    model = Wrap(hf)
    what = "transformers LlamaForCausalLM (SmolLM2-135M shape), SDPA"

params = sum(p.numel() for p in model.parameters())
flops_per_token = 6 * params + 12 * L * C * T
decay = [p for p in model.parameters() if p.dim() >= 2]
rest = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
fwd = torch.compile(model) if mode == "compile" else model
g = torch.Generator(device=dev).manual_seed(1)
data = [torch.randint(0, V, (B, T + 1), device=dev, generator=g) for _ in range(4)]


def step(k):
    for m in range(M):
        d = data[(k * M + m) % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(d[:, :-1], d[:, 1:]) / M
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item() * M


rates, losses = [], []
torch.cuda.reset_peak_memory_stats()
for k in range(steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses.append(step(k))
    torch.cuda.synchronize()
    rates.append(B * M * T / (time.perf_counter() - t0))
tps = sum(rates[skip:]) / len(rates[skip:])
print(f"torch {torch.__version__} {family} {mode} ({what}) params {params} batch {B}x{M}x{T} steps {steps} "
      f"tokens_per_s {tps:.0f} tflops {flops_per_token * tps / 1e12:.1f} mfu {100 * flops_per_token * tps / 1e12 / peak:.1f}% "
      f"peak_mem_gib {torch.cuda.max_memory_allocated() / 2**30:.2f} loss1 {losses[0]:.4f} loss {losses[-1]:.4f}", flush=True)
