// Llama's decoder (RMSNorm, rotary grouped-query attention, SwiGLU), which llama.cpp's family is and the
// mixture-of-experts families (moe.cpp) build on: its [model] keys, its blocks with an optional expert layer,
// and its config.json keys.
#pragma once
#include <functional>

#include "model/family.hpp"

namespace relay {

// The language-model keys and n_kv_head, ffn_hidden, rope_theta, norm_eps.
std::set<std::string> llama_keys();
// Refuses GPT's bias, then reads Llama's keys (n_kv_head defaults to n_head; ffn_hidden required when
// ffn_required) and checks that n_kv_head divides n_head.
void parse_llama_keys(const ConfigSection& model, Config::Model& m, bool ffn_required);
// After the family's own keys: rotary embeddings need an even head size (head_dim, or n_embd / n_head).
void check_rotary_head_size(const ConfigSection& model, const Config::Model& m);
// The language-model keys and Llama's as TOML lines.
void write_llama_keys(std::ostream& o, const Config::Model& m);

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
