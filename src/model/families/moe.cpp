// The mixtures of experts on Llama's decoder (llama.hpp): Mixtral (model.type = "mixtral", transformers'
// MixtralForCausalLM) and Qwen3-MoE ("qwen3_moe", Qwen3MoeForCausalLM). They differ in names (Mixtral's experts under
// block_sparse_moe.experts.E.w1 / w3 / w2 (gate, up, down) and its router block_sparse_moe.gate, Qwen3-MoE's under
// mlp.experts.E.gate_proj / up_proj / down_proj and mlp.gate) and in Qwen3-MoE's extra keys: dense layers
// (mlp_only_layers, decoder_sparse_step), norm_topk_prob, head_dim and per-head q_norm and k_norm.
#include "model/families/llama.hpp"

namespace relay {

namespace {

class MoeFamily final : public ModelFamily {
 public:
  explicit MoeFamily(bool qwen) : qwen_(qwen) {}
  const char* name() const override { return qwen_ ? "qwen3_moe" : "mixtral"; }
  bool language_model() const override { return true; }
  bool has_experts() const override { return true; }
  std::set<std::string> keys() const override {
    std::set<std::string> k = llama_keys();
    k.insert({"n_experts", "experts_per_token", "moe_ffn_hidden", "router_aux_loss_coef", "router_z_loss_coef"});
    if (qwen_) k.insert({"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "head_dim"});
    return k;
  }

  // Mixtral's answers to Qwen3-MoE's keys.
  std::string foreign_key(const std::string& key, const std::vector<const ModelKeys*>& owners) const override {
    const char* instead = key == "norm_topk_prob" ? "always renormalised top-k weights"
                          : key == "head_dim"     ? "head size n_embd / n_head"
                          : key == "decoder_sparse_step" || key == "mlp_only_layers" ? "experts in every layer"
                                                                                     : nullptr;
    if (qwen_ || !instead) return ModelFamily::foreign_key(key, owners);
    return cat("is a qwen3_moe key; model.type = \"mixtral\" has ", instead);
  }

  void parse_keys(const ConfigSection& model, Config::Model& m) const override {
    MoeArgs& a = m.edit_args<MoeArgs>();
    parse_llama_keys(model, m, a, /*ffn_required=*/false);
    model.integer("n_experts", a.n_experts, 1, 1 << 16, true);
    model.integer("experts_per_token", a.experts_per_token, 1, 1 << 16, true);
    if (a.experts_per_token > a.n_experts)
      model.fail("experts_per_token", cat("= ", a.experts_per_token, " is more than model.n_experts = ", a.n_experts,
                                          " (each token picks experts_per_token distinct experts)"));
    model.integer("moe_ffn_hidden", a.moe_ffn_hidden, 1, int64_t(1) << 24, true);
    a.norm_topk_prob = !qwen_;  // Mixtral renormalises; Qwen3MoeConfig's default is false
    model.boolean("norm_topk_prob", a.norm_topk_prob);
    model.integer("decoder_sparse_step", a.decoder_sparse_step, 1, 1 << 16);
    model.integer("head_dim", a.head_dim, 1, 1 << 16);
    model.real("router_aux_loss_coef", a.router_aux_loss_coef, 0, 1e6);
    model.real("router_z_loss_coef", a.router_z_loss_coef, 0, 1e6);
    if (auto* l = model.get("mlp_only_layers")) {
      auto* arr = l->as_array();
      if (!arr) model.fail("mlp_only_layers", cat("expected an array of layer indices, got ", toml_type_name(*l)));
      for (auto& e : *arr) {
        if (!e.is_integer() || e.value<int64_t>().value() < 0 || e.value<int64_t>().value() >= m.n_layer)
          model.fail("mlp_only_layers", cat("every entry must be a layer index in [0, model.n_layer = ", m.n_layer, ")"));
        a.mlp_only_layers.push_back(e.value<int64_t>().value());
      }
    }
    if (has_dense_layers(m) && a.ffn_hidden == 0)
      model.fail("ffn_hidden", "required key is missing: some layers are dense (model.mlp_only_layers, "
                               "model.decoder_sparse_step) and use a SwiGLU of ffn_hidden units");
    check_rotary_head_size(model, m);
  }

  void check_layout(const ConfigSection& parallel, const Config& c) const override {
    check_llama_tp(parallel, c, /*experts=*/true);
    const int64_t E = experts(c.model);
    if (E % c.parallel.ep != 0)
      parallel.fail("ep", cat("= ", c.parallel.ep, " must divide model.n_experts = ", E,
                              " (each rank holds n_experts / ep whole experts)"));
  }

  void write_keys(std::ostream& o, const Config::Model& m) const override {
    const MoeArgs& a = m.args<MoeArgs>();
    write_llama_keys(o, m);
    o << "n_experts = " << a.n_experts << "\nexperts_per_token = " << a.experts_per_token
      << "\nmoe_ffn_hidden = " << a.moe_ffn_hidden << "\nrouter_aux_loss_coef = "
      << toml_number(a.router_aux_loss_coef) << "\nrouter_z_loss_coef = " << toml_number(a.router_z_loss_coef) << "\n";
    if (qwen_) {
      o << "norm_topk_prob = " << (a.norm_topk_prob ? "true" : "false")
        << "\ndecoder_sparse_step = " << a.decoder_sparse_step << "\nmlp_only_layers = [";
      for (size_t i = 0; i < a.mlp_only_layers.size(); ++i) o << (i ? ", " : "") << a.mlp_only_layers[i];
      o << "]\n";
      if (a.head_dim > 0) o << "head_dim = " << a.head_dim << "\n";
    }
  }

  ModelSpec blocks(const Config& cfg, int64_t) const override {
    static const ExpertNames mixtral{"block_sparse_moe.", "w1", "w3", "w2", true};
    static const ExpertNames qwen{"mlp.", "gate_proj", "up_proj", "down_proj", false};
    return llama_blocks(cfg, qwen_ ? &qwen : &mixtral, /*qk_norm=*/qwen_);
  }

  bool tp_splits(const Config::Model& m, int tp) const override { return llama_tp_splits(m, tp, /*experts=*/true); }
  int64_t experts(const Config::Model& m) const override { return m.args<MoeArgs>().n_experts; }

  const char* hf_model_type() const override { return name(); }  // transformers' model_type spells them so
  const char* hf_architecture() const override { return qwen_ ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM"; }

  void hf_config(nlohmann::ordered_json& c, const Config::Model& m, const std::string&) const override {
    const MoeArgs& a = m.args<MoeArgs>();
    // Mixtral's intermediate_size is an expert's width; Qwen3-MoE's the dense layers' (moe_intermediate_size the
    // experts').
    const int64_t intermediate = !qwen_ ? a.moe_ffn_hidden : a.ffn_hidden > 0 ? a.ffn_hidden : a.moe_ffn_hidden;
    llama_hf_config(c, m, intermediate, [&](nlohmann::ordered_json& c) {
      if (!qwen_) {
        c["num_local_experts"] = a.n_experts;
        c["num_experts_per_tok"] = a.experts_per_token;
        c["router_jitter_noise"] = 0.0;
        c["sliding_window"] = nullptr;
      } else {
        c["num_experts"] = a.n_experts;
        c["num_experts_per_tok"] = a.experts_per_token;
        c["moe_intermediate_size"] = a.moe_ffn_hidden;
        c["norm_topk_prob"] = a.norm_topk_prob;
        c["decoder_sparse_step"] = a.decoder_sparse_step;
        c["mlp_only_layers"] = a.mlp_only_layers;
        c["use_sliding_window"] = false;
        c["sliding_window"] = nullptr;
      }
      c["router_aux_loss_coef"] = a.router_aux_loss_coef;
      c["output_router_logits"] = false;
    });
  }

  void hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where) const override {
    const MoeArgs& a = m.args<MoeArgs>();
    // The MLP's keys, with transformers' defaults for each class.
    if (!qwen_) {
      llama_hf_check(config, m, where,
                     {{"intermediate_size", 14336, "moe_ffn_hidden", a.moe_ffn_hidden},
                      {"num_local_experts", 8, "n_experts", a.n_experts},
                      {"num_experts_per_tok", 2, "experts_per_token", a.experts_per_token}},
                     {{"router_jitter_noise", 0.0, 0.0, "Relay's router adds no noise"}}, "sliding_window");
      return;
    }
    std::vector<HfKeyPair> pairs = {
        {"moe_intermediate_size", 768, "moe_ffn_hidden", a.moe_ffn_hidden},
        // transformers 4 (and Qwen's published configs) say num_experts; 5 writes num_local_experts
        {config.contains("num_local_experts") ? "num_local_experts" : "num_experts", 128, "n_experts", a.n_experts},
        {"num_experts_per_tok", 8, "experts_per_token", a.experts_per_token},
        {"norm_topk_prob", false, "norm_topk_prob", a.norm_topk_prob},
        {"decoder_sparse_step", 1, "decoder_sparse_step", a.decoder_sparse_step},
        {"mlp_only_layers", nlohmann::json::array(), "mlp_only_layers", a.mlp_only_layers}};
    if (has_dense_layers(m)) pairs.push_back({"intermediate_size", 6144, "ffn_hidden", a.ffn_hidden});
    llama_hf_check(config, m, where, pairs, {}, "use_sliding_window");
  }

  // transformers 5's modules hold a layer's experts fused, gate_up_proj (E, 2F, C) ([gate; up] per expert) and
  // down_proj (E, C, F), and name Mixtral's block mlp; save_pretrained writes the per-expert names Relay uses. A
  // directory in the fused form is read as if it held the per-expert tensors.
  void hf_import_names(std::map<std::string, Shape>& shapes,
                       std::map<std::string, std::pair<std::string, int64_t>>& slices) const override {
    const bool mixtral = !qwen_;
    auto ends = [](const std::string& n, const std::string& tail) {
      return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    // transformers 5's "model.layers.N.mlp" -> Relay's prefix of that layer's experts and router.
    auto block = [&](const std::string& mlp) {
      return mixtral && ends(mlp, ".mlp") ? mlp.substr(0, mlp.size() - 4) + ".block_sparse_moe" : mlp;
    };
    if (mixtral) hf_split_fused_experts(shapes, slices, {"w1", "w3", "w2"}, block);
    else hf_split_fused_experts(shapes, slices, {"gate_proj", "up_proj", "down_proj"});
    if (!mixtral) return;
    std::map<std::string, Shape> out;
    for (auto& [name, shape] : shapes) {
      if (ends(name, ".mlp.gate.weight")) {
        const std::string relay = block(name.substr(0, name.size() - 12)) + ".gate.weight";
        slices[relay] = {name, -1};
        out[relay] = shape;
      } else {
        out[name] = shape;
      }
    }
    shapes = std::move(out);
  }

 private:
  bool qwen_;

  static bool has_dense_layers(const Config::Model& m) {
    bool dense = false;
    for (int64_t i = 0; i < m.n_layer; ++i) dense = dense || !m.args<MoeArgs>().moe_layer(i);
    return dense;
  }
};

}  // namespace

const ModelFamily& mixtral_family() {
  static const MoeFamily f(/*qwen=*/false);
  return f;
}

const ModelFamily& qwen3_moe_family() {
  static const MoeFamily f(/*qwen=*/true);
  return f;
}

}  // namespace relay
