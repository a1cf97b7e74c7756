// TOML -> Config with strict validation: unknown sections and keys, wrong types and out-of-range
// values are errors naming the file and the key.
#include "core/config.hpp"

#include "core/config_keys.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.hpp"

namespace relay {

namespace {
// Spellings of the enums, in enum order (Section::enum_choice, to_toml).
constexpr const char* kPrecisionNames[] = {"fp32", "bf16", "tf32", "fp8"};
constexpr const char* kFp8RecipeNames[] = {"tensorwise", "blockwise"};
constexpr const char* kGradReduceNames[] = {"fp32", "bf16"};

// Every section and its keys ([model]'s: these and each family's own, ModelKeys::keys()). The parser reads these and
// config_keys() lists them: the configuration reference must name exactly these (tests/test_docs.cpp).
const std::map<std::string, std::set<std::string>>& section_keys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"run", {"dir"}},
      {"model", {"type", "seed", "init_from", "loss"}},
      {"data", {"train", "eval", "shuffle", "seed", "document_mask", "reset_positions", "preload"}},
      {"train", {"steps", "batch_size", "micro_batches", "log_every", "eval_every", "clip_grad_norm", "device",
                 "precision", "threads", "time_limit", "recompute", "skip_nonfinite", "cpu_bf16_gemm",
                 "fp8_recipe"}},
      {"optimizer", {"name", "lr", "betas", "eps", "weight_decay", "momentum", "zero"}},
      {"lr_schedule", {"name", "warmup_steps", "min_lr"}},
      {"parallel", {"dp", "pp", "tp", "cp", "ep", "schedule", "virtual_stages", "balance", "stage_memory_gib", "bucket_mb", "first_bucket_mb",
                    "comm", "grad_reduce", "timeout", "sequence_parallel", "reshard_after_forward", "overlap",
                    "fp8_param_gather"}},
      {"checkpoint", {"dir", "every", "keep", "save_initial", "resume", "async"}},
      {"trace", {"steps"}},
      {"log", {"tensorboard"}},
      {"moe", {"expert_bias", "bias_update_rate"}},
  };
  return keys;
}
}  // namespace

std::vector<std::string> config_keys(const std::vector<const ModelKeys*>& families) {
  std::set<std::string> all;
  for (const auto& [section, keys] : section_keys())
    for (const std::string& k : keys) all.insert(section + "." + k);
  for (const ModelKeys* f : families)
    for (const std::string& k : f->keys()) all.insert("model." + k);
  return {all.begin(), all.end()};
}

const char* precision_name(Precision p) { return kPrecisionNames[static_cast<size_t>(p)]; }
const char* fp8_recipe_name(Fp8Recipe r) { return kFp8RecipeNames[static_cast<size_t>(r)]; }
const char* grad_reduce_name(GradReduce g) { return kGradReduceNames[static_cast<size_t>(g)]; }

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    default: return "date/time";
  }
}

std::string toml_quote(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
}

std::string toml_number(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string r(buf, res.ptr);
  if (r.find_first_of(".eEn") == std::string::npos) r += ".0";
  return r;
}

ConfigSection::ConfigSection(const toml::table* t, std::string name, std::string source, std::set<std::string> known)
    : t_(t), name_(std::move(name)), source_(std::move(source)) {
  if (!t_) return;
  for (auto&& [k, v] : *t_)
    if (!known.count(std::string(k.str())))
      fail(std::string(k.str()), cat("unknown key (known keys in [", name_, "]: ", join(known), ")"));
}

void ConfigSection::fail(const std::string& key, const std::string& why) const {
  throw Error(cat(source_, ": ", name_, ".", key, ": ", why));
}

std::vector<std::string> ConfigSection::present() const {
  std::vector<std::string> keys;
  if (t_)
    for (auto&& [k, v] : *t_) keys.emplace_back(k.str());
  return keys;
}

void ConfigSection::str(const std::string& key, std::string& out, bool required) const {
  auto* n = get(key);
  if (!n) { if (required) fail(key, "required key is missing"); return; }
  if (!n->is_string()) fail(key, cat("expected a string, got ", toml_type_name(*n)));
  out = n->value<std::string>().value();
}

