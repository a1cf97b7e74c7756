#!/usr/bin/env python3
"""PyTorch twin of Relay's MoE CPU benchmark: transformers' MixtralForCausalLM, Qwen3MoeForCausalLM or
DeepseekV3ForCausalLM (the architectures of Relay's model.type = "mixtral" / "qwen3_moe" / "deepseek_v3") built from
the Relay config's shape with random
weights (nothing is downloaded), SDPA attention, the experts as transformers runs them by default
(experts_implementation None: its grouped-GEMM path where the CPU has one), Relay's batch, AdamW, clipping and
threads; the loss is the cross-entropy plus router_aux_loss_coef x transformers' own load-balancing loss
(output_router_logits), so the router's statistics are computed as in training. DeepSeek-V3's model has no
auxiliary loss in transformers (its routing is balanced by the correction bias, outside the backward): the
cross-entropy alone.

Modes: fp32, or bf16 = torch.autocast("cpu", dtype=torch.bfloat16).
Prints one line (torch_twin.report): tokens/s over the steps after the first SKIP, parameters, GFLOP/s with
6 x active matmul parameters + 12 x n_layer x n_embd x T per token.
Usage: torch_moe.py CONFIG STEPS THREADS BLOCK BATCH [MODE (fp32)] [SKIP (STEPS/4)]
"""
import sys
try:
    import tomllib  # Python 3.11+
except ImportError:  # an older python (a GPU machine's own): pip's copy of the same parser
    from pip._vendor import tomli as tomllib

import torch
import torch.nn.functional as F
from torch_twin import autocast, default_adamw, report, time_steps
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

if len(sys.argv) < 6:
    sys.exit(__doc__)
config_path = sys.argv[1]
steps, threads, T, B = (int(a) for a in sys.argv[2:6])
mode = sys.argv[6] if len(sys.argv) > 6 else "fp32"
skip = int(sys.argv[7]) if len(sys.argv) > 7 else steps // 4
with open(config_path, "rb") as f:
    cfg = tomllib.load(f)
m, o = cfg["model"], cfg["optimizer"]
V, L, H, C = m["vocab_size"], m["n_layer"], m["n_head"], m["n_embd"]
deepseek = m["type"] == "deepseek_v3"
if deepseek:  # transformers' key names are Relay's for this family
    E, k, Fe = m["n_routed_experts"], m["num_experts_per_tok"], m["moe_intermediate_size"]
else:
    E, k, Fe = m["n_experts"], m["experts_per_token"], m["moe_ffn_hidden"]
torch.set_num_threads(threads)
torch.manual_seed(0)
common = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
              num_key_value_heads=m.get("n_kv_head", H), max_position_embeddings=T, rms_norm_eps=m.get("norm_eps", 1e-5),
              rope_parameters=dict(rope_type="default", rope_theta=m.get("rope_theta", 10000.0)),
              initializer_range=m.get("init_std", 0.02), tie_word_embeddings=False, num_experts_per_tok=k,
              router_aux_loss_coef=m.get("router_aux_loss_coef", 0.001), use_cache=False, attn_implementation="sdpa")
if deepseek:
    common.pop("router_aux_loss_coef")
    common["num_key_value_heads"] = H
    model = DeepseekV3ForCausalLM(DeepseekV3Config(
        **common, intermediate_size=m["ffn_hidden"], moe_intermediate_size=Fe, n_routed_experts=E,
        n_shared_experts=m["n_shared_experts"], n_group=m["n_group"], topk_group=m["topk_group"],
        norm_topk_prob=m["norm_topk_prob"], routed_scaling_factor=m["routed_scaling_factor"],
        first_k_dense_replace=m["first_k_dense_replace"], q_lora_rank=m.get("q_lora_rank") or None,
        kv_lora_rank=m["kv_lora_rank"], qk_nope_head_dim=m["qk_nope_head_dim"], qk_rope_head_dim=m["qk_rope_head_dim"],
        v_head_dim=m["v_head_dim"], rope_interleave=m.get("rope_interleave", True), attention_bias=False))
    dense = []
elif m["type"] == "mixtral":
    model = MixtralForCausalLM(MixtralConfig(**common, intermediate_size=Fe, num_local_experts=E))
    dense = []
else:
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, intermediate_size=m.get("ffn_hidden", Fe),
                                               moe_intermediate_size=Fe, num_experts=E,
                                               norm_topk_prob=m.get("norm_topk_prob", False),
                                               decoder_sparse_step=m.get("decoder_sparse_step", 1),
                                               mlp_only_layers=m.get("mlp_only_layers", []),
                                               head_dim=m.get("head_dim", C // H)))
    dense = [i for i in range(L) if not model.model.layers[i].mlp.__class__.__name__.endswith("SparseMoeBlock")]
model.train()
params = sum(p.numel() for p in model.parameters())
experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
active = params - V * C - experts + experts * k // E  # matmul parameters a token uses (no embedding lookup)
opt = torch.optim.AdamW(model.parameters(), lr=o.get("lr", 1e-3), betas=tuple(o.get("betas", (0.9, 0.999))),
                        eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01))
clip = cfg.get("train", {}).get("clip_grad_norm", 1.0)
adamw = default_adamw(model.parameters())
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
coef = m.get("router_aux_loss_coef", 0.001)


def step():
    opt.zero_grad(set_to_none=True)
    with autocast(mode):
        out = model(input_ids=x) if deepseek else model(input_ids=x, output_router_logits=True)
        loss = F.cross_entropy(out.logits.view(-1, V).float(), y.view(-1))
        if not deepseek:
            loss = loss + coef * out.aux_loss
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


# attention's QK^T and att @ V per token (forward and backward, causal or not as the other rows count them)
attn = 6 * L * H * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"] + m["v_head_dim"]) * T if deepseek else \
    12 * L * H * m.get("head_dim", C // H) * T
tps, losses = time_steps(step, steps, skip, B * T)
report(mode, model.config._attn_implementation, adamw, threads, params, steps, skip, tps, 6 * active + attn, losses)
