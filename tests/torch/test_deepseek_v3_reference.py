#!/usr/bin/env python3
"""Golden reference: Relay's DeepSeek-V3 (multi-head latent attention, dense and routed-expert layers) against
transformers' DeepseekV3ForCausalLM (PyTorch 2.x from PyPI).

The GPT reference's harness (test_gpt_reference.py) with another family, as test_llama_reference.py: Relay trains a
small byte-level DeepSeek-V3 whose every layer is dense (first_k_dense_replace = n_layer) from its own initialisation;
transformers' DeepseekV3ForCausalLM (eager attention) loads Relay's step-0 tensors by their state_dict names (strictly:
none missing, none unexpected) and trains on the same sequences in the same order with torch.optim.AdamW, clipping and
Relay's schedule. MLA's shapes: 4 heads of 8 + 4 query/key columns (the last 4 rotary) and 6 value columns, a
kv_lora_rank of 16, and q_lora_rank 24 (q_a_proj -> q_a_layernorm -> q_b_proj) or unset (one q_proj); rotary pairs
interleaved (transformers' default rope_interleave) or rotate-half. Every step's loss and grad norm and every final
parameter, exp_avg and exp_avg_sq must agree within the harness's tolerance: MARGIN x what float32 alone moves each
kind (torch fp32 against fp64). Cases: q_lora set and unset serially, on tp 2 (heads split through q_b_proj and
kv_b_proj, the a-projections replicated), dp 2, and a document mask (block-diagonal 4-D mask, restarting positions);
q_proj on tp 2 with sequence parallelism (the input norm gathered, o_proj and down_proj reduce-scattered).
YaRN (rope_scaling = "yarn", transformers' rope_parameters rope_type "yarn"): 16 positions over an
original_max_position_embeddings of 8, factor 4, rope_theta 100 and beta_fast 1, beta_slow 0.01 so that the 2 rotary
frequencies sit at both ends of YaRN's ramp (0 and 1/3 of it: one plain, one blended), mscale 1 and mscale_all_dim 0.8
(cos and sin x 1.025, the softmax scale x 1.234 = yarn_get_mscale(4, 0.8)^2), serially with one q_proj and
rotate-half pairs (the model with q_lora_rank 24 and interleaved pairs matched every loss and grad norm too, but its
embedding moved 2.1e-4 from torch's against a calibration that came out at 1.7e-5 that time: Adam's amplified rounding
in rarely seen rows; a YaRN parameter off in Relay alone, beta_slow 0.02 or mscale_all_dim 0.7, moves every tensor by
1e-3 to 1e-1).
Generation (MLA's compressed cache, the absorbed form) is checked in test_deepseek_v3_hf_interop.py (greedy tokens =
transformers' generate) and tests/test_layers.cpp (MlaDecode: decode's logits = the forward's), not here: the
harness's per-case check would add a generate and two torch models to each of these cases.

MoE cases: layer 0 dense, layer 1 DeepSeek-V3's mixture of experts (8 experts in 4 groups, the 2 best groups kept,
top 2, one shared expert, routed_scaling_factor 2.5, norm_topk_prob), serially and on dp 2 x ep 2 (each rank holds 4
experts), dp 2 x ep 2 x pp 2 and tp 2 x dp 2 x ep 2 (each expert's units split over tp). Both sides start from one file of weights written here (Relay reads it through
model.init_from) holding a non-zero e_score_correction_bias, which Relay reads into moe.expert_bias (bias_update_rate
0: the bias stays what transformers holds). transformers 5 holds the experts fused (experts.gate_up_proj,
experts.down_proj): test_moe_reference.py's MoeModule trains them as Relay's per-expert tensors. Top-k routing is
discontinuous: the smallest margin of the torch fp32 run's group choice and expert choice (the topk_group-th minus the
next group score, the k-th minus the next choice score) is printed and must exceed 1e-5, so that two correct float32
runs cannot route a token differently (the data and seeds were picked so; never a looser tolerance). One case adds
Relay's per-sequence aux loss (router_aux_loss_coef 0.05), written here from the DeepSeek-V3 report's equations 17-20
on transformers' router logits (its top-k of the unbiased scores is in the margin too).

Multi-token prediction (model.num_mtp_layers = D; DeepSeek-V3 report section 2.2): transformers has no MTP forward, so
the reference is written here from the report's equations on transformers' own modules: module k is a
DeepseekV3DecoderLayer appended to model.layers at index n_layer + k - 1 (so its parameters carry the official
checkpoints' names) with enorm, hnorm (DeepseekV3RMSNorm), eh_proj (Linear 2C -> C on [enorm(Emb(t_{i+k}));
hnorm(h^{k-1})]) and shared_head.norm, the model's embedding and lm_head shared; h^0 is the input of model.norm; CE_k
is the mean over the T - k positions of each sequence that have a target t_{i+k+1}; the loss adds mtp_loss_weight /
D x sum_k CE_k. Relay logs the main loss as `loss` and the mean CE_k as `mtp_loss`: the test compares loss +
mtp_loss_weight x mtp_loss with torch's total (the harness's figures), and mtp_loss on its own (calibrated the same
way). Cases: D = 2 on dense layers serially and on dp 2 x pp 2 with zb-h1 and ZeRO-3 (the modules on stage 1, their
backward's input and weight halves apart, the embedding's gradient summed with stage 0's as a tied weight's); D = 1 after a routed layer
(its own routed layer) on tp 2 with recomputation, on dp 2 x ep 2 (the module's routed experts split over ep as the
main layer's) and on tp 2 with sequence parallelism (the block gathers h^0) (initial weights drawn with seed 12, whose
routing margins clear 1e-5); D = 2 with a document mask serially, the reference written from Megatron-LM's
multi_token_prediction.py on packed sequences (forward_mtp_documents: at each depth the ids and labels rolled one more
position left within their document, vacated slots id 0 and ignored; the modules on all T positions under the main
layers' block-diagonal mask and restarting positions; CE_k the mean over the labels left).

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
import torch.nn.functional as F  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
import test_gpt_reference as harness  # noqa: E402
from test_moe_reference import MoeModule  # noqa: E402

MODEL = dict(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_embd=32, ffn_hidden=48, kv_lora_rank=16,
             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, rope_theta=10000.0, norm_eps=1e-6)
# The dense cases' MoE keys (read and checked; no layer routes: first_k_dense_replace = n_layer), and the MoE cases'.
DENSE_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, n_group=2,
                 topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=MODEL["n_layer"])
ROUTED = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, n_group=4,
              topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1)
SMALLEST_MARGIN = [float("inf")]  # of the current torch run's routing
MTP_WEIGHT = 0.3  # mtp_loss_weight of the MTP cases (DeepSeek-V3's first 10T tokens)


# YaRN's case: config.json's rope_parameters (transformers 5), Relay's rope_-prefixed keys.
YARN = dict(factor=4.0, original_max_position_embeddings=8, beta_fast=1.0, beta_slow=0.01, mscale=1.0,
            mscale_all_dim=0.8)
YARN_THETA = 100.0


def moe_keys(opts):
    return ROUTED if opts.get("moe") else DENSE_MOE


def bias_names(moe):
    return [f"model.layers.{i}.mlp.gate.e_score_correction_bias"
            for i in range(moe["first_k_dense_replace"], MODEL["n_layer"])]


def initial_bias(moe):
    """Each MoE layer's e_score_correction_bias (E): non-zero, fixed, so that it changes choices."""
    rng = np.random.default_rng(5)
    return {n: rng.uniform(-0.02, 0.02, moe["n_routed_experts"]).astype(np.float32) for n in bias_names(moe)}


