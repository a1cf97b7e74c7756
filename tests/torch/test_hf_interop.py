#!/usr/bin/env python3
"""Hugging Face round trips with the real transformers, safetensors and PyTorch 2.x from PyPI.

For GPT-2 (GPT2LMHeadModel) and Llama (LlamaForCausalLM, 4 query heads sharing 2 key/value heads):
Import: a random transformers model (built from a config, nothing downloaded) saved with
save_pretrained, once as one model.safetensors and once in shards with model.safetensors.index.json ->
a Relay run with model.init_from = DIR, serially and on dp 2 x tp 2: Relay's step-0 checkpoint holds
exactly the HF weights (Conv1D weights transposed to Relay's (out, in)), and Relay's eval loss with
lr = 0 equals transformers' loss on the same eval tokens within 1e-5 relative.
Export: Relay trains, `relay ckpt export --format hf` writes a model directory, transformers'
AutoModelForCausalLM.from_pretrained loads it with no missing or unexpected keys, its eval loss equals
Relay's logged one within 1e-5, the logits of 20 generated positions (relay generate --logits-out) equal
transformers' within 1e-5 of their scale, and 20 greedy tokens of generate(do_sample=False) equal
`relay generate --temperature 0` from the same prompt; --dtype bf16 loads and holds the fp32 weights
rounded to bf16. An untied GPT-2 head goes both ways apart from the embedding.
Bad input (exit 1, one line naming what is wrong): an HF directory of another architecture, a config
key that differs from [model] (GPT-2's n_head, Llama's num_key_value_heads), a tensor missing from the
directory, a GPT without biases exported, export into a non-empty directory.

The packages live in the cached venv relay-torch2 (tests/torch/pypi_venv.py). Usage:
test_hf_interop.py <relay binary>; exit 77 = skipped (the venv cannot be made).
"""
import json
import os
import shutil
import sys
import tempfile

RELAY = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HF_HUB_OFFLINE="1",
           TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    sys.path.insert(0, HERE)
    from pypi_venv import hf_python, rerun_in_venv

    rerun_in_venv(hf_python, __file__, RELAY, env=ENV)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file as load_numpy  # noqa: E402
from hf_harness import Harness  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel,  # noqa: E402
                          LlamaConfig, LlamaForCausalLM)

torch.set_num_threads(1)
TOL = 1e-5  # relative: one fp32 forward pass in two libraries
T = 32      # block_size
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
EVAL_TOKENS = None  # the eval file's tokens (bytes)
# A run that keeps its initial weights: step-0 checkpoint, one step with lr 0, eval after it.
STILL = ["--set", "train.steps=1", "--set", "optimizer.lr=0.0", "--set", "optimizer.weight_decay=0.0",
         "--set", "train.eval_every=1", "--set", "checkpoint.save_initial=true"]


H = Harness(RELAY, ENV, TOL, T)
run, ok, eval_losses, close = H.run, H.ok, H.eval_losses, H.close
hf_eval_loss, relay_tensors, expect_error = H.hf_eval_loss, H.relay_tensors, H.expect_error


def randomized(m):
    """Biases and norm weights moved away from their 0 / 1 initialisation, so every tensor counts."""
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def random_gpt2(seed):
    torch.manual_seed(seed)
    return randomized(GPT2LMHeadModel(GPT2Config(
        vocab_size=256, n_positions=T, n_embd=64, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)))


def random_llama(seed):
    torch.manual_seed(seed)
    return randomized(LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)))


