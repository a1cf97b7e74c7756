#!/usr/bin/env python3
"""Golden reference: Relay's GPT against nanoGPT in PyTorch (GPT-2 architecture, Radford et al. 2019).

Relay trains a small byte-level GPT from its own initialisation (step-0 checkpoint); PyTorch loads those
weights into an independent nanoGPT module (nanogpt_ref.py) and trains on the same sequences in the same
order (Relay's sampler ported bit for bit) with torch.optim.AdamW, clip_grad_norm_ and Relay's schedule.
Every step's loss and grad norm and every final parameter, exp_avg and exp_avg_sq must agree; then
`relay generate` at temperature 0 must continue a prompt as torch's greedy decoding does.

The tolerance is measured, not guessed: the same torch run in float64 shows how far float32 alone moves
each kind of figure (losses, grad norms, parameters, exp_avg, exp_avg_sq; the calibration); Relay must be
within max(10 x that, 1e-5) of torch float32, kind by kind. Tensors are compared element by element
relative to |reference| + RMS(reference tensor), scalars relative to |reference|.
Cases: tied embeddings serially and on 4 ranks (dp = 2, pp = 2, 1F1B: embedding on stage 0, head on
stage 1), untied without biases serially with 2 micro-batches, and data.document_mask serially and on dp 2 x pp 2
(torch: an explicit block-diagonal causal mask, positions restarting with each document, ignore_index).

Usage: test_gpt_reference.py <relay binary>   (exit 77 = skipped: no torch or h5py)
       test_gpt_reference.py --selftest      (no Relay: checks the reference and this harness, using a
                                              stand-in "relay" made of the torch model, with injected bugs)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e} (install python3-torch and python3-h5py: scripts/setup.sh --with-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nanogpt_ref as ref  # noqa: E402

torch.set_num_threads(1)

MODEL = dict(vocab_size=256, block_size=16, n_layer=4, n_head=2, n_embd=32)
# eps = 1e-5, not 1e-8: Adam divides each gradient element by its own magnitude, so an element whose gradient
# cancels to ~1e-8 turns float32 rounding into a parameter-sized difference; eps caps that amplification and
# makes the calibrated tolerance about 100x tighter (fp32 vs fp64 worst ~1e-5 instead of ~1e-3).
RUN = dict(steps=8, batch_size=8, shuffle=True, data_seed=5, lr=1e-2, betas=(0.9, 0.95), eps=1e-5,
           weight_decay=0.1, clip=0.5, schedule=dict(name="cosine", warmup_steps=2, min_lr=1e-3))
SEQUENCES = 44     # < steps x batch: step 6's batch straddles the epoch boundary (positions 40..47)
SPARE_TOKENS = 7   # tokens past the last whole sequence, which (len - 1) // T must leave out
MARGIN, FLOOR = 10.0, 1e-5
PROMPT = b"Beautiful is"  # 12 tokens + 20 new > block_size 16: generation must crop the context as nanoGPT does
NEW_TOKENS = 20
CASES = [  # name, ranks, model options, token dtype, layout
    ("tied_serial", 1, dict(tie_embeddings=True, bias=True), np.uint16, dict(dp=1, pp=1, m=1)),
    ("tied_dp2_pp2_1f1b", 4, dict(tie_embeddings=True, bias=True), np.int32, dict(dp=2, pp=2, m=2)),
    ("untied_nobias_serial_m2", 1, dict(tie_embeddings=False, bias=False), np.uint16, dict(dp=1, pp=1, m=2)),
    # data.document_mask against an explicit block-diagonal causal mask, restarting positions and ignore_index:
    # documents of 1 to 40 tokens end with token 0, so sequences (T 16) hold several, or part of one.
    ("docmask_serial", 1, dict(tie_embeddings=True, bias=True), np.uint16, dict(dp=1, pp=1, m=1, docs=True)),
    ("docmask_dp2_pp2_m2", 4, dict(tie_embeddings=True, bias=True), np.uint16, dict(dp=2, pp=2, m=2, docs=True)),
    ("docmask_running_positions", 1, dict(tie_embeddings=False, bias=True), np.uint16,
     dict(dp=1, pp=1, m=1, docs=True, reset_positions=False)),
]
EOT = 0  # the document cases' end-of-text token: a byte plain text never holds


# ---- data, config, running Relay ----

def text_bytes(n):
    """n bytes of English: fortunes when installed, else the Zen of Python; repeated to length."""
    src = b""
    d = "/usr/share/games/fortunes"
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if os.path.isfile(p) and not name.endswith((".dat", ".u8")):
                src += open(p, "rb").read()
            if len(src) >= n:
                break
    if len(src) < 64:
        import codecs
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            import this  # prints the Zen on import
        src = codecs.decode(this.s, "rot13").encode()
    return (src * (n // len(src) + 1))[:n]


def write_tokens(path, dtype, docs=False):
    tokens = np.frombuffer(text_bytes(SEQUENCES * MODEL["block_size"] + 1 + SPARE_TOKENS), dtype=np.uint8).copy()
    if docs:  # documents of 1 to 40 tokens, each ended by EOT (as relay data tokenize separates them)
        rng, at = np.random.default_rng(3), 0
        while True:
            at += int(rng.integers(1, 41))
            if at >= len(tokens):
                break
            tokens[at - 1] = EOT
    with h5py.File(path, "w") as f:
        f["tokens"] = tokens.astype(dtype)
        f.attrs["vocab_size"] = MODEL["vocab_size"]
        f.attrs["tokenizer"] = "bytes"
        if docs:
            f.attrs["eot_id"] = EOT
    return torch.from_numpy(tokens.astype(np.int64))


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


class GptFamily:
    """What the harness needs of a model family: Relay's [model] section, the reference config and module.
    tests/torch/test_llama_reference.py passes its own (transformers' LlamaForCausalLM)."""
    name = "nanoGPT"

    @staticmethod
    def relay_model(opts):
        return dict(type="gpt", **MODEL, bias=opts["bias"], tie_embeddings=opts["tie_embeddings"], init_std=0.02,
                    seed=9)

    @staticmethod
    def config(opts):
        return ref.GPTConfig(**MODEL, **opts)

    @staticmethod
    def module(cfg):
        return ref.GPT(cfg)


FAMILY = GptFamily


def relay_config(d, data, opts, layout):
    sections = {
        "run": dict(dir=f"{d}/run"),
        "model": FAMILY.relay_model(opts),
        "data": dict(train=data, shuffle=RUN["shuffle"], seed=RUN["data_seed"],
                     **(dict(document_mask=True, reset_positions=layout.get("reset_positions", True))
                        if layout.get("docs") else {})),
        "train": dict(steps=RUN["steps"], batch_size=RUN["batch_size"], micro_batches=layout["m"], log_every=1,
                      clip_grad_norm=RUN["clip"]),
        "optimizer": dict(name="adamw", lr=RUN["lr"], betas=list(RUN["betas"]), eps=RUN["eps"],
                          weight_decay=RUN["weight_decay"]),
        "lr_schedule": RUN["schedule"],
        "parallel": dict(dp=layout["dp"], pp=layout["pp"], tp=layout.get("tp", 1), schedule="1f1b",
                         **(dict(ep=layout["ep"]) if layout.get("ep", 1) > 1 else {})),
        "checkpoint": dict(save_initial=True),
    }
    return "".join(f"[{s}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in kv.items()) + "\n"
                   for s, kv in sections.items())


def run_relay(relay, args, ranks, what):
    cmd = [relay] + args
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "OMP_NUM_THREADS=1"] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"{what}: exit code {r.returncode} from {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")


