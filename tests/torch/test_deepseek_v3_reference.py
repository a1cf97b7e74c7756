#!/usr/bin/env python3
"""Golden reference: Relay's DeepSeek-V3 (dense layers, multi-head latent attention) against transformers'
DeepseekV3ForCausalLM (PyTorch 2.x from PyPI).

The GPT reference's harness (test_gpt_reference.py) with another family, as test_llama_reference.py: Relay trains a
small byte-level DeepSeek-V3 whose every layer is dense (first_k_dense_replace = n_layer) from its own initialisation;
transformers' DeepseekV3ForCausalLM (eager attention) loads Relay's step-0 tensors by their state_dict names (strictly:
none missing, none unexpected) and trains on the same sequences in the same order with torch.optim.AdamW, clipping and
Relay's schedule. MLA's shapes: 4 heads of 8 + 4 query/key columns (the last 4 rotary) and 6 value columns, a
kv_lora_rank of 16, and q_lora_rank 24 (q_a_proj -> q_a_layernorm -> q_b_proj) or unset (one q_proj); rotary pairs
interleaved (transformers' default rope_interleave) or rotate-half. Every step's loss and grad norm and every final
parameter, exp_avg and exp_avg_sq must agree within the harness's tolerance: MARGIN x what float32 alone moves each
kind (torch fp32 against fp64). Cases: q_lora set and unset serially, on tp 2 (heads split through q_b_proj and
kv_b_proj, the a-projections replicated), dp 2, and a document mask (block-diagonal 4-D mask, restarting positions).
Relay cannot generate with MLA yet (no compressed cache): generation is not checked.

transformers and PyTorch 2.x come from PyPI into the cached venv of pypi_venv.py (torch2); exit 77 = skipped.
Usage: test_deepseek_v3_reference.py <relay binary>
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    sys.path.insert(0, HERE)
    from pypi_venv import hf_python, rerun_in_venv

    rerun_in_venv(hf_python, __file__, os.path.abspath(sys.argv[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
import test_gpt_reference as harness  # noqa: E402

MODEL = dict(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_embd=32, ffn_hidden=48, kv_lora_rank=16,
             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, rope_theta=10000.0, norm_eps=1e-6)
# The MoE keys Relay reads and checks (no layer routes yet: first_k_dense_replace = n_layer).
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, n_group=2,
           topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=MODEL["n_layer"])


class DeepseekV3(DeepseekV3ForCausalLM):
    """transformers' module as the harness calls a model: idx (B, T) -> logits (B, T, V); with a document mask as a
    custom 4-D additive attention mask and position_ids (test_llama_reference.py's Llama)."""

    def forward(self, idx, mask=None, positions=None):  # noqa: D102
        if mask is None:
            return super().forward(input_ids=idx).logits
        additive = torch.zeros(mask.shape, dtype=self.dtype).masked_fill(~mask, torch.finfo(self.dtype).min)
        return super().forward(input_ids=idx, attention_mask=additive, position_ids=positions).logits


class DeepseekV3Family:
    name = "transformers DeepseekV3ForCausalLM"
    generates = False  # MLA's compressed-cache generation is not in Relay yet

    @staticmethod
    def relay_model(opts):
        q = dict(q_lora_rank=opts["q_lora_rank"]) if opts["q_lora_rank"] else {}
        return dict(type="deepseek_v3", **MODEL, **MOE, **q, rope_interleave=opts["interleave"],
                    tie_embeddings=False, init_std=0.02, seed=9)

    @staticmethod
    def config(opts):
        c = DeepseekV3Config(
            vocab_size=MODEL["vocab_size"], hidden_size=MODEL["n_embd"], intermediate_size=MODEL["ffn_hidden"],
            num_hidden_layers=MODEL["n_layer"], num_attention_heads=MODEL["n_head"],
            num_key_value_heads=MODEL["n_head"], q_lora_rank=opts["q_lora_rank"] or None,
            kv_lora_rank=MODEL["kv_lora_rank"], qk_nope_head_dim=MODEL["qk_nope_head_dim"],
            qk_rope_head_dim=MODEL["qk_rope_head_dim"], v_head_dim=MODEL["v_head_dim"],
            rope_interleave=opts["interleave"], max_position_embeddings=MODEL["block_size"],
            rms_norm_eps=MODEL["norm_eps"], rope_parameters=dict(rope_type="default", rope_theta=MODEL["rope_theta"]),
            tie_word_embeddings=False, attention_bias=False, hidden_act="silu", num_mtp_layers=0,
            attn_implementation="eager", **MOE)
        c.block_size = MODEL["block_size"]
        return c

    @staticmethod
    def module(cfg):
        return DeepseekV3(cfg)


LORA = dict(q_lora_rank=24, interleave=True)
NO_LORA = dict(q_lora_rank=0, interleave=False)
CASES = [  # name, ranks, model options, token dtype, layout
    ("deepseek_v3_q_lora_serial", 1, LORA, np.uint16, dict(dp=1, pp=1, m=1)),
    ("deepseek_v3_q_proj_serial_m2", 1, NO_LORA, np.uint16, dict(dp=1, pp=1, m=2)),
    ("deepseek_v3_q_lora_tp2", 2, LORA, np.uint16, dict(dp=1, tp=2, pp=1, m=1)),
    ("deepseek_v3_q_proj_tp2", 2, dict(NO_LORA, interleave=True), np.uint16, dict(dp=1, tp=2, pp=1, m=1)),
    ("deepseek_v3_q_lora_dp2", 2, LORA, np.int32, dict(dp=2, pp=1, m=1)),
    ("deepseek_v3_docmask_serial", 1, LORA, np.uint16, dict(dp=1, pp=1, m=1, docs=True)),
]

if __name__ == "__main__":
    torch.manual_seed(0)
    harness.FAMILY = DeepseekV3Family
    sys.exit(1 if harness.run_cases(sys.argv[1], CASES) else 0)
