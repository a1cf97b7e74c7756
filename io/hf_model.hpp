// Hugging Face model directories (transformers' save_pretrained layout): config.json, generation_config.json
// and the weights in model.safetensors, or in several shards listed by model.safetensors.index.json
// ({"weight_map": {tensor name: shard file}}).
//
// Relay's GPT is transformers' GPT2LMHeadModel and its Llama is LlamaForCausalLM, with the same
// state_dict names, so the tensor mapping is the identity except for one thing: GPT-2's Conv1D layers
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) store their weight (in, out), Relay (out, in) as
// torch.nn.Linear does; those are transposed on the way in and out. A tied head is saved once, as the
// embedding (save_pretrained leaves lm_head.weight out). Mixtral and Qwen3-MoE are written with the per-expert
// names save_pretrained writes, and read from those or from transformers 5's fused expert tensors.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"

namespace relay {

// "gpt2" for model.type = "gpt", "llama" for "llama", "mixtral" and "qwen3_moe" for those; an Error (naming `where`)
// for the MLP.
std::string hf_model_type(const Config::Model& m, const std::string& where);

// Whether transformers stores this tensor of a model_type transposed (GPT-2's Conv1D weights).
bool hf_transposed(const std::string& model_type, const std::string& name);

// config.json for the model (torch_dtype "float32" or "bfloat16"). An Error naming the key when
// transformers' class cannot express the model (a GPT without biases).
nlohmann::ordered_json hf_config_json(const Config::Model& m, const std::string& torch_dtype, const std::string& tokenizer,
                                      const std::string& where);

// Writes the directory `dir` from the model's tensors (Relay's names and (out, in) shapes): config.json,
// generation_config.json and model.safetensors (F32, or BF16 rounded to nearest even when bf16). Written
// under a temporary name and renamed into place, so a failure leaves no half directory; `dir` must not
// exist or be empty.
void write_hf_dir(const std::string& dir, const Config::Model& m, const std::string& tokenizer,
                  std::vector<CheckpointTensor> tensors, bool bf16, const std::map<std::string, std::string>& metadata);

// True when `path` is a directory (model.init_from names an HF model directory rather than a file).
bool is_hf_dir(const std::string& path);

// A model directory for reading: config.json and every safetensors file it names. Errors start with
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
  std::string dir_, where_, model_type_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index into files_
  std::map<std::string, Shape> shapes_;
  // Mixtral and Qwen3-MoE: Relay's per-expert names read from transformers 5's fused expert tensors (source
  // tensor, offset of the slice in floats) or from a renamed tensor (offset -1).
  void name_experts();
  std::map<std::string, std::pair<std::string, int64_t>> slices_;
  mutable std::string cached_name_;  // the fused tensor read last, whole
  mutable std::vector<float> cached_;
};

}  // namespace relay
