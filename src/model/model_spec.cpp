// Block specs for the model families. MLP: one block per config layer, initialised as
// torch.nn.Linear / LayerNorm from (model.seed, layer index). GPT: GPT-2's parameters with nanoGPT's
// state_dict names, weights N(0, init_std) from (model.seed, name), c_proj weights
// N(0, init_std / sqrt(2 n_layer)), biases 0, layernorms 1 and 0. Llama: transformers'
// LlamaForCausalLM state_dict names, every weight N(0, init_std) (its initializer_range) from
// (model.seed, name), RMSNorm weights 1.
#include "model/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "model/blocks.hpp"

namespace relay {

const char* block_kind_name(BlockKind k) {
  switch (k) {
    case BlockKind::linear: return "linear";
    case BlockKind::relu: return "relu";
    case BlockKind::gelu: return "gelu";
    case BlockKind::tanh: return "tanh";
    case BlockKind::layernorm: return "layernorm";
    case BlockKind::embedding: return "embedding";
    case BlockKind::transformer: return "transformer";
    case BlockKind::llama_layer: return "llama_layer";
    case BlockKind::head: return "head";
  }
  return "?";
}

namespace {

ParamInit constant(double v) { return {ParamInit::constant, v, 0, 0}; }

ModelSpec mlp_spec(const Config& cfg, int64_t input_dim) {
  ModelSpec m;
  m.input_dim = input_dim;
  int64_t w = input_dim;
  const auto& layers = cfg.model.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& l = layers[i];
    BlockSpec b;
    b.in = w;
    const std::string n = std::to_string(i);
    if (l.type == "linear") {
      b.kind = BlockKind::linear;
      b.out = l.out;
      // torch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound
      // and continues the weight's random stream.
      const double bound = 1.0 / std::sqrt(double(w));
      b.params = {{n + ".weight", {l.out, w}, {ParamInit::uniform, bound, i, 0}},
                  {n + ".bias", {l.out}, {ParamInit::uniform, bound, i, static_cast<uint64_t>(l.out * w)}}};
      b.flops = 2.0 * double(w) * double(l.out);
    } else if (l.type == "layernorm") {
      b.kind = BlockKind::layernorm;
      b.out = w;
      b.eps = l.eps;
      b.params = {{n + ".weight", {w}, constant(1)}, {n + ".bias", {w}, constant(0)}};
      b.flops = 8.0 * double(w);
    } else {
      b.kind = l.type == "relu" ? BlockKind::relu : l.type == "gelu" ? BlockKind::gelu : BlockKind::tanh;
      b.out = w;
      b.flops = (l.type == "gelu" ? 10.0 : 1.0) * double(w);
      b.starts_unit = false;  // parameter-free layers stay with the layer before them
    }
    w = b.out;
    m.blocks.push_back(std::move(b));
  }
  if (!m.blocks.empty()) m.blocks.front().starts_unit = true;
  m.output_dim = w;
  return m;
}

// The language models' first and last blocks (gpt_blocks.cpp's Embedding and Head, shared by GPT-2 and
// Llama): token ids -> (rows, C) from the tables in params (the token embedding, [learned positions]);
// and a norm over C (params: its weight, [bias], then the output weight) -> logits over the vocabulary V.
BlockSpec lm_embedding(std::vector<ParamSpec> params, int64_t C, int64_t T) {
  BlockSpec b;
  b.kind = BlockKind::embedding;
  b.in = 0;
  b.out = C;
  b.seq_len = T;
  b.params = std::move(params);
  b.flops = double(C);
  return b;
}
BlockSpec lm_head(std::vector<ParamSpec> params, int64_t C, int64_t V, int64_t T, bool bias, NormKind norm, double eps) {
  BlockSpec b;
  b.kind = BlockKind::head;
  b.in = C;
  b.out = V;
  b.seq_len = T;
  b.bias = bias;
  b.norm = norm;
  b.eps = eps;
  b.params = std::move(params);
  b.flops = 2.0 * double(C) * double(V);
  return b;
}

ModelSpec gpt_spec(const Config& cfg) {
  const auto& c = cfg.model;
  const int64_t V = c.vocab_size, T = c.block_size, C = c.n_embd, L = c.n_layer;
  const double std_w = c.init_std, std_proj = c.init_std / std::sqrt(2.0 * double(L));
  auto normal = [](const std::string& name, double s) { return ParamInit{ParamInit::normal, s, name_stream(name), 0}; };
  auto w = [&](const std::string& name, Shape shape, double s, TpSplit split = {}) {
    return ParamSpec{name, std::move(shape), normal(name, s), split};
  };
  // Tensor-parallel splits (Megatron-LM): column-parallel = dim 0 (the QKV weight in 3 parts, q, k and
  // v, so each rank holds whole heads), row-parallel = dim 1, vocabulary-parallel = dim 0.
  const TpSplit col{0, 1}, qkv{0, 3}, row{1, 1}, vocab{0, 1};
  ModelSpec m;
  m.language_model = true;
  m.seq_len = T;
  m.output_dim = V;
  const ParamSpec wte = w("transformer.wte.weight", {V, C}, std_w, vocab);

  m.blocks.push_back(lm_embedding({wte, w("transformer.wpe.weight", {T, C}, std_w)}, C, T));

  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    BlockSpec b;
    b.kind = BlockKind::transformer;
    b.in = b.out = C;
    b.seq_len = T;
    b.n_head = c.n_head;
    b.bias = c.bias;
    auto add = [&](ParamSpec s, bool present = true) { if (present) b.params.push_back(std::move(s)); };
    add({p + "ln_1.weight", {C}, constant(1)});
    add({p + "ln_1.bias", {C}, constant(0)}, c.bias);
    add(w(p + "attn.c_attn.weight", {3 * C, C}, std_w, qkv));
    add({p + "attn.c_attn.bias", {3 * C}, constant(0), qkv}, c.bias);
    add(w(p + "attn.c_proj.weight", {C, C}, std_proj, row));
    add({p + "attn.c_proj.bias", {C}, constant(0)}, c.bias);
    add({p + "ln_2.weight", {C}, constant(1)});
    add({p + "ln_2.bias", {C}, constant(0)}, c.bias);
    add(w(p + "mlp.c_fc.weight", {4 * C, C}, std_w, col));
    add({p + "mlp.c_fc.bias", {4 * C}, constant(0), col}, c.bias);
    add(w(p + "mlp.c_proj.weight", {C, 4 * C}, std_proj, row));
    add({p + "mlp.c_proj.bias", {C}, constant(0)}, c.bias);
    // Per token: 2 x (3C^2 + C^2 + 4C^2 + 4C^2) in the projections, 2 x 2 x T x C in QK^T and att @ V.
    b.attn_flops = 4.0 * double(T) * double(C);
    b.flops = 24.0 * double(C) * double(C) + b.attn_flops;
    b.recomputable = true;
    m.blocks.push_back(std::move(b));
  }