def read_checkpoint(path):
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "relay-checkpoint", f"{path}: not a Relay checkpoint"
        model = {k: f["model"][k][()] for k in f["model"]}
        opt = f["optimizer"]
        state = {kind: {k: opt[kind][k][()] for k in opt[kind]} if kind in opt else {}
                 for kind in ("exp_avg", "exp_avg_sq")}
        return dict(step=int(f.attrs["step"]), opt_name=str(opt.attrs["name"]), opt_step=int(opt.attrs["step"]),
                    model=model, **state)


def read_metrics(path):
    recs = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r:
            recs[r["step"]] = r
    missing = [s for s in range(1, RUN["steps"] + 1) if s not in recs]
    if missing:
        raise AssertionError(f"{path}: no train record for steps {missing}")
    return dict(losses=[recs[s]["loss"] for s in range(1, RUN["steps"] + 1)],
                grad_norms=[recs[s]["grad_norm"] for s in range(1, RUN["steps"] + 1)])


# ---- comparison ----

def tensor_err(a, b):
    """max_i |a_i - b_i| / (|b_i| + RMS(b)): relative where b_i is large, absolute at the tensor's scale near 0."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    scale = np.abs(b) + math.sqrt(float(np.mean(b * b)))
    scale[scale == 0] = 1.0
    return float(np.max(np.abs(a - b) / scale))


KINDS = ("loss", "grad norm", "model", "exp_avg", "exp_avg_sq")


def differences(got, want):
    """[(kind, label, error)] over every step's loss and grad norm and every final tensor, labels naming the
    step or the tensor, in the order a reader wants the first failure: losses by step, grad norms, tensors."""
    out = []
    for kind, key in (("loss", "losses"), ("grad norm", "grad_norms")):
        for step, (a, b) in enumerate(zip(got[key], want[key]), start=1):
            out.append((kind, f"{kind} at step {step}", abs(a - b) / max(abs(b), 1e-30)))
    for kind in ("model", "exp_avg", "exp_avg_sq"):
        prefix = "model/" if kind == "model" else f"optimizer/{kind}/"
        for name, b in want[kind].items():
            a = got[kind].get(name)
            out.append((kind, prefix + name, math.inf if a is None else tensor_err(a, b)))
    return out


def worst(diffs, kind=None):
    """(label, error) of the largest error, over one kind or all."""
    return max(((lab, e) for k, lab, e in diffs if kind in (None, k)), key=lambda d: d[1])


def tolerances(calibration):
    """Per kind: max(MARGIN x the worst fp32-vs-fp64 error of that kind, FLOOR). Per kind, so that Adam's
    amplified rounding in a few parameter elements does not loosen the check on the losses."""
    return {k: max(MARGIN * worst(calibration, k)[1], FLOOR) for k in KINDS}


def logit_gap(logits, token):
    """How far token's logit lies below the maximum, relative to |max| + RMS(logits)."""
    top = float(logits.max())
    return (top - float(logits[token])) / (abs(top) + math.sqrt(float(np.mean(logits.astype(np.float64) ** 2))))


