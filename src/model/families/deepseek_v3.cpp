// DeepSeek-V3 (model.type = "deepseek_v3"): transformers' DeepseekV3ForCausalLM (DeepSeek-AI, arXiv:2412.19437):
// multi-head latent attention (model/mla_blocks.cpp) in every layer, Llama's RMSNorms and SwiGLU in the first
// first_k_dense_replace layers, DeepSeek-V3's mixture of experts (model/moe.hpp: sigmoid scores, group-limited top-k,
// shared experts, e_score_correction_bias = moe.expert_bias) in the others. Keys as config.json names them, Relay's
// spelling where Relay has one (hidden_size = n_embd, ...; Relay's per-sequence aux loss as router_aux_loss_coef).
// rope_scaling = "yarn": YaRN (arXiv:2309.00071) as transformers' _compute_yarn_parameters and DeepseekV3Attention
// apply it, config.json's rope_scaling (rope_parameters) dict flattened into rope_-prefixed keys.
#include "model/families/llama.hpp"
#include "model/moe.hpp"

namespace relay {

namespace {

// Llama's keys (n_kv_head unused: MLA's keys and values are per head) and DeepSeek-V3's own.
struct DeepseekV3Args : LlamaArgs {
  // MLA. q_lora_rank 0: config.json's null, one q_proj.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128;
  bool rope_interleave = true;
  std::string rope_scaling = "none";
  // YaRN (rope_scaling = "yarn"): config.json's rope_scaling dict's keys with a rope_ prefix; 0 for mscale and
  // mscale_all_dim is config.json's absent (transformers tests them for truth).
  double rope_factor = 1, rope_beta_fast = 32, rope_beta_slow = 1;
  int64_t rope_original_max_position_embeddings = 0;
  double rope_mscale = 0, rope_mscale_all_dim = 0;
  bool yarn() const { return rope_scaling == "yarn"; }
  // The rotary tables' frequencies and cos/sin factor (kernels/rope_angles.hpp), and DeepSeek-V3's softmax scale
  // factor: transformers' yarn_apply_mscale multiplies qk_head_dim^-1/2 by yarn_get_mscale(factor, mscale_all_dim)^2.
  RopeScaling rope_tables() const {
    if (!yarn()) return {};
    return yarn_scaling(rope_factor, double(rope_original_max_position_embeddings), rope_beta_fast, rope_beta_slow,
                        rope_mscale, rope_mscale_all_dim, qk_rope_head_dim, rope_theta);
  }
  double softmax_mscale2() const {
    if (!yarn() || rope_mscale_all_dim == 0) return 1.0;
    const double m = yarn_mscale(rope_factor, rope_mscale_all_dim);
    return m * m;
  }
  // The mixture of experts (transformers' defaults), and multi-token prediction.
  int64_t n_routed_experts = 256, num_experts_per_tok = 8, moe_intermediate_size = 2048, n_shared_experts = 1;
  int64_t n_group = 8, topk_group = 4, first_k_dense_replace = 3, num_mtp_layers = 0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 2.5, mtp_loss_weight = 0.3;
  // Relay's per-sequence aux loss (model/moe.hpp; not in transformers' config: 0, as transformers trains).
  double router_aux_loss_coef = 0.0;
  bool moe_layer(int64_t i) const { return i >= first_k_dense_replace; }
  std::unique_ptr<FamilyArgs> clone() const override { return std::make_unique<DeepseekV3Args>(*this); }
};

class DeepseekV3Family final : public ModelFamily {
 public:
  const char* name() const override { return "deepseek_v3"; }
  bool language_model() const override { return true; }
  bool has_experts() const override { return true; }
  std::string without_expert_layers(const Config::Model& m) const override {
    if (moe_layers(m) > 0) return "";
    return cat("model.first_k_dense_replace = ", m.args<DeepseekV3Args>().first_k_dense_replace, " >= n_layer = ",
               m.n_layer, " makes every layer dense");
  }
  std::set<std::string> keys() const override {
    std::set<std::string> k = kLanguageModelKeys;
    k.insert({"ffn_hidden", "rope_theta", "norm_eps", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "rope_interleave", "rope_scaling", "rope_factor",
              "rope_original_max_position_embeddings", "rope_beta_fast", "rope_beta_slow", "rope_mscale",
              "rope_mscale_all_dim", "n_routed_experts",
              "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "n_group", "topk_group",
              "norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace", "num_mtp_layers",
              "mtp_loss_weight", "router_aux_loss_coef"});
    return k;
  }

