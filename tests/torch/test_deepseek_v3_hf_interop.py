#!/usr/bin/env python3
"""Hugging Face round trips of Relay's DeepSeek-V3 (multi-head latent attention; layer 0 dense, layer 1 DeepSeek-V3's
mixture of experts: 4 experts in 2 groups, one group kept, top 2, one shared expert) with the real transformers 5 and
PyTorch 2.x from PyPI.

Import: a random DeepseekV3ForCausalLM (q_lora_rank 24, built from a config, nothing downloaded; norm weights moved
away from 1, e_score_correction_bias non-zero) saved with save_pretrained (per-expert tensors) -> a Relay run with
model.init_from = DIR and moe.expert_bias: Relay's step-0 checkpoint holds exactly the HF weights (the fused experts
split per expert, the bias as router/expert_bias), and Relay's eval loss with lr = 0 equals transformers' on the same
tokens within 1e-5 relative; the same directory rewritten with the experts fused as transformers 5 holds them
(mlp.experts.gate_up_proj, mlp.experts.down_proj) gives the same step-0 tensors.
Export: Relay trains 10 steps (q_lora_rank unset: one q_proj; the expert bias updated every step), `relay ckpt export
--format hf` writes a directory that from_pretrained loads as DeepseekV3ForCausalLM with no missing or unexpected keys,
its e_score_correction_bias the checkpoint's router/expert_bias, and its eval loss equals Relay's logged one.
Generation (MLA's compressed cache, decoded in the absorbed form): `relay generate --temperature 0` continues an
8-token prompt by 16 tokens exactly as transformers' generate (do_sample=False, DynamicCache) does, from the import's
step-0 checkpoint against the HF model itself (q_lora_rank 24, the non-zero bias), from the YaRN import's (24 positions
over 8 original ones) and from the export's (q_proj, trained); each prints the cache's bytes, checked against
layers x (kv_lora_rank + qk_rope_head_dim) x 4 bytes per token and x the 23 tokens the run held, beside a standard
cache's layers x heads x (qk_nope + qk_rope + v_head_dim) x 4 bytes.
YaRN: a DeepseekV3ForCausalLM whose rope_parameters are YaRN's (rope_type "yarn", factor 4 over 8 original positions
of the 32, mscale 1, mscale_all_dim 0.8) -> model.init_from with rope_scaling = "yarn" and the rope_ keys: eval loss =
transformers', also with config.json rewritten in transformers 4's form (rope_scaling {"type": "yarn", ...}); its
checkpoint exported: config.json's rope_parameters the same YaRN dict, eval loss = Relay's.
Bad input (exit 1, one line naming the key; on both of 2 ranks for kv_lora_rank, moe_intermediate_size under tp
and the Llama directory): kv_lora_rank missing, n_routed_experts not divisible by n_group,
topk_group > n_group, num_experts_per_tok > n_routed_experts, tp not dividing moe_intermediate_size, a non-zero
e_score_correction_bias without moe.expert_bias, router_z_loss_coef (no z-loss with sigmoid scores), an unknown
rope_scaling ("linear"), a YaRN key without rope_scaling = "yarn", a directory whose rope_parameters.rope_type is
"linear", YaRN's factor differing from the directory's, and a Llama directory for a deepseek_v3 run.
MTP: num_mtp_layers = 1 trained 2 steps and exported: config.json num_nextn_predict_layers = 1, the module under the
official names model.layers.2.* (enorm, hnorm, eh_proj, its decoder layer, shared_head.norm, and copies of the
embedding and head as embed_tokens and shared_head.head); from_pretrained reports no missing keys and exactly those as
unexpected (transformers builds no MTP module; it names the experts fused), its eval loss equals Relay's; init_from of that directory with
num_mtp_layers = 1 gives the exported checkpoint's tensors bitwise.

The packages live in the cached venv relay-torch2 (tests/torch/pypi_venv.py). Usage:
test_deepseek_v3_hf_interop.py <relay binary>; exit 77 = skipped (the venv cannot be made).
"""
import json
import os
import sys
import tempfile

RELAY = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HF_HUB_OFFLINE="1",
           TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1",
           OMP_NUM_THREADS="1")