void ConfigSection::integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required) const {
  auto* n = get(key);
  if (!n) { if (required) fail(key, "required key is missing"); return; }
  if (!n->is_integer()) fail(key, cat("expected an integer, got ", toml_type_name(*n)));
  int64_t v = n->value<int64_t>().value();
  if (v < lo || v > hi) fail(key, cat("must be in [", lo, ", ", hi, "], got ", v));
  out = v;
}

void ConfigSection::u64(const std::string& key, uint64_t& out) const {
  int64_t v = static_cast<int64_t>(out);
  integer(key, v, 0, INT64_MAX);
  out = static_cast<uint64_t>(v);
}

void ConfigSection::real(const std::string& key, double& out, double lo, double hi, bool lo_open) const {
  auto* n = get(key);
  if (!n) return;
  if (!n->is_number()) fail(key, cat("expected a number, got ", toml_type_name(*n)));
  double v = n->is_integer() ? double(n->value<int64_t>().value()) : n->value<double>().value();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
    fail(key, cat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", v));
  out = v;
}

void ConfigSection::boolean(const std::string& key, bool& out) const {
  auto* n = get(key);
  if (!n) return;
  if (!n->is_boolean()) fail(key, cat("expected true or false, got ", toml_type_name(*n)));
  out = n->value<bool>().value();
}

void ConfigSection::choice(const std::string& key, std::string& out, const std::set<std::string>& allowed) const {
  str(key, out);
  if (!allowed.count(out)) fail(key, cat("must be one of ", join(allowed), ", got \"", out, "\""));
}

std::string ConfigSection::join(const std::set<std::string>& s) {
  std::string r;
  for (auto& x : s) r += (r.empty() ? "" : ", ") + x;
  return r;
}

namespace {

// The short names the sections below were written with.
using Section = ConfigSection;
const char* type_name(const toml::node& n) { return toml_type_name(n); }

void apply_override(toml::table& root, const std::string& ov, const std::string& source) {
  auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(cat("--set ", ov, ": expected section.key=value"));
  std::string path = ov.substr(0, eq), value = ov.substr(eq + 1);
  auto dot = path.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size() || path.find('.', dot + 1) != std::string::npos)
    throw Error(cat("--set ", ov, ": the key must be section.key, got \"", path, "\""));
  std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  toml::node_view<toml::node> parsed;
  toml::table holder;
  try {
    holder = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    holder = toml::table{};
    holder.insert("v", value);  // a bare word is a string: --set run.dir=runs/x
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  auto* sec = root.get(section)->as_table();
  if (!sec) throw Error(cat(source, ": ", section, " is not a table"));
  sec->insert_or_assign(key, *holder.get("v"));
}

}  // namespace

double parse_duration(const std::string& text, const std::string& key) {
  auto bad = [&]() -> Error {
    return Error(cat(key, ": cannot read \"", text, "\" as a duration (examples: \"3h50m\", \"90m\", \"45s\", \"01:30:00\")"));
  };
  if (text.empty()) throw bad();
  if (text.find(':') != std::string::npos) {  // [[HH:]MM:]SS
    double total = 0;
    std::stringstream ss(text);
    std::string part;
    int parts = 0;
    while (std::getline(ss, part, ':')) {
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) throw bad();
      total = total * 60 + std::stod(part);
      ++parts;
    }
    if (parts > 3) throw bad();
    return total;
  }
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
    if (j == i) throw bad();
    double v = std::stod(text.substr(i, j - i));
    double unit = 1;
    if (j < text.size()) {
      char u = text[j++];
      if (u == 'h') unit = 3600; else if (u == 'm') unit = 60; else if (u == 's') unit = 1; else if (u == 'd') unit = 86400;
      else throw bad();
    } else if (any) {
      throw bad();  // "3h50" is ambiguous
    }
    total += v * unit;
    any = true;
    i = j;
  }
  return total;
}

void Config::Model::wrong_args() const {
  throw Error(cat("model.type = \"", type, "\": its [model] keys were asked for as another family's"));
}

