// Llama (model.type = "llama"): transformers' LlamaForCausalLM, and the decoder the MoE families share
// (llama.hpp). Hugging Face: model_type "llama", the same state_dict names as Relay's.
#include "model/families/llama.hpp"

#include <algorithm>

namespace relay {

bool MoeArgs::moe_layer(int64_t i) const {
  for (int64_t d : mlp_only_layers)
    if (d == i) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

std::set<std::string> llama_keys() {
  std::set<std::string> k = kLanguageModelKeys;
  k.insert({"n_kv_head", "ffn_hidden", "rope_theta", "norm_eps"});
  return k;
}

void parse_llama_keys(const ConfigSection& model, Config::Model& m, LlamaArgs& a, bool ffn_required) {
  parse_language_model_keys(model, m, /*tie_default=*/false);  // Llama's default: an untied lm_head
  a.n_kv_head = m.n_head;
  model.integer("n_kv_head", a.n_kv_head, 1, 1 << 16);
  model.integer("ffn_hidden", a.ffn_hidden, 1, int64_t(1) << 24, ffn_required);
  model.real("rope_theta", a.rope_theta, 0, 1e12, true);
  model.real("norm_eps", a.norm_eps, 0, 1, true);
  if (m.n_head % a.n_kv_head != 0)
    model.fail("n_kv_head", cat("= ", a.n_kv_head, " must divide model.n_head = ", m.n_head,
                                " (each key/value head serves n_head / n_kv_head query heads)"));
}

void check_rotary_head_size(const ConfigSection& model, const Config::Model& m) {
  const LlamaArgs& a = m.args<LlamaArgs>();
  const int64_t hd = a.head_size(m);
  if (hd % 2 != 0)
    model.fail(a.head_dim > 0 ? "head_dim" : "n_head",
               cat("gives head size ", hd, "; rotary embeddings need an even head size (",
                   a.head_dim > 0 ? "head_dim" : "n_embd / n_head", ")"));
}

void write_llama_keys(std::ostream& o, const Config::Model& m) {
  const LlamaArgs& a = m.args<LlamaArgs>();
  write_language_model_shape(o, m);
  write_language_model_init(o, m);
  o << "n_kv_head = " << a.n_kv_head << (a.ffn_hidden > 0 ? cat("\nffn_hidden = ", a.ffn_hidden) : "")
    << "\nrope_theta = " << toml_number(a.rope_theta) << "\nnorm_eps = " << toml_number(a.norm_eps) << "\n";
}

std::vector<TpDivides> llama_tp_divides(const Config::Model& m, bool experts) {
  const LlamaArgs& a = m.args<LlamaArgs>();
  std::vector<TpDivides> d;
  if (experts)
    d.push_back({"moe_ffn_hidden", m.args<MoeArgs>().moe_ffn_hidden,
                 " (each expert's SwiGLU units are split over the tp ranks)"});
  d.push_back({"n_kv_head", a.n_kv_head, " (each tensor-parallel rank holds whole key/value heads)"});
  d.push_back({"ffn_hidden", a.ffn_hidden, ""});  // 0 (divisible) when a MoE has no dense layers
  return d;
}

void check_llama_tp(const ConfigSection& parallel, const Config& c, bool experts) {
  if (c.parallel.tp > 1)
    for (const TpDivides& d : llama_tp_divides(c.model, experts))
      if (d.value % c.parallel.tp != 0)
        parallel.fail("tp", cat("= ", c.parallel.tp, " must divide model.", d.key, " = ", d.value, d.why));
}

bool llama_tp_splits(const Config::Model& m, int tp, bool experts) {
  if (m.n_head % tp || m.vocab_size < tp) return false;
  for (const TpDivides& d : llama_tp_divides(m, experts))
    if (d.value % tp) return false;
  return true;
}

ModelSpec llama_blocks(const Config& cfg, const ExpertNames* experts, bool qk_norm) {
  const auto& c = cfg.model;
  const LlamaArgs& a = c.args<LlamaArgs>();
  const MoeArgs* moe_args = experts ? &c.args<MoeArgs>() : nullptr;
  const int64_t V = c.vocab_size, T = c.block_size, C = c.n_embd, L = c.n_layer, F = a.ffn_hidden;
  const int64_t hd = a.head_size(c), Hq = c.n_head * hd, Hkv = a.n_kv_head * hd;
  auto moe_layer = [&](int64_t i) { return moe_args && moe_args->moe_layer(i); };
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < L; ++i) moe_layers += moe_layer(i) ? 1 : 0;
  const double sequences = double(std::max<int64_t>(cfg.train.batch_size, 1));  // of the global batch
  auto w = [&](const std::string& name, Shape shape, TpSplit split = {}) {
    return ParamSpec{name, std::move(shape), ParamInit{ParamInit::normal, c.init_std, name_stream(name), 0}, split};
  };
  auto constant = param_constant;
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
    b.n_kv_head = a.n_kv_head;
    b.ffn_hidden = F;
    b.rope_theta = a.rope_theta;
    b.eps = a.norm_eps;
    b.bias = false;
    b.head_dim = hd;
    b.qk_norm = qk_norm;
    b.params = {{p + "input_layernorm.weight", {C}, constant(1)},
                fp8_gemm(w(p + "self_attn.q_proj.weight", {Hq, C}, col)),
                fp8_gemm(w(p + "self_attn.k_proj.weight", {Hkv, C}, col)),
                fp8_gemm(w(p + "self_attn.v_proj.weight", {Hkv, C}, col)),
                fp8_gemm(w(p + "self_attn.o_proj.weight", {C, Hq}, row))};
    if (b.qk_norm) {
      b.params.push_back({p + "self_attn.q_norm.weight", {hd}, constant(1)});
      b.params.push_back({p + "self_attn.k_norm.weight", {hd}, constant(1)});
    }
    b.params.push_back({p + "post_attention_layernorm.weight", {C}, constant(1)});
    // Per token: 2 x (q, k, v, o) + 2 x 3 C F in the MLP (2 x (E C + k x 3 C F_moe) with experts), 2 x 2 x T x Hq
    // in QK^T and att @ V.
    double mlp_flops = 6.0 * double(C) * double(F);
    if (moe_layer(i)) {
      const MoeArgs& e = *moe_args;
      const int64_t E = e.n_experts, Fe = e.moe_ffn_hidden;
      b.moe = {E, e.experts_per_token, Fe, experts->always_renormalise || e.norm_topk_prob,
               e.router_aux_loss_coef / (double(moe_layers) * sequences),
               e.router_z_loss_coef / (double(moe_layers) * sequences * double(T)), 0, cfg.moe.expert_bias};
      b.moe.aux_coef = e.router_aux_loss_coef;
      b.moe.z_coef = e.router_z_loss_coef;
      for (const BlockSpec& prev : m.blocks) b.moe.layer += prev.moe.on() ? 1 : 0;
      const std::string moe = p + experts->block;
      b.params.push_back(w(moe + "gate.weight", {E, C}));
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = moe + "experts." + std::to_string(e) + ".";
        // Tensor parallelism splits each expert like the dense SwiGLU; the router stays whole.
        b.params.push_back(fp8_expert(w(x + experts->gate + ".weight", {Fe, C}, col)));
        b.params.push_back(fp8_expert(w(x + experts->up + ".weight", {Fe, C}, col)));
        b.params.push_back(fp8_expert(w(x + experts->down + ".weight", {C, Fe}, row)));
      }
      mlp_flops = 2.0 * double(C) * double(E) + double(e.experts_per_token) * 6.0 * double(C) * double(Fe);
    } else {
      b.params.push_back(fp8_gemm(w(p + "mlp.gate_proj.weight", {F, C}, col)));
      b.params.push_back(fp8_gemm(w(p + "mlp.up_proj.weight", {F, C}, col)));
      b.params.push_back(fp8_gemm(w(p + "mlp.down_proj.weight", {C, F}, row)));
    }
    b.attn_flops = 4.0 * double(T) * double(Hq);
    b.flops = 2.0 * double(C) * double(2 * Hq + 2 * Hkv) + mlp_flops + b.attn_flops;
    b.recomputable = true;
    m.blocks.push_back(std::move(b));
  }

  m.blocks.push_back(lm_head({{"model.norm.weight", {C}, constant(1)}, c.tie_embeddings ? embed : w("lm_head.weight", {V, C}, vocab)},
                             C, V, T, /*bias=*/false, NormKind::rmsnorm, a.norm_eps));
  return m;
}