  std::vector<ParamSpec> head = {{"transformer.ln_f.weight", {C}, constant(1)}};
  if (c.bias) head.push_back({"transformer.ln_f.bias", {C}, constant(0)});
  head.push_back(c.tie_embeddings ? wte : w("lm_head.weight", {V, C}, std_w, vocab));
  m.blocks.push_back(lm_head(std::move(head), C, V, T, c.bias, NormKind::layernorm, 1e-5));
  return m;
}

// Llama's decoder, and Mixtral's and Qwen3-MoE's (transformers' names: Mixtral's experts under
// block_sparse_moe.experts.E.w1 / w3 / w2 (gate, up, down) and its router block_sparse_moe.gate, Qwen3-MoE's under
// mlp.experts.E.gate_proj / up_proj / down_proj and mlp.gate; Qwen3's per-head q_norm and k_norm).
ModelSpec llama_spec(const Config& cfg) {
  const auto& c = cfg.model;
  const int64_t V = c.vocab_size, T = c.block_size, C = c.n_embd, L = c.n_layer, F = c.ffn_hidden;
  const int64_t hd = c.head_dim > 0 ? c.head_dim : C / c.n_head, Hq = c.n_head * hd, Hkv = c.n_kv_head * hd;
  const bool mixtral = c.type == "mixtral", qwen = c.type == "qwen3_moe";
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < L; ++i) moe_layers += c.moe_layer(i) ? 1 : 0;
  const double sequences = double(std::max<int64_t>(cfg.train.batch_size, 1));  // of the global batch
  auto w = [&](const std::string& name, Shape shape, TpSplit split = {}) {
    return ParamSpec{name, std::move(shape), ParamInit{ParamInit::normal, c.init_std, name_stream(name), 0}, split};
  };
  // Tensor-parallel splits: q/k/v, gate and up column-parallel (dim 0: whole heads, as n_head and n_kv_head
  // divide by tp), o and down row-parallel (dim 1), the embedding and lm_head vocabulary-parallel.
  const TpSplit col{0, 1}, row{1, 1}, vocab{0, 1};
  ModelSpec m;
  m.language_model = true;
  m.seq_len = T;
  m.output_dim = V;
  const ParamSpec embed = w("model.embed_tokens.weight", {V, C}, vocab);

  m.blocks.push_back(lm_embedding({embed}, C, T));

  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    BlockSpec b;
    b.kind = BlockKind::llama_layer;
    b.in = b.out = C;
    b.seq_len = T;
    b.n_head = c.n_head;
    b.n_kv_head = c.n_kv_head;
    b.ffn_hidden = F;
    b.rope_theta = c.rope_theta;
    b.eps = c.norm_eps;
    b.bias = false;
    b.head_dim = hd;
    b.qk_norm = qwen;
    b.params = {{p + "input_layernorm.weight", {C}, constant(1)},
                w(p + "self_attn.q_proj.weight", {Hq, C}, col),
                w(p + "self_attn.k_proj.weight", {Hkv, C}, col),
                w(p + "self_attn.v_proj.weight", {Hkv, C}, col),
                w(p + "self_attn.o_proj.weight", {C, Hq}, row)};
    if (b.qk_norm) {
      b.params.push_back({p + "self_attn.q_norm.weight", {hd}, constant(1)});
      b.params.push_back({p + "self_attn.k_norm.weight", {hd}, constant(1)});
    }
    b.params.push_back({p + "post_attention_layernorm.weight", {C}, constant(1)});
    // Per token: 2 x (q, k, v, o) + 2 x 3 C F in the MLP (2 x (E C + k x 3 C F_moe) with experts), 2 x 2 x T x Hq
    // in QK^T and att @ V.
    double mlp_flops = 6.0 * double(C) * double(F);
    if (c.moe_layer(i)) {
      const int64_t E = c.n_experts, Fe = c.moe_ffn_hidden;
      b.moe = {E, c.experts_per_token, Fe, mixtral || c.norm_topk_prob,
               c.router_aux_loss_coef / (double(moe_layers) * sequences),
               c.router_z_loss_coef / (double(moe_layers) * sequences * double(T)), 0, cfg.moe.expert_bias};
      for (const BlockSpec& prev : m.blocks) b.moe.layer += prev.moe.on() ? 1 : 0;
      const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
      b.params.push_back(w(moe + "gate.weight", {E, C}));
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = moe + "experts." + std::to_string(e) + ".";
        // Tensor parallelism splits each expert like the dense SwiGLU; the router stays whole.
        b.params.push_back(w(x + (mixtral ? "w1.weight" : "gate_proj.weight"), {Fe, C}, col));
        b.params.push_back(w(x + (mixtral ? "w3.weight" : "up_proj.weight"), {Fe, C}, col));
        b.params.push_back(w(x + (mixtral ? "w2.weight" : "down_proj.weight"), {C, Fe}, row));
      }
      mlp_flops = 2.0 * double(C) * double(E) + double(c.experts_per_token) * 6.0 * double(C) * double(Fe);
    } else {
      b.params.push_back(w(p + "mlp.gate_proj.weight", {F, C}, col));
      b.params.push_back(w(p + "mlp.up_proj.weight", {F, C}, col));
      b.params.push_back(w(p + "mlp.down_proj.weight", {C, F}, row));
    }
    b.attn_flops = 4.0 * double(T) * double(Hq);
    b.flops = 2.0 * double(C) * double(2 * Hq + 2 * Hkv) + mlp_flops + b.attn_flops;
    b.recomputable = true;
    m.blocks.push_back(std::move(b));
  }

  m.blocks.push_back(lm_head({{"model.norm.weight", {C}, constant(1)}, c.tie_embeddings ? embed : w("lm_head.weight", {V, C}, vocab)},
                             C, V, T, /*bias=*/false, NormKind::rmsnorm, c.norm_eps));
  return m;
}

}  // namespace