  // Mixtral's and Qwen3-MoE's z-loss key: sigmoid scores have none (moe.hpp).
  std::string foreign_key(const std::string& key, const std::vector<const ModelKeys*>& owners) const override {
    if (key == "router_z_loss_coef")
      return "is not a deepseek_v3 key: DeepSeek-V3's sigmoid router has no z-loss (router_aux_loss_coef sets its "
             "per-sequence load-balancing loss)";
    return ModelFamily::foreign_key(key, owners);
  }

  void parse_keys(const ConfigSection& model, Config::Model& m) const override {
    DeepseekV3Args& a = m.edit_args<DeepseekV3Args>();
    parse_language_model_keys(model, m, /*tie_default=*/false);
    model.integer("ffn_hidden", a.ffn_hidden, 1, int64_t(1) << 24, true);
    model.real("rope_theta", a.rope_theta, 0, 1e12, true);
    model.real("norm_eps", a.norm_eps, 0, 1, true);
    model.integer("q_lora_rank", a.q_lora_rank, 0, int64_t(1) << 20);
    model.integer("kv_lora_rank", a.kv_lora_rank, 1, int64_t(1) << 20, true);
    model.integer("qk_nope_head_dim", a.qk_nope_head_dim, 1, 1 << 16);
    model.integer("qk_rope_head_dim", a.qk_rope_head_dim, 2, 1 << 16);
    model.integer("v_head_dim", a.v_head_dim, 1, 1 << 16);
    model.boolean("rope_interleave", a.rope_interleave);
    model.str("rope_scaling", a.rope_scaling);
    if (a.qk_rope_head_dim % 2 != 0)
      model.fail("qk_rope_head_dim", cat("= ", a.qk_rope_head_dim, ": rotary embeddings need an even width"));
    model.choice("rope_scaling", a.rope_scaling, {"none", "yarn"});
    parse_yarn(model, a);
    model.integer("n_routed_experts", a.n_routed_experts, 1, 1 << 16);
    model.integer("num_experts_per_tok", a.num_experts_per_tok, 1, 1 << 16);
    model.integer("moe_intermediate_size", a.moe_intermediate_size, 1, int64_t(1) << 24);
    model.integer("n_shared_experts", a.n_shared_experts, 0, 1 << 16);
    model.integer("n_group", a.n_group, 1, 1 << 16);
    model.integer("topk_group", a.topk_group, 1, 1 << 16);
    model.boolean("norm_topk_prob", a.norm_topk_prob);
    model.real("routed_scaling_factor", a.routed_scaling_factor, 0, 1e6, true);
    model.integer("first_k_dense_replace", a.first_k_dense_replace, 0, 1 << 16);
    model.integer("num_mtp_layers", a.num_mtp_layers, 0, 1 << 16);
    model.real("mtp_loss_weight", a.mtp_loss_weight, 0, 1e6);
    model.real("router_aux_loss_coef", a.router_aux_loss_coef, 0, 1e6);
    if (a.n_routed_experts % a.n_group != 0)
      model.fail("n_routed_experts", cat("= ", a.n_routed_experts, " must be divisible by model.n_group = ", a.n_group,
                                         " (the experts are routed in n_group equal groups)"));
    if (a.topk_group > a.n_group)
      model.fail("topk_group", cat("= ", a.topk_group, " is more than model.n_group = ", a.n_group,
                                   " (each token's experts come from topk_group of the n_group groups)"));
    if (a.num_experts_per_tok > a.n_routed_experts)
      model.fail("num_experts_per_tok", cat("= ", a.num_experts_per_tok, " is more than model.n_routed_experts = ",
                                            a.n_routed_experts, " (each token picks distinct experts)"));
    if (a.num_mtp_layers >= m.block_size)
      model.fail("num_mtp_layers", cat("= ", a.num_mtp_layers, " must be less than model.block_size = ", m.block_size,
                                       " (module k predicts the tokens k + 1 ahead of each of T - k positions)"));
  }

  void check_layout(const ConfigSection& parallel, const Config& c) const override {
    const DeepseekV3Args& a = c.model.args<DeepseekV3Args>();
    if (c.parallel.tp > 1 && a.ffn_hidden % c.parallel.tp != 0)
      parallel.fail("tp", cat("= ", c.parallel.tp, " must divide model.ffn_hidden = ", a.ffn_hidden));
    if (moe_layers(c.model) > 0) {
      if (c.parallel.tp > 1 && a.moe_intermediate_size % c.parallel.tp != 0)
        parallel.fail("tp", cat("= ", c.parallel.tp, " must divide model.moe_intermediate_size = ",
                                a.moe_intermediate_size, " (each expert's SwiGLU units are split over the tp ranks)"));
      if (a.n_routed_experts % c.parallel.ep != 0)
        parallel.fail("ep", cat("= ", c.parallel.ep, " must divide model.n_routed_experts = ", a.n_routed_experts,
                                " (each rank holds n_routed_experts / ep whole experts)"));
    }
  }