void llama_hf_config(nlohmann::ordered_json& c, const Config::Model& m, int64_t intermediate_size,
                     const std::function<void(nlohmann::ordered_json&)>& experts) {
  const LlamaArgs& a = m.args<LlamaArgs>();
  c["vocab_size"] = m.vocab_size;
  c["hidden_size"] = m.n_embd;
  c["intermediate_size"] = intermediate_size;
  c["num_hidden_layers"] = m.n_layer;
  c["num_attention_heads"] = m.n_head;
  c["num_key_value_heads"] = a.n_kv_head;
  c["head_dim"] = a.head_size(m);
  if (experts) experts(c);
  c["max_position_embeddings"] = m.block_size;
  c["rms_norm_eps"] = a.norm_eps;
  c["rope_theta"] = a.rope_theta;  // transformers 4.x
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};  // transformers 5
  c["hidden_act"] = "silu";
  c["attention_bias"] = false;
  if (!experts) c["mlp_bias"] = false;
  c["attention_dropout"] = 0.0;
  if (!experts) c["pretraining_tp"] = 1;
}

void llama_hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where,
                    const std::vector<HfKeyPair>& mlp_pairs, const std::vector<HfFixedKey>& extra_fixed,
                    const char* window) {
  using json = nlohmann::json;
  const LlamaArgs& a = m.args<LlamaArgs>();
  const json rope = hf_value_or(config, "rope_parameters", json::object());
  std::vector<HfKeyPair> pairs = {
      {"vocab_size", 32000, "vocab_size", m.vocab_size}, {"hidden_size", 4096, "n_embd", m.n_embd},
      {"num_hidden_layers", 32, "n_layer", m.n_layer}, {"num_attention_heads", 32, "n_head", m.n_head},
      {"num_key_value_heads", hf_value_or(config, "num_attention_heads", 32), "n_kv_head", a.n_kv_head},
      {"rms_norm_eps", 1e-6, "norm_eps", a.norm_eps},
      {"rope_theta", rope.value("rope_theta", 10000.0), "rope_theta", a.rope_theta},
      {"tie_word_embeddings", false, "tie_embeddings", m.tie_embeddings}};
  pairs.insert(pairs.end(), mlp_pairs.begin(), mlp_pairs.end());
  hf_check_pairs(config, pairs, where);
  // Keys with no Relay counterpart: the architecture Relay computes is fixed there.
  const int64_t hd = a.head_dim > 0 ? a.head_dim : m.n_embd / std::max<int64_t>(1, m.n_head);
  std::vector<HfFixedKey> fixed = {{"hidden_act", "silu", "silu", "Relay's Llama MLP is SwiGLU"},
                                   {"attention_bias", false, false, "Relay's Llama has no biases"},
                                   {"mlp_bias", false, false, "Relay's Llama has no biases"},
                                   {"head_dim", m.n_embd / std::max<int64_t>(1, m.n_head), hd,
                                    a.head_dim > 0 ? "model.head_dim" : "Relay's heads are n_embd / n_head wide"},
                                   {"rope_scaling", nullptr, nullptr, "Relay applies plain rotary embeddings"}};
  fixed.insert(fixed.end(), extra_fixed.begin(), extra_fixed.end());
  if (window && !hf_value_or(config, window, nullptr).is_null() && hf_value_or(config, window, nullptr) != false)
    throw Error(cat(where, ": config.json ", window, " = ", config[window].dump(),
                    " but Relay's attention is causal over the whole block (no sliding window)"));
  if (rope.value("rope_type", "default") != "default")
    throw Error(cat(where, ": config.json rope_parameters.rope_type = \"", rope.value("rope_type", ""),
                    "\" but Relay applies plain rotary embeddings (\"default\")"));
  const json max_pos = hf_value_or(config, "max_position_embeddings", 2048);
  if (!max_pos.is_number() || max_pos.get<double>() < double(m.block_size))
    throw Error(cat(where, ": config.json max_position_embeddings = ", max_pos.dump(), " but model.block_size = ",
                    m.block_size, " is longer"));
  hf_check_fixed(config, fixed, where);
}