std::string family_names(const std::vector<const ModelKeys*>& families, bool (ModelKeys::*which)() const) {
  std::vector<std::string> names;
  for (const ModelKeys* f : families)
    if (!which || (f->*which)()) names.push_back(cat("\"", f->name(), "\""));
  std::string r;
  for (size_t i = 0; i < names.size(); ++i) r += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return r;
}

std::string ModelKeys::foreign_key(const std::string& key, const std::vector<const ModelKeys*>& owners) const {
  auto all = [&](bool (ModelKeys::*which)() const) {
    return std::all_of(owners.begin(), owners.end(), [&](const ModelKeys* f) { return (f->*which)(); });
  };
  auto none = [&](bool (ModelKeys::*which)() const) {
    return std::none_of(owners.begin(), owners.end(), [&](const ModelKeys* f) { return (f->*which)(); });
  };
  const std::string names = family_names(owners), type = name();
  if (!has_experts() && all(&ModelKeys::has_experts))
    return cat("is a mixture-of-experts key; model.type = \"", type, "\" has no experts (use ", names, ")");
  if (!language_model() && all(&ModelKeys::language_model))
    return cat("is a language-model key; set model.type = ", names, " to use it");
  if (language_model() && none(&ModelKeys::language_model))
    return cat("is a key of model.type = ", names, "; a model.type = \"", type, "\" model is given by vocab_size, "
               "block_size, n_layer, n_head and n_embd");
  return cat("is a key of model.type = ", names, ", not of model.type = \"", type, "\" (its keys: ",
             ConfigSection::join(keys()), ")");
}