def check_generation(relay, d, ckpt_path, cfg):
    """relay generate at temperature 0 against torch's greedy decoding from the same final checkpoint.

    Relay's token at each position must be a maximum of torch's logits for Relay's own prefix, up to a
    tolerance calibrated like the training one (torch fp32 vs fp64 logits on the same prefixes); a near-tie may
    legitimately pick another token and the continuations then part, so equality with torch's continuation is
    reported, and only a token torch ranks clearly below its maximum fails."""
    weights = read_checkpoint(ckpt_path)["model"]
    models = {}
    for dtype in (torch.float32, torch.float64):
        models[dtype] = FAMILY.module(cfg)
        ref.load_weights(models[dtype], weights, ckpt_path)
        models[dtype].to(dtype)
    prompt = list(PROMPT)
    with open(f"{d}/prompt.txt", "w") as f:
        f.write(" ".join(map(str, prompt)) + "\n")
    out = f"{d}/generated.txt"
    run_relay(relay, ["generate", "--checkpoint", ckpt_path, "--prompt-tokens", f"{d}/prompt.txt",
                      "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0", "--tokens-out", out], 1,
              "relay generate")
    got = [int(t) for t in open(out).read().split()]
    if len(got) != len(prompt) + NEW_TOKENS or got[:len(prompt)] != prompt:
        raise AssertionError(f"generate: expected the {len(prompt)} prompt ids then {NEW_TOKENS} new ones, got {got}")
    want = ref.greedy(models[torch.float32], prompt, NEW_TOKENS)
    positions = range(len(prompt), len(got))
    logits = {dt: [ref.next_token_logits(m, got[:i]).double().numpy() for i in positions] for dt, m in models.items()}
    calib = max(tensor_err(a, b) for a, b in zip(logits[torch.float32], logits[torch.float64]))
    tol = max(MARGIN * calib, FLOOR)
    for i, lg in zip(positions, logits[torch.float64]):
        gap = logit_gap(lg, got[i])
        if gap > tol:
            cropped = (f"; the sequence is longer than block_size {cfg.block_size} here, so torch saw only its last "
                       f"{cfg.block_size} tokens, as nanoGPT's generate does") if i > cfg.block_size else ""
            raise AssertionError(f"generate: new token {i - len(prompt)} (position {i}) is {got[i]}, torch's maximum "
                                 f"is {int(lg.argmax())} (relative logit gap {gap:.2e} > tolerance {tol:.2e}{cropped})"
                                 f"\n  relay: {got}\n  torch: {want}")
    same = next((i for i in range(len(got)) if got[i] != want[i]), None)
    text = bytes(got[len(prompt):]).decode("latin-1")
    return (f"{NEW_TOKENS} greedy tokens {text!r} " +
            ("identical to torch's" if same is None else f"agree up to a near-tie at position {same}") +
            f" (logits fp32 vs fp64 {calib:.2e}, tolerance {tol:.2e})")


