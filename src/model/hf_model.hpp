// A model as a Hugging Face model directory (transformers' save_pretrained layout; the files are io/hf_dir.hpp's).
// Each family says how (model/family.hpp): config.json's model_type, architectures and keys, which tensors
// transformers stores transposed (GPT-2's Conv1D weights (in, out), Relay (out, in) as torch.nn.Linear) and how a
// directory's names map to Relay's (Mixtral's and Qwen3-MoE's fused expert tensors of transformers 5). Relay's
// state_dict names are otherwise transformers'. A tied head is saved once, as the embedding (save_pretrained
// leaves lm_head.weight out).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "io/hf_dir.hpp"

namespace relay {

class ModelFamily;

// config.json for the model (torch_dtype "float32" or "bfloat16"). An Error naming `where` for a family with no
// Hugging Face form (the MLP), or naming the key when transformers' class cannot express the model (a GPT
// without biases).
nlohmann::ordered_json hf_config_json(const Config::Model& m, const std::string& torch_dtype, const std::string& tokenizer,
                                      const std::string& where);

// Writes the directory `dir` from the model's tensors (Relay's names and (out, in) shapes): config.json,
// generation_config.json and model.safetensors (F32, or BF16 rounded to nearest even when bf16). Written
// under a temporary name and renamed into place, so a failure leaves no half directory; `dir` must not
// exist or be empty.
void write_hf_dir(const std::string& dir, const Config::Model& m, const std::string& tokenizer,
                  std::vector<CheckpointTensor> tensors, bool bf16, const std::map<std::string, std::string>& metadata);

// A model directory for reading, its tensors under Relay's names and in Relay's layout. Errors start with
// `where` (e.g. `model.init_from = "DIR"`) and name the file at fault.
class HfModelDir {
 public:
  HfModelDir(const std::string& dir, const std::string& where);
  // Checks config.json against the run's [model]: the model_type, then every key that has a Relay
  // counterpart; the first difference is an Error naming both keys and both values.
  void check_matches(const Config::Model& m) const;
  // Every tensor of the directory, name -> shape as Relay holds it (GPT-2's Conv1D weights (out, in)).
  const std::map<std::string, Shape>& tensors() const { return shapes_; }
  // One tensor as float32 in Relay's layout (F32, BF16 and F16 in the file).
  void read(const std::string& name, const Shape& relay_shape, float* out) const;

 private:
  HfDir dir_;
  std::string where_, model_type_;
  const ModelFamily* family_;  // config.json's model_type's; null when no family has it
  std::map<std::string, Shape> shapes_;
  // Relay's names read from a slice of a fused tensor (source tensor, offset of the slice in floats) or from a
  // renamed tensor (offset -1).
  std::map<std::string, std::pair<std::string, int64_t>> slices_;
  mutable std::string cached_name_;  // the fused tensor read last, whole
  mutable std::vector<float> cached_;
};

}  // namespace relay
