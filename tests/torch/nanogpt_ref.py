"""PyTorch reference for Relay's GPT: nanoGPT's model (github.com/karpathy/nanoGPT, model.py) and Relay's data order.

Written from the GPT-2 paper's architecture and torch's own ops, independently of Relay's C++: the model,
Relay's sampler (io/sampler.*, core/rng.hpp) and LR schedule (src/optim) ported to Python, and one
training loop that runs in float32 or float64 from the same weights. Used by test_gpt_reference.py.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    bias: bool = True
    tie_embeddings: bool = True


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch 1.13's nn.LayerNorm cannot drop only the bias); eps 1e-5."""

    def __init__(self, dim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)  # weight (3C, C): q, k, v stacked
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x, mask=None):  # x (B, T, C); mask (B, 1, T, T) bool (query, key) or None: causal
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # each (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c.n_embd, c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c.n_embd, c.bias)
        self.mlp = MLP(c)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT without dropout. Tied: one Parameter, named transformer.wte.weight, used as embedding and head."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),  # (V, C)
            wpe=nn.Embedding(c.block_size, c.n_embd),  # (T, C)
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=LayerNorm(c.n_embd, c.bias),
        ))
        if not c.tie_embeddings:
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)  # weight (V, C)

    def init_like_nanogpt(self, seed, std=0.02):
        """Only for the self-test: Relay's runs start from Relay's own step-0 weights."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    s = std / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else std
                    p.copy_(torch.randn(p.shape, generator=g) * s)

    def forward(self, idx, mask=None, positions=None):  # idx (B, T) int64 -> logits (B, T, V)
        """mask (B, 1, T, T) bool and positions (B, T): a document mask's (document_layout); None: causal, 0..T-1."""
        T = idx.shape[1]
        assert T <= self.config.block_size, f"sequence of {T} tokens > block_size {self.config.block_size}"
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device) if positions is None else positions)
        for block in tr.h:
            x = block(x, mask)
        x = tr.ln_f(x)
        head = tr.wte.weight if self.config.tie_embeddings else self.lm_head.weight
        return F.linear(x, head)


def load_weights(model, tensors, where):
    """Copies {name: numpy array} into the model; every parameter must be there with its shape, nothing else."""
    params = dict(model.named_parameters())
    missing, extra = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
    if missing or extra:
        raise AssertionError(f"{where}: tensor names differ from nanoGPT's state_dict: "
                             f"missing {missing or 'none'}, unexpected {extra or 'none'}")
    with torch.no_grad():
        for name, p in params.items():
            a = tensors[name]
            if tuple(a.shape) != tuple(p.shape):
                raise AssertionError(f"{where}: {name} has shape {list(a.shape)}, nanoGPT's is {list(p.shape)}")
            p.copy_(torch.from_numpy(np.asarray(a)))


# ---- Relay's sampler (io/sampler.hpp, core/rng.hpp), bit for bit ----

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def permutation(n, seed, stream):
    """relay::permutation: Fisher-Yates driven by Rng(seed, stream).below(i + 1) (Lemire's multiply-shift)."""
    p = list(range(n))
    state = splitmix64(splitmix64(seed) ^ ((stream * 0xD1B54A32D192ED03) & M64))
    for i in range(n - 1, 0, -1):
        r = splitmix64(state)
        state = (state + 1) & M64
        j = (r * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def batch_samples(n, batch_size, shuffle, seed, step0):
    """Sample indices of 0-based step step0's global batch: positions step0*B .. step0*B+B-1 of the stream."""
    out, orders = [], {}
    for pos in range(step0 * batch_size, (step0 + 1) * batch_size):
        epoch, offset = divmod(pos, n)
        if shuffle and epoch not in orders:
            orders[epoch] = permutation(n, seed, epoch)
        out.append(orders[epoch][offset] if shuffle else offset)
    return out


def learning_rate(sched, base_lr, step, total):
    """relay::learning_rate (src/optim/optimizer.cpp); step counts from 1."""
    if sched["name"] == "constant":
        return base_lr
    warm, mn = sched["warmup_steps"], sched["min_lr"]
    if warm > 0 and step <= warm:
        return base_lr * step / warm
    if total <= warm:
        return base_lr
    progress = min(1.0, max(0.0, (step - warm) / (total - warm)))
    return mn + 0.5 * (base_lr - mn) * (1.0 + math.cos(math.pi * progress))


# ---- training and generation ----

def sequences(tokens, T, idx):
    """tokens (L,) int64; sequence s is tokens[s*T : s*T+T+1] -> inputs (B, T), targets (B, T)."""
    rows = torch.stack([tokens[s * T: s * T + T + 1] for s in idx])  # (B, T+1)
    return rows[:, :-1], rows[:, 1:]


def document_layout(x, eot, reset_positions=True):
    """Relay's data.document_mask, written plainly: x (B, T) inputs; a document ends with (and includes) each
    eot token. Returns mask (B, 1, T, T) bool, query t sees key s when s <= t and both are in one document (an
    explicit block-diagonal causal mask), and positions (B, T) restarting at 0 with each document (or 0..T-1)."""
    B, T = x.shape
    doc = torch.zeros(B, T, dtype=torch.int64)
    positions = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        d, start = 0, 0
        for t in range(T):
            doc[b, t], positions[b, t] = d, (t - start if reset_positions else t)
            if int(x[b, t]) == eot:
                d, start = d + 1, t + 1
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None], positions


