#!/usr/bin/env python3
"""Golden reference: Relay's mixtures of experts against transformers' MixtralForCausalLM and Qwen3MoeForCausalLM.

The GPT reference's harness (test_gpt_reference.py) with two more families: Relay trains a small byte-level
Mixtral and Qwen3-MoE from its own initialisation; transformers' modules (eager attention, router jitter 0) load
Relay's step-0 tensors by Relay's per-expert names (the names `save_pretrained` writes for these families; the
modules of transformers 5 hold each layer's experts fused, gate_up_proj (E, 2F, C) and down_proj (E, C, F), so the
wrapper below keeps per-expert parameters and stacks them into the fused form at every forward: autograd gives each
expert's own gradient and AdamW, elementwise, updates it as the fused tensor's slice). Both train on the same
sequences in the same order with torch.optim.AdamW, clipping and Relay's schedule; the loss is the cross-entropy
plus, computed here from the router logits transformers returns (output_router_logits), the issue's terms:
  aux_{l,s} = E / (k T^2) sum_e c_e sum_t p_{t,e}   (p the fp32 softmax of layer l's router logits over the tokens
                                                    t of sequence s, c_e how many of them have e in their top k),
  loss += router_aux_loss_coef x mean over MoE layers and sequences of aux_{l,s}
        + router_z_loss_coef x mean over MoE layers and tokens of (logsumexp_e z_{t,e})^2.
Every step's loss and grad norm and every final parameter, exp_avg and exp_avg_sq must agree within the harness's
tolerance: MARGIN x what float32 alone moves each kind (torch fp32 against fp64).

Top-k routing is discontinuous: where a token's k-th and (k+1)-th probabilities agree to rounding, two correct
float32 runs may route it differently. The smallest such margin the torch run meets is reported; a failure with a
margin near float32 rounding (~1e-7) is that, not a bug.

Cases, serially: Mixtral (renormalised top-2 of 4 experts, z-loss on), Qwen3-MoE (head_dim 16 with n_embd 32 and
4 heads, q_norm / k_norm, layer 0 dense via mlp_only_layers, norm_topk_prob on), and Mixtral on dp 2 x ep 2 x pp 2
(each rank holds 2 of the 4 experts; the tokens travel to them and back in all-to-alls: the same run), and
Qwen3-MoE on tp 2 (heads, experts' SwiGLU units and the dense layer split over two ranks).

transformers and PyTorch 2.x come from PyPI into the cached venv of pypi_venv.py (torch2); exit 77 = skipped.
Usage: test_moe_reference.py <relay binary>
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
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
import test_gpt_reference as harness  # noqa: E402

MODEL = dict(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
MOE = dict(n_experts=4, experts_per_token=2, moe_ffn_hidden=24, router_aux_loss_coef=0.02, router_z_loss_coef=0.001)
QWEN = dict(head_dim=16, ffn_hidden=40, mlp_only_layers=[0], norm_topk_prob=True)
SMALLEST_MARGIN = [float("inf")]  # over the fp32 torch run of the current case


class MoeModule(torch.nn.Module):
    """transformers' MoE model as the harness trains it: idx (B, T) -> logits (B, T, V), parameters under Relay's
    names (per expert), extra_loss() the router terms of the last forward."""

    def __init__(self, hf, rename, expert_names, coefs):
        super().__init__()
        self.hf = hf
        self.coefs = coefs
        self.k = hf.config.num_experts_per_tok
        self.by_name = {rename(n): p for n, p in hf.named_parameters() if not n.endswith(("gate_up_proj", "down_proj"))
                        or ".experts." not in n}
        self.expert_params = torch.nn.ParameterList()
        self.fused = []  # (experts module, [(gate, up, down)] by expert)
        for name, mod in hf.named_modules():
            if not hasattr(mod, "gate_up_proj"):
                continue
            E, F2, C = mod.gate_up_proj.shape
            triples = []
            for e in range(E):
                t = tuple(torch.nn.Parameter(torch.empty(s)) for s in ((F2 // 2, C), (F2 // 2, C), (C, F2 // 2)))
                for n, p in zip(expert_names(name, e), t):
                    self.by_name[n] = p
                    self.expert_params.append(p)
                triples.append(t)
            del mod.gate_up_proj, mod.down_proj
            self.fused.append((mod, triples))

    def named_parameters(self, *args, **kwargs):  # noqa: D102
        return iter(self.by_name.items())

    def stack_experts(self):
        """The per-expert parameters stacked into the fused tensors transformers' experts module reads."""
        for mod, triples in self.fused:
            mod.gate_up_proj = torch.stack([torch.cat([g, u], 0) for g, u, _ in triples])
            mod.down_proj = torch.stack([d for _, _, d in triples])

    def forward(self, idx):  # noqa: D102
        self.stack_experts()
        out = self.hf(input_ids=idx, output_router_logits=True)
        B, T = idx.shape
        aux, z = [], []
        for logits in out.router_logits:  # (B T, E) per MoE layer
            E = logits.shape[-1]
            calc = logits.float() if logits.dtype != torch.float64 else logits
            p = torch.softmax(calc, -1).view(B, T, E)
            top = p.topk(self.k + 1 if self.k < E else self.k, -1).values.detach()
            if self.k < E:
                SMALLEST_MARGIN[0] = min(SMALLEST_MARGIN[0], float((top[..., self.k - 1] - top[..., self.k]).min()))
            c = F.one_hot(p.topk(self.k, -1).indices, E).sum(dim=(1, 2)).to(p.dtype)  # (B, E) constants
            aux.append(E / (self.k * T * T) * (c * p.sum(1)).sum(-1))                  # (B)
            z.append(torch.logsumexp(calc, -1) ** 2)                                    # (B T)
        self._extra = self.coefs[0] * torch.stack(aux).mean() + self.coefs[1] * torch.stack(z).mean()
        return out.logits

    def extra_loss(self):  # noqa: D102
        return self._extra