namespace {

class LlamaFamily final : public ModelFamily {
 public:
  const char* name() const override { return "llama"; }
  bool language_model() const override { return true; }
  std::set<std::string> keys() const override { return llama_keys(); }

  void parse_keys(const ConfigSection& model, Config::Model& m) const override {
    parse_llama_keys(model, m, m.edit_args<LlamaArgs>(), /*ffn_required=*/true);
    check_rotary_head_size(model, m);
  }

  void check_layout(const ConfigSection& parallel, const Config& c) const override {
    check_llama_tp(parallel, c, /*experts=*/false);
  }

  void write_keys(std::ostream& o, const Config::Model& m) const override { write_llama_keys(o, m); }

  ModelSpec blocks(const Config& cfg, int64_t) const override { return llama_blocks(cfg, nullptr, false); }

  bool tp_splits(const Config::Model& m, int tp) const override { return llama_tp_splits(m, tp, /*experts=*/false); }

  const char* hf_model_type() const override { return "llama"; }
  const char* hf_architecture() const override { return "LlamaForCausalLM"; }

  void hf_config(nlohmann::ordered_json& c, const Config::Model& m, const std::string&) const override {
    llama_hf_config(c, m, m.args<LlamaArgs>().ffn_hidden, nullptr);
  }

  void hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where) const override {
    llama_hf_check(config, m, where, {{"intermediate_size", 11008, "ffn_hidden", m.args<LlamaArgs>().ffn_hidden}}, {},
                   nullptr);
  }
};

}  // namespace

const ModelFamily& llama_family() {
  static const LlamaFamily f;
  return f;
}

}  // namespace relay