if "--inside" not in sys.argv:  # re-run this file with the venv's python
    sys.path.insert(0, HERE)
    from pypi_venv import hf_python, rerun_in_venv

    rerun_in_venv(hf_python, __file__, RELAY, env=ENV)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hf_harness import Harness  # noqa: E402
import h5py  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from safetensors.numpy import load_file as load_numpy  # noqa: E402
from safetensors.numpy import save_file as save_numpy  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

torch.set_num_threads(1)
TOL = 1e-5
T = 32
STILL = ["--set", "train.steps=1", "--set", "optimizer.lr=0.0", "--set", "optimizer.weight_decay=0.0",
         "--set", "train.eval_every=1", "--set", "checkpoint.save_initial=true"]
# The model on both sides: layer 0 dense, layer 1 routed (first_k_dense_replace = 1), 4 heads of 8 + 4 query/key
# columns and 6 value columns.
HF = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
          max_position_embeddings=T, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=10000.0),
          rope_interleave=True, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
          n_shared_experts=1, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
          first_k_dense_replace=1, num_mtp_layers=0, tie_word_embeddings=False, bos_token_id=None,
          eos_token_id=None, pad_token_id=None)
RELAY_MODEL = """type = "deepseek_v3"
vocab_size = 256
block_size = 32
n_layer = 2
n_head = 4
n_embd = 32
ffn_hidden = 48
kv_lora_rank = 16
qk_nope_head_dim = 8
qk_rope_head_dim = 4
v_head_dim = 6
norm_eps = 1e-6
n_routed_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 16
n_group = 2
topk_group = 1
first_k_dense_replace = 1"""

H = Harness(RELAY, ENV, TOL, T)
run, ok, eval_losses, close = H.run, H.ok, H.eval_losses, H.close
hf_eval_loss, relay_tensors, expect_error = H.hf_eval_loss, H.relay_tensors, H.expect_error


def check_generate(ck, model, what, tmp, eval_tokens, new=16):
    """relay generate's greedy tokens from checkpoint ck = transformers' generate (do_sample=False: its DynamicCache)
    from `model` holding the same weights, and the line it prints: the compressed cache's bytes per token and for the
    run's tokens = the formula, beside a standard cache of the same heads."""
    prompt = [int(t) for t in eval_tokens[:8]]
    open(f"{tmp}/prompt.txt", "w").write(" ".join(map(str, prompt)))
    cmd = [RELAY, "generate", "--checkpoint", ck, "--prompt-tokens", f"{tmp}/prompt.txt", "--max-new-tokens", str(new),
           "--temperature", "0", "--tokens-out", f"{tmp}/generated.txt"]
    r = subprocess.run(cmd, capture_output=True, env=ENV, timeout=600)  # bytes: it prints the byte-level text
    stdout = r.stdout.decode("latin-1")
    if r.returncode != 0:
        sys.exit(f"FAILED {what}: {' '.join(cmd)} exited {r.returncode}: {stdout[-2000:]}{r.stderr.decode('latin-1')}")
    got = [int(t) for t in open(f"{tmp}/generated.txt").read().split()]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None)[0].tolist()
    if got != want:
        sys.exit(f"FAILED {what}: relay generate {got}\n  transformers' generate {want}")
    cfg = model.config
    L, held = cfg.num_hidden_layers, len(prompt) + new - 1  # the last token is never run through the model
    per = L * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
    std = L * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * 4
    line = next((ln for ln in stdout.splitlines() if ln.startswith("cache: ")), "")
    expect = (f"cache: {per} bytes per token = {L} layers x ({cfg.kv_lora_rank} latent + {cfg.qk_rope_head_dim} rotary "
              f"key) values x 4 bytes; {per * held} bytes for the {held} tokens of this run; a standard key-value cache "
              f"of the same heads: {std} bytes per token, {std * held} bytes")
    if not line.startswith(expect):
        sys.exit(f"FAILED {what}: relay generate printed {line!r}, expected it to begin {expect!r}")
    return f"{new} greedy tokens = transformers' generate; {line}"