  void write_keys(std::ostream& o, const Config::Model& m) const override {
    const DeepseekV3Args& a = m.args<DeepseekV3Args>();
    write_language_model_shape(o, m);
    write_language_model_init(o, m);
    o << "ffn_hidden = " << a.ffn_hidden << "\nrope_theta = " << toml_number(a.rope_theta)
      << "\nnorm_eps = " << toml_number(a.norm_eps) << "\n";
    if (a.q_lora_rank > 0) o << "q_lora_rank = " << a.q_lora_rank << "\n";
    o << "kv_lora_rank = " << a.kv_lora_rank << "\nqk_nope_head_dim = " << a.qk_nope_head_dim
      << "\nqk_rope_head_dim = " << a.qk_rope_head_dim << "\nv_head_dim = " << a.v_head_dim
      << "\nrope_interleave = " << (a.rope_interleave ? "true" : "false") << "\nrope_scaling = "
      << toml_quote(a.rope_scaling) << "\n";
    if (a.yarn()) {
      o << "rope_factor = " << toml_number(a.rope_factor) << "\nrope_original_max_position_embeddings = "
        << a.rope_original_max_position_embeddings << "\nrope_beta_fast = " << toml_number(a.rope_beta_fast)
        << "\nrope_beta_slow = " << toml_number(a.rope_beta_slow) << "\n";
      if (a.rope_mscale != 0) o << "rope_mscale = " << toml_number(a.rope_mscale) << "\n";
      if (a.rope_mscale_all_dim != 0) o << "rope_mscale_all_dim = " << toml_number(a.rope_mscale_all_dim) << "\n";
    }
    o << "n_routed_experts = " << a.n_routed_experts
      << "\nnum_experts_per_tok = " << a.num_experts_per_tok << "\nmoe_intermediate_size = " << a.moe_intermediate_size
      << "\nn_shared_experts = " << a.n_shared_experts << "\nn_group = " << a.n_group << "\ntopk_group = "
      << a.topk_group << "\nnorm_topk_prob = " << (a.norm_topk_prob ? "true" : "false")
      << "\nrouted_scaling_factor = " << toml_number(a.routed_scaling_factor)
      << "\nfirst_k_dense_replace = " << a.first_k_dense_replace << "\nnum_mtp_layers = " << a.num_mtp_layers
      << "\nmtp_loss_weight = " << toml_number(a.mtp_loss_weight)
      << "\nrouter_aux_loss_coef = " << toml_number(a.router_aux_loss_coef) << "\n";
  }

