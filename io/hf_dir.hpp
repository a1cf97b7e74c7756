// Hugging Face model directories (transformers' save_pretrained layout) as files: config.json,
// generation_config.json and the weights in model.safetensors, or in several shards listed by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}). What the keys and tensors mean is
// the model family's (model/hf_model.hpp); here they are JSON and named tensors.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"

namespace relay {

// Writes the directory `dir`: config.json, generation_config.json (config's bos and eos token ids) and
// model.safetensors (the tensors as the file holds them; F32, or BF16 rounded to nearest even when bf16). Written
// under a temporary name and renamed into place, so a failure leaves no half directory; `dir` must not exist or
// be empty. Errors start with `where`.
void write_hf_files(const std::string& dir, const nlohmann::ordered_json& config,
                    const std::vector<CheckpointTensor>& tensors, bool bf16,
                    const std::map<std::string, std::string>& metadata, const std::string& where);

// True when `path` is a directory (model.init_from names an HF model directory rather than a file).
bool is_hf_dir(const std::string& path);

// A model directory for reading: config.json and every safetensors file it names. Errors start with
// `where` (e.g. `model.init_from = "DIR"`) and name the file at fault.
class HfDir {
 public:
  HfDir(const std::string& dir, const std::string& where);
  const nlohmann::json& config() const { return config_; }
  // Every tensor of the directory, name -> shape as stored.
  const std::map<std::string, Shape>& tensors() const { return shapes_; }
  // One tensor as float32 in the given shape (F32, BF16 and F16 in the file); an Error when it is missing.
  void read(const std::string& name, const Shape& shape, float* out) const;

 private:
  std::string dir_, where_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index into files_
  std::map<std::string, Shape> shapes_;
};

}  // namespace relay
