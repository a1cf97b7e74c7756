// Hugging Face model directories: config.json <-> [model], and the weights, for GPT-2 and Llama.
#include "io/hf_model.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/bf16.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace relay {

std::string hf_model_type(const Config::Model& m, const std::string& where) {
  if (m.is_gpt()) return "gpt2";
  if (m.is_llama()) return "llama";
  if (m.is_moe()) return m.type;  // "mixtral", "qwen3_moe": transformers' model_type spells them so
  throw Error(cat(where, ": model.type = \"", m.type, "\" has no Hugging Face form (gpt, llama, mixtral and qwen3_moe do)"));
}

bool hf_transposed(const std::string& model_type, const std::string& name) {
  if (model_type != "gpt2" || name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) return false;
  for (const char* conv1d : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const size_t n = std::strlen(conv1d);
    if (name.size() > n && name.compare(name.size() - n, n, conv1d) == 0) return true;
  }
  return false;
}

namespace {

// The token ids transformers' generate() should know: GPT-2's <|endoftext|> when the data was tokenized
// with GPT-2's tokenizer; none for bytes (no end-of-text token), so generate() never stops early.
json eos_token(const Config::Model& m, const std::string& tokenizer) {
  return tokenizer == "gpt2" && m.vocab_size > 50256 ? json(50256) : json(nullptr);
}

}  // namespace

nlohmann::ordered_json hf_config_json(const Config::Model& m, const std::string& torch_dtype, const std::string& tokenizer,
                                      const std::string& where) {
  const std::string type = hf_model_type(m, where);
  nlohmann::ordered_json c;
  if (type == "gpt2") {
    if (!m.bias)
      throw Error(cat(where, ": model.bias = false: transformers' GPT2LMHeadModel always has biases, so this GPT "
                             "has no Hugging Face form"));
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
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
  } else {
    const bool mixtral = type == "mixtral", qwen = type == "qwen3_moe";
    c["architectures"] = {mixtral ? "MixtralForCausalLM" : qwen ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM"};
    c["model_type"] = type;
    c["vocab_size"] = m.vocab_size;
    c["hidden_size"] = m.n_embd;
    // Mixtral's intermediate_size is an expert's width; Qwen3-MoE's the dense layers' (moe_intermediate_size the
    // experts').
    c["intermediate_size"] = mixtral ? m.moe_ffn_hidden : m.ffn_hidden > 0 ? m.ffn_hidden : m.moe_ffn_hidden;
    c["num_hidden_layers"] = m.n_layer;
    c["num_attention_heads"] = m.n_head;
    c["num_key_value_heads"] = m.n_kv_head;
    c["head_dim"] = m.head_dim > 0 ? m.head_dim : m.n_embd / m.n_head;
    if (mixtral) {
      c["num_local_experts"] = m.n_experts;
      c["num_experts_per_tok"] = m.experts_per_token;
      c["router_jitter_noise"] = 0.0;
      c["sliding_window"] = nullptr;
    }
    if (qwen) {
      c["num_experts"] = m.n_experts;
      c["num_experts_per_tok"] = m.experts_per_token;
      c["moe_intermediate_size"] = m.moe_ffn_hidden;
      c["norm_topk_prob"] = m.norm_topk_prob;
      c["decoder_sparse_step"] = m.decoder_sparse_step;
      c["mlp_only_layers"] = m.mlp_only_layers;
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
    }
    if (m.is_moe()) {
      c["router_aux_loss_coef"] = m.router_aux_loss_coef;
      c["output_router_logits"] = false;
    }
    c["max_position_embeddings"] = m.block_size;
    c["rms_norm_eps"] = m.norm_eps;
    c["rope_theta"] = m.rope_theta;  // transformers 4.x
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};  // transformers 5
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    if (!m.is_moe()) c["mlp_bias"] = false;
    c["attention_dropout"] = 0.0;
    if (m.is_llama()) c["pretraining_tp"] = 1;
  }
  c["tie_word_embeddings"] = m.tie_embeddings;
  c["initializer_range"] = m.init_std;
  c["bos_token_id"] = eos_token(m, tokenizer);
  c["eos_token_id"] = eos_token(m, tokenizer);
  c["use_cache"] = true;
  c["pad_token_id"] = nullptr;
  c["dtype"] = torch_dtype;        // transformers 5
  c["torch_dtype"] = torch_dtype;  // transformers 4
  return c;
}

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text << "\n";
  f.flush();
  if (!f) throw Error(cat("--out: cannot write ", path.string(), ": ", std::strerror(errno)));
}

