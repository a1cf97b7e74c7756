// The registry of model families (one line each) and what the language-model families share: their common
// [model] keys and the Hugging Face config.json checks.
#include "model/family.hpp"

#include <algorithm>

namespace relay {

// Defined in src/model/families/*.cpp.
const ModelFamily& mlp_family();
const ModelFamily& gpt2_family();
const ModelFamily& llama_family();
const ModelFamily& mixtral_family();
const ModelFamily& qwen3_moe_family();
const ModelFamily& deepseek_v3_family();

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> all = {&mlp_family(), &gpt2_family(), &llama_family(),
                                                      &mixtral_family(), &qwen3_moe_family(), &deepseek_v3_family()};
  return all;
}

const ModelFamily& model_family(const std::string& type) {
  for (const ModelFamily* f : model_families())
    if (type == f->name()) return *f;
  std::set<std::string> names;
  for (const ModelFamily* f : model_families()) names.insert(f->name());
  throw Error(cat("model.type = \"", type, "\" is not a model family (", ConfigSection::join(names), ")"));
}

const ModelFamily* hf_model_family(const std::string& hf_type) {
  for (const ModelFamily* f : model_families())
    if (f->hf_model_type() && hf_type == f->hf_model_type()) return f;
  return nullptr;
}

namespace {
std::vector<const ModelKeys*> keys_of_families() {
  const auto& all = model_families();
  return {all.begin(), all.end()};
}
}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config(path, overrides, keys_of_families());
}

Config parse_config_text(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  return parse_config_text(text, source, overrides, keys_of_families());
}

std::vector<std::string> config_keys() { return config_keys(keys_of_families()); }

std::string family_names(bool (ModelKeys::*which)() const) { return family_names(keys_of_families(), which); }

std::string to_toml(const Config& cfg) { return cfg.to_toml(model_family(cfg)); }

const std::set<std::string> kLanguageModelKeys = {"vocab_size", "block_size", "n_layer", "n_head",
                                                  "n_embd", "tie_embeddings", "init_std"};

void parse_language_model_keys(const ConfigSection& model, Config::Model& m, bool tie_default) {
  if (m.loss != "cross_entropy")
    model.fail("loss", cat("a model.type = \"", m.type, "\" model trains with \"cross_entropy\" (next-token loss)"));
  model.integer("vocab_size", m.vocab_size, 1, int64_t(1) << 31, true);
  model.integer("block_size", m.block_size, 1, int64_t(1) << 20, true);
  model.integer("n_layer", m.n_layer, 1, 1 << 16, true);
  model.integer("n_head", m.n_head, 1, 1 << 16, true);
  model.integer("n_embd", m.n_embd, 1, int64_t(1) << 20, true);
  m.tie_embeddings = tie_default;
  model.boolean("tie_embeddings", m.tie_embeddings);
  model.real("init_std", m.init_std, 0, 10, true);
  if (m.n_embd % m.n_head != 0)
    model.fail("n_embd", cat("= ", m.n_embd, " must be divisible by model.n_head = ", m.n_head,
                             " (each head gets n_embd / n_head channels)"));
}

void write_language_model_shape(std::ostream& o, const Config::Model& m) {
  o << "vocab_size = " << m.vocab_size << "\nblock_size = " << m.block_size << "\nn_layer = " << m.n_layer
    << "\nn_head = " << m.n_head << "\nn_embd = " << m.n_embd;
}

void write_language_model_init(std::ostream& o, const Config::Model& m) {
  o << "\ntie_embeddings = " << (m.tie_embeddings ? "true" : "false") << "\ninit_std = " << toml_number(m.init_std)
    << "\n";
}

nlohmann::json hf_value_or(const nlohmann::json& c, const std::string& key, const nlohmann::json& dflt) {
  auto it = c.find(key);
  return it == c.end() || it->is_null() ? dflt : *it;
}

namespace {
bool same(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}
}  // namespace

void hf_check_pairs(const nlohmann::json& config, const std::vector<HfKeyPair>& pairs, const std::string& where) {
  for (auto& p : pairs) {
    const nlohmann::json theirs = hf_value_or(config, p.hf, p.dflt);
    if (!same(theirs, p.ours))
      throw Error(cat(where, ": config.json ", p.hf, " = ", theirs.dump(), " but model.", p.relay, " = ", p.ours.dump()));
  }
}

void hf_check_fixed(const nlohmann::json& config, const std::vector<HfFixedKey>& fixed, const std::string& where) {
  for (auto& f : fixed) {
    const nlohmann::json theirs = f.ours.is_null() ? (config.contains(f.hf) ? config[f.hf] : nlohmann::json(nullptr))
                                                   : hf_value_or(config, f.hf, f.dflt);
    if (!same(theirs, f.ours))
      throw Error(cat(where, ": config.json ", f.hf, " = ", theirs.dump(), " but ", f.why, " (", f.ours.dump(), ")"));
  }
}

void hf_split_fused_experts(std::map<std::string, Shape>& shapes,
                            std::map<std::string, std::pair<std::string, int64_t>>& slices,
                            const std::array<const char*, 3>& names,
                            const std::function<std::string(const std::string&)>& block) {
  std::map<std::string, Shape> out;
  auto ends = [](const std::string& n, const std::string& tail) {
    return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (auto& [name, shape] : shapes) {
    const bool gate_up = ends(name, ".experts.gate_up_proj"), down = ends(name, ".experts.down_proj");
    if (!(gate_up || down) || shape.size() != 3) {
      out[name] = shape;
      continue;
    }
    const std::string mlp = name.substr(0, name.size() - (gate_up ? 21 : 18));
    const std::string prefix = (block ? block(mlp) : mlp) + ".experts.";
    const int64_t E = shape[0], rows = gate_up ? shape[1] / 2 : shape[1], cols = shape[2];
    for (int64_t e = 0; e < E; ++e)
      for (int part = 0; part < (gate_up ? 2 : 1); ++part) {
        const std::string relay = cat(prefix, e, ".", names[gate_up ? part : 2], ".weight");
        slices[relay] = {name, (e * (gate_up ? 2 : 1) + part) * rows * cols};
        out[relay] = {rows, cols};
      }
  }
  shapes = std::move(out);
}

}  // namespace relay