def compare_case(relay, tmp, name, ranks, opts, dtype, layout):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    cfg = FAMILY.config(opts)
    data = f"{d}/tokens.h5"
    tokens = write_tokens(data, dtype, layout.get("docs", False))
    run = dict(RUN, eot=EOT, reset_positions=layout.get("reset_positions", True)) if layout.get("docs") else RUN
    open(f"{d}/c.toml", "w").write(relay_config(d, data, opts, layout))
    run_relay(relay, ["train", "--config", f"{d}/c.toml"], ranks, "relay train")
    ckdir = f"{d}/run/checkpoints"
    start = read_checkpoint(f"{ckdir}/step_00000000.h5")
    final = read_checkpoint(f"{ckdir}/step_{RUN['steps']:08d}.h5")
    if final["opt_name"] != "adamw" or final["opt_step"] != RUN["steps"] or final["step"] != RUN["steps"]:
        raise AssertionError(f"final checkpoint says optimizer {final['opt_name']} at step {final['opt_step']} "
                             f"(file step {final['step']}), expected adamw at {RUN['steps']}")
    relay_res = dict(read_metrics(f"{d}/run/metrics.jsonl"), **final)

    fp32 = ref.train(cfg, start["model"], tokens, run, torch.float32, make_model=lambda: FAMILY.module(cfg))
    fp64 = ref.train(cfg, start["model"], tokens, run, torch.float64, make_model=lambda: FAMILY.module(cfg))
    calibration = differences(fp32, fp64)
    alternatives = FAMILY.alternatives if hasattr(FAMILY, "alternatives") else lambda *a, **k: []
    for alt in alternatives(cfg, start["model"], tokens, run):
        calibration += differences(alt, fp32)  # another float32 realisation of the same math
    tol = tolerances(calibration)
    diffs = differences(relay_res, fp32)
    vs64 = differences(relay_res, fp64)
    print(f"{name}: {'figure':<10} {'torch calibration':>19} {'tolerance':>10} {'relay vs fp32':>14} "
          f"{'relay vs fp64':>14}   worst relay-vs-fp32 at")
    for k in KINDS:
        w = worst(diffs, k)
        print(f"{name}: {k:<10} {worst(calibration, k)[1]:19.2e} {tol[k]:10.2e} {w[1]:14.2e} "
              f"{worst(vs64, k)[1]:14.2e}   {w[0]}")
    print(f"{name}: losses relay {' '.join(f'{x:.6f}' for x in relay_res['losses'])}")
    print(f"{name}: losses torch {' '.join(f'{x:.6f}' for x in fp32['losses'])}")
    bad = [(lab, e, tol[k]) for k, lab, e in diffs if not e <= tol[k]]
    if bad:
        lines = "\n".join(f"  {lab}: {e:.3e} > {t:.2e}" for lab, e, t in bad[:12])
        more = f"\n  ... and {len(bad) - 12} more" if len(bad) > 12 else ""
        raise AssertionError(f"{len(bad)} of {len(diffs)} figures differ from torch float32 by more than "
                             f"their tolerance (first: {bad[0][0]}):\n{lines}{more}")
    clipped = sum(g > RUN["clip"] for g in fp32["grad_norms"])
    print(f"{name}: {RUN['steps']} losses and grad norms ({clipped} steps clipped), {len(fp32['model'])} parameters "
          f"with exp_avg and exp_avg_sq agree")
    final_path = f"{ckdir}/step_{RUN['steps']:08d}.h5"
    if getattr(FAMILY, "generates", True):  # a family whose blocks cannot generate yet says generates = False
        print(f"{name}: generate: {check_generation(relay, d, final_path, cfg)}")


def run_cases(relay, cases):
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks, opts, dtype, layout in cases:
            try:
                compare_case(relay, tmp, name, ranks, opts, dtype, layout)
                print(f"PASSED {name}")
            except (AssertionError, subprocess.TimeoutExpired, OSError) as e:
                failures.append(name)
                print(f"FAILED {name}: {e}")
    names = ": " + ", ".join(failures) if failures else ""
    print(f"{len(cases) - len(failures)} passed, {len(failures)} failed{names}")
    return failures