def hf_common(opts):
    return dict(vocab_size=MODEL["vocab_size"], hidden_size=MODEL["n_embd"], num_hidden_layers=MODEL["n_layer"],
                num_attention_heads=MODEL["n_head"], num_key_value_heads=MODEL["n_kv_head"],
                max_position_embeddings=MODEL["block_size"], rms_norm_eps=1e-5,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False,
                num_experts_per_tok=MOE["experts_per_token"], router_aux_loss_coef=MOE["router_aux_loss_coef"],
                attention_bias=False, hidden_act="silu", attn_implementation="eager", experts_implementation="eager")


class MixtralFamily:
    name = "transformers MixtralForCausalLM"

    @staticmethod
    def relay_model(opts):
        return dict(type="mixtral", **MODEL, **MOE, init_std=0.02, seed=9)

    @staticmethod
    def config(opts):
        c = MixtralConfig(**hf_common(opts), intermediate_size=MOE["moe_ffn_hidden"],
                          num_local_experts=MOE["n_experts"], router_jitter_noise=0.0, sliding_window=None)
        c.block_size = MODEL["block_size"]
        return c

    @staticmethod
    def module(cfg):
        def rename(n):  # transformers 5's module names -> the per-expert checkpoint names (save_pretrained's)
            return n.replace(".mlp.gate.", ".block_sparse_moe.gate.")

        def experts(mod_name, e):  # model.layers.N.mlp.experts -> w1 (gate), w3 (up), w2 (down)
            p = mod_name.replace(".mlp.experts", ".block_sparse_moe.experts") + f".{e}."
            return [p + "w1.weight", p + "w3.weight", p + "w2.weight"]
        return MoeModule(MixtralForCausalLM(cfg), rename, experts,
                         (MOE["router_aux_loss_coef"], MOE["router_z_loss_coef"]))