namespace {

// What every section's reader needs: the parsed file, its name for messages, and the run's model family.
struct Reading {
  const toml::table& root;
  const std::string& source;
  const ModelKeys& family;
  std::string language_models, with_experts;  // the registry's families of each kind, for messages
  Section section(const char* name) const {
    const toml::node* n = root.get(name);
    return Section(n ? n->as_table() : nullptr, name, source, section_keys().at(name));
  }
};

// [model]: the keys every run has, then the family's own (model.type; src/model/families). Returns the family.
const ModelKeys& read_model(const toml::table* t, const std::string& source, const std::vector<const ModelKeys*>& families,
                            Config& c) {
  const std::set<std::string> common = section_keys().at("model");
  std::set<std::string> model_keys = common, types;
  for (const ModelKeys* f : families) {
    types.insert(f->name());
    for (const std::string& k : f->keys()) model_keys.insert(k);
  }
  Section model(t, "model", source, model_keys);
  model.choice("type", c.model.type, types);
  const ModelKeys& family = **std::find_if(families.begin(), families.end(),
                                           [&](const ModelKeys* f) { return f->name() == c.model.type; });
  model.u64("seed", c.model.seed);
  model.str("init_from", c.model.init_from);
  model.choice("loss", c.model.loss, {"cross_entropy", "mse"});
  const std::set<std::string> own = family.keys();
  for (const std::string& k : model.present())  // another family's key
    if (!common.count(k) && !own.count(k)) {
      std::vector<const ModelKeys*> owners;
      for (const ModelKeys* f : families)
        if (f->keys().count(k)) owners.push_back(f);
      model.fail(k, family.foreign_key(k, owners));
    }
  family.parse_keys(model, c.model);
  return family;
}

// [run]: where the run writes.
void read_run(const Reading& r, Config& c) {
  const Section run = r.section("run");
  run.str("dir", c.run.dir);
  if (c.run.dir.empty()) run.fail("dir", "must not be empty");
}

// [data]: the training and eval files and how they are read.
void read_data(const Reading& r, Config& c) {
  const Section data = r.section("data");
  data.str("train", c.data.train, true);
  data.str("eval", c.data.eval);
  data.boolean("shuffle", c.data.shuffle);
  data.u64("seed", c.data.seed);
  data.boolean("document_mask", c.data.document_mask);
  data.boolean("reset_positions", c.data.reset_positions);
  data.choice("preload", c.data.preload, {"auto", "on", "off"});
  if (c.data.preload == "on" && r.family.language_model())
    data.fail("preload", "holds an MLP's feature file on the device; a language model's batches are token ids "
                         "(4 bytes a token), read and uploaded as they are");
  if (c.data.document_mask && !r.family.language_model())
    data.fail("document_mask", cat("needs a language model (model.type = ", r.language_models, "): model.type = \"",
                                   c.model.type, "\" has no documents"));
}

// [train]: steps, batch, device, precision, recomputation.
void read_train(const Reading& r, Config& c) {
  const Section train = r.section("train");
  train.integer("steps", c.train.steps, 1, INT64_MAX / 4, true);
  train.integer("batch_size", c.train.batch_size, 1, int64_t(1) << 31, true);
  train.integer("micro_batches", c.train.micro_batches, 1, 1 << 20);
  train.integer("log_every", c.train.log_every, 1, INT64_MAX);
  train.integer("eval_every", c.train.eval_every, 0, INT64_MAX);
  train.real("clip_grad_norm", c.train.clip_grad_norm, 0, 1e30);
  train.choice("device", c.train.device, {"cpu", "cuda", "auto"});
  train.enum_choice("precision", c.train.precision, kPrecisionNames);
  train.enum_choice("fp8_recipe", c.train.fp8_recipe, kFp8RecipeNames);
  if (train.get("fp8_recipe") && c.train.precision != Precision::fp8)
    train.fail("fp8_recipe", cat("= \"", fp8_recipe_name(c.train.fp8_recipe), "\" scales FP8 GEMMs and needs "
                                 "train.precision = \"fp8\", got train.precision = \"", precision_name(c.train.precision),
                                 "\" (remove train.fp8_recipe, or set train.precision = \"fp8\")"));
  train.integer("threads", c.train.threads, 0, 4096);
  train.choice("cpu_bf16_gemm", c.train.cpu_bf16_gemm, {"auto", "native", "widened"});
  train.str("time_limit", c.train.time_limit);
  train.choice("recompute", c.train.recompute, {"none", "blocks"});
  train.integer("skip_nonfinite", c.train.skip_nonfinite, 0, INT64_MAX);
  if (!c.train.time_limit.empty()) parse_duration(c.train.time_limit, r.source + ": train.time_limit");
}

// [optimizer]: AdamW or SGD, and the ZeRO stage.
void read_optimizer(const Reading& r, Config& c) {
  const Section opt = r.section("optimizer");
  opt.choice("name", c.optimizer.name, {"adamw", "sgd"});
  opt.real("lr", c.optimizer.lr, 0, 1e6);
  if (auto* b = opt.get("betas")) {
    auto* arr = b->as_array();
    if (!arr || arr->size() != 2 || !(*arr)[0].is_number() || !(*arr)[1].is_number())
      opt.fail("betas", "expected two numbers like [0.9, 0.999]");
    auto num = [](const toml::node& n) { return n.is_integer() ? double(n.value<int64_t>().value()) : n.value<double>().value(); };
    c.optimizer.beta1 = num((*arr)[0]);
    c.optimizer.beta2 = num((*arr)[1]);
    for (double v : {c.optimizer.beta1, c.optimizer.beta2})
      if (!(v >= 0 && v < 1)) opt.fail("betas", cat("each beta must be in [0, 1), got ", v));
  }
  opt.real("eps", c.optimizer.eps, 0, 1, true);
  opt.real("weight_decay", c.optimizer.weight_decay, 0, 1e6);
  opt.real("momentum", c.optimizer.momentum, 0, 1);
  if (auto* z = opt.get("zero")) {  // a stage 0..3, or true / false (1 / 0, as before stages)
    if (z->is_boolean()) c.optimizer.zero = z->value<bool>().value() ? 1 : 0;
    else if (!z->is_integer()) opt.fail("zero", cat("expected a ZeRO stage 0, 1, 2 or 3 (or true / false), got ", type_name(*z)));
    else {
      const int64_t v = z->value<int64_t>().value();
      if (v < 0 || v > 3) opt.fail("zero", cat("must be a ZeRO stage 0, 1, 2 or 3, got ", v));
      c.optimizer.zero = int(v);
    }
  }
  if (c.optimizer.name == "adamw" && c.optimizer.momentum != 0)
    opt.fail("momentum", "is an SGD setting; with optimizer.name = \"adamw\" use optimizer.betas");
}

// [lr_schedule]: the learning-rate schedule, checked against train.steps and optimizer.lr.
void read_lr_schedule(const Reading& r, Config& c) {
  const Section lrs = r.section("lr_schedule");
  lrs.choice("name", c.lr_schedule.name, {"constant", "cosine"});
  lrs.integer("warmup_steps", c.lr_schedule.warmup_steps, 0, INT64_MAX);
  lrs.real("min_lr", c.lr_schedule.min_lr, 0, 1e6);
  if (c.lr_schedule.warmup_steps > c.train.steps)
    lrs.fail("warmup_steps", cat("must be <= train.steps (", c.train.steps, "), got ", c.lr_schedule.warmup_steps));
  if (c.lr_schedule.min_lr > c.optimizer.lr)
    lrs.fail("min_lr", cat("must be <= optimizer.lr (", c.optimizer.lr, "), got ", c.lr_schedule.min_lr));
}

// [parallel]: degrees, schedule, communication; each degree checked against the model.
void read_parallel(const Reading& r, Config& c) {
  const Section par = r.section("parallel");
  par.integer("dp", c.parallel.dp, 1, 1 << 20);
  par.integer("pp", c.parallel.pp, 1, 1 << 16);
  par.integer("cp", c.parallel.cp, 1, 1 << 12);
  if (c.parallel.cp > 1) {
    if (!r.family.language_model())
      par.fail("cp", cat("= ", c.parallel.cp, " needs model.type = ", r.language_models, " (context parallelism splits "
                         "sequences; a model.type = \"", c.model.type, "\" model has none)"));
    if (c.model.block_size % (2 * c.parallel.cp) != 0)
      par.fail("cp", cat("= ", c.parallel.cp, ": model.block_size = ", c.model.block_size, " must be divisible by 2 x cp = ",
                         2 * c.parallel.cp, " (each sequence is cut into 2 cp equal chunks, rank i holding chunks i and "
                         "2cp - 1 - i)"));
  }
  par.integer("tp", c.parallel.tp, 1, 1 << 12);
  par.integer("ep", c.parallel.ep, 1, 1 << 16);
  if (c.parallel.ep > 1) {  // Megatron-LM's and torchtitan's rule: the expert-parallel ranks are data-parallel ranks
    if (!r.family.has_experts())
      par.fail("ep", cat("= ", c.parallel.ep, " splits experts over ranks and needs a mixture of experts "
                         "(model.type = ", r.with_experts, "), got model.type = \"", c.model.type, "\""));
    if (!r.family.without_expert_layers(c.model).empty())
      par.fail("ep", cat("= ", c.parallel.ep, " splits experts over ranks and needs MoE layers: ",
                         r.family.without_expert_layers(c.model)));
    if (c.parallel.dp % c.parallel.ep != 0)
      par.fail("ep", cat("= ", c.parallel.ep, " must divide parallel.dp = ", c.parallel.dp,
                         " (the expert-parallel ranks are taken from the data-parallel ranks)"));
  }
  par.choice("schedule", c.parallel.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1"});
  par.integer("virtual_stages", c.parallel.virtual_stages, 1, 1024);
  par.real("bucket_mb", c.parallel.bucket_mb, 0, 1e6, true);
  par.real("first_bucket_mb", c.parallel.first_bucket_mb, 0, 1e6, true);
  par.choice("comm", c.parallel.comm, {"auto", "nccl", "mpi"});
  par.enum_choice("grad_reduce", c.parallel.grad_reduce, kGradReduceNames);
  par.boolean("reshard_after_forward", c.parallel.reshard_after_forward);
  par.boolean("overlap", c.parallel.overlap);
  par.boolean("fp8_param_gather", c.parallel.fp8_param_gather);
  if (c.parallel.fp8_param_gather) {
    auto refuse = [&](const std::string& why) { par.fail("fp8_param_gather", cat("= true ", why)); };
    if (c.optimizer.zero != 3)
      refuse(cat("gathers ZeRO-3's sharded parameters as FP8 codes and needs optimizer.zero = 3, got optimizer.zero = ",
                 c.optimizer.zero));
    if (c.train.precision != Precision::fp8 || c.train.fp8_recipe != Fp8Recipe::tensorwise)
      refuse(cat("gathers weights as the tensorwise FP8 GEMMs read them and needs train.precision = \"fp8\" with "
                 "train.fp8_recipe = \"tensorwise\", got train.precision = \"", precision_name(c.train.precision), "\"",
                 c.train.precision == Precision::fp8 ? cat(", train.fp8_recipe = \"", fp8_recipe_name(c.train.fp8_recipe), "\"")
                                                     : std::string()));
  }
  par.str("timeout", c.parallel.timeout);
  if (c.parallel.timeout != "0") parse_duration(c.parallel.timeout, r.source + ": parallel.timeout");
  if (c.parallel.tp > 1) {
    if (!r.family.language_model())
      par.fail("tp", cat("= ", c.parallel.tp, " needs model.type = ", r.language_models, " (tensor parallelism splits "
                         "attention heads, MLP units and the vocabulary; a model.type = \"", c.model.type,
                         "\" model uses parallel.dp and parallel.pp)"));
    if (c.model.n_head % c.parallel.tp != 0)
      par.fail("tp", cat("= ", c.parallel.tp, " must divide model.n_head = ", c.model.n_head,
                         " (each tensor-parallel rank holds whole attention heads)"));
    if (c.model.vocab_size < c.parallel.tp)
      par.fail("tp", cat("= ", c.parallel.tp, " is more than model.vocab_size = ", c.model.vocab_size));
  }
  r.family.check_layout(par, c);  // tp and ep against the family's own keys (its key/value heads, experts, ...)
  par.boolean("sequence_parallel", c.parallel.sequence_parallel);
  if (c.parallel.sequence_parallel) {
    if (c.parallel.tp < 2)
      par.fail("sequence_parallel", cat("= true needs parallel.tp > 1 (it splits the rows of a tensor-parallel group's "
                                        "norms and residuals over its ranks), got tp = ", c.parallel.tp));
    else if ((c.model.block_size / c.parallel.cp) % c.parallel.tp != 0)
      par.fail("sequence_parallel", cat("= true: model.block_size / parallel.cp = ", c.model.block_size / c.parallel.cp,
                                        " tokens per rank must be divisible by parallel.tp = ", c.parallel.tp,
                                        " (each tp rank holds an equal share of them)"));
  }
  par.real("stage_memory_gib", c.parallel.stage_memory_gib, 0, 1e9);  // GiB a pipeline rank may hold; 0: compute alone
  if (auto* b = par.get("balance")) {
    auto* arr = b->as_array();
    if (!arr) par.fail("balance", cat("expected an array of integers, got ", type_name(*b)));
    for (auto& e : *arr) {
      if (!e.is_integer() || e.value<int64_t>().value() < 1)
        par.fail("balance", "every entry must be an integer >= 1 (the number of config layers in that stage)");
      c.parallel.balance.push_back(e.value<int64_t>().value());
    }
  }
}

// [trace]: the traced steps.
void read_trace(const Reading& r, Config& c) {
  const Section tr = r.section("trace");
  if (auto* st = tr.get("steps")) {
    auto* arr = st->as_array();
    if (!arr || arr->size() != 2 || !(*arr)[0].is_integer() || !(*arr)[1].is_integer())
      tr.fail("steps", "expected two step numbers [first, last], like [10, 12]");
    c.trace.first = (*arr)[0].value<int64_t>().value();
    c.trace.last = (*arr)[1].value<int64_t>().value();
    if (c.trace.first < 1 || c.trace.last < c.trace.first)
      tr.fail("steps", cat("must be [first, last] with 1 <= first <= last, got [", c.trace.first, ", ", c.trace.last, "]"));
  }
}

// [log]: extra logs.
void read_log(const Reading& r, Config& c) {
  const Section lg = r.section("log");
  lg.boolean("tensorboard", c.log.tensorboard);
}

// [moe]: mixture-of-experts training.
void read_moe(const Reading& r, Config& c) {
  const Section moe = r.section("moe");
  moe.boolean("expert_bias", c.moe.expert_bias);
  moe.real("bias_update_rate", c.moe.bias_update_rate, 0, 1e3);
  if (c.moe.expert_bias && !r.family.has_experts())
    moe.fail("expert_bias", cat("= true needs a mixture of experts (model.type = ", r.with_experts,
                                "), got model.type = \"", c.model.type, "\""));
  if (c.moe.expert_bias && !r.family.without_expert_layers(c.model).empty())
    moe.fail("expert_bias", cat("= true needs MoE layers: ", r.family.without_expert_layers(c.model)));
}

// [checkpoint]: where, how often, what to resume.
void read_checkpoint(const Reading& r, Config& c) {
  const Section ck = r.section("checkpoint");
  ck.str("dir", c.checkpoint.dir);
  ck.integer("every", c.checkpoint.every, 0, INT64_MAX);
  ck.integer("keep", c.checkpoint.keep, 0, INT64_MAX);
  ck.boolean("save_initial", c.checkpoint.save_initial);
  ck.boolean("async", c.checkpoint.async);
  ck.str("resume", c.checkpoint.resume);
  if (c.checkpoint.resume.empty()) ck.fail("resume", "must be \"none\", \"auto\" or a checkpoint path");
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = c.run.dir + "/checkpoints";
}

// Rules across sections.
void check_across_sections(const Reading& r, const Config& c) {
  if (c.train.recompute == "blocks" && c.parallel.schedule == "zb-h1")
    r.section("train").fail("recompute", "= \"blocks\" does not combine with parallel.schedule = \"zb-h1\" (its separate weight-"
                            "gradient step needs each block's saved intermediates; use 1f1b or interleaved)");
  if (c.train.recompute == "blocks" && !r.family.language_model())
    r.section("train").fail("recompute", cat("= \"blocks\" recomputes transformer blocks and needs model.type = ", r.language_models));
}

}  // namespace

Config parse_config_text(const std::string& text, const std::string& source, const std::vector<std::string>& overrides,
                         const std::vector<const ModelKeys*>& families) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(cat(source, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
                    e.description()));
  }
  for (auto& ov : overrides) apply_override(root, ov, source);

  std::set<std::string> sections;
  for (const auto& [name, keys] : section_keys()) sections.insert(name);
  for (auto&& [k, v] : root) {
    if (!sections.count(std::string(k.str())))
      throw Error(cat(source, ": unknown section [", k.str(), "] (known: ", Section::join(sections), ")"));
    if (!v.is_table()) throw Error(cat(source, ": ", k.str(), " must be a table [", k.str(), "]"));
  }
  Config c;
  c.source = source;
  const toml::node* model = root.get("model");
  const ModelKeys& family = read_model(model ? model->as_table() : nullptr, source, families, c);
  const Reading r{root, source, family, family_names(families, &ModelKeys::language_model),
                  family_names(families, &ModelKeys::has_experts)};
  read_run(r, c);
  read_data(r, c);
  read_train(r, c);
  read_optimizer(r, c);
  read_lr_schedule(r, c);
  read_parallel(r, c);
  check_across_sections(r, c);
  read_trace(r, c);
  read_log(r, c);
  read_moe(r, c);
  read_checkpoint(r, c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const std::vector<const ModelKeys*>& families) {
  std::ifstream f(path);
  if (!f) throw Error(cat("--config ", path, ": cannot open the file"));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config_text(ss.str(), path, overrides, families);
}