  ModelSpec blocks(const Config& cfg, int64_t) const override {
    const auto& c = cfg.model;
    const DeepseekV3Args& a = c.args<DeepseekV3Args>();
    const int64_t V = c.vocab_size, T = c.block_size, C = c.n_embd, H = c.n_head, F = a.ffn_hidden;
    const int64_t dqk = a.qk_nope_head_dim + a.qk_rope_head_dim, dv = a.v_head_dim, r = a.kv_lora_rank;
    const int64_t ql = a.q_lora_rank, dr = a.qk_rope_head_dim;
    const int64_t L_moe = moe_layers(c), E = a.n_routed_experts, Fe = a.moe_intermediate_size;
    const double sequences = double(std::max<int64_t>(cfg.train.batch_size, 1));  // of the global batch
    auto w = [&](const std::string& name, Shape shape, TpSplit split = {}) {
      return ParamSpec{name, std::move(shape), ParamInit{ParamInit::normal, c.init_std, name_stream(name), 0}, split};
    };
    auto constant = param_constant;
    // q_b_proj (q_proj), kv_b_proj, gate and up column-parallel (whole heads, whole units), o and down row-parallel,
    // the a-projections and norms replicated, the embedding and lm_head vocabulary-parallel.
    const TpSplit col{0, 1}, row{1, 1}, vocab{0, 1};
    ModelSpec m;
    m.language_model = true;
    m.seq_len = T;
    m.output_dim = V;
    const ParamSpec embed = w("model.embed_tokens.weight", {V, C}, vocab);
    m.blocks.push_back(lm_embedding({embed}, C, T));
    // Decoder layer i (MLA, then a dense SwiGLU or with moe DeepSeek-V3's experts); the MTP modules' are i >= n_layer.
    auto decoder_layer = [&](int64_t i, bool moe) {
      const std::string p = "model.layers." + std::to_string(i) + ".", at = p + "self_attn.";
      BlockSpec b;
      b.kind = BlockKind::mla_layer;
      b.in = b.out = C;
      b.seq_len = T;
      b.n_head = H;
      b.n_kv_head = H;
      b.ffn_hidden = F;
      b.rope_theta = a.rope_theta;
      b.eps = a.norm_eps;
      b.bias = false;
      b.head_dim = dqk;
      b.mla = {ql, r, a.qk_nope_head_dim, dr, dv, a.rope_interleave, a.rope_tables(), a.softmax_mscale2()};
      b.params = {{p + "input_layernorm.weight", {C}, constant(1)}};
      if (ql > 0) {
        b.params.push_back(fp8_gemm(w(at + "q_a_proj.weight", {ql, C})));
        b.params.push_back({at + "q_a_layernorm.weight", {ql}, constant(1)});
        b.params.push_back(fp8_gemm(w(at + "q_b_proj.weight", {H * dqk, ql}, col)));
      } else {
        b.params.push_back(fp8_gemm(w(at + "q_proj.weight", {H * dqk, C}, col)));
      }
      // Not fp8_gemm: its two row blocks (latent, rotary key) are two GEMMs with a scale each (a working copy).
      b.params.push_back(w(at + "kv_a_proj_with_mqa.weight", {r + dr, C}));
      b.params.push_back({at + "kv_a_layernorm.weight", {r}, constant(1)});
      b.params.push_back(fp8_gemm(w(at + "kv_b_proj.weight", {H * (a.qk_nope_head_dim + dv), r}, col)));
      b.params.push_back(fp8_gemm(w(at + "o_proj.weight", {C, H * dv}, row)));
      b.params.push_back({p + "post_attention_layernorm.weight", {C}, constant(1)});
      double mlp_flops = 6.0 * double(C) * double(F);
      if (moe) {
        // moe.hpp's order: the router, the shared experts (gate, up by rows over tp, down by columns), the experts.
        b.moe = {E, a.num_experts_per_tok, Fe, a.norm_topk_prob, a.router_aux_loss_coef / (double(L_moe) * sequences),
                 0, 0, cfg.moe.expert_bias};
        b.moe.aux_coef = a.router_aux_loss_coef;
        b.moe.score = MoeSpec::Score::sigmoid;
        b.moe.n_group = a.n_group;
        b.moe.topk_group = a.topk_group;
        b.moe.routed_scaling = a.routed_scaling_factor;
        b.moe.n_shared = a.n_shared_experts;
        b.moe.layer = int(i - a.first_k_dense_replace);
        if (i >= c.n_layer) {  // an MTP module's: outside the run's router statistics and expert bias (mtp_block.cpp)
          b.moe.layer = 0;
          b.moe.expert_bias = false;
          b.moe.aux_weight = b.moe.aux_coef = 0;
        }
        const int64_t Fs = b.moe.shared_hidden();
        b.params.push_back(w(p + "mlp.gate.weight", {E, C}));
        if (Fs > 0) {
          b.params.push_back(fp8_expert(w(p + "mlp.shared_experts.gate_proj.weight", {Fs, C}, col)));
          b.params.push_back(fp8_expert(w(p + "mlp.shared_experts.up_proj.weight", {Fs, C}, col)));
          b.params.push_back(fp8_expert(w(p + "mlp.shared_experts.down_proj.weight", {C, Fs}, row)));
        }
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          b.params.push_back(fp8_expert(w(x + "gate_proj.weight", {Fe, C}, col)));
          b.params.push_back(fp8_expert(w(x + "up_proj.weight", {Fe, C}, col)));
          b.params.push_back(fp8_expert(w(x + "down_proj.weight", {C, Fe}, row)));
        }
        RELAY_ASSERT(b.params.size() == (ql > 0 ? 9 : 7) + MoeMlp::param_count(b.moe),
                     "deepseek_v3: layer " << i << " lists " << b.params.size() << " params");
        mlp_flops = 2.0 * double(C) * double(E) + double(a.num_experts_per_tok + a.n_shared_experts) * 6.0 *
                                                      double(C) * double(Fe);
      } else {
        b.params.push_back(fp8_gemm(w(p + "mlp.gate_proj.weight", {F, C}, col)));
        b.params.push_back(fp8_gemm(w(p + "mlp.up_proj.weight", {F, C}, col)));
        b.params.push_back(fp8_gemm(w(p + "mlp.down_proj.weight", {C, F}, row)));
      }
      // Per token: 2 x the projections' multiply-adds, 2 x 2 x T x H (dqk + dv) / 2 in QK^T and att @ V (causal
      // halves are the planner's business, as Llama's), 2 x 3 C F in the SwiGLU (the MoE's: the router's 2 C E and
      // 2 x 3 C moe_intermediate_size for each of the k routed and n_shared shared experts).
      const double proj = (ql > 0 ? double(C * ql + ql * H * dqk) : double(C * H * dqk)) + double(C * (r + dr)) +
                          double(r * H * (a.qk_nope_head_dim + dv)) + double(H * dv * C);
      b.attn_flops = 2.0 * double(T) * double(H) * double(dqk + dv);
      b.flops = 2.0 * proj + mlp_flops + b.attn_flops;
      b.recomputable = true;
      return b;
    };
    for (int64_t i = 0; i < c.n_layer; ++i) m.blocks.push_back(decoder_layer(i, a.moe_layer(i)));
    const ParamSpec out = c.tie_embeddings ? embed : w("lm_head.weight", {V, C}, vocab);
    if (a.num_mtp_layers > 0) m.blocks.push_back(mtp_block(cfg, decoder_layer, embed, out));
    m.blocks.push_back(lm_head({{"model.norm.weight", {C}, constant(1)}, out}, C, V, T, /*bias=*/false,
                               NormKind::rmsnorm, a.norm_eps));
    // The MTP modules read the main model's hidden states before its final norm: the head stays on their stage.
    if (a.num_mtp_layers > 0) m.blocks.back().starts_unit = false;
    return m;
  }

