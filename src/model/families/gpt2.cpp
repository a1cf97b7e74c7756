// GPT-2 (model.type = "gpt"): GPT-2's decoder with nanoGPT's state_dict names, which are transformers'
// GPT2LMHeadModel's. Weights N(0, init_std) from (model.seed, name), c_proj weights N(0, init_std / sqrt(2 n_layer)),
// biases 0, layernorms 1 and 0. Hugging Face: model_type "gpt2"; its Conv1D layers store their weights (in, out).
#include <cmath>
#include <cstring>

#include "model/family.hpp"

namespace relay {

namespace {

struct GptArgs : FamilyArgs {
  bool bias = true;  // biases in every linear layer and layernorm (GPT-2 has them)
  std::unique_ptr<FamilyArgs> clone() const override { return std::make_unique<GptArgs>(*this); }
};

class Gpt2Family final : public ModelFamily {
 public:
  const char* name() const override { return "gpt"; }
  bool language_model() const override { return true; }
  std::set<std::string> keys() const override {
    std::set<std::string> k = kLanguageModelKeys;
    k.insert("bias");
    return k;
  }

  void parse_keys(const ConfigSection& model, Config::Model& m) const override {
    parse_language_model_keys(model, m, /*tie_default=*/true);
    model.boolean("bias", m.edit_args<GptArgs>().bias);
  }

  void write_keys(std::ostream& o, const Config::Model& m) const override {
    write_language_model_shape(o, m);
    o << "\nbias = " << (m.args<GptArgs>().bias ? "true" : "false");
    write_language_model_init(o, m);
  }

  ModelSpec blocks(const Config& cfg, int64_t) const override {
    const auto& c = cfg.model;
    const bool bias = c.args<GptArgs>().bias;
    const int64_t V = c.vocab_size, T = c.block_size, C = c.n_embd, L = c.n_layer;
    const double std_w = c.init_std, std_proj = c.init_std / std::sqrt(2.0 * double(L));
    auto normal = [](const std::string& name, double s) { return ParamInit{ParamInit::normal, s, name_stream(name), 0}; };
    auto w = [&](const std::string& name, Shape shape, double s, TpSplit split = {}) {
      return ParamSpec{name, std::move(shape), normal(name, s), split};
    };
    auto constant = param_constant;
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
      b.bias = bias;
      auto add = [&](ParamSpec s, bool present = true) { if (present) b.params.push_back(std::move(s)); };
      add({p + "ln_1.weight", {C}, constant(1)});
      add({p + "ln_1.bias", {C}, constant(0)}, bias);
      add(fp8_gemm(w(p + "attn.c_attn.weight", {3 * C, C}, std_w, qkv)));
      add({p + "attn.c_attn.bias", {3 * C}, constant(0), qkv}, bias);
      add(fp8_gemm(w(p + "attn.c_proj.weight", {C, C}, std_proj, row)));
      add({p + "attn.c_proj.bias", {C}, constant(0)}, bias);
      add({p + "ln_2.weight", {C}, constant(1)});
      add({p + "ln_2.bias", {C}, constant(0)}, bias);
      add(fp8_gemm(w(p + "mlp.c_fc.weight", {4 * C, C}, std_w, col)));
      add({p + "mlp.c_fc.bias", {4 * C}, constant(0), col}, bias);
      add(fp8_gemm(w(p + "mlp.c_proj.weight", {C, 4 * C}, std_proj, row)));
      add({p + "mlp.c_proj.bias", {C}, constant(0)}, bias);
      // Per token: 2 x (3C^2 + C^2 + 4C^2 + 4C^2) in the projections, 2 x 2 x T x C in QK^T and att @ V.
      b.attn_flops = 4.0 * double(T) * double(C);
      b.flops = 24.0 * double(C) * double(C) + b.attn_flops;
      b.recomputable = true;
      m.blocks.push_back(std::move(b));
    }

    std::vector<ParamSpec> head = {{"transformer.ln_f.weight", {C}, constant(1)}};
    if (bias) head.push_back({"transformer.ln_f.bias", {C}, constant(0)});
    head.push_back(c.tie_embeddings ? wte : w("lm_head.weight", {V, C}, std_w, vocab));
    m.blocks.push_back(lm_head(std::move(head), C, V, T, bias, NormKind::layernorm, 1e-5));
    return m;
  }

  const char* hf_model_type() const override { return "gpt2"; }
  const char* hf_architecture() const override { return "GPT2LMHeadModel"; }

  void hf_config(nlohmann::ordered_json& c, const Config::Model& m, const std::string& where) const override {
    if (!m.args<GptArgs>().bias)
      throw Error(cat(where, ": model.bias = false: transformers' GPT2LMHeadModel always has biases, so this GPT "
                             "has no Hugging Face form"));
    c["vocab_size"] = m.vocab_size;
    c["n_positions"] = m.block_size;
    c["n_embd"] = m.n_embd;
    c["n_layer"] = m.n_layer;
    c["n_head"] = m.n_head;
    c["n_inner"] = nullptr;                  // 4 * n_embd, as Relay's MLP
    c["activation_function"] = "gelu_new";   // GELU, tanh approximation
    c["layer_norm_epsilon"] = 1e-5;
    c["resid_pdrop"] = c["embd_pdrop"] = c["attn_pdrop"] = 0.0;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
  }

  void hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where) const override {
    hf_check_pairs(config,
                   {{"vocab_size", 50257, "vocab_size", m.vocab_size}, {"n_positions", 1024, "block_size", m.block_size},
                    {"n_embd", 768, "n_embd", m.n_embd}, {"n_layer", 12, "n_layer", m.n_layer},
                    {"n_head", 12, "n_head", m.n_head}, {"tie_word_embeddings", true, "tie_embeddings", m.tie_embeddings}},
                   where);
    const nlohmann::json act = hf_value_or(config, "activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      throw Error(cat(where, ": config.json activation_function = ", act.dump(),
                      " but Relay's GPT uses GELU with the tanh approximation (\"gelu_new\")"));
    if (!m.args<GptArgs>().bias)
      throw Error(cat(where, ": config.json is a GPT-2 (which has biases) but model.bias = false"));
    hf_check_fixed(config,
                   {{"layer_norm_epsilon", 1e-5, 1e-5, "Relay's GPT layernorm"},
                    {"n_inner", 4 * m.n_embd, 4 * m.n_embd, "Relay's GPT MLP is 4 * n_embd wide"},
                    {"scale_attn_by_inverse_layer_idx", false, false, "Relay's GPT attention"}},
                   where);
  }

  bool hf_transposed(const std::string& name) const override {
    if (name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) return false;
    for (const char* conv1d : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
      const size_t n = std::strlen(conv1d);
      if (name.size() > n && name.compare(name.size() - n, n, conv1d) == 0) return true;
    }
    return false;
  }
};

}  // namespace

const ModelFamily& gpt2_family() {
  static const Gpt2Family f;
  return f;
}

}  // namespace relay
