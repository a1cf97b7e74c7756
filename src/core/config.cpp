// TOML -> Config with strict validation: unknown sections and keys, wrong types and out-of-range
// values are errors naming the file and the key.
#include "core/config.hpp"

#include <toml++/toml.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"

namespace relay {

namespace {
// Spellings of the enums, in enum order (Section::enum_choice, to_toml).
constexpr const char* kPrecisionNames[] = {"fp32", "bf16", "tf32"};
constexpr const char* kGradReduceNames[] = {"fp32", "bf16"};
}  // namespace

const char* precision_name(Precision p) { return kPrecisionNames[static_cast<size_t>(p)]; }
const char* grad_reduce_name(GradReduce g) { return kGradReduceNames[static_cast<size_t>(g)]; }

namespace {

const char* type_name(const toml::node& n) {
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

// Reads one section with a fixed set of keys, checking types.
class Section {
 public:
  Section(const toml::table* t, std::string name, std::string source, std::set<std::string> known)
      : t_(t), name_(std::move(name)), source_(std::move(source)) {
    if (!t_) return;
    for (auto&& [k, v] : *t_)
      if (!known.count(std::string(k.str())))
        fail(std::string(k.str()), cat("unknown key (known keys in [", name_, "]: ", join(known), ")"));
  }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(cat(source_, ": ", name_, ".", key, ": ", why));
  }
  const toml::node* get(const std::string& key) const { return t_ ? t_->get(key) : nullptr; }

  void str(const std::string& key, std::string& out, bool required = false) const {
    auto* n = get(key);
    if (!n) { if (required) fail(key, "required key is missing"); return; }
    if (!n->is_string()) fail(key, cat("expected a string, got ", type_name(*n)));
    out = n->value<std::string>().value();
  }
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required = false) const {
    auto* n = get(key);
    if (!n) { if (required) fail(key, "required key is missing"); return; }
    if (!n->is_integer()) fail(key, cat("expected an integer, got ", type_name(*n)));
    int64_t v = n->value<int64_t>().value();
    if (v < lo || v > hi) fail(key, cat("must be in [", lo, ", ", hi, "], got ", v));
    out = v;
  }
  void u64(const std::string& key, uint64_t& out) const {
    int64_t v = static_cast<int64_t>(out);
    integer(key, v, 0, INT64_MAX);
    out = static_cast<uint64_t>(v);
  }
  void real(const std::string& key, double& out, double lo, double hi, bool lo_open = false) const {
    auto* n = get(key);
    if (!n) return;
    if (!n->is_number()) fail(key, cat("expected a number, got ", type_name(*n)));
    double v = n->is_integer() ? double(n->value<int64_t>().value()) : n->value<double>().value();
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
      fail(key, cat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", v));
    out = v;
  }
  void boolean(const std::string& key, bool& out) const {
    auto* n = get(key);
    if (!n) return;
    if (!n->is_boolean()) fail(key, cat("expected true or false, got ", type_name(*n)));
    out = n->value<bool>().value();
  }
  void choice(const std::string& key, std::string& out, const std::set<std::string>& allowed) const {
    str(key, out);
    if (!allowed.count(out)) fail(key, cat("must be one of ", join(allowed), ", got \"", out, "\""));
  }
  // A choice parsed into its enum: names[i] is the spelling of E(i).
  template <typename E, size_t N>
  void enum_choice(const std::string& key, E& out, const char* const (&names)[N]) const {
    std::string v = names[static_cast<size_t>(out)];
    choice(key, v, std::set<std::string>(std::begin(names), std::end(names)));
    for (size_t i = 0; i < N; ++i)
      if (v == names[i]) out = static_cast<E>(i);
  }
  static std::string join(const std::set<std::string>& s) {
    std::string r;
    for (auto& x : s) r += (r.empty() ? "" : ", ") + x;
    return r;
  }

 private:
  const toml::table* t_;
  std::string name_, source_;
};

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

std::string toml_quote(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
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

namespace {

constexpr const char* kMoeKeys[] = {"n_experts", "experts_per_token", "moe_ffn_hidden", "norm_topk_prob",
                                    "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
                                    "router_z_loss_coef", "head_dim"};

// The mixture-of-experts keys of [model] (model.type = "mixtral" or "qwen3_moe"; refused for "llama").
void parse_moe_keys(const Section& model, Config::Model& m) {
  if (!m.is_moe()) {
    for (const char* k : kMoeKeys)
      if (model.get(k))
        model.fail(k, cat("is a mixture-of-experts key; model.type = \"", m.type,
                          "\" has no experts (use \"mixtral\" or \"qwen3_moe\")"));
    return;
  }
  const bool qwen = m.type == "qwen3_moe";
  for (const char* k : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "head_dim"})
    if (!qwen && model.get(k))
      model.fail(k, cat("is a qwen3_moe key; model.type = \"mixtral\" has ",
                        std::string(k) == "norm_topk_prob" ? "always renormalised top-k weights"
                        : std::string(k) == "head_dim"     ? "head size n_embd / n_head"
                                                           : "experts in every layer"));
  model.integer("n_experts", m.n_experts, 1, 1 << 16, true);
  model.integer("experts_per_token", m.experts_per_token, 1, 1 << 16, true);
  if (m.experts_per_token > m.n_experts)
    model.fail("experts_per_token", cat("= ", m.experts_per_token, " is more than model.n_experts = ", m.n_experts,
                                        " (each token picks experts_per_token distinct experts)"));
  model.integer("moe_ffn_hidden", m.moe_ffn_hidden, 1, int64_t(1) << 24, true);
  m.norm_topk_prob = !qwen;  // Mixtral renormalises; Qwen3MoeConfig's default is false
  model.boolean("norm_topk_prob", m.norm_topk_prob);
  model.integer("decoder_sparse_step", m.decoder_sparse_step, 1, 1 << 16);
  model.integer("head_dim", m.head_dim, 1, 1 << 16);
  model.real("router_aux_loss_coef", m.router_aux_loss_coef, 0, 1e6);
  model.real("router_z_loss_coef", m.router_z_loss_coef, 0, 1e6);
  if (auto* l = model.get("mlp_only_layers")) {
    auto* arr = l->as_array();
    if (!arr) model.fail("mlp_only_layers", cat("expected an array of layer indices, got ", type_name(*l)));
    for (auto& e : *arr) {
      if (!e.is_integer() || e.value<int64_t>().value() < 0 || e.value<int64_t>().value() >= m.n_layer)
        model.fail("mlp_only_layers", cat("every entry must be a layer index in [0, model.n_layer = ", m.n_layer, ")"));
      m.mlp_only_layers.push_back(e.value<int64_t>().value());
    }
  }
  bool dense = false;
  for (int64_t i = 0; i < m.n_layer; ++i) dense = dense || !m.moe_layer(i);
  if (dense && m.ffn_hidden == 0)
    model.fail("ffn_hidden", "required key is missing: some layers are dense (model.mlp_only_layers, "
                             "model.decoder_sparse_step) and use a SwiGLU of ffn_hidden units");
}

}  // namespace

bool Config::Model::moe_layer(int64_t i) const {
  if (!is_moe()) return false;
  for (int64_t d : mlp_only_layers)
    if (d == i) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

Config parse_config_text(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(cat(source, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
                    e.description()));
  }
  for (auto& ov : overrides) apply_override(root, ov, source);

  const std::set<std::string> sections = {"run", "model", "data", "train", "optimizer", "lr_schedule", "parallel",
                                          "checkpoint", "trace", "log", "moe"};
  for (auto&& [k, v] : root) {
    if (!sections.count(std::string(k.str())))
      throw Error(cat(source, ": unknown section [", k.str(), "] (known: ", Section::join(sections), ")"));
    if (!v.is_table()) throw Error(cat(source, ": ", k.str(), " must be a table [", k.str(), "]"));
  }
  auto tab = [&](const char* n) { return root.get(n) ? root.get(n)->as_table() : nullptr; };
  Config c;
  c.source = source;

  Section run(tab("run"), "run", source, {"dir"});
  run.str("dir", c.run.dir);
  if (c.run.dir.empty()) run.fail("dir", "must not be empty");

  Section model(tab("model"), "model", source,
                {"type", "seed", "init_from", "loss", "layers", "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias",
                 "tie_embeddings", "init_std", "n_kv_head", "ffn_hidden", "rope_theta", "norm_eps", "n_experts",
                 "experts_per_token", "moe_ffn_hidden", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                 "router_aux_loss_coef", "router_z_loss_coef", "head_dim"});
  model.choice("type", c.model.type, {"mlp", "gpt", "llama", "mixtral", "qwen3_moe"});
  model.u64("seed", c.model.seed);
  model.str("init_from", c.model.init_from);
  model.choice("loss", c.model.loss, {"cross_entropy", "mse"});
  if (c.model.is_lm()) {
    const std::string t = c.model.type;
    for (const char* k : {"layers"})
      if (model.get(k)) model.fail(k, cat("is an MLP key; a model.type = \"", t, "\" model is given by vocab_size, "
                                          "block_size, n_layer, n_head and n_embd"));
    if (c.model.loss != "cross_entropy")
      model.fail("loss", cat("a model.type = \"", t, "\" model trains with \"cross_entropy\" (next-token loss)"));
    model.integer("vocab_size", c.model.vocab_size, 1, int64_t(1) << 31, true);
    model.integer("block_size", c.model.block_size, 1, int64_t(1) << 20, true);
    model.integer("n_layer", c.model.n_layer, 1, 1 << 16, true);
    model.integer("n_head", c.model.n_head, 1, 1 << 16, true);
    model.integer("n_embd", c.model.n_embd, 1, int64_t(1) << 20, true);
    if (c.model.llama_like()) c.model.tie_embeddings = false;  // Llama's default: an untied lm_head
    model.boolean("tie_embeddings", c.model.tie_embeddings);
    model.real("init_std", c.model.init_std, 0, 10, true);
    if (c.model.n_embd % c.model.n_head != 0)
      model.fail("n_embd", cat("= ", c.model.n_embd, " must be divisible by model.n_head = ", c.model.n_head,
                               " (each head gets n_embd / n_head channels)"));
    if (c.model.is_gpt()) {
      for (const char* k : {"n_kv_head", "ffn_hidden", "rope_theta", "norm_eps"})
        if (model.get(k)) model.fail(k, "is a Llama key; set model.type = \"llama\" to use it");
      for (const char* k : kMoeKeys)
        if (model.get(k)) model.fail(k, "is a mixture-of-experts key; set model.type = \"mixtral\" or \"qwen3_moe\"");
      model.boolean("bias", c.model.bias);
    } else {
      if (model.get("bias")) model.fail("bias", "is a GPT key: a Llama model has no biases");
      c.model.bias = false;
      c.model.n_kv_head = c.model.n_head;
      model.integer("n_kv_head", c.model.n_kv_head, 1, 1 << 16);
      model.integer("ffn_hidden", c.model.ffn_hidden, 1, int64_t(1) << 24, c.model.is_llama());
      model.real("rope_theta", c.model.rope_theta, 0, 1e12, true);
      model.real("norm_eps", c.model.norm_eps, 0, 1, true);
      if (c.model.n_head % c.model.n_kv_head != 0)
        model.fail("n_kv_head", cat("= ", c.model.n_kv_head, " must divide model.n_head = ", c.model.n_head,
                                    " (each key/value head serves n_head / n_kv_head query heads)"));
      parse_moe_keys(model, c.model);
      const int64_t hd = c.model.head_dim > 0 ? c.model.head_dim : c.model.n_embd / c.model.n_head;
      if (hd % 2 != 0)
        model.fail(c.model.head_dim > 0 ? "head_dim" : "n_head",
                   cat("gives head size ", hd, "; rotary embeddings need an even head size (",
                       c.model.head_dim > 0 ? "head_dim" : "n_embd / n_head", ")"));
    }
  } else {
    for (const char* k : {"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "tie_embeddings", "init_std",
                          "n_kv_head", "ffn_hidden", "rope_theta", "norm_eps", "n_experts", "experts_per_token",
                          "moe_ffn_hidden", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                          "router_aux_loss_coef", "router_z_loss_coef", "head_dim"})
      if (model.get(k)) model.fail(k, "is a language-model key; set model.type = \"gpt\", \"llama\", \"mixtral\" or \"qwen3_moe\" to use it");
    auto* layers = model.get("layers");
    if (!layers) model.fail("layers", "required key is missing");
    if (!layers->is_array()) model.fail("layers", cat("expected an array of tables, got ", type_name(*layers)));
    int idx = 0;
    for (auto& ln : *layers->as_array()) {
      std::string lname = cat("layers[", idx, "]");
      if (!ln.is_table()) model.fail(lname, "expected a table like { type = \"linear\", out = 256 }");
      Section l(ln.as_table(), cat("model.layers[", idx, "]"), source, {"type", "out", "eps"});
      LayerConfig lc;
      l.choice("type", lc.type, {"linear", "relu", "gelu", "tanh", "layernorm"});
      if (lc.type == "linear") l.integer("out", lc.out, 1, int64_t(1) << 31, true);
      else if (l.get("out")) l.fail("out", cat("only linear layers take 'out' (this layer is ", lc.type, ")"));
      if (lc.type == "layernorm") l.real("eps", lc.eps, 0, 1, true);
      else if (l.get("eps")) l.fail("eps", cat("only layernorm layers take 'eps' (this layer is ", lc.type, ")"));
      c.model.layers.push_back(lc);
      ++idx;
    }
    if (c.model.layers.empty()) model.fail("layers", "must hold at least one layer");
    bool any_linear = false;
    for (auto& l : c.model.layers) any_linear |= l.type == "linear";
    if (!any_linear) model.fail("layers", "needs at least one linear layer");
  }

  Section data(tab("data"), "data", source, {"train", "eval", "shuffle", "seed", "document_mask", "reset_positions"});
  data.str("train", c.data.train, true);
  data.str("eval", c.data.eval);
  data.boolean("shuffle", c.data.shuffle);
  data.u64("seed", c.data.seed);
  data.boolean("document_mask", c.data.document_mask);
  data.boolean("reset_positions", c.data.reset_positions);
  if (c.data.document_mask && !c.model.is_lm())
    data.fail("document_mask", "needs a language model (model.type = \"gpt\" or \"llama\"): an MLP has no documents");

  Section train(tab("train"), "train", source,
                {"steps", "batch_size", "micro_batches", "log_every", "eval_every", "clip_grad_norm", "device",
                 "precision", "threads", "time_limit", "recompute", "skip_nonfinite"});
  train.integer("steps", c.train.steps, 1, INT64_MAX / 4, true);
  train.integer("batch_size", c.train.batch_size, 1, int64_t(1) << 31, true);
  train.integer("micro_batches", c.train.micro_batches, 1, 1 << 20);
  train.integer("log_every", c.train.log_every, 1, INT64_MAX);
  train.integer("eval_every", c.train.eval_every, 0, INT64_MAX);
  train.real("clip_grad_norm", c.train.clip_grad_norm, 0, 1e30);
  train.choice("device", c.train.device, {"cpu", "cuda", "auto"});
  train.enum_choice("precision", c.train.precision, kPrecisionNames);
  train.integer("threads", c.train.threads, 0, 4096);
  train.str("time_limit", c.train.time_limit);
  train.choice("recompute", c.train.recompute, {"none", "blocks"});
  train.integer("skip_nonfinite", c.train.skip_nonfinite, 0, INT64_MAX);
  if (!c.train.time_limit.empty()) parse_duration(c.train.time_limit, source + ": train.time_limit");

  Section opt(tab("optimizer"), "optimizer", source, {"name", "lr", "betas", "eps", "weight_decay", "momentum", "zero"});
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

  Section lrs(tab("lr_schedule"), "lr_schedule", source, {"name", "warmup_steps", "min_lr"});
  lrs.choice("name", c.lr_schedule.name, {"constant", "cosine"});
  lrs.integer("warmup_steps", c.lr_schedule.warmup_steps, 0, INT64_MAX);
  lrs.real("min_lr", c.lr_schedule.min_lr, 0, 1e6);
  if (c.lr_schedule.warmup_steps > c.train.steps)
    lrs.fail("warmup_steps", cat("must be <= train.steps (", c.train.steps, "), got ", c.lr_schedule.warmup_steps));
  if (c.lr_schedule.min_lr > c.optimizer.lr)
    lrs.fail("min_lr", cat("must be <= optimizer.lr (", c.optimizer.lr, "), got ", c.lr_schedule.min_lr));

  Section par(tab("parallel"), "parallel", source,
              {"dp", "pp", "tp", "cp", "ep", "schedule", "virtual_stages", "balance", "bucket_mb", "comm", "grad_reduce",
               "timeout", "sequence_parallel", "reshard_after_forward"});
  par.integer("dp", c.parallel.dp, 1, 1 << 20);
  par.integer("pp", c.parallel.pp, 1, 1 << 16);
  par.integer("cp", c.parallel.cp, 1, 1 << 12);
  if (c.parallel.cp > 1) {
    if (!c.model.is_lm())
      par.fail("cp", cat("= ", c.parallel.cp, " needs model.type = \"gpt\" or \"llama\" (context parallelism splits "
                         "sequences; an MLP model has none)"));
    if (c.model.block_size % (2 * c.parallel.cp) != 0)
      par.fail("cp", cat("= ", c.parallel.cp, ": model.block_size = ", c.model.block_size, " must be divisible by 2 x cp = ",
                         2 * c.parallel.cp, " (each sequence is cut into 2 cp equal chunks, rank i holding chunks i and "
                         "2cp - 1 - i)"));
  }
  par.integer("tp", c.parallel.tp, 1, 1 << 12);
  par.integer("ep", c.parallel.ep, 1, 1 << 16);
  if (c.parallel.ep > 1) {  // Megatron-LM's and torchtitan's rule: the expert-parallel ranks are data-parallel ranks
    if (!c.model.is_moe())
      par.fail("ep", cat("= ", c.parallel.ep, " splits experts over ranks and needs a mixture of experts (model.type = "
                         "\"mixtral\" or \"qwen3_moe\"), got model.type = \"", c.model.type, "\""));
    if (c.parallel.dp % c.parallel.ep != 0)
      par.fail("ep", cat("= ", c.parallel.ep, " must divide parallel.dp = ", c.parallel.dp,
                         " (the expert-parallel ranks are taken from the data-parallel ranks)"));
    if (c.model.n_experts % c.parallel.ep != 0)
      par.fail("ep", cat("= ", c.parallel.ep, " must divide model.n_experts = ", c.model.n_experts,
                         " (each rank holds n_experts / ep whole experts)"));
    if (c.optimizer.zero >= 2)
      par.fail("ep", cat("= ", c.parallel.ep, " does not combine with optimizer.zero = ", c.optimizer.zero,
                         " yet (ZeRO-1 shards expert and dense optimizer states; use optimizer.zero = 1)"));
  }
  par.choice("schedule", c.parallel.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1"});
  par.integer("virtual_stages", c.parallel.virtual_stages, 1, 1024);
  par.real("bucket_mb", c.parallel.bucket_mb, 0, 1e6, true);
  par.choice("comm", c.parallel.comm, {"auto", "nccl", "mpi"});
  par.enum_choice("grad_reduce", c.parallel.grad_reduce, kGradReduceNames);
  par.boolean("reshard_after_forward", c.parallel.reshard_after_forward);
  par.str("timeout", c.parallel.timeout);
  if (c.parallel.timeout != "0") parse_duration(c.parallel.timeout, source + ": parallel.timeout");
  if (c.parallel.tp > 1) {
    if (!c.model.is_lm())
      par.fail("tp", cat("= ", c.parallel.tp, " needs model.type = \"gpt\" or \"llama\" (tensor parallelism splits "
                         "attention heads, MLP units and the vocabulary; an MLP model uses parallel.dp and parallel.pp)"));
    if (c.model.n_head % c.parallel.tp != 0)
      par.fail("tp", cat("= ", c.parallel.tp, " must divide model.n_head = ", c.model.n_head,
                         " (each tensor-parallel rank holds whole attention heads)"));
    if (c.model.is_moe() && c.model.moe_ffn_hidden % c.parallel.tp != 0)
      par.fail("tp", cat("= ", c.parallel.tp, " must divide model.moe_ffn_hidden = ", c.model.moe_ffn_hidden,
                         " (each expert's SwiGLU units are split over the tp ranks)"));
    if (c.model.llama_like() && c.model.n_kv_head % c.parallel.tp != 0)
      par.fail("tp", cat("= ", c.parallel.tp, " must divide model.n_kv_head = ", c.model.n_kv_head,
                         " (each tensor-parallel rank holds whole key/value heads)"));
    if (c.model.llama_like() && c.model.ffn_hidden % c.parallel.tp != 0)
      par.fail("tp", cat("= ", c.parallel.tp, " must divide model.ffn_hidden = ", c.model.ffn_hidden));
    if (c.model.vocab_size < c.parallel.tp)
      par.fail("tp", cat("= ", c.parallel.tp, " is more than model.vocab_size = ", c.model.vocab_size));
  }
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
  if (c.train.recompute == "blocks" && c.parallel.schedule == "zb-h1")
    train.fail("recompute", "= \"blocks\" does not combine with parallel.schedule = \"zb-h1\" (its separate weight-"
                            "gradient step needs each block's saved intermediates; use 1f1b or interleaved)");
  if (c.train.recompute == "blocks" && !c.model.is_lm())
    train.fail("recompute", "= \"blocks\" recomputes transformer blocks and needs model.type = \"gpt\" or \"llama\"");
  if (auto* b = par.get("balance")) {
    auto* arr = b->as_array();
    if (!arr) par.fail("balance", cat("expected an array of integers, got ", type_name(*b)));
    for (auto& e : *arr) {
      if (!e.is_integer() || e.value<int64_t>().value() < 1)
        par.fail("balance", "every entry must be an integer >= 1 (the number of config layers in that stage)");
      c.parallel.balance.push_back(e.value<int64_t>().value());
    }
  }

  Section tr(tab("trace"), "trace", source, {"steps"});
  if (auto* st = tr.get("steps")) {
    auto* arr = st->as_array();
    if (!arr || arr->size() != 2 || !(*arr)[0].is_integer() || !(*arr)[1].is_integer())
      tr.fail("steps", "expected two step numbers [first, last], like [10, 12]");
    c.trace.first = (*arr)[0].value<int64_t>().value();
    c.trace.last = (*arr)[1].value<int64_t>().value();
    if (c.trace.first < 1 || c.trace.last < c.trace.first)
      tr.fail("steps", cat("must be [first, last] with 1 <= first <= last, got [", c.trace.first, ", ", c.trace.last, "]"));
  }

  Section lg(tab("log"), "log", source, {"tensorboard"});
  lg.boolean("tensorboard", c.log.tensorboard);

  Section moe(tab("moe"), "moe", source, {"expert_bias", "bias_update_rate"});
  moe.boolean("expert_bias", c.moe.expert_bias);
  moe.real("bias_update_rate", c.moe.bias_update_rate, 0, 1e3);
  if (c.moe.expert_bias && !c.model.is_moe())
    moe.fail("expert_bias", cat("= true needs a mixture of experts (model.type = \"mixtral\" or \"qwen3_moe\"), got "
                                "model.type = \"", c.model.type, "\""));

  Section ck(tab("checkpoint"), "checkpoint", source, {"dir", "every", "keep", "save_initial", "resume", "async"});
  ck.str("dir", c.checkpoint.dir);
  ck.integer("every", c.checkpoint.every, 0, INT64_MAX);
  ck.integer("keep", c.checkpoint.keep, 0, INT64_MAX);
  ck.boolean("save_initial", c.checkpoint.save_initial);
  ck.boolean("async", c.checkpoint.async);
  ck.str("resume", c.checkpoint.resume);
  if (c.checkpoint.resume.empty()) ck.fail("resume", "must be \"none\", \"auto\" or a checkpoint path");
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = c.run.dir + "/checkpoints";
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) throw Error(cat("--config ", path, ": cannot open the file"));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config_text(ss.str(), path, overrides);
}

std::string Config::to_toml() const {
  std::ostringstream o;
  auto q = [](const std::string& s) { return toml_quote(s); };
  // The shortest text that reads back as the same double: numbers print as the user wrote them
  // (lr = 0.003, not 0.0030000000000000001), and a saved config loads back to the same Config.
  auto num = [](double v) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    std::string r(buf, res.ptr);
    if (r.find_first_of(".eEn") == std::string::npos) r += ".0";
    return r;
  };
  o << "[run]\ndir = " << q(run.dir) << "\n\n";
  o << "[model]\ntype = " << q(model.type) << "\nseed = " << model.seed << "\nloss = " << q(model.loss) << "\n";
  if (!model.init_from.empty()) o << "init_from = " << q(model.init_from) << "\n";
  if (model.is_lm()) {
    o << "vocab_size = " << model.vocab_size << "\nblock_size = " << model.block_size << "\nn_layer = " << model.n_layer
      << "\nn_head = " << model.n_head << "\nn_embd = " << model.n_embd;
    if (model.is_gpt()) o << "\nbias = " << (model.bias ? "true" : "false");
    o << "\ntie_embeddings = " << (model.tie_embeddings ? "true" : "false") << "\ninit_std = " << num(model.init_std)
      << "\n";
    if (model.llama_like())
      o << "n_kv_head = " << model.n_kv_head << (model.ffn_hidden > 0 ? cat("\nffn_hidden = ", model.ffn_hidden) : "")
        << "\nrope_theta = " << num(model.rope_theta) << "\nnorm_eps = " << num(model.norm_eps) << "\n";
    if (model.is_moe()) {
      o << "n_experts = " << model.n_experts << "\nexperts_per_token = " << model.experts_per_token
        << "\nmoe_ffn_hidden = " << model.moe_ffn_hidden << "\nrouter_aux_loss_coef = "
        << num(model.router_aux_loss_coef) << "\nrouter_z_loss_coef = " << num(model.router_z_loss_coef) << "\n";
      if (model.type == "qwen3_moe") {
        o << "norm_topk_prob = " << (model.norm_topk_prob ? "true" : "false")
          << "\ndecoder_sparse_step = " << model.decoder_sparse_step << "\nmlp_only_layers = [";
        for (size_t i = 0; i < model.mlp_only_layers.size(); ++i) o << (i ? ", " : "") << model.mlp_only_layers[i];
        o << "]\n";
        if (model.head_dim > 0) o << "head_dim = " << model.head_dim << "\n";
      }
    }
  } else {
    o << "layers = [\n";
    for (auto& l : model.layers) {
      o << "  { type = " << q(l.type);
      if (l.type == "linear") o << ", out = " << l.out;
      if (l.type == "layernorm") o << ", eps = " << num(l.eps);
      o << " },\n";
    }
    o << "]\n";
  }
  o << "\n[data]\ntrain = " << q(data.train) << "\n";
  if (!data.eval.empty()) o << "eval = " << q(data.eval) << "\n";
  o << "shuffle = " << (data.shuffle ? "true" : "false") << "\nseed = " << data.seed << "\n";
  if (data.document_mask)
    o << "document_mask = true\nreset_positions = " << (data.reset_positions ? "true" : "false") << "\n";
  o << "\n";
  o << "[train]\nsteps = " << train.steps << "\nbatch_size = " << train.batch_size
    << "\nmicro_batches = " << train.micro_batches << "\nlog_every = " << train.log_every
    << "\neval_every = " << train.eval_every << "\nclip_grad_norm = " << num(train.clip_grad_norm)
    << "\ndevice = " << q(train.device) << "\nprecision = " << q(precision_name(train.precision)) << "\nthreads = " << train.threads
    << "\nrecompute = " << q(train.recompute) << "\nskip_nonfinite = " << train.skip_nonfinite << "\n";
  if (!train.time_limit.empty()) o << "time_limit = " << q(train.time_limit) << "\n";
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
  o << "bucket_mb = " << num(parallel.bucket_mb) << "\ncomm = " << q(parallel.comm)
    << "\ngrad_reduce = " << q(grad_reduce_name(parallel.grad_reduce))
    << "\nreshard_after_forward = " << (parallel.reshard_after_forward ? "true" : "false") << "\ntimeout = "
    << q(parallel.timeout) << "\n\n";
  o << "[log]\ntensorboard = " << (log.tensorboard ? "true" : "false") << "\n\n";
  if (model.is_moe())
    o << "[moe]\nexpert_bias = " << (moe.expert_bias ? "true" : "false") << "\nbias_update_rate = "
      << num(moe.bias_update_rate) << "\n\n";
  if (trace.on()) o << "[trace]\nsteps = [" << trace.first << ", " << trace.last << "]\n\n";
  o << "[checkpoint]\ndir = " << q(checkpoint.dir) << "\nevery = " << checkpoint.every << "\nkeep = " << checkpoint.keep
    << "\nsave_initial = " << (checkpoint.save_initial ? "true" : "false") << "\nresume = " << q(checkpoint.resume)
    << "\nasync = " << (checkpoint.async ? "true" : "false") << "\n";
  return o.str();
}

}  // namespace relay
