// Autoregressive generation from a GPT model (one rank, CPU or GPU) with a key-value cache: each new
// token costs one position's forward pass. Sampling as nanoGPT's generate(): logits / temperature,
// optional top-k, then a draw; greedy (first maximum) when temperature = 0.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "model/param.hpp"

namespace relay {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = the whole vocabulary
  uint64_t seed = 1;
};

class GptGenerator {
 public:
  // store must hold every parameter of cfg's model (nanoGPT names), e.g. loaded from a checkpoint.
  GptGenerator(Backend& be, const Config& cfg, ParamStore& store);
  // prompt (>= 1 token ids in [0, vocab_size)) followed by max_new_tokens generated ones. Past
  // block_size tokens the context is cropped to the last block_size, as nanoGPT does.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt);

 private:
  // Runs position t (< block_size) of token `tok` through the model, filling the caches' row t;
  // returns the logits (vocab_size) on the host.
  const std::vector<float>& step(int32_t tok, int64_t t);
  int32_t sample(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t draw);
  Param& p(const std::string& name);

  Backend& be_;
  const Config::Model m_;
  ParamStore& store_;
  // Per layer: k and v caches (1, block_size, C).
  std::vector<Tensor> kcache_, vcache_;
  Tensor tok_, x_, ln_, mean_, rstd_, qkv_, atty_, y_, fcg_, logits_, zero_;  // one row each (run dtype)
  Tensor logits_f32_;  // (1, V) the logits widened for the host
  std::vector<float> host_logits_;
};

}  // namespace relay