# ---- self-test: the reference and the harness, without Relay ----

def fake_relay(argv):
    """A stand-in for the relay binary made of the torch model in float32 (rank 0 does all the work).

    RELAY_FAKE_BUG injects one bug so the self-test can see the harness catch it: unshuffled (data order),
    gelu_erf (exact GELU instead of tanh), no_decay_1d (no weight decay on biases and gains),
    second_best (generate picks the runner-up once)."""
    import tomllib
    bug = os.environ.get("RELAY_FAKE_BUG", "")
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != 0:
        return 0
    opts = dict(zip(argv[1::2], argv[2::2]))
    if bug == "gelu_erf":
        torch.nn.GELU = lambda approximate="none": torch.nn.modules.activation.GELU()

    def write_ckpt(path, step, model, exp_avg, exp_avg_sq, config):
        with h5py.File(path, "w") as f:
            f.attrs.update(format="relay-checkpoint", version=1, step=step, config=config)
            for k, v in model.items():
                f[f"model/{k}"] = np.asarray(v, np.float32)
            f.create_group("optimizer").attrs.update(name="adamw", step=step)
            for kind, st in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                for k, v in st.items():
                    f[f"optimizer/{kind}/{k}"] = np.asarray(v, np.float32)
            f.attrs["complete"] = 1

    if argv[0] == "train":
        text = open(opts["--config"]).read()
        c = tomllib.loads(text)
        m = c["model"]
        cfg = ref.GPTConfig(**{k: m[k] for k in MODEL}, bias=m["bias"], tie_embeddings=m["tie_embeddings"])
        model = ref.GPT(cfg)
        model.init_like_nanogpt(m["seed"])
        start = {k: p.detach().numpy().copy() for k, p in model.named_parameters()}
        with h5py.File(c["data"]["train"], "r") as f:
            tokens = torch.from_numpy(f["tokens"][()].astype(np.int64))
        run = dict(RUN, shuffle=c["data"]["shuffle"] and bug != "unshuffled")
        if c["data"].get("document_mask"):
            run.update(eot=EOT, reset_positions=c["data"].get("reset_positions", True))
        if bug == "no_decay_1d":  # weight decay on matrices only, as GPT recipes often do but Relay must not
            adamw = torch.optim.AdamW

            def adamw_matrices_only(params, **kw):
                params = list(params)
                return adamw([{"params": [p for p in params if p.dim() >= 2]},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], **kw)
            torch.optim.AdamW = adamw_matrices_only
        res = ref.train(cfg, start, tokens, run, torch.float32)
        ck = f"{c['run']['dir']}/checkpoints"
        os.makedirs(ck, exist_ok=True)
        zeros = {k: np.zeros_like(v) for k, v in start.items()}
        write_ckpt(f"{ck}/step_00000000.h5", 0, start, zeros, zeros, text)
        write_ckpt(f"{ck}/step_{RUN['steps']:08d}.h5", RUN["steps"], res["model"], res["exp_avg"], res["exp_avg_sq"],
                   text)
        with open(f"{c['run']['dir']}/metrics.jsonl", "w") as f:
            for s, (l, g) in enumerate(zip(res["losses"], res["grad_norms"]), start=1):
                f.write(json.dumps(dict(step=s, loss=float(np.float32(l)), grad_norm=g)) + "\n")
        return 0
    if argv[0] == "generate":
        with h5py.File(opts["--checkpoint"], "r") as f:
            m = tomllib.loads(f.attrs["config"])["model"]
            weights = {k: f["model"][k][()] for k in f["model"]}
        cfg = ref.GPTConfig(**{k: m[k] for k in MODEL}, bias=m["bias"], tie_embeddings=m["tie_embeddings"])
        model = ref.GPT(cfg)
        ref.load_weights(model, weights, opts["--checkpoint"])
        ids = [int(t) for t in open(opts["--prompt-tokens"]).read().split()]
        for i in range(int(opts["--max-new-tokens"])):
            logits = ref.next_token_logits(model, ids)
            if bug == "second_best" and i == 5:
                logits[int(logits.argmax())] = -math.inf
            ids.append(int(torch.argmax(logits)))
        open(opts["--tokens-out"], "w").write(" ".join(map(str, ids)) + "\n")
        return 0
    print(f"fake relay: unknown command {argv}")
    return 2