std::vector<std::string> ModelSpec::tied() const {
  std::map<std::string, int> uses;
  std::vector<std::string> out;
  for (const BlockSpec& b : blocks)
    for (const ParamSpec& p : b.params)
      if (++uses[p.name] == 2) out.push_back(p.name);
  return out;
}

double ModelSpec::attention_flops_per_row() const {
  double f = 0;
  for (const BlockSpec& b : blocks) f += b.attn_flops;
  return f;
}

std::string ModelSpec::tp_shard(int tp, int r) const {
  if (tp == 1 || !language_model) return "whole blocks";
  auto range = [&](const char* what, int64_t n) {
    return cat(what, " [", tp_begin(n, tp, r), ", ", tp_end(n, tp, r), ") of ", n);
  };
  for (const BlockSpec& b : blocks) {
    if (b.kind == BlockKind::transformer)
      return cat(range("heads", b.n_head), ", ", range("MLP units", 4 * b.in), ", ", range("vocabulary", output_dim));
    if (b.kind == BlockKind::llama_layer)
      return cat(range("query heads", b.n_head), ", ", range("key/value heads", b.n_kv_head), ", ",
                 range("SwiGLU units", b.ffn_hidden), ", ", range("vocabulary", output_dim));
  }
  return range("vocabulary", output_dim);
}