class Qwen3MoeFamily:
    name = "transformers Qwen3MoeForCausalLM"

    @staticmethod
    def relay_model(opts):
        return dict(type="qwen3_moe", **MODEL, **MOE, **QWEN, init_std=0.02, seed=9)

    @staticmethod
    def config(opts):
        c = Qwen3MoeConfig(**hf_common(opts), intermediate_size=QWEN["ffn_hidden"],
                           moe_intermediate_size=MOE["moe_ffn_hidden"], num_experts=MOE["n_experts"],
                           norm_topk_prob=QWEN["norm_topk_prob"], mlp_only_layers=QWEN["mlp_only_layers"],
                           decoder_sparse_step=1, head_dim=QWEN["head_dim"])
        c.block_size = MODEL["block_size"]
        return c

    @staticmethod
    def module(cfg):
        def experts(mod_name, e):
            p = f"{mod_name}.{e}."
            return [p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"]
        return MoeModule(Qwen3MoeForCausalLM(cfg), lambda n: n, experts,
                         (MOE["router_aux_loss_coef"], MOE["router_z_loss_coef"]))


def compare(relay, tmp, family, name, ranks, layout):
    """The harness's training comparison (compare_case without generation), with the top-k margin reported."""
    harness.FAMILY = family
    SMALLEST_MARGIN[0] = float("inf")
    d = os.path.join(tmp, name)
    os.makedirs(d)
    cfg = family.config({})
    data = f"{d}/tokens.h5"
    tokens = harness.write_tokens(data, np.uint16)
    open(f"{d}/c.toml", "w").write(harness.relay_config(d, data, {}, layout))
    harness.run_relay(relay, ["train", "--config", f"{d}/c.toml"], ranks, "relay train")
    ckdir = f"{d}/run/checkpoints"
    start = harness.read_checkpoint(f"{ckdir}/step_00000000.h5")
    final = harness.read_checkpoint(f"{ckdir}/step_{harness.RUN['steps']:08d}.h5")
    got = dict(harness.read_metrics(f"{d}/run/metrics.jsonl"), **final)
    ref = harness.ref
    fp32 = ref.train(cfg, start["model"], tokens, harness.RUN, torch.float32, make_model=lambda: family.module(cfg))
    margin = SMALLEST_MARGIN[0]
    fp64 = ref.train(cfg, start["model"], tokens, harness.RUN, torch.float64, make_model=lambda: family.module(cfg))
    tol = harness.tolerances(harness.differences(fp32, fp64))
    diffs = harness.differences(got, fp32)
    for k in harness.KINDS:
        w = harness.worst(diffs, k)
        print(f"{name}: {k:<10} tolerance {tol[k]:9.2e}  relay vs torch fp32 {w[1]:9.2e}  at {w[0]}")
    print(f"{name}: losses relay {' '.join(f'{x:.6f}' for x in got['losses'])}")
    print(f"{name}: losses torch {' '.join(f'{x:.6f}' for x in fp32['losses'])}")
    print(f"{name}: smallest top-k margin (k-th minus (k+1)-th router probability) in the torch run: {margin:.2e}")
    bad = [(lab, e, tol[k]) for k, lab, e in diffs if not e <= tol[k]]
    if bad:
        lines = "\n".join(f"  {lab}: {e:.3e} > {t:.2e}" for lab, e, t in bad[:12])
        raise AssertionError(f"{len(bad)} of {len(diffs)} figures differ from torch float32 by more than their "
                             f"tolerance (smallest top-k margin {margin:.2e}):\n{lines}")
    print(f"{name}: {harness.RUN['steps']} losses and grad norms, {len(fp32['model'])} parameters with exp_avg and "
          f"exp_avg_sq agree with {family.name}")


CASES = [  # name, family, ranks, layout
    ("mixtral_serial", MixtralFamily, 1, dict(dp=1, pp=1, m=1)),
    ("qwen3_moe_serial_m2", Qwen3MoeFamily, 1, dict(dp=1, pp=1, m=2)),
    ("mixtral_dp2_ep2_pp2", MixtralFamily, 4, dict(dp=2, ep=2, pp=2, m=2)),
    ("qwen3_moe_tp2", Qwen3MoeFamily, 2, dict(dp=1, pp=1, tp=2, m=1)),
]

if __name__ == "__main__":
    import subprocess
    import tempfile
    torch.manual_seed(0)
    torch.set_num_threads(1)
    harness.MARGIN = 10.0
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, family, ranks, layout in CASES:
            try:
                compare(sys.argv[1], tmp, family, name, ranks, layout)
                print(f"PASSED {name}")
            except (AssertionError, subprocess.TimeoutExpired, OSError) as e:
                failures.append(name)
                print(f"FAILED {name}: {e}")
    print(f"{len(CASES) - len(failures)} passed, {len(failures)} failed" + (": " + ", ".join(failures) if failures else ""))
    sys.exit(1 if failures else 0)