def routing_margin(router, inputs, _):
    """Forward hook on a DeepseekV3TopkRouter: the smallest margin of its group and expert choices."""
    with torch.no_grad():
        x = inputs[0].reshape(-1, router.hidden_dim)
        choice = torch.sigmoid(x @ router.weight.t().to(x.dtype)) + router.e_score_correction_bias.to(x.dtype)
        G, E, k, kg = router.num_group, router.num_experts, router.top_k, router.topk_group
        groups = choice.view(-1, G, E // G).topk(2, -1).values.sum(-1).sort(-1, descending=True).values  # (n, G)
        if kg < G:
            SMALLEST_MARGIN[0] = min(SMALLEST_MARGIN[0], float((groups[:, kg - 1] - groups[:, kg]).min()))
        kept = choice.view(-1, G, E // G).topk(2, -1).values.sum(-1) >= groups[:, kg - 1:kg]  # (n, G)
        masked = choice.masked_fill(~kept.repeat_interleave(E // G, -1), float("-inf"))
        best = masked.topk(k + 1, -1).values
        SMALLEST_MARGIN[0] = min(SMALLEST_MARGIN[0], float((best[:, k - 1] - best[:, k]).min()))


class DeepseekV3(MoeModule):
    """transformers' module as the harness calls a model: idx (B, T) -> logits (B, T, V), the routed experts as
    Relay's per-expert parameters; with a document mask as a custom 4-D additive attention mask and position_ids
    (test_llama_reference.py's Llama)."""

    def __init__(self, cfg):
        def experts(mod_name, e):  # model.layers.N.mlp.experts -> the per-expert names save_pretrained writes
            return [f"{mod_name}.{e}.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
        hf = DeepseekV3ForCausalLM(cfg)
        self_mtp = add_mtp_modules(hf, cfg)
        super().__init__(hf, lambda n: n, experts, (0.0, 0.0))
        self.mtp = self_mtp
        self.mtp_weight = getattr(cfg, "relay_mtp_weight", 0.0)
        self._mtp_extra, self._targets = 0.0, None
        for layer in self.mtp:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(routing_margin)
        self.aux_coef = getattr(cfg, "relay_aux", 0.0)
        self._aux = []  # (B) per MoE layer of the last forward
        for name, bias in getattr(cfg, "relay_bias", {}).items():
            layer = self.hf.model.layers[int(name.split(".")[2])]
            layer.mlp.gate.e_score_correction_bias.copy_(torch.from_numpy(bias))
            layer.mlp.gate.register_forward_hook(routing_margin)
            if self.aux_coef > 0:
                layer.mlp.gate.register_forward_hook(self.sequence_aux)

    def sequence_aux(self, router, inputs, output):
        """Relay's per-sequence aux loss with sigmoid scores, from the DeepSeek-V3 report's equations 17-20: per
        sequence of T tokens, E / (k T) sum_e c_e mean_t s'[t, e], s' each token's sigmoid scores normalised to sum 1,
        c_e (a constant) its tokens whose k best unbiased scores over all experts hold e."""
        B, T = inputs[0].shape[:2]
        E, k = router.num_experts, router.top_k
        p = output[0].sigmoid()                                                   # (B T, E)
        top = p.detach().topk(k + 1, -1)
        SMALLEST_MARGIN[0] = min(SMALLEST_MARGIN[0], float((top.values[:, k - 1] - top.values[:, k]).min()))
        q = (p / (p.sum(-1, keepdim=True) + 1e-20)).view(B, T, E)
        counts = torch.zeros_like(p).scatter_(1, top.indices[:, :k], 1.0).view(B, T, E).sum(1)  # (B, E)
        self._aux.append(E / (k * T) * (counts * q.mean(1)).sum(-1))            # (B)

    def extra_loss(self):  # noqa: D102
        """router_aux_loss_coef x the mean over the main MoE layers and sequences (Relay's weighting), plus the MTP
        modules' mtp_loss_weight / D x sum_k CE_k."""
        aux = self.aux_coef * torch.stack(self._aux).mean() if self._aux else 0.0
        return aux + self._mtp_extra

    def set_targets(self, y):  # noqa: D102
        self._targets = y

    def forward(self, idx, mask=None, positions=None):  # noqa: D102
        self._aux = []
        self.stack_experts()
        if self.mtp:
            return self.forward_mtp(idx, mask, positions)
        if mask is None:
            return self.hf(input_ids=idx).logits
        dtype = self.hf.dtype
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        return self.hf(input_ids=idx, attention_mask=additive, position_ids=positions).logits


def add_mtp_modules(hf, cfg):
    """cfg.relay_mtp modules appended to hf.model.layers (past num_hidden_layers, so the model's own forward never
    runs them) under the official names: each a DeepseekV3DecoderLayer of the last layer's kind with enorm, hnorm,
    eh_proj and shared_head.norm."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
    D, L, C = getattr(cfg, "relay_mtp", 0), cfg.num_hidden_layers, cfg.hidden_size
    layers = []
    first_dense = cfg.first_k_dense_replace
    cfg.first_k_dense_replace = L + D if L <= first_dense else 0  # the last layer's kind, whatever the index
    for k in range(1, D + 1):
        layer = DeepseekV3DecoderLayer(cfg, L + k - 1)
        layer.enorm = DeepseekV3RMSNorm(C, eps=cfg.rms_norm_eps)
        layer.hnorm = DeepseekV3RMSNorm(C, eps=cfg.rms_norm_eps)
        layer.eh_proj = torch.nn.Linear(2 * C, C, bias=False)
        layer.shared_head = torch.nn.Module()
        layer.shared_head.norm = DeepseekV3RMSNorm(C, eps=cfg.rms_norm_eps)
        hf.model.layers.append(layer)
        layers.append(layer)
    cfg.first_k_dense_replace = first_dense
    return layers


MTP_LOG = {}  # dtype -> [each step's mean CE_k] of the case's torch runs


def roll_in_documents(t, same, fill):
    """Megatron-LM's roll_tensor on packed documents, written plainly: t (B, T) one position left within each
    document, the vacated last slot of each document (and of the sequence) set to fill. same (B, T - 1) bool: position
    i + 1 is in position i's document."""
    out = torch.full_like(t, fill)
    out[:, :-1] = torch.where(same, t[:, 1:], torch.full_like(t[:, 1:], fill))
    return out


def forward_mtp_documents(self, idx, mask, positions, h):
    """The MTP modules under a document mask, as Megatron-LM's multi_token_prediction.py runs them on packed
    sequences: at each depth the input ids and the labels (the main loss's, ignore_index at the end-of-text inputs)
    are rolled one more position left within their document (vacated slots: id 0, label ignored); every module runs
    on all T positions with the main layers' block-diagonal mask and restarting positions; CE_k is the mean over the
    labels left."""
    dtype = self.hf.dtype
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    same = torch.diagonal(mask[:, 0], offset=-1, dim1=1, dim2=2)  # (B, T - 1) mask[b, 0, i + 1, i]
    ids, labels, ces = idx, self._targets, []
    embed, head = self.hf.model.embed_tokens, self.hf.lm_head
    for layer in self.mtp:
        ids, labels = roll_in_documents(ids, same, 0), roll_in_documents(labels, same, -100)
        x = layer.eh_proj(torch.cat([layer.enorm(embed(ids)), layer.hnorm(h)], -1))      # (B, T, C)
        x = layer(x, attention_mask=additive, position_ids=positions,
                  position_embeddings=self.hf.model.rotary_emb(x, positions))
        out = head(layer.shared_head.norm(x))                                             # (B, T, V)
        ces.append(F.cross_entropy(out.float().reshape(-1, out.shape[-1]), labels.reshape(-1), ignore_index=-100))
        h = x
    return ces


def forward_mtp(self, idx, mask=None, positions=None):
    """The main model's logits, and the MTP modules' mtp_loss_weight / D x sum_k CE_k into _mtp_extra (report section
    2.2): module k on positions i < T - k, input token t_{i+k}, target t_{i+k+1}; with a document mask
    forward_mtp_documents' modules."""
    captured = []
    hook = self.hf.model.norm.register_forward_hook(lambda m, inputs, out: captured.append(inputs[0]))
    if mask is None:
        logits = self.hf(input_ids=idx).logits
    else:
        dtype = self.hf.dtype
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        logits = self.hf(input_ids=idx, attention_mask=additive, position_ids=positions).logits
    hook.remove()
    if mask is not None:
        ces = forward_mtp_documents(self, idx, mask, positions, captured[0])
        self._mtp_extra = self.mtp_weight / len(self.mtp) * torch.stack(ces).sum()
        MTP_LOG.setdefault(self.hf.dtype, []).append(float(torch.stack(ces).detach().mean()))
        return logits
    B, T = idx.shape
    full = torch.cat([idx, self._targets[:, -1:]], 1)  # (B, T + 1) every token t_0 .. t_T
    h, ces = captured[0], []                            # h^0 (B, T, C) before the final norm
    embed, head = self.hf.model.embed_tokens, self.hf.lm_head
    for k, layer in enumerate(self.mtp, start=1):
        n = T - k
        e = embed(full[:, k:k + n])                                                       # (B, n, C) t_{i+k}
        x = layer.eh_proj(torch.cat([layer.enorm(e), layer.hnorm(h[:, :n])], -1))        # (B, n, C)
        pos = torch.arange(n).unsqueeze(0)
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(B, 1, n, n)
        additive = torch.zeros(causal.shape, dtype=x.dtype).masked_fill(~causal, torch.finfo(x.dtype).min)
        x = layer(x, attention_mask=additive, position_ids=pos,
                  position_embeddings=self.hf.model.rotary_emb(x, pos))
        out = head(layer.shared_head.norm(x))                                             # (B, n, V)
        ces.append(F.cross_entropy(out.float().reshape(-1, out.shape[-1]), full[:, k + 1:k + 1 + n].reshape(-1)))
        h = x
    self._mtp_extra = self.mtp_weight / len(self.mtp) * torch.stack(ces).sum()
    MTP_LOG.setdefault(self.hf.dtype, []).append(float(torch.stack(ces).detach().mean()))
    return logits


DeepseekV3.forward_mtp = forward_mtp


def write_initial_weights(d, opts):
    """The MoE cases' step-0 weights in Relay's names, e_score_correction_bias included (model.init_from)."""
    from safetensors.numpy import save_file
    cfg = DeepseekV3Family.config(opts)
    rng = np.random.default_rng(opts.get("init_seed", 11))
    tensors = {}
    for name, p in DeepseekV3(cfg).named_parameters():
        norm = name.endswith("norm.weight")
        tensors[name] = np.ones(p.shape, np.float32) if norm else rng.normal(0, 0.02, p.shape).astype(np.float32)
    tensors.update(initial_bias(moe_keys(opts)))
    path = os.path.join(d, "init.safetensors")
    save_file(tensors, path)
    return path


BASE_RELAY_CONFIG, BASE_COMPARE_CASE = harness.relay_config, harness.compare_case


def relay_config(d, data, opts, layout):
    """The harness's config; the MoE cases start from write_initial_weights' file with the bias held fixed."""
    text = BASE_RELAY_CONFIG(d, data, opts, layout)
    if layout.get("schedule"):  # the MTP cases' other schedule and recomputation
        text = text.replace('schedule = "1f1b"', f'schedule = "{layout["schedule"]}"')
    if layout.get("recompute"):
        text = text.replace("[train]\n", '[train]\nrecompute = "blocks"\n', 1)
    if layout.get("zero"):
        text = text.replace("[optimizer]\n", f'[optimizer]\nzero = {layout["zero"]}\n', 1)
    if layout.get("sp"):
        text = text.replace("[parallel]\n", "[parallel]\nsequence_parallel = true\n", 1)
    assert f'schedule = "{layout.get("schedule", "1f1b")}"' in text and ("recompute" in text) == bool(layout.get("recompute"))
    if not opts.get("moe"):
        return text
    path = write_initial_weights(d, opts)
    return (text.replace("[model]\n", f"[model]\ninit_from = \"{path}\"\n", 1)
            + "[moe]\nexpert_bias = true\nbias_update_rate = 0.0\n")


class DeepseekV3Family:
    name = "transformers DeepseekV3ForCausalLM"
    generates = False  # generation is checked elsewhere (see the docstring): not once per case here

    @staticmethod
    def relay_model(opts):
        q = dict(q_lora_rank=opts["q_lora_rank"]) if opts["q_lora_rank"] else {}
        aux = dict(router_aux_loss_coef=opts["aux"]) if opts.get("aux") else {}
        mtp = dict(num_mtp_layers=opts["mtp"], mtp_loss_weight=MTP_WEIGHT) if opts.get("mtp") else {}
        model = dict(type="deepseek_v3", **MODEL, **moe_keys(opts), **q, **aux, **mtp, rope_interleave=opts["interleave"],
                     tie_embeddings=False, init_std=0.02, seed=9)
        if opts.get("yarn"):
            model.update(rope_theta=YARN_THETA, rope_scaling="yarn", **{f"rope_{k}": v for k, v in YARN.items()})
        return model

    @staticmethod
    def config(opts):
        rope = dict(rope_type="default", rope_theta=MODEL["rope_theta"])
        if opts.get("yarn"):
            rope = dict(rope_type="yarn", rope_theta=YARN_THETA, **YARN)
        c = DeepseekV3Config(
            vocab_size=MODEL["vocab_size"], hidden_size=MODEL["n_embd"], intermediate_size=MODEL["ffn_hidden"],
            num_hidden_layers=MODEL["n_layer"], num_attention_heads=MODEL["n_head"],
            num_key_value_heads=MODEL["n_head"], q_lora_rank=opts["q_lora_rank"] or None,
            kv_lora_rank=MODEL["kv_lora_rank"], qk_nope_head_dim=MODEL["qk_nope_head_dim"],
            qk_rope_head_dim=MODEL["qk_rope_head_dim"], v_head_dim=MODEL["v_head_dim"],
            rope_interleave=opts["interleave"], max_position_embeddings=MODEL["block_size"],
            rms_norm_eps=MODEL["norm_eps"], rope_parameters=rope,
            tie_word_embeddings=False, attention_bias=False, hidden_act="silu", num_mtp_layers=0,
            attn_implementation="eager", experts_implementation="eager", **moe_keys(opts))
        c.block_size = MODEL["block_size"]
        c.relay_mtp, c.relay_mtp_weight = opts.get("mtp", 0), MTP_WEIGHT
        if opts.get("moe"):
            c.relay_bias = initial_bias(moe_keys(opts))
            c.relay_aux = opts.get("aux", 0.0)
        return c

    @staticmethod
    def module(cfg):
        return DeepseekV3(cfg)


LORA = dict(q_lora_rank=24, interleave=True)
NO_LORA = dict(q_lora_rank=0, interleave=False)
MOE_CASE = dict(LORA, moe=True)
CASES = [  # name, ranks, model options, token dtype, layout
    ("deepseek_v3_q_lora_serial", 1, LORA, np.uint16, dict(dp=1, pp=1, m=1)),
    ("deepseek_v3_q_proj_serial_m2", 1, NO_LORA, np.uint16, dict(dp=1, pp=1, m=2)),
    ("deepseek_v3_q_lora_tp2", 2, LORA, np.uint16, dict(dp=1, tp=2, pp=1, m=1)),
    ("deepseek_v3_q_proj_tp2", 2, dict(NO_LORA, interleave=True), np.uint16, dict(dp=1, tp=2, pp=1, m=1)),
    ("deepseek_v3_q_proj_tp2_sp", 2, NO_LORA, np.uint16, dict(dp=1, tp=2, pp=1, m=2, sp=True)),
    ("deepseek_v3_q_lora_dp2", 2, LORA, np.int32, dict(dp=2, pp=1, m=1)),
    ("deepseek_v3_docmask_serial", 1, LORA, np.uint16, dict(dp=1, pp=1, m=1, docs=True)),
    ("deepseek_v3_yarn_serial", 1, dict(NO_LORA, yarn=True), np.uint16, dict(dp=1, pp=1, m=1)),
    ("deepseek_v3_moe_serial", 1, MOE_CASE, np.uint16, dict(dp=1, pp=1, m=1)),
    ("deepseek_v3_moe_dp2_ep2", 2, MOE_CASE, np.uint16, dict(dp=2, ep=2, pp=1, m=1)),
    ("deepseek_v3_moe_dp2_ep2_pp2", 4, MOE_CASE, np.uint16, dict(dp=2, ep=2, pp=2, m=2)),
    ("deepseek_v3_moe_tp2_dp2_ep2", 4, MOE_CASE, np.uint16, dict(dp=2, tp=2, ep=2, pp=1, m=1)),
    ("deepseek_v3_moe_aux_dp2_ep2", 2, dict(MOE_CASE, aux=0.05), np.uint16, dict(dp=2, ep=2, pp=1, m=1)),
    ("deepseek_v3_mtp2_serial", 1, dict(LORA, mtp=2), np.uint16, dict(dp=1, pp=1, m=1)),
    ("deepseek_v3_mtp2_dp2_pp2_zb_zero3", 4, dict(LORA, mtp=2), np.uint16,
     dict(dp=2, pp=2, m=2, schedule="zb-h1", zero=3)),
    ("deepseek_v3_mtp1_moe_tp2_recompute", 2, dict(MOE_CASE, mtp=1, init_seed=12), np.uint16,
     dict(dp=1, tp=2, pp=1, m=1, recompute=True)),
    ("deepseek_v3_mtp1_moe_dp2_ep2", 2, dict(MOE_CASE, mtp=1, init_seed=12), np.uint16, dict(dp=2, ep=2, pp=1, m=1)),
    ("deepseek_v3_mtp1_moe_tp2_sp", 2, dict(MOE_CASE, mtp=1, init_seed=12), np.uint16, dict(dp=1, tp=2, pp=1, m=1, sp=True)),
    ("deepseek_v3_mtp2_docmask_serial", 1, dict(LORA, mtp=2), np.uint16, dict(dp=1, pp=1, m=1, docs=True)),
]
RELAY_MTP = []  # the case's Relay run: each step's mtp_loss


def read_metrics_mtp(path):
    """The harness's figures with the MTP term added to each loss (Relay logs it apart as mtp_loss); the mtp_loss
    figures into RELAY_MTP."""
    import json
    got = BASE_READ_METRICS(path)
    recs = {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r}
    RELAY_MTP[:] = [recs[s]["mtp_loss"] for s in range(1, len(got["losses"]) + 1) if "mtp_loss" in recs[s]]
    if RELAY_MTP:
        got["losses"] = [l + MTP_WEIGHT * m for l, m in zip(got["losses"], RELAY_MTP)]
    return got


BASE_READ_METRICS = harness.read_metrics


def run_case(relay, tmp, name, ranks, opts, dtype, layout):
    """The harness's comparison; a MoE case also needs its torch run's routing clear of near-ties."""
    SMALLEST_MARGIN[0] = float("inf")
    MTP_LOG.clear()
    RELAY_MTP.clear()
    BASE_COMPARE_CASE(relay, tmp, name, ranks, opts, dtype, layout)
    if opts.get("mtp"):  # mtp_loss on its own, within the harness's rule: MARGIN x torch fp32 vs fp64, at least FLOOR
        want, f64 = MTP_LOG[torch.float32], MTP_LOG[torch.float64]
        if len(RELAY_MTP) != len(want):
            raise AssertionError(f"{name}: relay logged {len(RELAY_MTP)} mtp_loss figures, torch ran {len(want)} steps")
        rel = lambda a, b: abs(a - b) / max(abs(b), 1e-30)  # noqa: E731
        tol = max(harness.MARGIN * max(map(rel, want, f64)), harness.FLOOR)
        err = max(map(rel, RELAY_MTP, want))
        print(f"{name}: mtp_loss relay {' '.join(f'{x:.6f}' for x in RELAY_MTP)}")
        print(f"{name}: mtp_loss torch {' '.join(f'{x:.6f}' for x in want)} (relay vs fp32 {err:.2e}, tolerance {tol:.2e})")
        if not err <= tol:
            raise AssertionError(f"{name}: mtp_loss differs from torch float32 by {err:.2e} > {tol:.2e}")
    if opts.get("moe"):
        print(f"{name}: smallest routing margin in the torch runs: {SMALLEST_MARGIN[0]:.2e}")
        if not SMALLEST_MARGIN[0] > 1e-5:
            raise AssertionError(f"routing margin {SMALLEST_MARGIN[0]:.2e} <= 1e-5: pick other seeds, not a tolerance")

if __name__ == "__main__":
    torch.manual_seed(0)
    harness.FAMILY = DeepseekV3Family
    harness.relay_config = relay_config
    selected = [c for c in CASES if not os.environ.get("RELAY_CASES") or c[0] in os.environ["RELAY_CASES"].split(",")]
    harness.compare_case = run_case
    harness.read_metrics = read_metrics_mtp
    sys.exit(1 if harness.run_cases(sys.argv[1], selected) else 0)