def expected_names(n_layer, bias, tied):
    """The checkpoint names the interface promises, spelled out independently of the module."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        for sub in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            names.append(f"transformer.h.{i}.{sub}.weight")
            if bias:
                names.append(f"transformer.h.{i}.{sub}.bias")
    names += ["transformer.ln_f.weight"] + (["transformer.ln_f.bias"] if bias else [])
    return set(names + ([] if tied else ["lm_head.weight"]))


def selftest():
    ok = True

    def check(cond, what):
        nonlocal ok
        ok &= bool(cond)
        print(f"{'ok  ' if cond else 'FAIL'} {what}")

    # The sampler port against relay::permutation (values printed by core/rng.hpp compiled alone).
    check(ref.permutation(10, 3, 0) == [4, 8, 7, 2, 0, 5, 1, 9, 6, 3], "permutation(10, 3, 0) as relay::permutation")
    b = ref.batch_samples(SEQUENCES, 8, True, 5, 5)
    check(b[:4] == ref.permutation(44, 5, 0)[40:] and b[4:] == ref.permutation(44, 5, 1)[:4],
          "step 6's batch straddles epochs 0 and 1")
    for tied in (True, False):
        for bias in (True, False):
            cfg = ref.GPTConfig(**MODEL, bias=bias, tie_embeddings=tied)
            names = {k for k, _ in ref.GPT(cfg).named_parameters()}
            check(names == expected_names(MODEL["n_layer"], bias, tied), f"parameter names, tied={tied} bias={bias}")
    cfg = ref.GPTConfig(**MODEL)
    model = ref.GPT(cfg)
    model.init_like_nanogpt(1)
    model.double()
    x = torch.randint(0, 256, (2, 16))
    y = x.clone()
    y[:, 9:] = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        check(torch.equal(model(x)[:, :9], model(y)[:, :9]), "causal: later tokens do not change earlier logits")
        check(torch.allclose(model(x)[:, :5], model(x[:, :5])), "a prefix's logits do not depend on the padding")

    # Calibration on random tokens from a random nanoGPT initialisation, at the sizes the test uses.
    for tied, bias in ((True, True), (False, False)):
        cfg = ref.GPTConfig(**MODEL, bias=bias, tie_embeddings=tied)
        m = ref.GPT(cfg)
        m.init_like_nanogpt(7)
        start = {k: p.detach().numpy().copy() for k, p in m.named_parameters()}
        tokens = torch.randint(0, 256, (SEQUENCES * MODEL["block_size"] + 1 + SPARE_TOKENS,),
                               generator=torch.Generator().manual_seed(3))
        calibration = differences(ref.train(cfg, start, tokens, RUN, torch.float32),
                                  ref.train(cfg, start, tokens, RUN, torch.float64))
        tol = tolerances(calibration)
        print(f"     random data, tied={tied} bias={bias}: torch fp32 vs fp64 worst (-> tolerance) per figure:")
        for k in KINDS:
            w = worst(calibration, k)
            print(f"       {k:<10} {w[1]:.2e} (-> {tol[k]:.2e})  at {w[0]}")
        check(0 < worst(calibration)[1] < 1e-3, "fp32 and fp64 differ, but only by rounding")

    # The harness end to end, with the torch model standing in for relay, then with one bug at a time.
    with tempfile.TemporaryDirectory() as tmp:
        fake = f"{tmp}/relay"
        with open(fake, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} --fake-relay \"$@\"\n")
        os.chmod(fake, 0o755)
        check(run_cases(fake, CASES) == [], "harness passes a correct stand-in (3 cases, one on 4 ranks)")
        for bug, case in (("unshuffled", 0), ("gelu_erf", 0), ("no_decay_1d", 2), ("second_best", 2)):
            os.environ["RELAY_FAKE_BUG"] = bug
            print(f"---- injected bug: {bug}")
            check(run_cases(fake, [CASES[case]]) == [CASES[case][0]], f"harness catches the injected bug {bug}")
        os.environ.pop("RELAY_FAKE_BUG")
    print("selftest passed" if ok else "selftest FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fake-relay":
        sys.exit(fake_relay(sys.argv[2:]))
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "--selftest":
        sys.exit(selftest())
    sys.exit(1 if run_cases(os.path.abspath(sys.argv[1]), CASES) else 0)