def write_toml(path, tmp, extra=""):
    open(path, "w").write(f"""[model]
{RELAY_MODEL}
{extra}
[moe]
expert_bias = true
[data]
train = "{tmp}/train.h5"
eval = "{tmp}/eval.h5"
[train]
steps = 10
batch_size = 8
micro_batches = 2
eval_every = 5
""")
    return path


with tempfile.TemporaryDirectory() as tmp:
    text = open(os.path.join(HERE, "..", "..", "README.md"), "rb").read()
    cut = len(text) * 9 // 10
    open(f"{tmp}/train.txt", "wb").write(text[:cut])
    open(f"{tmp}/eval.txt", "wb").write(text[cut:cut + 8 * T + 1])
    for part in ("train", "eval"):
        run(["data", "tokenize", "--in", f"{tmp}/{part}.txt", "--out", f"{tmp}/{part}.h5", "--tokenizer", "bytes"])
    eval_tokens = np.frombuffer(text[cut:cut + 8 * T + 1], dtype=np.uint8).astype(np.int64)
    lora = write_toml(f"{tmp}/lora.toml", tmp, "q_lora_rank = 24")
    plain = write_toml(f"{tmp}/plain.toml", tmp)

    # Import: save_pretrained -> model.init_from.
    torch.manual_seed(5)
    hf = DeepseekV3ForCausalLM(DeepseekV3Config(**HF, q_lora_rank=24, attn_implementation="eager",
                                                experts_implementation="eager"))
    bias_name = "model.layers.1.mlp.gate.e_score_correction_bias"
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)  # norm weights away from 1, so every tensor counts
        hf.get_buffer(bias_name).copy_(torch.tensor([0.03, -0.02, 0.01, -0.04]))
    hf.eval()
    hf.save_pretrained(f"{tmp}/hf_dsv3")
    fused = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    want = {}  # Relay's names: the experts per expert (save_pretrained's form), the bias apart
    for k, v in fused.items():
        if k.endswith(".experts.gate_up_proj"):
            for e in range(v.shape[0]):
                half = v.shape[1] // 2
                want[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :half]
                want[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, half:]
        elif k.endswith(".experts.down_proj"):
            for e in range(v.shape[0]):
                want[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
        elif k != bias_name:
            want[k] = v

    def check_import(rd, form):
        step0 = relay_tensors(rd, 0, tmp)
        if set(step0) != set(want):
            sys.exit(f"FAILED import ({form}): tensors {sorted(set(step0) ^ set(want))} differ in name")
        for k, v in want.items():
            if not np.array_equal(step0[k], v):
                sys.exit(f"FAILED import ({form}): tensor {k} differs from HF's")
        with h5py.File(f"{rd}/checkpoints/step_00000000.h5") as f:
            bias = np.asarray(f["router/expert_bias"])
        if not np.array_equal(bias, fused[bias_name][None, :]):
            sys.exit(f"FAILED import ({form}): router/expert_bias {bias} is not e_score_correction_bias")

    still = STILL + ["--set", "moe.bias_update_rate=0.0"]
    rd = f"{tmp}/import"
    run(["train", "--config", lora, "--set", f'run.dir="{rd}"', "--set", f'model.init_from="{tmp}/hf_dsv3"'] + still)
    check_import(rd, "per-expert")
    rel = close(eval_losses(rd)[1], hf_eval_loss(hf, eval_tokens), "import: eval loss")
    ok(f"import: step-0 tensors = HF's {len(want)} bitwise, e_score_correction_bias = router/expert_bias; eval loss "
       f"= transformers' (relative {rel:.1e})")
    ok(f"generate, q_lora_rank 24: {check_generate(f'{rd}/checkpoints/step_00000000.h5', hf, 'generate (q_lora)', tmp, eval_tokens)}")
    os.makedirs(f"{tmp}/hf_fused")
    for name in ("config.json", "generation_config.json"):
        if os.path.exists(f"{tmp}/hf_dsv3/{name}"):
            shutil.copy(f"{tmp}/hf_dsv3/{name}", f"{tmp}/hf_fused/{name}")
    save_numpy({k: np.ascontiguousarray(v) for k, v in fused.items()}, f"{tmp}/hf_fused/model.safetensors",
               metadata={"format": "pt"})
    rd = f"{tmp}/import_fused"
    run(["train", "--config", lora, "--set", f'run.dir="{rd}"', "--set", f'model.init_from="{tmp}/hf_fused"'] + still)
    check_import(rd, "fused")
    ok("import: a directory with the experts fused (gate_up_proj, down_proj) gives the same step-0 tensors")

    # YaRN in: rope_parameters -> rope_scaling = "yarn" and its keys; out: the same rope_parameters.
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8, beta_fast=32.0,
                beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8)
    yarn_sets = ['model.rope_scaling="yarn"'] + [f"model.rope_{k}={v}" for k, v in yarn.items()
                                                 if k not in ("rope_type", "rope_theta")]
    torch.manual_seed(7)
    hf_yarn = DeepseekV3ForCausalLM(DeepseekV3Config(**dict(HF, rope_parameters=yarn), q_lora_rank=24,
                                                     attn_implementation="eager", experts_implementation="eager"))
    hf_yarn.eval()
    hf_yarn.save_pretrained(f"{tmp}/hf_yarn")
    rd = f"{tmp}/import_yarn"
    run(["train", "--config", lora, "--set", f'run.dir="{rd}"', "--set", f'model.init_from="{tmp}/hf_yarn"'] + still
        + [a for s in yarn_sets for a in ("--set", s)])
    hf_yarn_loss = hf_eval_loss(hf_yarn, eval_tokens)
    rel_in = close(eval_losses(rd)[1], hf_yarn_loss, "YaRN import: eval loss")
    # transformers 4's form of the same directory: rope_scaling {"type": "yarn", ...} and a top-level rope_theta.
    os.makedirs(f"{tmp}/hf_yarn4")
    for name in os.listdir(f"{tmp}/hf_yarn"):
        shutil.copy(f"{tmp}/hf_yarn/{name}", f"{tmp}/hf_yarn4/{name}")
    cfg4 = json.load(open(f"{tmp}/hf_yarn/config.json"))
    cfg4.pop("rope_parameters")
    cfg4["rope_theta"] = yarn["rope_theta"]
    cfg4["rope_scaling"] = dict({k: v for k, v in yarn.items() if k not in ("rope_type", "rope_theta")}, type="yarn")
    json.dump(cfg4, open(f"{tmp}/hf_yarn4/config.json", "w"))
    run(["train", "--config", lora, "--set", f'run.dir="{tmp}/import_yarn4"', "--set",
         f'model.init_from="{tmp}/hf_yarn4"'] + still + [a for s in yarn_sets for a in ("--set", s)])
    rel_in4 = close(eval_losses(f"{tmp}/import_yarn4")[1], hf_yarn_loss, "YaRN import (rope_scaling): eval loss")
    gen_yarn = check_generate(f"{rd}/checkpoints/step_00000000.h5", hf_yarn, "generate (YaRN)", tmp, eval_tokens)
    last = sorted(os.listdir(f"{rd}/checkpoints"))[-1]
    run(["ckpt", "export", f"{rd}/checkpoints/{last}", "--format", "hf", "--out", f"{tmp}/export_yarn"])
    model = AutoModelForCausalLM.from_pretrained(f"{tmp}/export_yarn", attn_implementation="eager")
    model.eval()
    got = {k: model.config.rope_parameters.get(k) for k in yarn}
    if got != yarn:
        sys.exit(f"FAILED YaRN export: config.json rope_parameters {got}, expected {yarn}")
    rel_out = close(hf_eval_loss(model, eval_tokens), eval_losses(rd)[1], "YaRN export: eval loss")
    ok(f"YaRN: import eval loss = transformers' (relative {rel_in:.1e}; from transformers 4's rope_scaling form "
       f"{rel_in4:.1e}); exported rope_parameters = {yarn['rope_type']} x{yarn['factor']:g}, eval loss = Relay's "
       f"(relative {rel_out:.1e})")
    ok(f"generate, YaRN (24 positions over 8 original ones): {gen_yarn}")

    # Export: 10 steps -> relay ckpt export --format hf -> from_pretrained.
    rd = f"{tmp}/export"
    run(["train", "--config", plain, "--set", f'run.dir="{rd}"'])
    out = f"{tmp}/export_hf"
    run(["ckpt", "export", f"{rd}/checkpoints/step_00000010.h5", "--format", "hf", "--out", out])
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, attn_implementation="eager")
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    if type(model).__name__ != "DeepseekV3ForCausalLM" or bad:
        sys.exit(f"FAILED export: from_pretrained gave {type(model).__name__}, loading info {bad}")
    exported = load_numpy(f"{out}/model.safetensors")[bias_name]
    with h5py.File(f"{rd}/checkpoints/step_00000010.h5") as f:
        trained_bias = np.asarray(f["router/expert_bias"])[0]
    if not np.array_equal(exported, trained_bias) or not np.any(trained_bias != 0):
        sys.exit(f"FAILED export: e_score_correction_bias {exported} is not router/expert_bias {trained_bias} "
                 "(or the bias never moved)")
    if model.config.q_lora_rank is not None or model.config.first_k_dense_replace != 1:
        sys.exit(f"FAILED export: config.json q_lora_rank {model.config.q_lora_rank}, first_k_dense_replace "
                 f"{model.config.first_k_dense_replace}")
    rel = close(hf_eval_loss(model, eval_tokens), eval_losses(rd)[10], "export: eval loss")
    ok(f"export: from_pretrained -> DeepseekV3ForCausalLM, no missing/unexpected keys, e_score_correction_bias = "
       f"router/expert_bias; transformers' eval loss = Relay's at step 10 (relative {rel:.1e})")
    ok(f"generate from the export, q_proj: "
       f"{check_generate(f'{rd}/checkpoints/step_00000010.h5', model, 'generate (export)', tmp, eval_tokens)}")

    # Multi-token prediction: D = 1 (a routed layer, as the last main layer) exported under the official names
    # (model.layers.2.*, num_nextn_predict_layers = 1), loaded by from_pretrained with no missing keys (transformers
    # has no MTP modules: exactly those keys unexpected), read back by model.init_from bitwise.
    rd = f"{tmp}/mtp"
    mtp = ["--set", "model.num_mtp_layers=1", "--set", "train.steps=2", "--set", "train.eval_every=2"]
    run(["train", "--config", plain, "--set", f'run.dir="{rd}"'] + mtp)
    out = f"{tmp}/mtp_hf"
    run(["ckpt", "export", f"{rd}/checkpoints/step_00000002.h5", "--format", "hf", "--out", out])
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, attn_implementation="eager")
    model.eval()
    names = set(load_numpy(f"{out}/model.safetensors"))
    mtp_names = {n for n in names if n.startswith("model.layers.2.")}
    official = {"model.layers.2." + n for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight",
                                                "shared_head.norm.weight", "shared_head.head.weight",
                                                "self_attn.q_proj.weight", "mlp.gate.weight",
                                                "mlp.experts.3.down_proj.weight", "mlp.shared_experts.up_proj.weight")}
    # (transformers reports the module's experts under its fused names, mlp.experts.gate_up_proj and down_proj)
    unexpected = set(info["unexpected_keys"])
    if (info["missing_keys"] or not unexpected or any(not n.startswith("model.layers.2.") for n in unexpected)
            or not official <= mtp_names):
        sys.exit(f"FAILED mtp export: missing {info['missing_keys']}, unexpected {sorted(info['unexpected_keys'])}, "
                 f"official names absent {sorted(official - mtp_names)}")
    if model.config.num_mtp_layers != 1:
        sys.exit(f"FAILED mtp export: config.json says {model.config.num_mtp_layers} MTP layers, not 1")
    rel = close(hf_eval_loss(model, eval_tokens), eval_losses(rd)[2], "mtp export: eval loss")
    rd2 = f"{tmp}/mtp_import"
    run(["train", "--config", plain, "--set", f'run.dir="{rd2}"', "--set", f'model.init_from="{out}"',
         "--set", "moe.bias_update_rate=0.0"] + mtp + STILL)
    back, trained = relay_tensors(rd2, 0, tmp), relay_tensors(rd, 2, tmp)
    diff = sorted(k for k in set(back) | set(trained) if k not in back or k not in trained
                  or not np.array_equal(back[k], trained[k]))
    if diff:
        sys.exit(f"FAILED mtp import: tensors {diff[:5]} differ from the exported checkpoint's")
    ok(f"mtp: export with num_nextn_predict_layers = 1 and {len(mtp_names)} model.layers.2.* tensors (from_pretrained: "
       f"{len(unexpected)} unexpected keys, all model.layers.2.*, none missing; eval loss = Relay's, relative {rel:.1e}); init_from reads "
       f"all {len(back)} tensors back bitwise")

    # Bad input: one line naming the key, exit 1 on both ranks.
    def bad_case(sets, needles, what, init_from=None, ranks=1):
        cmd = ["train", "--config", plain, "--set", "train.steps=1", "--set", f"parallel.dp={ranks}",
               "--set", f'run.dir="{tmp}/bad"'] + [a for s in sets for a in ("--set", s)]
        if init_from:
            cmd += ["--set", f'model.init_from="{init_from}"']
        ok(f"{what}: exit 1 on {ranks} rank(s), {expect_error(cmd, needles, ranks=ranks)}")

    open(f"{tmp}/no_kv.toml", "w").write(open(plain).read().replace("kv_lora_rank = 16\n", ""))
    line = expect_error(["train", "--config", f"{tmp}/no_kv.toml", "--set", "parallel.dp=2"], ["model.kv_lora_rank"],
                        ranks=2)
    ok(f"kv_lora_rank missing: exit 1 on 2 ranks, {line}")
    bad_case(["model.n_routed_experts=6", "model.n_group=4"], ["model.n_routed_experts", "model.n_group = 4"],
             "n_routed_experts % n_group")
    bad_case(["model.topk_group=3"], ["model.topk_group", "= 3", "model.n_group = 2"], "topk_group > n_group")
    bad_case(["model.num_experts_per_tok=5"], ["model.num_experts_per_tok", "model.n_routed_experts = 4"],
             "num_experts_per_tok > n_routed_experts")
    bad_case(["parallel.dp=1", "parallel.tp=2", "model.moe_intermediate_size=15"],
             ["parallel.tp", "model.moe_intermediate_size = 15"], "tp not dividing moe_intermediate_size", ranks=2)
    bad_case(["moe.expert_bias=false", "model.q_lora_rank=24"], [bias_name, "moe.expert_bias = false"],
             "a non-zero e_score_correction_bias without moe.expert_bias", init_from=f"{tmp}/hf_dsv3")
    bad_case(["model.router_z_loss_coef=0.001"], ["model.router_z_loss_coef", "z-loss"], "router_z_loss_coef")
    bad_case(['model.rope_scaling="linear"'], ["model.rope_scaling", "linear"], "an unknown rope_scaling")
    bad_case(["model.rope_factor=4.0"], ["model.rope_factor", 'rope_scaling = \"yarn\"'],
             "a YaRN key without rope_scaling = yarn")
    os.makedirs(f"{tmp}/hf_linear")
    for name in os.listdir(f"{tmp}/hf_yarn"):
        shutil.copy(f"{tmp}/hf_yarn/{name}", f"{tmp}/hf_linear/{name}")
    cfg = json.load(open(f"{tmp}/hf_yarn/config.json"))
    cfg["rope_parameters"] = dict(rope_type="linear", rope_theta=10000.0, factor=4.0)
    json.dump(cfg, open(f"{tmp}/hf_linear/config.json", "w"))
    bad_case(["model.q_lora_rank=24"], ["rope_parameters.rope_type", "linear", "yarn"],
             "an HF directory with rope_type linear", init_from=f"{tmp}/hf_linear")
    bad_case(["model.q_lora_rank=24"] + [s.replace("rope_factor=4.0", "rope_factor=8.0") for s in yarn_sets],
             ["rope_parameters.factor = 4", "model.rope_factor = 8"], "YaRN's factor differing from the directory's",
             init_from=f"{tmp}/hf_yarn")
    torch.manual_seed(6)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=T)).save_pretrained(f"{tmp}/hf_llama")
    bad_case([], ['model_type "llama"', "LlamaForCausalLM", 'model.type = "deepseek_v3"'],
             "a Llama directory for a deepseek_v3 run", init_from=f"{tmp}/hf_llama", ranks=2)
    print(f"{H.passed} passed, 0 failed (transformers {transformers.__version__}, torch {torch.__version__})")