  bool tp_splits(const Config::Model& m, int tp) const override {
    const DeepseekV3Args& a = m.args<DeepseekV3Args>();
    return m.n_head % tp == 0 && m.vocab_size >= tp && a.ffn_hidden % tp == 0 &&
           (moe_layers(m) == 0 || a.moe_intermediate_size % tp == 0);
  }
  // Every layer's router sees all n_routed_experts (ep splits them); a model without MoE layers has none to split.
  int64_t experts(const Config::Model& m) const override {
    return moe_layers(m) > 0 ? m.args<DeepseekV3Args>().n_routed_experts : 0;
  }

  const char* hf_model_type() const override { return "deepseek_v3"; }
  const char* hf_architecture() const override { return "DeepseekV3ForCausalLM"; }

  void hf_config(nlohmann::ordered_json& c, const Config::Model& m, const std::string&) const override {
    const DeepseekV3Args& a = m.args<DeepseekV3Args>();
    c["vocab_size"] = m.vocab_size;
    c["hidden_size"] = m.n_embd;
    c["intermediate_size"] = a.ffn_hidden;
    c["moe_intermediate_size"] = a.moe_intermediate_size;
    c["num_hidden_layers"] = m.n_layer;
    c["num_attention_heads"] = m.n_head;
    c["num_key_value_heads"] = m.n_head;
    c["n_shared_experts"] = a.n_shared_experts;
    c["n_routed_experts"] = a.n_routed_experts;
    c["routed_scaling_factor"] = a.routed_scaling_factor;
    c["kv_lora_rank"] = a.kv_lora_rank;
    c["q_lora_rank"] = a.q_lora_rank > 0 ? nlohmann::json(a.q_lora_rank) : nlohmann::json(nullptr);
    c["qk_rope_head_dim"] = a.qk_rope_head_dim;
    c["v_head_dim"] = a.v_head_dim;
    c["qk_nope_head_dim"] = a.qk_nope_head_dim;
    c["n_group"] = a.n_group;
    c["topk_group"] = a.topk_group;
    c["num_experts_per_tok"] = a.num_experts_per_tok;
    c["first_k_dense_replace"] = a.first_k_dense_replace;
    c["norm_topk_prob"] = a.norm_topk_prob;
    c["num_nextn_predict_layers"] = a.num_mtp_layers;  // transformers' num_mtp_layers (its attribute_map)
    c["hidden_act"] = "silu";
    c["max_position_embeddings"] = m.block_size;
    c["rms_norm_eps"] = a.norm_eps;
    c["rope_theta"] = a.rope_theta;  // transformers 4.x
    // transformers 5
    c["rope_parameters"] = {{"rope_type", a.yarn() ? "yarn" : "default"}, {"rope_theta", a.rope_theta}};
    if (a.yarn()) {
      nlohmann::ordered_json& y = c["rope_parameters"];
      y["factor"] = a.rope_factor;
      y["original_max_position_embeddings"] = a.rope_original_max_position_embeddings;
      y["beta_fast"] = a.rope_beta_fast;
      y["beta_slow"] = a.rope_beta_slow;
      if (a.rope_mscale != 0) y["mscale"] = a.rope_mscale;
      if (a.rope_mscale_all_dim != 0) y["mscale_all_dim"] = a.rope_mscale_all_dim;
    }
    c["rope_interleave"] = a.rope_interleave;
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
  }

