// A model as a Hugging Face model directory: config.json <-> [model] and the tensors, each family's way.
#include "model/hf_model.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "model/family.hpp"

using json = nlohmann::json;

namespace relay {

namespace {

// model.type's family, which must have a Hugging Face form.
const ModelFamily& hf_family(const Config::Model& m, const std::string& where) {
  const ModelFamily& f = model_family(m.type);
  if (f.hf_model_type()) return f;
  std::vector<std::string> with;
  for (const ModelFamily* g : model_families())
    if (g->hf_model_type()) with.push_back(g->name());
  std::string names;
  for (size_t i = 0; i < with.size(); ++i) names += (i == 0 ? "" : i + 1 == with.size() ? " and " : ", ") + with[i];
  throw Error(cat(where, ": model.type = \"", m.type, "\" has no Hugging Face form (", names, " do)"));
}

// The token ids transformers' generate() should know: GPT-2's <|endoftext|> when the data was tokenized
// with GPT-2's tokenizer; none for bytes (no end-of-text token), so generate() never stops early.
json eos_token(const Config::Model& m, const std::string& tokenizer) {
  return tokenizer == "gpt2" && m.vocab_size > 50256 ? json(50256) : json(nullptr);
}

// (rows, cols) -> (cols, rows), row-major.
std::vector<float> transposed(const float* v, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[r * cols + c];
  return t;
}

}  // namespace

nlohmann::ordered_json hf_config_json(const Config::Model& m, const std::string& torch_dtype, const std::string& tokenizer,
                                      const std::string& where) {
  const ModelFamily& f = hf_family(m, where);
  nlohmann::ordered_json c;
  c["architectures"] = {f.hf_architecture()};
  c["model_type"] = f.hf_model_type();
  f.hf_config(c, m, where);
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

void write_hf_dir(const std::string& dir, const Config::Model& m, const std::string& tokenizer,
                  std::vector<CheckpointTensor> tensors, bool bf16, const std::map<std::string, std::string>& metadata) {
  const std::string where = cat("--out ", dir);
  const auto config = hf_config_json(m, bf16 ? "bfloat16" : "float32", tokenizer, where);
  const ModelFamily& f = model_family(m.type);
  for (const auto& [name, source] : f.hf_copies(m)) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const CheckpointTensor& t) { return t.name == source; });
    if (it == tensors.end()) throw Error(cat(where, ": no tensor ", source, " to write as ", name));
    CheckpointTensor copy;
    copy.name = name;
    copy.shape = it->shape;
    copy.data.assign(it->values(), it->values() + shape_numel(it->shape));
    tensors.push_back(std::move(copy));
  }
  for (auto& t : tensors)
    if (f.hf_transposed(t.name)) {  // Relay's (out, in) -> Conv1D's (in, out)
      t.data = transposed(t.values(), t.shape[0], t.shape[1]);
      t.view = nullptr;
      t.shape = {t.shape[1], t.shape[0]};
    }
  write_hf_files(dir, config, tensors, bf16, metadata, where);
}

HfModelDir::HfModelDir(const std::string& dir, const std::string& where) : dir_(dir, where), where_(where) {
  model_type_ = dir_.config().value("model_type", "");
  family_ = hf_model_family(model_type_);
  for (auto& [name, shape] : dir_.tensors())
    shapes_[name] = family_ && family_->hf_transposed(name) && shape.size() == 2 ? Shape{shape[1], shape[0]} : shape;
  if (family_) family_->hf_import_names(shapes_, slices_);
}

void HfModelDir::check_matches(const Config::Model& m) const {
  const ModelFamily& f = hf_family(m, where_);
  const std::string want = f.hf_model_type();
  if (model_type_ != want) {
    const json arch = hf_value_or(dir_.config(), "architectures", json::array());
    throw Error(cat(where_, ": config.json has model_type \"", model_type_, "\" (architectures ", arch.dump(),
                    ") but model.type = \"", m.type, "\" reads model_type \"", want, "\""));
  }
  f.hf_check(dir_.config(), m, where_);
}

void HfModelDir::read(const std::string& name, const Shape& relay_shape, float* out) const {
  if (auto sl = slices_.find(name); sl != slices_.end()) {  // a fused expert tensor's slice, or a renamed one
    const auto& [source, offset] = sl->second;
    if (offset < 0) return dir_.read(source, relay_shape, out);
    if (cached_name_ != source) {
      const Shape stored = dir_.tensors().at(source);
      cached_.resize(static_cast<size_t>(shape_numel(stored)));
      dir_.read(source, stored, cached_.data());
      cached_name_ = source;
    }
    std::copy_n(cached_.data() + offset, shape_numel(relay_shape), out);
    return;
  }
  if (!family_ || !family_->hf_transposed(name) || !dir_.tensors().count(name)) return dir_.read(name, relay_shape, out);
  const Shape stored{relay_shape[1], relay_shape[0]};  // Conv1D (in, out)
  std::vector<float> buf(static_cast<size_t>(shape_numel(stored)));
  dir_.read(name, stored, buf.data());
  const std::vector<float> t = transposed(buf.data(), stored[0], stored[1]);
  std::copy(t.begin(), t.end(), out);
}

}  // namespace relay