ModelSpec make_model_spec(const Config& cfg, int64_t input_dim) {
  ModelSpec m = cfg.model.is_gpt() ? gpt_spec(cfg) : cfg.model.llama_like() ? llama_spec(cfg) : mlp_spec(cfg, input_dim);
  for (size_t i = 0; i < m.blocks.size(); ++i) m.blocks[i].index = static_cast<int>(i);
  for (BlockSpec& b : m.blocks) b.dtype = compute_dtype(cfg.train.precision);
  if (cfg.parallel.sequence_parallel && m.language_model && cfg.parallel.tp > 1)
    for (BlockSpec& b : m.blocks) b.sp = static_cast<int>(cfg.parallel.tp);
  return m;
}

void allocate_buffers(Backend& be, const std::vector<BufferSpec>& specs, std::vector<Tensor>& out) {
  out.clear();
  for (const BufferSpec& b : specs) out.emplace_back(be, b.shape, b.dtype);
}

std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  switch (spec.kind) {
    case BlockKind::embedding:
    case BlockKind::transformer:
    case BlockKind::head: return gpt_saved_shapes(spec, rows, tp);
    case BlockKind::llama_layer: return llama_saved_shapes(spec, rows, tp);
    default: return mlp_saved_shapes(spec, rows);
  }
}

int64_t saved_bytes(const BlockSpec& spec, int64_t rows, int tp) {
  int64_t n = 0;
  for (const BufferSpec& b : saved_shapes(spec, rows, tp)) n += shape_numel(b.shape) * int64_t(dtype_size(b.dtype));
  return n;
}

int64_t block_out_width(const BlockSpec& spec, int tp, int tp_rank) {
  if (spec.kind != BlockKind::head) return spec.out;
  return tp_end(spec.out, tp, tp_rank) - tp_begin(spec.out, tp, tp_rank);
}

std::unique_ptr<Block> make_block(const BlockSpec& spec, ParamStore& store, const TensorParallel& tp,
                                  const ContextParallel& cp, const ExpertParallel& ep) {
  std::vector<Param*> params;
  for (size_t i = 0; i < spec.params.size(); ++i)
    if (ep.holds(spec, i)) params.push_back(store.get(spec.params[i]));
  switch (spec.kind) {
    case BlockKind::embedding:
    case BlockKind::transformer:
    case BlockKind::head: return make_gpt_block(spec, std::move(params), tp, cp);
    case BlockKind::llama_layer: return make_llama_block(spec, std::move(params), tp, cp, ep);
    default: return make_mlp_block(spec, std::move(params));
  }
}

}  // namespace relay