def import_case(family, hf, toml, tmp):
    """save_pretrained (one file; shards + index) -> init_from on 1 rank and dp 2 x tp 2: step-0 tensors
    equal HF's bitwise, eval loss equal."""
    hf.save_pretrained(f"{tmp}/hf_{family}")
    hf.save_pretrained(f"{tmp}/hf_{family}_shards", max_shard_size="100KB")
    shards = [f for f in os.listdir(f"{tmp}/hf_{family}_shards") if f.endswith(".safetensors")]
    if len(shards) < 2 or not os.path.exists(f"{tmp}/hf_{family}_shards/model.safetensors.index.json"):
        sys.exit(f"FAILED: save_pretrained(max_shard_size) wrote {shards}, not several shards and an index")
    want_loss = hf_eval_loss(hf, EVAL_TOKENS)
    tied = hf.config.tie_word_embeddings
    hf_sd = {k: v.numpy() for k, v in hf.state_dict().items()
             if not (tied and k == "lm_head.weight") and not k.endswith(".attn.bias")}
    for src, ranks, layout in ((f"hf_{family}", 1, []), (f"hf_{family}_shards", 1, []),
                               (f"hf_{family}_shards", 4, ["--set", "parallel.dp=2", "--set", "parallel.tp=2"])):
        rd = f"{tmp}/import_{src}_{ranks}"
        run(["train", "--config", toml, "--set", f'run.dir="{rd}"', "--set", f'model.init_from="{tmp}/{src}"']
            + STILL + layout, ranks)
        step0 = relay_tensors(rd, 0, tmp)
        if set(step0) != set(hf_sd):
            sys.exit(f"FAILED {family} import: tensors {sorted(set(step0) ^ set(hf_sd))} differ in name from HF's")
        for k, v in hf_sd.items():
            if not np.array_equal(step0[k], v.T if family == "gpt2" and k.endswith(CONV1D) else v):
                sys.exit(f"FAILED {family} import from {src} on {ranks} rank(s): tensor {k} differs from HF's")
        rel = close(eval_losses(rd)[1], want_loss, f"{family} import from {src} on {ranks} rank(s): eval loss")
        ok(f"{family} import from {src} ({len(shards) if 'shards' in src else 1} file(s)) on {ranks} rank(s): "
           f"step-0 tensors = HF's {len(hf_sd)} bitwise; eval loss = transformers' (relative {rel:.1e})")


