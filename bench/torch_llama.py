#!/usr/bin/env python3
"""PyTorch twin of Relay's Llama CPU benchmark: transformers' LlamaForCausalLM (the architecture of
Relay's model.type = "llama": RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases)
built from a LlamaConfig with random weights (nothing is downloaded; weights N(0, init_std) as
transformers' initializer_range, norms 1), attention through SDPA (attn_implementation "sdpa"), with
Relay's batch, AdamW (PyTorch's default implementation on CPU), gradient clipping and threads.
The model's shape, AdamW's hyperparameters and the clipping norm come from the same Relay config (TOML)
that Relay trains with; the block size and the batch are given here, as the bench gives them to Relay.

Modes: fp32  every tensor fp32
       bf16  the same under torch.autocast("cpu", dtype=torch.bfloat16): matmuls in bf16, weights,
             gradients, optimizer and the norms/softmax/loss in fp32
Prints one line: the first and the last step's loss, tokens/s = batch x block / step time (the mean
over the steps after the first SKIP), the parameter count and GFLOP/s = (6 x matmul parameters +
12 x n_layer x n_embd x T) x tokens/s (matmul parameters: all but an untied embedding table).

Usage: torch_llama.py CONFIG STEPS THREADS BLOCK BATCH [MODE (fp32)] [SKIP (STEPS/4)]
"""
import sys
import tomllib

import torch
import torch.nn.functional as F
from torch_twin import autocast, default_adamw, report, time_steps
from transformers import LlamaConfig, LlamaForCausalLM

if len(sys.argv) < 6:
    sys.exit(__doc__)
config_path = sys.argv[1]
steps, threads, T, B = (int(a) for a in sys.argv[2:6])
mode = sys.argv[6] if len(sys.argv) > 6 else "fp32"
skip = int(sys.argv[7]) if len(sys.argv) > 7 else steps // 4
if mode not in ("fp32", "bf16") or not 0 <= skip < steps:
    sys.exit(f"torch_llama.py: mode must be fp32 or bf16 (got {mode!r}), 0 <= SKIP < STEPS (got {skip}, {steps})")
with open(config_path, "rb") as f:
    cfg = tomllib.load(f)
m, o = cfg["model"], cfg["optimizer"]
if m.get("type") != "llama" or o.get("name", "adamw") != "adamw":
    sys.exit(f"torch_llama.py: {config_path}: needs model.type = \"llama\" and optimizer.name = \"adamw\"")
V, L, H, C = m["vocab_size"], m["n_layer"], m["n_head"], m["n_embd"]
tied = m.get("tie_embeddings", False)  # Relay's Llama default: an untied lm_head
torch.set_num_threads(threads)
torch.manual_seed(0)

config = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=m["ffn_hidden"], num_hidden_layers=L,
                     num_attention_heads=H, num_key_value_heads=m.get("n_kv_head", H), max_position_embeddings=T,
                     rms_norm_eps=m.get("norm_eps", 1e-5), rope_theta=m.get("rope_theta", 10000.0),
                     initializer_range=m.get("init_std", 0.02), tie_word_embeddings=tied, attention_bias=False,
                     mlp_bias=False, hidden_act="silu", use_cache=False, attn_implementation="sdpa")
model = LlamaForCausalLM(config).train()
params = sum(p.numel() for p in model.parameters())  # tied: the shared table once
matmul_params = params - (0 if tied else V * C)  # the embedding lookup does no matmul
opt = torch.optim.AdamW(model.parameters(), lr=o.get("lr", 1e-3), betas=tuple(o.get("betas", (0.9, 0.999))),
                        eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01))
clip = cfg.get("train", {}).get("clip_grad_norm", 1.0)
adamw = default_adamw(model.parameters())
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))  # (B, T) inputs and targets


def step():
    opt.zero_grad(set_to_none=True)
    with autocast(mode):
        logits = model(input_ids=x).logits  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


tps, losses = time_steps(step, steps, skip, B * T)
report(mode, model.config._attn_implementation, adamw, threads, params, steps, skip, tps,
       6 * matmul_params + 12 * L * C * T, losses)
