#!/usr/bin/env python3
"""PyTorch's causal attention on the GPU at the shapes of bench/gpu_check.sh's op profiles, for Relay's
flash_attention_forward / _backward per-call times (RELAY_OP_PROFILE): torch.nn.functional.scaled_dot_product_attention
(bf16, is_causal, the flash backend where PyTorch picks it), forward and forward + backward, mean over 20 calls after
5 warm-up calls, by CUDA events. Measures; never fails.
Usage: torch_gpu_attention.py [B (16)] [T (1024)]
"""
import sys

import torch
import torch.nn.functional as F

B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024


def timed(fn, n=20, warm=5):
    for _ in range(warm):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


for name, H, KV, hd in (("gpt2-124m", 12, 12, 64), ("smollm2-135m", 9, 3, 64)):
    q = torch.randn(B, H, T, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, T, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, T, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, H, T, hd, device="cuda", dtype=torch.bfloat16)
    gqa = dict(enable_gqa=True) if KV != H else {}
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa))
    both = timed(lambda: torch.autograd.backward(F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa), dy))
    print("torch sdpa %-13s B %d H %d KV %d T %d hd %d: forward %.3f ms, backward %.3f ms (forward + backward %.3f)"
          % (name, B, H, KV, T, hd, fwd, both - fwd, both))