def untied_case(family, hf, toml, tmp):
    """An untied head (lm_head.weight saved apart) through init_from and back through export, serially."""
    hf.save_pretrained(f"{tmp}/hf_{family}_untied")
    rd = f"{tmp}/untied_{family}"
    run(["train", "--config", toml, "--set", f'run.dir="{rd}"', "--set", f'model.init_from="{tmp}/hf_{family}_untied"',
         "--set", "model.tie_embeddings=false"] + STILL)
    if not np.array_equal(relay_tensors(rd, 0, tmp)["lm_head.weight"], hf.lm_head.weight.detach().numpy()):
        sys.exit(f"FAILED {family} untied import: lm_head.weight differs from HF's")
    run(["ckpt", "export", f"{rd}/checkpoints/step_00000001.h5", "--format", "hf", "--out", f"{tmp}/{family}_untied_out"])
    model, info = AutoModelForCausalLM.from_pretrained(f"{tmp}/{family}_untied_out", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad or model.config.tie_word_embeddings or not torch.equal(model.lm_head.weight, hf.lm_head.weight):
        sys.exit(f"FAILED {family} untied export: loading info {bad}, tie {model.config.tie_word_embeddings}, "
                 "or lm_head.weight differs")
    want = hf_eval_loss(hf, EVAL_TOKENS)
    rel = max(close(eval_losses(rd)[1], want, f"{family} untied import: eval loss"),
              close(hf_eval_loss(model.eval(), EVAL_TOKENS), want, f"{family} untied export: eval loss"))
    ok(f"{family} untied head: init_from and export keep lm_head.weight apart; eval losses equal (relative {rel:.1e})")


def export_case(family, arch, toml, tmp):
    """Relay trains -> export --format hf -> from_pretrained: no missing/unexpected keys, eval loss and 20
    greedy tokens equal; --dtype bf16 = the fp32 tensors rounded. Returns the checkpoint."""
    rd = f"{tmp}/{family}"
    run(["train", "--config", toml, "--set", f'run.dir="{rd}"'])
    ck = f"{rd}/checkpoints/step_00000020.h5"
    out = f"{tmp}/{family}_out_fp32"
    run(["ckpt", "export", ck, "--format", "hf", "--out", out])
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    if type(model).__name__ != arch or bad:
        sys.exit(f"FAILED {family} export: from_pretrained gave {type(model).__name__}, loading info {bad}")
    rel = close(hf_eval_loss(model, EVAL_TOKENS), eval_losses(rd)[20], f"{family} export: eval loss")
    ok(f"{family} export: from_pretrained -> {arch}, no missing/unexpected keys; transformers' eval loss = "
       f"Relay's at step 20 (relative {rel:.1e})")

    prompt = [int(t) for t in EVAL_TOKENS[:8]]
    open(f"{tmp}/prompt.txt", "w").write(" ".join(map(str, prompt)))
    run(["generate", "--checkpoint", ck, "--prompt-tokens", f"{tmp}/prompt.txt", "--max-new-tokens", "20",
         "--temperature", "0", "--tokens-out", f"{tmp}/{family}_tokens.txt",
         "--logits-out", f"{tmp}/{family}_logits.txt"])
    relay_ids = [int(t) for t in open(f"{tmp}/{family}_tokens.txt").read().split()]
    # Logits: Relay's for each new token (its key-value cache) against transformers' full forward of the
    # same prefix, within 1e-5 of the logits' scale.
    relay_logits = np.loadtxt(f"{tmp}/{family}_logits.txt", ndmin=2)
    worst = 0.0
    with torch.no_grad():
        for i in range(20):
            hf = model(torch.tensor([relay_ids[:len(prompt) + i]])).logits[0, -1].double().numpy()
            worst = max(worst, float(np.max(np.abs(relay_logits[i] - hf)) / np.max(np.abs(hf))))
    if relay_logits.shape != (20, model.config.vocab_size) or not worst <= 1e-5:
        sys.exit(f"FAILED {family} export: logits of shape {relay_logits.shape} differ from transformers' by {worst:.2e}")
    ok(f"{family} export: the logits of all 20 generated positions = transformers' (max {worst:.1e} of their scale)")
    with torch.no_grad():
        hf_ids = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=20, do_sample=False)[0].tolist()
    if relay_ids != hf_ids or len(hf_ids) != len(prompt) + 20:
        sys.exit(f"FAILED {family} export: greedy tokens differ:\n relay {relay_ids}\n hf    {hf_ids}")
    ok(f"{family} export: 20 greedy tokens of generate(do_sample=False) = relay generate --temperature 0")

    out16 = f"{tmp}/{family}_out_bf16"
    run(["ckpt", "export", ck, "--format", "hf", "--dtype", "bf16", "--out", out16])
    _, info = AutoModelForCausalLM.from_pretrained(out16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"FAILED {family} export bf16: loading info {bad}")
    fp32, b16 = load_file(f"{out}/model.safetensors"), load_file(f"{out16}/model.safetensors")
    for k, v in fp32.items():
        if b16[k].dtype != torch.bfloat16 or not torch.equal(b16[k], v.to(torch.bfloat16)):
            sys.exit(f"FAILED {family} export bf16: {k} is not the fp32 tensor rounded to bf16")
    if json.load(open(f"{out16}/config.json"))["dtype"] != "bfloat16":
        sys.exit(f"FAILED {family} export bf16: config.json dtype is not bfloat16")
    ok(f"{family} export --dtype bf16: from_pretrained loads it; its {len(b16)} tensors = the fp32 ones rounded to bf16")
    rd16 = f"{tmp}/{family}_from_bf16"  # and back: BF16 weights widen to exactly those floats
    run(["train", "--config", toml, "--set", f'run.dir="{rd16}"', "--set", f'model.init_from="{out16}"'] + STILL)
    step0 = relay_tensors(rd16, 0, tmp)
    for k, v in b16.items():
        want = v.float().numpy()
        if not np.array_equal(step0[k], want.T if family == "gpt2" and k.endswith(CONV1D) else want):
            sys.exit(f"FAILED {family} init_from the bf16 export: tensor {k} is not the bf16 value")
    ok(f"{family}: init_from = the bf16 export gives exactly its bf16 values as float32")
    return ck


def write_toml(path, tmp, model):
    open(path, "w").write(f"""[model]
{model}
[data]
train = "{tmp}/train.h5"
eval = "{tmp}/eval.h5"
[train]
steps = 20
batch_size = 8
micro_batches = 2
eval_every = 10
""")
    return path


