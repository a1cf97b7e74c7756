// Llama's decoder (RMSNorm, rotary grouped-query attention, SwiGLU), which llama.cpp's family is and the
// mixture-of-experts families (moe.cpp) build on: its [model] keys, its blocks with an optional expert layer,
// and its config.json keys.
#pragma once
#include <functional>
#include <memory>

#include "model/family.hpp"

namespace relay {

// Llama's [model] keys besides the language models' (model.type = "llama"; the MoE families' MoeArgs has them too):
// grouped-query attention (n_kv_head key/value heads, default n_head), the SwiGLU's width, the rotary base and the
// RMSNorm epsilon. head_dim: each head's width, 0 = n_embd / n_head (a key of qwen3_moe's only).
struct LlamaArgs : FamilyArgs {
  int64_t n_kv_head = 0, ffn_hidden = 0;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  int64_t head_dim = 0;
  int64_t head_size(const Config::Model& m) const { return head_dim > 0 ? head_dim : m.n_embd / m.n_head; }
  std::unique_ptr<FamilyArgs> clone() const override { return std::make_unique<LlamaArgs>(*this); }
};

// The mixtures of experts' keys on Llama's (model.type = "mixtral": transformers' MixtralForCausalLM; "qwen3_moe":
// Qwen3MoeForCausalLM). n_experts experts per MoE layer, each a SwiGLU of moe_ffn_hidden units; each token goes to its
// experts_per_token (top-k) most probable ones. norm_topk_prob (qwen3_moe; Mixtral always renormalises): the k
// weights divided by their sum. qwen3_moe's dense layers (ffn_hidden units): those in mlp_only_layers and those i
// with (i + 1) % decoder_sparse_step != 0; qwen3_moe also normalises q and k per head (q_norm, k_norm). The training
// loss adds router_aux_loss_coef x the per-sequence load-balancing loss and router_z_loss_coef x the z-loss
// (model/moe.hpp).
struct MoeArgs : LlamaArgs {
  int64_t n_experts = 0, experts_per_token = 0, moe_ffn_hidden = 0, decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001, router_z_loss_coef = 0.0;
  // Whether decoder layer i routes over experts (qwen3_moe: decoder_sparse_step, mlp_only_layers).
  bool moe_layer(int64_t i) const;
  std::unique_ptr<FamilyArgs> clone() const override { return std::make_unique<MoeArgs>(*this); }
};

// The language-model keys and n_kv_head, ffn_hidden, rope_theta, norm_eps.
std::set<std::string> llama_keys();
// Reads Llama's keys into a (n_kv_head defaults to n_head; ffn_hidden required when ffn_required) and checks that
// n_kv_head divides n_head.
void parse_llama_keys(const ConfigSection& model, Config::Model& m, LlamaArgs& a, bool ffn_required);
// After the family's own keys: rotary embeddings need an even head size (head_dim, or n_embd / n_head).
void check_rotary_head_size(const ConfigSection& model, const Config::Model& m);
// The language-model keys and Llama's as TOML lines.
void write_llama_keys(std::ostream& o, const Config::Model& m);

// What parallel.tp must divide in a Llama decoder besides n_head (each rank holds whole heads and units): the
// config's check (check_layout) and the planner's question (tp_splits) both read this list. experts: a MoE's.
struct TpDivides {
  const char* key;  // model.KEY
  int64_t value;
  const char* why;  // after the message, "" or " (...)"
};
std::vector<TpDivides> llama_tp_divides(const Config::Model& m, bool experts);
// parallel.tp against llama_tp_divides: an Error from `parallel` naming the first key tp does not divide.
void check_llama_tp(const ConfigSection& parallel, const Config& c, bool experts);
// Whether tp divides n_head and every one of llama_tp_divides and is at most the vocabulary.
bool llama_tp_splits(const Config::Model& m, int tp, bool experts);

// A MoE family's names of a layer's router and experts: model.layers.N.<block>gate.weight and
// <block>experts.E.<gate|up|down>.weight.
struct ExpertNames {
  const char* block;               // "block_sparse_moe." or "mlp."
  const char* gate, *up, *down;    // "w1", "w3", "w2" or "gate_proj", "up_proj", "down_proj"
  bool always_renormalise;         // the top-k weights divided by their sum whatever model.norm_topk_prob says
};
// transformers' LlamaForCausalLM state_dict names, every weight N(0, init_std) (its initializer_range) from
// (model.seed, name), RMSNorm weights 1. experts: the MoE layers' names (null for llama); qk_norm: Qwen3's per-head
// q_norm and k_norm.
ModelSpec llama_blocks(const Config& cfg, const ExpertNames* experts, bool qk_norm);

// config.json's keys of a Llama decoder after architectures and model_type; experts (null for llama) writes the
// MoE family's own keys after head_dim.
void llama_hf_config(nlohmann::ordered_json& c, const Config::Model& m, int64_t intermediate_size,
                     const std::function<void(nlohmann::ordered_json&)>& experts);
// Checks config.json's Llama keys, then mlp_pairs (the MLP's or the experts' keys), then extra_fixed and, when
// window is not null, that config.json has no sliding window under that key.
void llama_hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where,
                    const std::vector<HfKeyPair>& mlp_pairs, const std::vector<HfFixedKey>& extra_fixed,
                    const char* window);

}  // namespace relay