def train(cfg, weights, tokens, run, dtype, autocast=False, make_model=None):
    """Trains a GPT from weights {name: array} with run's data order, AdamW, clipping and schedule.

    make_model: another module to train instead of nanoGPT's GPT(cfg) (tests/torch/test_llama_reference.py
    trains transformers' LlamaForCausalLM): make_model() -> a module mapping idx (B, T) to logits (B, T, V); one
    with an extra_loss() method has its value (of the last forward) added to the loss.
    run: dict(steps, batch_size, shuffle, data_seed, lr, betas, eps, weight_decay, clip, schedule), and for a
    document mask eot (the end-of-text token) and reset_positions: the model gets document_layout's mask and
    positions, and the position whose input is eot has its target ignored (ignore_index, out of the mean).
    autocast: the forward under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 GEMMs, fp32 parameters and
    optimizer), the loss in float32 from the logits, as mixed-precision users train.
    Returns dict(losses, grad_norms, model, exp_avg, exp_avg_sq), the tensors keyed by parameter name.
    """
    model = make_model() if make_model else GPT(cfg)
    load_weights(model, weights, "initial weights")
    model.to(dtype)
    params = dict(model.named_parameters())
    # One group: Relay decays every parameter (embeddings, biases and LayerNorm gains included).
    opt = torch.optim.AdamW(params.values(), lr=run["lr"], betas=run["betas"], eps=run["eps"],
                            weight_decay=run["weight_decay"])
    T = cfg.block_size
    n = (len(tokens) - 1) // T
    losses, grad_norms = [], []
    for step in range(1, run["steps"] + 1):
        x, y = sequences(tokens, T, batch_samples(n, run["batch_size"], run["shuffle"], run["data_seed"], step - 1))
        for g in opt.param_groups:
            g["lr"] = learning_rate(run["schedule"], run["lr"], step, run["steps"])
        opt.zero_grad()
        kw = {}
        if run.get("eot") is not None:
            kw["mask"], kw["positions"] = document_layout(x, run["eot"], run.get("reset_positions", True))
            y = torch.where(x == run["eot"], torch.full_like(y, -100), y)
        if hasattr(model, "set_targets"):  # a model predicting further ahead (test_deepseek_v3_reference.py's MTP)
            model.set_targets(y)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x, **kw)  # (B, T, V)
        # The mean over the counted targets: all B*T, or all but a document mask's ignored ones.
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1), ignore_index=-100)
        if hasattr(model, "extra_loss"):  # terms the model adds to the loss (tests/torch/test_moe_reference.py's router)
            loss = loss + model.extra_loss()
        loss.backward()
        if run["clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params.values(), run["clip"])
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in params.values()]))
        opt.step()
        losses.append(loss.item())
        grad_norms.append(norm.item())

    def numpy(t):
        return t.detach().double().numpy()
    return dict(losses=losses, grad_norms=grad_norms,
                model={k: numpy(p) for k, p in params.items()},
                exp_avg={k: numpy(opt.state[p]["exp_avg"]) for k, p in params.items()},
                exp_avg_sq={k: numpy(opt.state[p]["exp_avg_sq"]) for k, p in params.items()})


@torch.no_grad()
def next_token_logits(model, ids):
    """Logits (V,) for the token after ids, seeing at most the last block_size tokens (nanoGPT's generate)."""
    ctx = ids[-model.config.block_size:]
    return model(torch.tensor([ctx], dtype=torch.int64))[0, -1]


def greedy(model, prompt, max_new_tokens):
    """Greedy continuation; torch.argmax returns the first maximum, as Relay's temperature = 0 must."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(int(torch.argmax(next_token_logits(model, ids))))
    return ids
