// Model families: one file each under src/model/families (torchtitan's models/<name>/) holding the family's
// [model] keys, their struct (Config::Model::args) and defaults, its checks of them against [parallel], its block
// specs and parameter names, and its Hugging Face form (config.json both ways, the architectures name, tensor
// renames and fused-expert layouts). Everything else asks a family questions through this interface
// (language_model(), has_experts(), experts(), tp_splits(), hf_architecture()), never its name or its keys; a
// message that lists families asks the registry (family_names).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/config_keys.hpp"
#include "model/model_spec.hpp"

namespace relay {

class ModelFamily : public ModelKeys {
 public:
  // The model as blocks (model_spec.hpp's make_model_spec adds what every family shares). input_dim: the MLP's
  // feature count, from the data.
  virtual ModelSpec blocks(const Config& cfg, int64_t input_dim) const = 0;
  // Whether tensor parallelism of degree tp splits the model into whole heads and units on every rank (the
  // planner's search; the configuration's checks are core/config.cpp's and the family's check_layout).
  virtual bool tp_splits(const Config::Model& m, int tp) const { return m.n_head % tp == 0 && m.vocab_size >= tp; }
  // The experts of each MoE layer, which parallel.ep splits (check_layout requires ep to divide them); 0 without.
  virtual int64_t experts(const Config::Model& m) const { return 0; }
  // Whether expert parallelism of degree ep gives every rank whole experts (the planner's search).
  virtual bool ep_splits(const Config::Model& m, int ep) const { return experts(m) > 0 && experts(m) % ep == 0; }
  // Whether the model trains under context parallelism of degree cp (the planner's search; check_layout refuses it).
  virtual bool cp_splits(const Config::Model&, int) const { return true; }
  // Whether the family's blocks run sequence parallelism (the planner's search turns it on with tp where they do;
  // check_layout refuses it where they do not).
  virtual bool sequence_parallel() const { return true; }

  // --- Hugging Face (transformers) form; model/hf_model.hpp reads and writes it with these ---
  // config.json's model_type and its architectures entry; null: the family has no Hugging Face form.
  virtual const char* hf_model_type() const { return nullptr; }
  virtual const char* hf_architecture() const { return nullptr; }
  // config.json's keys for m after architectures and model_type (hf_model.cpp adds the keys every family
  // shares). An Error naming the key when transformers' class cannot express the model.
  virtual void hf_config(nlohmann::ordered_json& c, const Config::Model& m, const std::string& where) const {}
  // Checks a directory's config.json (its model_type already this family's) against [model]: the first
  // difference is an Error naming both keys and both values.
  virtual void hf_check(const nlohmann::json& config, const Config::Model& m, const std::string& where) const {}
  // Whether transformers stores this tensor transposed (GPT-2's Conv1D weights (in, out)).
  virtual bool hf_transposed(const std::string& name) const { return false; }
  // Relay's names for a directory's tensors: shapes (name -> shape as Relay holds it) is rewritten in place, and
  // slices says where each renamed one comes from: (stored tensor, offset of the slice in floats), offset -1 for a
  // whole tensor under a new name. The default keeps every name.
  virtual void hf_import_names(std::map<std::string, Shape>& shapes,
                               std::map<std::string, std::pair<std::string, int64_t>>& slices) const {}
  // transformers' names of a tensor per MoE layer that Relay holds as row l of moe.expert_bias (router/expert_bias;
  // DeepSeek-V3's e_score_correction_bias), MoE layer after MoE layer: exported from that row (zeros without
  // moe.expert_bias) and read back into it by model.init_from. Empty: the family has none.
  virtual std::vector<std::string> hf_expert_bias_names(const Config::Model& m) const { return {}; }
  // Tensors a directory holds twice under a second name (DeepSeek-V3's MTP modules' copies of the embedding and the
  // output head): (that name, Relay's parameter) pairs, written as copies on export; reading drops them
  // (hf_import_names). Empty: none.
  virtual std::vector<std::pair<std::string, std::string>> hf_copies(const Config::Model&) const { return {}; }
};

// Every family, in the registry's order (family.cpp).
const std::vector<const ModelFamily*>& model_families();
// model.type's family; an Error for a name no family has.
const ModelFamily& model_family(const std::string& type);
inline const ModelFamily& model_family(const Config& cfg) { return model_family(cfg.model.type); }
// The family whose config.json model_type is hf_type; null when none.
const ModelFamily* hf_model_family(const std::string& hf_type);
// The registry's families for messages ("a", "b" or "c"; core/config_keys.hpp's family_names): all of them, or
// those `which` says true of (&ModelKeys::language_model, &ModelKeys::has_experts).
std::string family_names(bool (ModelKeys::*which)() const = nullptr);

// The run configuration with every family's [model] keys (core/config.hpp's parser, given the registry).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config parse_config_text(const std::string& text, const std::string& source,
                         const std::vector<std::string>& overrides = {});
// Every key the parser accepts with the registry's families ("section.key"; core/config.hpp's config_keys).
std::vector<std::string> config_keys();
// cfg.to_toml with its family.
std::string to_toml(const Config& cfg);

// --- What the language-model families share (family.cpp) ---
// The keys every language model has: vocab_size, block_size, n_layer, n_head, n_embd, tie_embeddings (default
// tie_default) and init_std; first refusing any loss but the next-token cross-entropy.
void parse_language_model_keys(const ConfigSection& model, Config::Model& m, bool tie_default);
extern const std::set<std::string> kLanguageModelKeys;
// vocab_size .. n_embd as TOML lines (no newline after n_embd: GPT's bias follows), and tie_embeddings, init_std.
void write_language_model_shape(std::ostream& o, const Config::Model& m);
void write_language_model_init(std::ostream& o, const Config::Model& m);

// config.json's value of `key`, or transformers' default for the class when save_pretrained left it out.
nlohmann::json hf_value_or(const nlohmann::json& c, const std::string& key, const nlohmann::json& dflt);
// A config.json key with a Relay counterpart: its name, transformers' default, the Relay key and its value.
struct HfKeyPair { const char* hf; nlohmann::json dflt; const char* relay; nlohmann::json ours; };
// A config.json key with no Relay counterpart, whose value the architecture Relay computes fixes.
struct HfFixedKey { const char* hf; nlohmann::json dflt; nlohmann::json ours; const char* why; };
// The first pair or fixed key whose config.json value differs: an Error naming both.
void hf_check_pairs(const nlohmann::json& config, const std::vector<HfKeyPair>& pairs, const std::string& where);
void hf_check_fixed(const nlohmann::json& config, const std::vector<HfFixedKey>& fixed, const std::string& where);
// transformers 5's fused expert tensors of a layer, <mlp>.experts.gate_up_proj (E, 2F, C) ([gate; up] per expert) and
// <mlp>.experts.down_proj (E, C, F), renamed in shapes to the per-expert tensors save_pretrained writes,
// block(<mlp>).experts.E.<names[0 | 1 | 2]>.weight, each a slice of the fused one (ModelFamily::hf_import_names).
void hf_split_fused_experts(std::map<std::string, Shape>& shapes,
                            std::map<std::string, std::pair<std::string, int64_t>>& slices,
                            const std::array<const char*, 3>& names,
                            const std::function<std::string(const std::string&)>& block = {});

}  // namespace relay
