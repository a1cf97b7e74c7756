// Autoregressive generation from a language model (one rank, CPU or GPU) with key-value caches: each
// new token costs one position's pass through the model's own blocks (Block::decode: the blocks are the
// one definition of the model; generation does not restate it). Sampling as nanoGPT's generate():
// logits / temperature, optional top-k, then a draw; greedy (first maximum) when temperature = 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/block.hpp"
#include "model/param.hpp"

namespace relay {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = the whole vocabulary
  uint64_t seed = 1;
};

class Generator {
 public:
  // store must hold every parameter of cfg's model (its state_dict names), e.g. loaded from a
  // checkpoint. A relay::Error when the model cannot generate (an MLP).
  Generator(Backend& be, const Config& cfg, ParamStore& store);
  // prompt (>= 1 token ids in [0, vocab_size)) followed by max_new_tokens generated ones. Past
  // block_size tokens the context is cropped to the last block_size, as nanoGPT does.
  // logits, when given, receives the logits (vocab_size, f32) each new token was drawn from, in order.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                std::vector<std::vector<float>>* logits = nullptr);
  // moe.expert_bias: the checkpoint's bias, (MoE layers, n_experts), for every MoE layer's top-k choice.
  void set_expert_bias(const std::vector<float>& bias) {
    for (auto& b : blocks_) b->set_expert_bias(be_, bias);
  }
  // The decode caches: bytes one position adds over every block (and a standard key-value cache of the same heads),
  // the blocks that keep one, their values per position when all agree ("" otherwise), and the most positions the
  // caches have held so far (a run's total is bytes x that).
  struct CacheSize {
    int64_t bytes = 0, standard_bytes = 0, layers = 0;
    std::string values;
  };
  CacheSize cache_size() const;
  int64_t cached_positions() const { return cached_positions_; }

 private:
  // Runs position t (< block_size) of token `tok` through the model, filling the caches' row t;
  // returns the logits (vocab_size) on the host.
  const std::vector<float>& step(int32_t tok, int64_t t);
  int32_t sample(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t draw);

  Backend& be_;
  int64_t block_size_, vocab_size_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<BlockSaved> caches_;  // per block: its key-value cache and scratch (Block::allocate_decode)
  Tensor tok_;                      // i32 (1): the token at the position being run
  std::vector<Tensor> acts_;        // acts_[k] (1, out of block k), run dtype; the last holds the logits
  Tensor logits_f32_;               // (1, V) the logits widened for the host
  std::vector<float> host_logits_;
  int64_t cached_positions_ = 0;
};

}  // namespace relay
