#include "model/generate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/rng.hpp"
#include "model/model_spec.hpp"

namespace relay {

Generator::Generator(Backend& be, const Config& cfg, ParamStore& store)
    : be_(be), block_size_(cfg.model.block_size), vocab_size_(cfg.model.vocab_size) {
  const ModelSpec spec = make_model_spec(cfg, 0);
  for (const BlockSpec& b : spec.blocks) {
    blocks_.push_back(make_block(b, store));
    if (!blocks_.back()->can_decode())  // the MLP's blocks have no decode step
      throw Error(cat("a model.type = \"", cfg.model.type, "\" model cannot generate (its ", block_kind_name(b.kind),
                      " blocks have no decode step)"));
  }
  caches_.resize(blocks_.size());
  tok_ = Tensor(be, {1}, DType::i32);
  for (size_t k = 0; k < blocks_.size(); ++k) {
    blocks_[k]->allocate_decode(be, 1, block_size_, caches_[k]);
    acts_.emplace_back(be, Shape{1, blocks_[k]->out_width()}, blocks_[k]->spec().dtype);
  }
  logits_f32_ = Tensor(be, {1, vocab_size_});
}

Generator::CacheSize Generator::cache_size() const {
  CacheSize c;
  bool same = true;
  for (const auto& b : blocks_) {
    const Block::DecodeCache d = b->decode_cache();
    if (d.bytes == 0) continue;
    same = same && (c.layers == 0 || d.values == c.values);
    if (c.layers++ == 0) c.values = d.values;
    c.bytes += d.bytes;
    c.standard_bytes += d.standard_bytes;
  }
  if (!same) c.values.clear();
  return c;
}

const std::vector<float>& Generator::step(int32_t tok, int64_t t) {
  cached_positions_ = std::max(cached_positions_, t + 1);
  be_.upload(tok_, &tok);
  for (size_t k = 0; k < blocks_.size(); ++k) blocks_[k]->decode(be_, k ? acts_[k - 1] : tok_, acts_[k], t, caches_[k]);
  be_.convert(acts_.back(), logits_f32_);  // (1, V)
  host_logits_.resize(static_cast<size_t>(vocab_size_));
  be_.download(host_logits_.data(), logits_f32_);
  return host_logits_;
}

int32_t Generator::sample(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t draw) {
  const size_t V = logits.size();
  if (opt.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> z(V);
  for (size_t i = 0; i < V; ++i) z[i] = double(logits[i]) / opt.temperature;
  if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < V) {  // keep the k largest, as torch.topk does
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<size_t>(opt.top_k - 1)];
    for (auto& v : z) if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (auto& v : z) sum += (v = std::exp(v - mx));
  Rng rng(opt.seed, draw);  // one stream per generated token: the same seed gives the same text
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < V; ++i) {
    if ((u -= z[i]) < 0) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(V - 1);
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                         std::vector<std::vector<float>>* logits_out) {
  RELAY_ASSERT(!prompt.empty(), "generation needs at least one prompt token");
  const int64_t T = block_size_;
  std::vector<int32_t> seq = prompt;
  int64_t cached = 0;  // positions of seq in the cache, counted from `base`
  size_t base = 0;     // seq index of cache position 0
  for (int64_t k = 0; k < opt.max_new_tokens; ++k) {
    if (static_cast<int64_t>(seq.size()) > T) {  // crop to the last T tokens and rebuild the cache
      base = seq.size() - static_cast<size_t>(T);
      cached = 0;
    }
    const std::vector<float>* logits = nullptr;
    for (; base + static_cast<size_t>(cached) < seq.size(); ++cached)
      logits = &step(seq[base + static_cast<size_t>(cached)], cached);
    if (logits_out) logits_out->push_back(*logits);
    seq.push_back(sample(*logits, opt, static_cast<uint64_t>(k)));
  }
  return seq;
}

}  // namespace relay
