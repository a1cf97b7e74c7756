// What a model family adds to the run configuration: its [model] keys (read with ConfigSection, so its errors name
// the file and the key like every other section's) and the capabilities other sections' checks ask about.
// core only declares the interface; each family implements it in src/model/families (model/family.hpp).
#pragma once
#include <toml++/toml.h>

#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"

namespace relay {

// "string", "integer", ...: a TOML value's type for messages.
const char* toml_type_name(const toml::node& n);
// A string as a TOML literal (quoted, escaped).
std::string toml_quote(const std::string& s);
// The shortest text that reads back as the same double: numbers print as the user wrote them
// (lr = 0.003, not 0.0030000000000000001), and a saved config loads back to the same Config.
std::string toml_number(double v);

// Reads one section with a fixed set of keys, checking types. Errors: "FILE: SECTION.KEY: why".
class ConfigSection {
 public:
  ConfigSection(const toml::table* t, std::string name, std::string source, std::set<std::string> known);
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;
  const toml::node* get(const std::string& key) const { return t_ ? t_->get(key) : nullptr; }
  const std::string& source() const { return source_; }  // the config file, for sections nested in this one
  // Every key the section holds.
  std::vector<std::string> present() const;

  void str(const std::string& key, std::string& out, bool required = false) const;
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required = false) const;
  void u64(const std::string& key, uint64_t& out) const;
  void real(const std::string& key, double& out, double lo, double hi, bool lo_open = false) const;
  void boolean(const std::string& key, bool& out) const;
  void choice(const std::string& key, std::string& out, const std::set<std::string>& allowed) const;
  // A choice parsed into its enum: names[i] is the spelling of E(i).
  template <typename E, size_t N>
  void enum_choice(const std::string& key, E& out, const char* const (&names)[N]) const {
    std::string v = names[static_cast<size_t>(out)];
    choice(key, v, std::set<std::string>(std::begin(names), std::end(names)));
    for (size_t i = 0; i < N; ++i)
      if (v == names[i]) out = static_cast<E>(i);
  }
  static std::string join(const std::set<std::string>& s);

 private:
  const toml::table* t_;
  std::string name_, source_;
};

// A model family as the configuration sees it (model.type = name()).
class ModelKeys {
 public:
  virtual ~ModelKeys() = default;
  virtual const char* name() const = 0;
  // A decoder-only language model over token ids (as opposed to the MLP): cp, tp, recomputation and document
  // masks apply to it.
  virtual bool language_model() const = 0;
  // A mixture of experts: the [moe] section and parallel.ep apply to it.
  virtual bool has_experts() const { return false; }
  // Why this model (its parsed keys) has no MoE layer though the family has experts (deepseek_v3 with every layer
  // dense): the text after "needs MoE layers: ", read by [moe] and parallel.ep; empty when it has some.
  virtual std::string without_expert_layers(const Config::Model&) const { return ""; }
  // Its [model] keys besides type, seed, init_from and loss.
  virtual std::set<std::string> keys() const = 0;
  // Reads its keys from [model] into m (the language models' into m's shared fields, the rest into its own struct,
  // Config::Model::edit_args), with its defaults. Another family's keys are refused before (foreign_key).
  virtual void parse_keys(const ConfigSection& model, Config::Model& m) const = 0;
  // Why [model] may not hold `key`, one of the keys of `owners` (the families that have it, in the registry's
  // order) but not of this family: the text after "model.KEY: " in the error.
  virtual std::string foreign_key(const std::string& key, const std::vector<const ModelKeys*>& owners) const;
  // Checks [parallel]'s degrees against its own keys (Llama's: parallel.tp must divide model.n_kv_head): an Error
  // from `parallel` naming both keys. Called after [parallel]'s checks against the keys every model has.
  virtual void check_layout(const ConfigSection& parallel, const Config& c) const {}
  // Its keys as TOML lines (every one, defaults filled in), for Config::to_toml.
  virtual void write_keys(std::ostream& o, const Config::Model& m) const = 0;
};

// The names of `families` for messages, each quoted, in their order, the last after "or": "a", "b" or "c" (lists of
// families come from the registry). which: only those it says true of (&ModelKeys::language_model, ...).
std::string family_names(const std::vector<const ModelKeys*>& families, bool (ModelKeys::*which)() const = nullptr);

}  // namespace relay