with tempfile.TemporaryDirectory() as tmp:
    text = open(os.path.join(HERE, "..", "..", "README.md"), "rb").read()
    cut = len(text) * 9 // 10
    open(f"{tmp}/train.txt", "wb").write(text[:cut])
    open(f"{tmp}/eval.txt", "wb").write(text[cut:])
    for part in ("train", "eval"):
        run(["data", "tokenize", "--in", f"{tmp}/{part}.txt", "--out", f"{tmp}/{part}.h5", "--tokenizer", "bytes"])
    EVAL_TOKENS = np.frombuffer(text[cut:], dtype=np.uint8).astype(np.int64)
    gpt_toml = write_toml(f"{tmp}/gpt.toml", tmp, f"""type = "gpt"
vocab_size = 256
block_size = {T}
n_layer = 2
n_head = 4
n_embd = 64""")
    llama_toml = write_toml(f"{tmp}/llama.toml", tmp, f"""type = "llama"
vocab_size = 256
block_size = {T}
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 64
ffn_hidden = 96
norm_eps = 1e-5""")

    import_case("gpt2", random_gpt2(5), gpt_toml, tmp)
    ck = export_case("gpt2", "GPT2LMHeadModel", gpt_toml, tmp)
    torch.manual_seed(7)
    untied_case("gpt2", randomized(GPT2LMHeadModel(GPT2Config(
        vocab_size=256, n_positions=T, n_embd=64, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None,
        tie_word_embeddings=False))), gpt_toml, tmp)
    import_case("llama", random_llama(6), llama_toml, tmp)
    export_case("llama", "LlamaForCausalLM", llama_toml, tmp)

    # ---- bad input ----------------------------------------------------------------------------------------
    BertForMaskedLM(BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=128)).save_pretrained(f"{tmp}/hf_bert")
    base = ["train", "--config", gpt_toml, "--set", "train.steps=1", "--set", "parallel.dp=2"]
    line = expect_error(base + ["--set", f'run.dir="{tmp}/bad1"', "--set", f'model.init_from="{tmp}/hf_bert"'],
                        ["config.json", '"bert"', "BertForMaskedLM", 'model.type = "gpt"'], ranks=2)
    ok(f"another architecture, 2 ranks: exit 1, {line}")
    line = expect_error(base + ["--set", f'run.dir="{tmp}/bad2"', "--set", f'model.init_from="{tmp}/hf_gpt2"',
                                "--set", "model.n_head=2"], ["config.json n_head = 4 but model.n_head = 2"], ranks=2)
    ok(f"mismatched key, 2 ranks: exit 1, {line}")
    os.makedirs(f"{tmp}/hf_missing")
    shutil.copy(f"{tmp}/hf_gpt2/config.json", f"{tmp}/hf_missing/config.json")
    sd = load_file(f"{tmp}/hf_gpt2/model.safetensors")
    del sd["transformer.h.1.mlp.c_fc.weight"]
    save_file(sd, f"{tmp}/hf_missing/model.safetensors", metadata={"format": "pt"})
    line = expect_error(base + ["--set", f'run.dir="{tmp}/bad3"', "--set", f'model.init_from="{tmp}/hf_missing"'],
                        ["transformer.h.1.mlp.c_fc.weight", "missing", f"{tmp}/hf_missing"], ranks=2)
    ok(f"tensor missing from the directory, 2 ranks: exit 1, {line}")
    run(["train", "--config", gpt_toml, "--set", f'run.dir="{tmp}/nobias"', "--set", "model.bias=false",
         "--set", "train.steps=1"])
    line = expect_error(["ckpt", "export", f"{tmp}/nobias/checkpoints/step_00000001.h5", "--format", "hf",
                         "--out", f"{tmp}/out_nobias"], ["model.bias = false", "GPT2LMHeadModel"])
    if os.path.exists(f"{tmp}/out_nobias") or any(f.startswith("out_nobias") for f in os.listdir(tmp)):
        sys.exit("FAILED: a failed export left a directory behind")
    ok(f"GPT without biases exported: exit 1, nothing written, {line}")
    line = expect_error(["ckpt", "export", ck, "--format", "hf", "--out", f"{tmp}/gpt2_out_fp32"],
                        ["gpt2_out_fp32", "not an empty"])
    ok(f"export into a non-empty directory: exit 1, {line}")
    line = expect_error(["train", "--config", llama_toml, "--set", "train.steps=1", "--set", "parallel.dp=2",
                         "--set", f'run.dir="{tmp}/bad4"', "--set", f'model.init_from="{tmp}/hf_llama"',
                         "--set", "model.n_kv_head=4"],
                        ["config.json num_key_value_heads = 2 but model.n_kv_head = 4"], ranks=2)
    ok(f"Llama key differs, 2 ranks: exit 1, {line}")
    line = expect_error(["train", "--config", gpt_toml, "--set", "train.steps=1", "--set", f'run.dir="{tmp}/bad5"',
                         "--set", f'model.init_from="{tmp}/hf_llama"'],
                        ['model_type "llama"', "LlamaForCausalLM", 'model.type = "gpt"'])
    ok(f"a Llama directory for a GPT run: exit 1, {line}")

    print(f"{H.passed} passed, 0 failed (transformers {transformers.__version__}, torch {torch.__version__})")