std::string Config::to_toml(const ModelKeys& family) const {
  std::ostringstream o;
  auto q = [](const std::string& s) { return toml_quote(s); };
  auto num = [](double v) { return toml_number(v); };
  o << "[run]\ndir = " << q(run.dir) << "\n\n";
  o << "[model]\ntype = " << q(model.type) << "\nseed = " << model.seed << "\nloss = " << q(model.loss) << "\n";
  if (!model.init_from.empty()) o << "init_from = " << q(model.init_from) << "\n";
  family.write_keys(o, model);
  o << "\n[data]\ntrain = " << q(data.train) << "\n";
  if (!data.eval.empty()) o << "eval = " << q(data.eval) << "\n";
  o << "shuffle = " << (data.shuffle ? "true" : "false") << "\nseed = " << data.seed << "\n";
  if (data.preload != "auto") o << "preload = " << q(data.preload) << "\n";
  if (data.document_mask)
    o << "document_mask = true\nreset_positions = " << (data.reset_positions ? "true" : "false") << "\n";
  o << "\n";
  o << "[train]\nsteps = " << train.steps << "\nbatch_size = " << train.batch_size
    << "\nmicro_batches = " << train.micro_batches << "\nlog_every = " << train.log_every
    << "\neval_every = " << train.eval_every << "\nclip_grad_norm = " << num(train.clip_grad_norm)
    << "\ndevice = " << q(train.device) << "\nprecision = " << q(precision_name(train.precision)) << "\nthreads = " << train.threads
    << "\nrecompute = " << q(train.recompute) << "\nskip_nonfinite = " << train.skip_nonfinite << "\n";
  if (!train.time_limit.empty()) o << "time_limit = " << q(train.time_limit) << "\n";
  if (train.cpu_bf16_gemm != "auto") o << "cpu_bf16_gemm = " << q(train.cpu_bf16_gemm) << "\n";
  if (train.precision == Precision::fp8) o << "fp8_recipe = " << q(fp8_recipe_name(train.fp8_recipe)) << "\n";
  o << "\n[optimizer]\nname = " << q(optimizer.name) << "\nlr = " << num(optimizer.lr) << "\nbetas = ["
    << num(optimizer.beta1) << ", " << num(optimizer.beta2) << "]\neps = " << num(optimizer.eps)
    << "\nweight_decay = " << num(optimizer.weight_decay) << "\nmomentum = " << num(optimizer.momentum)
    << "\nzero = " << optimizer.zero << "\n\n";
  o << "[lr_schedule]\nname = " << q(lr_schedule.name) << "\nwarmup_steps = " << lr_schedule.warmup_steps
    << "\nmin_lr = " << num(lr_schedule.min_lr) << "\n\n";
  o << "[parallel]\ndp = " << parallel.dp << "\npp = " << parallel.pp << "\ntp = " << parallel.tp;
  if (parallel.cp > 1) o << "\ncp = " << parallel.cp;
  if (parallel.ep > 1) o << "\nep = " << parallel.ep;
  if (parallel.sequence_parallel) o << "\nsequence_parallel = true";
  o << "\nschedule = " << q(parallel.schedule)
    << "\nvirtual_stages = " << parallel.virtual_stages << "\n";
  if (!parallel.balance.empty()) {
    o << "balance = [";
    for (size_t i = 0; i < parallel.balance.size(); ++i) o << (i ? ", " : "") << parallel.balance[i];
    o << "]\n";
  }
  if (parallel.stage_memory_gib > 0) o << "stage_memory_gib = " << num(parallel.stage_memory_gib) << "\n";
  o << "bucket_mb = " << num(parallel.bucket_mb) << "\nfirst_bucket_mb = " << num(parallel.first_bucket_mb)
    << "\ncomm = " << q(parallel.comm)
    << "\ngrad_reduce = " << q(grad_reduce_name(parallel.grad_reduce))
    << "\nreshard_after_forward = " << (parallel.reshard_after_forward ? "true" : "false")
    << "\noverlap = " << (parallel.overlap ? "true" : "false")
    << "\nfp8_param_gather = " << (parallel.fp8_param_gather ? "true" : "false") << "\ntimeout = "
    << q(parallel.timeout) << "\n\n";
  o << "[log]\ntensorboard = " << (log.tensorboard ? "true" : "false") << "\n\n";
  if (family.has_experts())
    o << "[moe]\nexpert_bias = " << (moe.expert_bias ? "true" : "false") << "\nbias_update_rate = "
      << num(moe.bias_update_rate) << "\n\n";
  if (trace.on()) o << "[trace]\nsteps = [" << trace.first << ", " << trace.last << "]\n\n";
  o << "[checkpoint]\ndir = " << q(checkpoint.dir) << "\nevery = " << checkpoint.every << "\nkeep = " << checkpoint.keep
    << "\nsave_initial = " << (checkpoint.save_initial ? "true" : "false") << "\nresume = " << q(checkpoint.resume)
    << "\nasync = " << (checkpoint.async ? "true" : "false") << "\n";
  return o.str();
}

}  // namespace relay