  void hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where) const override {
    using json = nlohmann::json;
    const DeepseekV3Args& a = m.args<DeepseekV3Args>();
    const json rope = hf_rope(config);
    const json q_lora = hf_value_or(config, "q_lora_rank", 1536);
    hf_check_pairs(config,
                   {{"vocab_size", 129280, "vocab_size", m.vocab_size}, {"hidden_size", 7168, "n_embd", m.n_embd},
                    {"intermediate_size", 18432, "ffn_hidden", a.ffn_hidden},
                    {"num_hidden_layers", 61, "n_layer", m.n_layer}, {"num_attention_heads", 128, "n_head", m.n_head},
                    {"rms_norm_eps", 1e-6, "norm_eps", a.norm_eps},
                    {"rope_theta", rope.value("rope_theta", 10000.0), "rope_theta", a.rope_theta},
                    {"tie_word_embeddings", false, "tie_embeddings", m.tie_embeddings},
                    {"kv_lora_rank", 512, "kv_lora_rank", a.kv_lora_rank},
                    {"qk_nope_head_dim", 128, "qk_nope_head_dim", a.qk_nope_head_dim},
                    {"qk_rope_head_dim", 64, "qk_rope_head_dim", a.qk_rope_head_dim},
                    {"v_head_dim", 128, "v_head_dim", a.v_head_dim},
                    {"rope_interleave", true, "rope_interleave", a.rope_interleave},
                    {"n_routed_experts", 256, "n_routed_experts", a.n_routed_experts},
                    {"num_experts_per_tok", 8, "num_experts_per_tok", a.num_experts_per_tok},
                    {"moe_intermediate_size", 2048, "moe_intermediate_size", a.moe_intermediate_size},
                    {"n_shared_experts", 1, "n_shared_experts", a.n_shared_experts},
                    {"n_group", 8, "n_group", a.n_group}, {"topk_group", 4, "topk_group", a.topk_group},
                    {"norm_topk_prob", true, "norm_topk_prob", a.norm_topk_prob},
                    {"routed_scaling_factor", 2.5, "routed_scaling_factor", a.routed_scaling_factor},
                    {"first_k_dense_replace", 3, "first_k_dense_replace", a.first_k_dense_replace}},
                   where);
    // The MTP modules (model.layers.{num_hidden_layers + k - 1}.*): config.json's count, transformers' default 1, must
    // be Relay's when Relay trains some; with none, a directory's MTP tensors are refused by name as not the model's.
    const json nextn = config.contains("num_nextn_predict_layers") ? config["num_nextn_predict_layers"]
                                                                   : hf_value_or(config, "num_mtp_layers", 1);
    if (a.num_mtp_layers > 0 && (!nextn.is_number_integer() || nextn.get<int64_t>() != a.num_mtp_layers))
      throw Error(cat(where, ": config.json num_nextn_predict_layers = ", nextn.dump(), " but model.num_mtp_layers = ",
                      a.num_mtp_layers));
    // config.json's null q_lora_rank is Relay's 0 (one q_proj).
    const json ours_q = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
    if (config.contains("q_lora_rank") ? config["q_lora_rank"] != ours_q : a.q_lora_rank != 1536)
      throw Error(cat(where, ": config.json q_lora_rank = ", config.contains("q_lora_rank") ? config["q_lora_rank"].dump()
                                                                                         : q_lora.dump(),
                      " but model.q_lora_rank = ", ours_q.dump()));
    hf_check_yarn(config, rope, m, where);
    const json max_pos = hf_value_or(config, "max_position_embeddings", 4096);
    if (!max_pos.is_number() || max_pos.get<double>() < double(m.block_size))
      throw Error(cat(where, ": config.json max_position_embeddings = ", max_pos.dump(), " but model.block_size = ",
                      m.block_size, " is longer"));
    hf_check_fixed(config, {{"hidden_act", "silu", "silu", "Relay's DeepSeek-V3 MLP is SwiGLU"},
                            {"scoring_func", "sigmoid", "sigmoid", "DeepSeek-V3's router scores are sigmoids"},
                            {"topk_method", "noaux_tc", "noaux_tc", "Relay routes as transformers' noaux_tc"},
                            {"attention_bias", false, false, "Relay's DeepSeek-V3 has no biases"}},
                   where);
  }

  // MoE layer l's e_score_correction_bias is row l of moe.expert_bias (router/expert_bias).
  std::vector<std::string> hf_expert_bias_names(const Config::Model& m) const override {
    std::vector<std::string> names;
    for (int64_t i = 0; i < m.n_layer; ++i)
      if (m.args<DeepseekV3Args>().moe_layer(i))
        names.push_back(cat("model.layers.", i, ".mlp.gate.e_score_correction_bias"));
    return names;
  }

