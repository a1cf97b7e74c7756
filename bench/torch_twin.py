"""What bench/torch_gpt.py and bench/torch_llama.py share: which AdamW PyTorch picks, and timing a
training step (one line printed in the format the bench scripts parse)."""
import contextlib
import time

import torch


def default_adamw(params):
    """The AdamW implementation PyTorch picks by default for these tensors: fused, foreach or for-loop
    (a private helper: "default" when this PyTorch lacks it)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
        fused, foreach = _default_to_fused_or_foreach(list(params), False, False)
        return "fused" if fused else "foreach" if foreach else "for-loop"
    except (ImportError, TypeError):
        return "default"


def autocast(mode):
    """CPU autocast to bf16 for mode "bf16", nothing for "fp32"."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()


def time_steps(step, steps, skip, tokens_per_step):
    """Runs step() (returns the loss) `steps` times; returns (tokens/s averaged over the steps after the
    first `skip`, the losses)."""
    rates, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        rates.append(tokens_per_step / (time.perf_counter() - t0))
    return sum(rates[skip:]) / len(rates[skip:]), losses


def report(mode, attention, adamw, threads, params, steps, skip, tps, flops_per_token, losses):
    print(f"torch {torch.__version__} mode {mode} attention {attention} adamw {adamw} "
          f"threads {threads} params {params} steps {steps} skip {skip} tokens_per_s {tps:.1f} "
          f"gflops {flops_per_token * tps / 1e9:.1f} loss1 {losses[0]:.4f} loss {losses[-1]:.4f}")
