#!/usr/bin/env python3
"""Golden reference: Relay's MoE layer with DeepSeek-V3's routing (model/moe.hpp, MoeSpec::score = sigmoid) against
transformers' DeepseekV3MoE, the module itself, in fp32.

Relay's side is tests/torch/moe_layer.cpp (MoeMlp forward, backward_input and backward_weight on the CPU backend on
weights and inputs from a file); ctest passes its path in RELAY_MOE_LAYER. DeepseekV3MoE is built from a
DeepseekV3Config and loads the same weights: the router gate.weight and its e_score_correction_bias (non-zero: the
choice only), the shared experts' gate_proj / up_proj / down_proj, and the experts fused as transformers 5 holds them
(experts.gate_up_proj (E, 2F, C): gate rows then up rows; experts.down_proj (E, C, F)). Both run y = moe(x) and the
backward of sum(y * dy); the output, the input's gradient and every weight's gradient must agree within 1e-5 of the
tensor's largest magnitude (fp32 against fp32, sums in different orders).

Cases: n_group 4 / topk_group 2 (groups of two) with norm_topk_prob, n_group 2 / topk_group 1 without it, both with
routed_scaling_factor 2.5 and one or two shared experts; then the first with Relay's per-sequence load-balancing
loss, written here from the DeepSeek-V3 report's equations 17-20 (the complementary sequence-wise loss: each token's
sigmoid scores normalised to sum 1, averaged over the sequence, times E / (k T) times the count of its tokens whose k
best unbiased scores hold each expert), whose value and gradients must agree too.

Top-k routing is discontinuous: the inputs are drawn again (a new seed) until every token's group choice and expert
choice clear a margin of 1e-3, so two correct float32 computations cannot route a token differently.

transformers and PyTorch 2.x come from PyPI into the cached venv of pypi_venv.py (torch2); exit 77 = skipped.
Usage: test_deepseek_moe_reference.py <relay binary>
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RELAY = os.path.abspath(sys.argv[1])

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    sys.path.insert(0, HERE)
    from pypi_venv import hf_python, rerun_in_venv

    rerun_in_venv(hf_python, __file__, RELAY)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402

LAYER = os.environ.get("RELAY_MOE_LAYER", os.path.join(os.path.dirname(RELAY), "tests", "moe_layer"))
B, T, C, E, F = 2, 8, 16, 8, 12
TOL = 1e-5
MARGIN = 1e-3

CASES = [
    dict(name="groups4_top2_norm_shared1", k=3, n_group=4, topk_group=2, norm=True, n_shared=1, aux=0.0),
    dict(name="groups2_top1_nonorm_shared2", k=2, n_group=2, topk_group=1, norm=False, n_shared=2, aux=0.0),
    dict(name="groups4_top2_norm_shared1_seq_aux", k=3, n_group=4, topk_group=2, norm=True, n_shared=1, aux=0.1),
]


def margins(x, router, bias, case):
    """The smallest gap, over the tokens, between the last kept and the first dropped group score, and between the
    k-th and (k+1)-th choice score of the kept groups' experts (float64)."""
    s = torch.sigmoid(x.double() @ router.double().T) + bias.double()  # (n, E)
    g = s.view(-1, case["n_group"], E // case["n_group"]).topk(2, dim=-1)[0].sum(-1)  # (n, n_group)
    gs = g.sort(dim=-1, descending=True)[0]
    smallest = (gs[:, case["topk_group"] - 1] - gs[:, case["topk_group"]]).min().item()
    keep = torch.zeros_like(g).scatter_(1, g.topk(case["topk_group"], dim=-1)[1], 1).bool()
    keep = keep.unsqueeze(-1).expand(-1, -1, E // case["n_group"]).reshape(-1, E)
    top = s.masked_fill(~keep, float("-inf")).sort(dim=-1, descending=True)[0]
    k = case["k"]
    if k < top.shape[1] and torch.isfinite(top[:, k]).all():
        smallest = min(smallest, (top[:, k - 1] - top[:, k]).min().item())
    plain = torch.sigmoid(x.double() @ router.double().T).sort(dim=-1, descending=True)[0]  # the aux loss's top-k
    return min(smallest, (plain[:, k - 1] - plain[:, k]).min().item())


def draw(case):
    """Weights and inputs whose routing clears MARGIN: returns a dict of float32 tensors."""
    Fs = case["n_shared"] * F
    for seed in range(100):
        g = torch.Generator().manual_seed(1000 * seed + case["k"])
        r = lambda *s, std=0.3: (torch.randn(*s, generator=g) * std).float()  # noqa: E731
        w = dict(x=r(B * T, C, std=1.0), dy=r(B * T, C, std=1.0), router=r(E, C), bias=r(E, std=0.05),
                 sgate=r(Fs, C), sup=r(Fs, C), sdown=r(C, Fs), gate=r(E, F, C), up=r(E, F, C), down=r(E, C, F))
        m = margins(w["x"], w["router"], w["bias"], case)
        if m > MARGIN:
            return w, seed, m
    sys.exit(f"FAILED: {case['name']}: no seed in 100 gives a routing margin above {MARGIN}")


def run_relay(case, w, tmp):
    Fs = case["n_shared"] * F
    path_in, path_out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    header = np.array([B * T, T, C, E, case["k"], F, case["n_group"], case["topk_group"], int(case["norm"]),
                       case["n_shared"], 1, 1], dtype="<i8")
    reals = np.array([2.5, case["aux"] / B], dtype="<f8")  # Relay's aux_weight: the coefficient over the sequences
    order = ["x", "dy", "router", "bias", "sgate", "sup", "sdown"]
    with open(path_in, "wb") as f:
        f.write(header.tobytes() + reals.tobytes())
        for name in order:
            f.write(w[name].numpy().astype("<f4").tobytes())
        for e in range(E):
            for name in ("gate", "up", "down"):
                f.write(w[name][e].numpy().astype("<f4").tobytes())
    r = subprocess.run([LAYER, path_in, path_out], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {case['name']}: {LAYER} exited {r.returncode}: {r.stderr[-2000:]}")
    raw = open(path_out, "rb").read()
    at = 0

    def f32(*shape):
        nonlocal at
        n = int(np.prod(shape))
        v = np.frombuffer(raw, dtype="<f4", count=n, offset=at).reshape(shape)
        at += 4 * n
        return torch.from_numpy(v.copy())

    out = dict(y=f32(B * T, C), dx=f32(B * T, C), router=f32(E, C), sgate=f32(Fs, C), sup=f32(Fs, C),
               sdown=f32(C, Fs))
    experts = [(f32(F, C), f32(F, C), f32(C, F)) for _ in range(E)]
    out["gate"] = torch.stack([e[0] for e in experts])
    out["up"] = torch.stack([e[1] for e in experts])
    out["down"] = torch.stack([e[2] for e in experts])
    at += 4 * B * T * case["k"]  # the chosen experts (i32)
    out["aux"] = float(np.frombuffer(raw, dtype="<f8", count=1, offset=at)[0])
    return out


def run_transformers(case, w):
    cfg = DeepseekV3Config(hidden_size=C, moe_intermediate_size=F, n_routed_experts=E,
                           num_experts_per_tok=case["k"], n_group=case["n_group"], topk_group=case["topk_group"],
                           norm_topk_prob=case["norm"], routed_scaling_factor=2.5,
                           n_shared_experts=case["n_shared"], hidden_act="silu", experts_implementation="eager")
    moe = DeepseekV3MoE(cfg).float()
    with torch.no_grad():
        moe.gate.weight.copy_(w["router"])
        moe.gate.e_score_correction_bias.copy_(w["bias"])
        moe.shared_experts.gate_proj.weight.copy_(w["sgate"])
        moe.shared_experts.up_proj.weight.copy_(w["sup"])
        moe.shared_experts.down_proj.weight.copy_(w["sdown"])
        moe.experts.gate_up_proj.copy_(torch.cat([w["gate"], w["up"]], dim=1))
        moe.experts.down_proj.copy_(w["down"])
    x = w["x"].view(B, T, C).clone().requires_grad_(True)
    y = moe(x)
    loss = (y * w["dy"].view(B, T, C)).sum()
    aux = torch.zeros((), dtype=torch.float32)
    if case["aux"] > 0:
        # DeepSeek-V3's complementary sequence-wise loss (report eq. 17-20), per sequence s of T tokens:
        # q = p / sum_e p (the token's sigmoid scores normalised), P_e = mean_t q[t, e], f_e = E / (k T) c_e (c_e its
        # tokens whose k best sigmoid scores, over all experts and without the bias, hold e: a constant),
        # aux_s = sum_e f_e P_e; loss += coef x mean over sequences.
        logits = moe.gate(x.view(-1, C))[0]
        p = logits.sigmoid()
        idx = p.detach().topk(case["k"], dim=-1)[1]
        chosen = moe.gate(x.view(-1, C))[2]
        differ = sum(set(a.tolist()) != set(b.tolist()) for a, b in zip(idx, chosen))
        if differ == 0:
            sys.exit(f"FAILED: {case['name']}: the aux loss's top-k is the routing's for every token: not a test of it")
        print(f"{case['name']}: {differ} of {B * T} tokens' aux-loss top-k differ from their biased, grouped choice")
        q = (p / (p.sum(-1, keepdim=True) + 1e-20)).view(B, T, E)
        counts = torch.zeros(B * T, E).scatter_(1, idx, 1.0).view(B, T, E).sum(1)  # (B, E)
        aux = (E / (case["k"] * T) * counts * q.mean(1)).sum()  # sum over sequences
        loss = loss + case["aux"] / B * aux
    loss.backward()
    g_gate_up = moe.experts.gate_up_proj.grad
    return dict(y=y.detach().view(B * T, C), dx=x.grad.view(B * T, C), router=moe.gate.weight.grad,
                sgate=moe.shared_experts.gate_proj.weight.grad, sup=moe.shared_experts.up_proj.weight.grad,
                sdown=moe.shared_experts.down_proj.weight.grad, gate=g_gate_up[:, :F], up=g_gate_up[:, F:],
                down=moe.experts.down_proj.grad, aux=aux.item())


def main():
    if not os.path.exists(LAYER):
        sys.exit(f"FAILED: {LAYER} not found (build the moe_layer target, or set RELAY_MOE_LAYER)")
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            w, seed, margin = draw(case)
            got, want = run_relay(case, w, tmp), run_transformers(case, w)
            worst = 0.0
            for name in ("y", "dx", "router", "sgate", "sup", "sdown", "gate", "up", "down"):
                scale = want[name].abs().max().item()
                err = (got[name] - want[name]).abs().max().item() / max(scale, 1e-30)
                worst = max(worst, err)
                if not err <= TOL or scale == 0:
                    failures.append(f"{case['name']}: {name}: max |relay - transformers| = {err:.2e} of its largest "
                                    f"magnitude {scale:.3e} (tolerance {TOL})")
            if case["aux"] > 0 and abs(got["aux"] - want["aux"]) > TOL * abs(want["aux"]):
                failures.append(f"{case['name']}: aux {got['aux']:.8g} != {want['aux']:.8g}")
            print(f"{case['name']}: seed {seed}, routing margin {margin:.2e}, worst relative error {worst:.2e}"
                  + (f", aux {got['aux']:.6f} (torch {want['aux']:.6f})" if case["aux"] > 0 else ""))
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print("PASSED")


main()