  // transformers 5 holds a layer's routed experts fused, mlp.experts.gate_up_proj (E, 2F, C) ([gate; up] per expert)
  // and mlp.experts.down_proj (E, C, F); save_pretrained writes the per-expert names Relay uses. A directory in the
  // fused form is read as if it held the per-expert tensors.
  void hf_import_names(std::map<std::string, Shape>& shapes,
                       std::map<std::string, std::pair<std::string, int64_t>>& slices) const override {
    hf_split_fused_experts(shapes, slices, {"gate_proj", "up_proj", "down_proj"});
    // The MTP modules' copies of the embedding and the head (hf_copies): the model's own are read.
    auto ends = [](const std::string& n, const std::string& tail) {
      return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto it = shapes.begin(); it != shapes.end();)
      if (it->first.rfind("model.layers.", 0) == 0 &&
          (ends(it->first, ".embed_tokens.weight") || ends(it->first, ".shared_head.head.weight")))
        it = shapes.erase(it);
      else
        ++it;
  }

  // The official checkpoints hold each MTP module's embedding and output head as its own tensors.
  std::vector<std::pair<std::string, std::string>> hf_copies(const Config::Model& m) const override {
    std::vector<std::pair<std::string, std::string>> out;
    const int64_t D = m.args<DeepseekV3Args>().num_mtp_layers;
    for (int64_t k = 1; k <= D; ++k) {
      const std::string p = cat("model.layers.", m.n_layer + k - 1, ".");
      out.push_back({p + "embed_tokens.weight", "model.embed_tokens.weight"});
      out.push_back({p + "shared_head.head.weight", m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"});
    }
    return out;
  }

 private:
  // The multi-token prediction modules (model/mtp_block.cpp) under the official checkpoints' names: module k is
  // model.layers.{n_layer + k - 1}: enorm, hnorm, eh_proj (C, 2C), a decoder layer of the last layer's kind and
  // shared_head.norm; its embedding and output head are the model's (one parameter each).
  template <class Layer>
  static BlockSpec mtp_block(const Config& cfg, const Layer& decoder_layer, const ParamSpec& embed,
                             const ParamSpec& out) {
    const auto& c = cfg.model;
    const DeepseekV3Args& a = c.args<DeepseekV3Args>();
    const int64_t C = c.n_embd, V = c.vocab_size, T = c.block_size;
    BlockSpec b;
    b.kind = BlockKind::mtp;
    b.in = b.out = C;
    b.seq_len = T;
    b.eps = a.norm_eps;
    b.bias = false;
    b.mtp = {a.num_mtp_layers, a.mtp_loss_weight};
    b.params = {embed, out};
    for (int64_t k = 1; k <= a.num_mtp_layers; ++k) {
      const int64_t i = c.n_layer + k - 1;
      const std::string p = "model.layers." + std::to_string(i) + ".";
      BlockSpec layer = decoder_layer(i, c.n_layer > a.first_k_dense_replace);
      const ParamSpec head_norm{p + "shared_head.norm.weight", {C}, param_constant(1)};
      b.params.push_back({p + "enorm.weight", {C}, param_constant(1)});
      b.params.push_back({p + "hnorm.weight", {C}, param_constant(1)});
      b.params.push_back({p + "eh_proj.weight", {C, 2 * C},
                          ParamInit{ParamInit::normal, c.init_std, name_stream(p + "eh_proj.weight"), 0}});
      b.params.push_back(head_norm);
      b.params.insert(b.params.end(), layer.params.begin(), layer.params.end());
      BlockSpec head = lm_head({head_norm, out}, C, V, T, /*bias=*/false, NormKind::rmsnorm, a.norm_eps);
      // Per row: eh_proj's 2 x C x 2C, the decoder layer's, the shared head's 2 C V.
      b.flops += 4.0 * double(C) * double(C) + layer.flops + head.flops;
      b.attn_flops += layer.attn_flops;
      b.inner.push_back(std::move(layer));
      b.inner.push_back(std::move(head));
      b.inner.push_back(lm_embedding({embed}, C, T));
    }
    return b;
  }

  // YaRN's keys: read with rope_scaling = "yarn" only (factor and original_max_position_embeddings required), and
  // named when given without it.
  static void parse_yarn(const ConfigSection& model, DeepseekV3Args& a) {
    const char* keys[] = {"rope_factor", "rope_original_max_position_embeddings", "rope_beta_fast", "rope_beta_slow",
                          "rope_mscale", "rope_mscale_all_dim"};
    if (!a.yarn()) {
      for (const char* k : keys)
        if (model.get(k))
          model.fail(k, cat("YaRN's key, read only with model.rope_scaling = \"yarn\" (it is \"", a.rope_scaling,
                            "\")"));
      return;
    }
    for (const char* k : {"rope_factor", "rope_original_max_position_embeddings"})
      if (!model.get(k))
        model.fail(k, "missing: YaRN (model.rope_scaling = \"yarn\") needs it, as config.json's rope_scaling");
    model.real("rope_factor", a.rope_factor, 0, 1e6, true);
    model.integer("rope_original_max_position_embeddings", a.rope_original_max_position_embeddings, 1,
                  int64_t(1) << 40, true);
    model.real("rope_beta_fast", a.rope_beta_fast, 0, 1e6, true);
    model.real("rope_beta_slow", a.rope_beta_slow, 0, 1e6, true);
    model.real("rope_mscale", a.rope_mscale, 0, 1e6);
    model.real("rope_mscale_all_dim", a.rope_mscale_all_dim, 0, 1e6);
  }

  // config.json's rotary parameters: transformers 5's rope_parameters, or transformers 4's rope_scaling dict (its
  // "type" or "rope_type") with the top-level rope_theta; {} for plain rotary embeddings.
  static nlohmann::json hf_rope(const nlohmann::json& config) {
    using json = nlohmann::json;
    json rope = hf_value_or(config, "rope_parameters", json::object());
    if (!rope.is_object()) rope = json::object();
    const json old = hf_value_or(config, "rope_scaling", json(nullptr));
    if (old.is_object() && rope.value("rope_type", "default") == "default") {
      const json theta =
          rope.contains("rope_theta") ? rope["rope_theta"] : hf_value_or(config, "rope_theta", json(nullptr));
      rope = old;
      if (!rope.contains("rope_type") && rope.contains("type")) rope["rope_type"] = rope["type"];
      if (!theta.is_null()) rope["rope_theta"] = theta;
    }
    return rope;
  }

  // config.json's rope type and YaRN parameters against model.rope_scaling and its rope_ keys.
  static void hf_check_yarn(const nlohmann::json& config, const nlohmann::json& rope, const Config::Model& m,
                            const std::string& where) {
    using json = nlohmann::json;
    const DeepseekV3Args& a = m.args<DeepseekV3Args>();
    const std::string type = rope.value("rope_type", std::string("default"));
    if (type != "default" && type != "yarn")
      throw Error(cat(where, ": config.json rope_parameters.rope_type = \"", type, "\": Relay's deepseek_v3 applies ",
                      "\"default\" (model.rope_scaling = \"none\") or \"yarn\" (model.rope_scaling = \"yarn\")"));
    const std::string ours = a.yarn() ? "yarn" : "default";
    if (type != ours)
      throw Error(cat(where, ": config.json rope_parameters.rope_type = \"", type, "\" but model.rope_scaling = \"",
                      a.rope_scaling, "\""));
    if (type != "yarn") return;
    for (const char* k : {"attention_factor", "truncate"})
      if (rope.contains(k) && !(std::string(k) == "truncate" && rope[k] == json(true)))
        throw Error(cat(where, ": config.json rope_parameters.", k, " = ", rope[k].dump(),
                        ": Relay's YaRN derives the attention factor from mscale and mscale_all_dim and truncates the "
                        "correction range (transformers' defaults)"));
    auto number = [&](const char* k, double fallback) {
      const json v = rope.contains(k) && !rope[k].is_null() ? rope[k] : json(fallback);
      if (!v.is_number())
        throw Error(cat(where, ": config.json rope_parameters.", k, " = ", v.dump(), " is not a number"));
      return v.get<double>();
    };
    if (!rope.contains("factor") || !rope["factor"].is_number())
      throw Error(cat(where, ": config.json rope_parameters.factor is missing: YaRN needs it (model.rope_factor)"));
    const double max_pos = number("original_max_position_embeddings",
                                  hf_value_or(config, "max_position_embeddings", json(4096)).get<double>());
    const struct {
      const char* hf;
      double theirs, ours;
    } pairs[] = {{"factor", number("factor", 1), a.rope_factor},
                 {"original_max_position_embeddings", max_pos, double(a.rope_original_max_position_embeddings)},
                 {"beta_fast", number("beta_fast", 32), a.rope_beta_fast},
                 {"beta_slow", number("beta_slow", 1), a.rope_beta_slow},
                 {"mscale", number("mscale", 0), a.rope_mscale},
                 {"mscale_all_dim", number("mscale_all_dim", 0), a.rope_mscale_all_dim}};
    for (const auto& p : pairs)
      if (p.theirs != p.ours)
        throw Error(cat(where, ": config.json rope_parameters.", p.hf, " = ", toml_number(p.theirs), " but model.rope_",
                        p.hf, " = ", toml_number(p.ours)));
  }

  static int64_t moe_layers(const Config::Model& m) {
    return std::max<int64_t>(0, m.n_layer - m.args<DeepseekV3Args>().first_k_dense_replace);
  }
};

}  // namespace

const ModelFamily& deepseek_v3_family() {
  static const DeepseekV3Family f;
  return f;
}

}  // namespace relay
