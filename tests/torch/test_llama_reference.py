#!/usr/bin/env python3
"""Golden reference: Relay's Llama against transformers' LlamaForCausalLM (PyTorch 2.x from PyPI).

The GPT reference's harness (test_gpt_reference.py) with another model family: Relay trains a small
byte-level Llama (4 query heads sharing 2 key/value heads: grouped-query attention; RMSNorm, SwiGLU,
rotary positions, no biases) from its own initialisation; transformers' LlamaForCausalLM (eager attention)
loads Relay's step-0 tensors by their state_dict names (strictly: none missing, none unexpected) and trains
on the same sequences in the same order with torch.optim.AdamW, clipping and Relay's schedule. Every step's
loss and grad norm and every final parameter, exp_avg and exp_avg_sq must agree within 10 x what float32
alone moves them (torch fp32 against torch fp64, measured per kind), then `relay generate` at temperature 0
must continue a prompt as greedy decoding with the transformers model does.
Cases: untied serially, untied on dp 2 x tp 2 x pp 2 (8 ranks), tied serially with 2 micro-batches.

transformers and PyTorch 2.x come from PyPI into the cached venv of pypi_venv.py (torch2); exit 77 = skipped.
Usage: test_llama_reference.py <relay binary>
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    sys.path.insert(0, HERE)
    from pypi_venv import VenvError, hf_python

    try:
        py = hf_python()
    except VenvError as e:
        print(f"SKIPPED: {e}")
        sys.exit(77)
    sys.exit(subprocess.run([py, os.path.abspath(__file__), os.path.abspath(sys.argv[1]), "--inside"]).returncode)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
import test_gpt_reference as harness  # noqa: E402

MODEL = dict(harness.MODEL, n_head=4, n_kv_head=2, ffn_hidden=64, rope_theta=10000.0, norm_eps=1e-5)


class Llama(LlamaForCausalLM):
    """transformers' module as the harness calls a model: idx (B, T) -> logits (B, T, V)."""

    def forward(self, idx):  # noqa: D102
        return super().forward(input_ids=idx).logits


class LlamaFamily:
    name = "transformers LlamaForCausalLM"

    @staticmethod
    def relay_model(opts):
        return dict(type="llama", **MODEL, tie_embeddings=opts["tie_embeddings"], init_std=0.02, seed=9)

    @staticmethod
    def config(opts):
        c = LlamaConfig(vocab_size=MODEL["vocab_size"], hidden_size=MODEL["n_embd"], intermediate_size=MODEL["ffn_hidden"],
                        num_hidden_layers=MODEL["n_layer"], num_attention_heads=MODEL["n_head"],
                        num_key_value_heads=MODEL["n_kv_head"], max_position_embeddings=MODEL["block_size"],
                        rms_norm_eps=MODEL["norm_eps"], rope_theta=MODEL["rope_theta"],
                        tie_word_embeddings=opts["tie_embeddings"], attention_bias=False, mlp_bias=False,
                        hidden_act="silu", attn_implementation="eager")
        c.block_size = MODEL["block_size"]  # the harness crops generation contexts to it, as Relay does
        return c

    @staticmethod
    def module(cfg):
        return Llama(cfg)


CASES = [  # name, ranks, model options, token dtype, layout
    ("llama_untied_serial", 1, dict(tie_embeddings=False), np.uint16, dict(dp=1, pp=1, m=1)),
    ("llama_untied_dp2_tp2_pp2", 8, dict(tie_embeddings=False), np.int32, dict(dp=2, tp=2, pp=2, m=2)),
    ("llama_tied_serial_m2", 1, dict(tie_embeddings=True), np.uint16, dict(dp=1, pp=1, m=2)),
]

if __name__ == "__main__":
    torch.manual_seed(0)
    harness.FAMILY = LlamaFamily
    sys.exit(1 if harness.run_cases(sys.argv[1], CASES) else 0)