// (rows, cols) -> (cols, rows), row-major.
std::vector<float> transposed(const float* v, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[r * cols + c];
  return t;
}

}  // namespace

void write_hf_dir(const std::string& dir, const Config::Model& m, const std::string& tokenizer,
                  std::vector<CheckpointTensor> tensors, bool bf16, const std::map<std::string, std::string>& metadata) {
  const std::string where = cat("--out ", dir);
  const auto config = hf_config_json(m, bf16 ? "bfloat16" : "float32", tokenizer, where);
  std::error_code ec;
  if (fs::exists(dir) && !(fs::is_directory(dir) && fs::is_empty(dir, ec)))
    throw Error(cat(where, ": exists and is not an empty directory; choose a new one"));
  const std::string type = hf_model_type(m, where);
  for (auto& t : tensors)
    if (hf_transposed(type, t.name)) {  // Relay's (out, in) -> Conv1D's (in, out)
      t.data = transposed(t.values(), t.shape[0], t.shape[1]);
      t.view = nullptr;
      t.shape = {t.shape[1], t.shape[0]};
    }
  // Everything goes into DIR.tmp-PID, renamed to DIR at the end: no half directory on failure.
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "out/" -> "out": the temporary is a sibling
  const fs::path tmp = cat(target.string(), ".tmp-", ::getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw Error(cat(where, ": cannot create ", tmp.string(), ": ", ec.message()));
  try {
    write_text(tmp / "config.json", config.dump(2));
    nlohmann::ordered_json gen = {{"_from_model_config", true}, {"bos_token_id", config["bos_token_id"]},
                                  {"eos_token_id", config["eos_token_id"]}};
    write_text(tmp / "generation_config.json", gen.dump(2));
    write_safetensors((tmp / "model.safetensors").string(), tensors, metadata, bf16 ? "BF16" : "F32");
    if (fs::exists(target)) fs::remove(target);  // the empty directory checked above
    fs::rename(tmp, target, ec);
    if (ec) throw Error(cat(where, ": cannot rename ", tmp.string(), " into place: ", ec.message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

bool is_hf_dir(const std::string& path) { return fs::is_directory(path); }

namespace {

json read_json(const fs::path& path, const std::string& where) {
  std::ifstream f(path);
  if (!f) throw Error(cat(where, ": cannot read ", path.filename().string()));
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(cat(where, ": ", path.filename().string(), " is not valid JSON (", e.what(), ")"));
  }
}

// config.json's value of `key`, or transformers' default for the class when save_pretrained left it out.
json value_or(const json& c, const std::string& key, const json& dflt) {
  auto it = c.find(key);
  return it == c.end() || it->is_null() ? dflt : *it;
}

bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

}  // namespace

HfModelDir::HfModelDir(const std::string& dir, const std::string& where) : dir_(dir), where_(where) {
  const fs::path d(dir);
  if (!fs::exists(d / "config.json"))
    throw Error(cat(where, ": the directory has no config.json (not a Hugging Face model directory)"));
  config_ = read_json(d / "config.json", where);
  if (!config_.is_object()) throw Error(cat(where, ": config.json is not a JSON object"));
  model_type_ = config_.value("model_type", "");
  std::vector<std::string> names;  // the safetensors files, in the index's order
  if (fs::exists(d / "model.safetensors.index.json")) {
    const json index = read_json(d / "model.safetensors.index.json", where);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(cat(where, ": model.safetensors.index.json has no \"weight_map\" object"));
    for (auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string())
        throw Error(cat(where, ": model.safetensors.index.json: weight_map[\"", tensor, "\"] is not a file name"));
      if (std::find(names.begin(), names.end(), file.get<std::string>()) == names.end())
        names.push_back(file.get<std::string>());
    }
  } else if (fs::exists(d / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    throw Error(cat(where, ": the directory has neither model.safetensors nor model.safetensors.index.json "
                           "(Relay reads safetensors weights, not pytorch_model.bin)"));
  }
  for (auto& name : names) {
    if (!fs::exists(d / name))
      throw Error(cat(where, ": model.safetensors.index.json names ", name, ", which the directory does not hold"));
    files_.push_back(std::make_unique<SafetensorsFile>((d / name).string()));
    for (auto& e : files_.back()->entries()) {
      file_of_[e.name] = files_.size() - 1;
      shapes_[e.name] = hf_transposed(model_type_, e.name) && e.shape.size() == 2 ? Shape{e.shape[1], e.shape[0]} : e.shape;
    }
  }
  if (model_type_ == "mixtral" || model_type_ == "qwen3_moe") name_experts();
}

// transformers 5's modules hold a layer's experts fused, gate_up_proj (E, 2F, C) ([gate; up] per expert) and
// down_proj (E, C, F), and name Mixtral's block mlp; save_pretrained writes the per-expert names Relay uses
// (block_sparse_moe.experts.E.w1 / w3 / w2 for Mixtral, mlp.experts.E.gate_proj / up_proj / down_proj for
// Qwen3-MoE). A directory in the fused form is read as if it held the per-expert tensors.
void HfModelDir::name_experts() {
  const bool mixtral = model_type_ == "mixtral";
  std::map<std::string, Shape> out;
  auto ends = [](const std::string& n, const std::string& tail) {
    return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
  };
  // transformers 5's "model.layers.N.mlp" -> Relay's prefix of that layer's experts and router.
  auto block = [&](const std::string& mlp) {
    return mixtral && ends(mlp, ".mlp") ? mlp.substr(0, mlp.size() - 4) + ".block_sparse_moe" : mlp;
  };
  const char* names[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
  for (auto& [name, shape] : shapes_) {
    const bool gate_up = ends(name, ".experts.gate_up_proj"), down = ends(name, ".experts.down_proj");
    if ((gate_up || down) && shape.size() == 3) {
      const std::string prefix = block(name.substr(0, name.size() - (gate_up ? 21 : 18))) + ".experts.";
      const int64_t E = shape[0], rows = gate_up ? shape[1] / 2 : shape[1], cols = shape[2];
      for (int64_t e = 0; e < E; ++e)
        for (int part = 0; part < (gate_up ? 2 : 1); ++part) {
          const std::string relay = cat(prefix, e, ".", names[gate_up ? part : 2], ".weight");
          slices_[relay] = {name, (e * (gate_up ? 2 : 1) + part) * rows * cols};
          out[relay] = {rows, cols};
        }
    } else if (mixtral && ends(name, ".mlp.gate.weight")) {
      const std::string relay = block(name.substr(0, name.size() - 12)) + ".gate.weight";
      slices_[relay] = {name, -1};
      out[relay] = shape;
    } else {
      out[name] = shape;
    }
  }
  shapes_ = std::move(out);
}

void HfModelDir::check_matches(const Config::Model& m) const {
  const std::string want = hf_model_type(m, where_);
  if (model_type_ != want) {
    const json arch = value_or(config_, "architectures", json::array());
    throw Error(cat(where_, ": config.json has model_type \"", model_type_, "\" (architectures ", arch.dump(),
                    ") but model.type = \"", m.type, "\" reads model_type \"", want, "\""));
  }
  // key in config.json, transformers' default, the Relay key and its value
  struct Pair { const char* hf; json dflt; const char* relay; json ours; };
  std::vector<Pair> pairs;
  if (want == "gpt2") {
    pairs = {{"vocab_size", 50257, "vocab_size", m.vocab_size}, {"n_positions", 1024, "block_size", m.block_size},
             {"n_embd", 768, "n_embd", m.n_embd}, {"n_layer", 12, "n_layer", m.n_layer},
             {"n_head", 12, "n_head", m.n_head}, {"tie_word_embeddings", true, "tie_embeddings", m.tie_embeddings}};
  } else {
    const json rope = value_or(config_, "rope_parameters", json::object());
    pairs = {{"vocab_size", 32000, "vocab_size", m.vocab_size}, {"hidden_size", 4096, "n_embd", m.n_embd},
             {"num_hidden_layers", 32, "n_layer", m.n_layer}, {"num_attention_heads", 32, "n_head", m.n_head},
             {"num_key_value_heads", value_or(config_, "num_attention_heads", 32), "n_kv_head", m.n_kv_head},
             {"rms_norm_eps", 1e-6, "norm_eps", m.norm_eps},
             {"rope_theta", rope.value("rope_theta", 10000.0), "rope_theta", m.rope_theta},
             {"tie_word_embeddings", false, "tie_embeddings", m.tie_embeddings}};
    // The MLP's keys, with transformers' defaults for each class.
    if (want == "llama") pairs.push_back({"intermediate_size", 11008, "ffn_hidden", m.ffn_hidden});
    if (want == "mixtral")
      pairs.insert(pairs.end(), {{"intermediate_size", 14336, "moe_ffn_hidden", m.moe_ffn_hidden},
                                 {"num_local_experts", 8, "n_experts", m.n_experts},
                                 {"num_experts_per_tok", 2, "experts_per_token", m.experts_per_token}});
    if (want == "qwen3_moe") {
      pairs.insert(pairs.end(), {{"moe_intermediate_size", 768, "moe_ffn_hidden", m.moe_ffn_hidden},
                                 // transformers 4 (and Qwen's published configs) say num_experts; 5 writes
                                 // num_local_experts
                                 {config_.contains("num_local_experts") ? "num_local_experts" : "num_experts", 128,
                                  "n_experts", m.n_experts},
                                 {"num_experts_per_tok", 8, "experts_per_token", m.experts_per_token},
                                 {"norm_topk_prob", false, "norm_topk_prob", m.norm_topk_prob},
                                 {"decoder_sparse_step", 1, "decoder_sparse_step", m.decoder_sparse_step},
                                 {"mlp_only_layers", json::array(), "mlp_only_layers", m.mlp_only_layers}});
      bool dense = false;
      for (int64_t i = 0; i < m.n_layer; ++i) dense = dense || !m.moe_layer(i);
      if (dense) pairs.push_back({"intermediate_size", 6144, "ffn_hidden", m.ffn_hidden});
    }
  }
  for (auto& p : pairs) {
    const json theirs = value_or(config_, p.hf, p.dflt);
    if (!same(theirs, p.ours))
      throw Error(cat(where_, ": config.json ", p.hf, " = ", theirs.dump(), " but model.", p.relay, " = ", p.ours.dump()));
  }
  // Keys with no Relay counterpart: the architecture Relay computes is fixed there.
  struct Fixed { const char* hf; json dflt; json ours; const char* why; };
  std::vector<Fixed> fixed;
  if (want == "gpt2") {
    fixed = {{"layer_norm_epsilon", 1e-5, 1e-5, "Relay's GPT layernorm"},
             {"n_inner", 4 * m.n_embd, 4 * m.n_embd, "Relay's GPT MLP is 4 * n_embd wide"},
             {"scale_attn_by_inverse_layer_idx", false, false, "Relay's GPT attention"}};
    const json act = value_or(config_, "activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      throw Error(cat(where_, ": config.json activation_function = ", act.dump(),
                      " but Relay's GPT uses GELU with the tanh approximation (\"gelu_new\")"));
    if (!m.bias)
      throw Error(cat(where_, ": config.json is a GPT-2 (which has biases) but model.bias = false"));
  } else {
    const int64_t hd = m.head_dim > 0 ? m.head_dim : m.n_embd / std::max<int64_t>(1, m.n_head);
    fixed = {{"hidden_act", "silu", "silu", "Relay's Llama MLP is SwiGLU"},
             {"attention_bias", false, false, "Relay's Llama has no biases"},
             {"mlp_bias", false, false, "Relay's Llama has no biases"},
             {"head_dim", m.n_embd / std::max<int64_t>(1, m.n_head), hd,
              m.head_dim > 0 ? "model.head_dim" : "Relay's heads are n_embd / n_head wide"},
             {"rope_scaling", nullptr, nullptr, "Relay applies plain rotary embeddings"}};
    if (want == "mixtral") fixed.push_back({"router_jitter_noise", 0.0, 0.0, "Relay's router adds no noise"});
    const char* window = want == "mixtral" ? "sliding_window" : want == "qwen3_moe" ? "use_sliding_window" : nullptr;
    if (window && !value_or(config_, window, nullptr).is_null() && value_or(config_, window, nullptr) != false)
      throw Error(cat(where_, ": config.json ", window, " = ", config_[window].dump(),
                      " but Relay's attention is causal over the whole block (no sliding window)"));
    const json rope = value_or(config_, "rope_parameters", json::object());
    if (rope.value("rope_type", "default") != "default")
      throw Error(cat(where_, ": config.json rope_parameters.rope_type = \"", rope.value("rope_type", ""),
                      "\" but Relay applies plain rotary embeddings (\"default\")"));
    const json max_pos = value_or(config_, "max_position_embeddings", 2048);
    if (!max_pos.is_number() || max_pos.get<double>() < double(m.block_size))
      throw Error(cat(where_, ": config.json max_position_embeddings = ", max_pos.dump(), " but model.block_size = ",
                      m.block_size, " is longer"));
  }
  for (auto& f : fixed) {
    const json theirs = f.ours.is_null() ? (config_.contains(f.hf) ? config_[f.hf] : json(nullptr))
                                         : value_or(config_, f.hf, f.dflt);
    if (!same(theirs, f.ours))
      throw Error(cat(where_, ": config.json ", f.hf, " = ", theirs.dump(), " but ", f.why, " (", f.ours.dump(), ")"));
  }
}

void HfModelDir::read(const std::string& name, const Shape& relay_shape, float* out) const {
  if (auto sl = slices_.find(name); sl != slices_.end()) {  // a fused expert tensor's slice, or a renamed one
    const auto& [source, offset] = sl->second;
    const SafetensorsFile& f = *files_[file_of_.at(source)];
    const Shape stored = f.find(source)->shape;
    if (offset < 0) return f.read(source, relay_shape, out);
    if (cached_name_ != source) {
      cached_.resize(static_cast<size_t>(shape_numel(stored)));
      f.read(source, stored, cached_.data());
      cached_name_ = source;
    }
    std::copy_n(cached_.data() + offset, shape_numel(relay_shape), out);
    return;
  }
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw Error(cat(where_, ": tensor ", name, " is missing from the directory"));
  const SafetensorsFile& f = *files_[it->second];
  if (!hf_transposed(model_type_, name)) return f.read(name, relay_shape, out);
  const Shape stored{relay_shape[1], relay_shape[0]};  // Conv1D (in, out)
  std::vector<float> buf(static_cast<size_t>(shape_numel(stored)));
  f.read(name, stored, buf.data());
  const std::vector<float> t = transposed(buf.data(), stored[0], stored[1]);
  std::copy(t.begin(), t.end(), out);
}

}  // namespace relay
