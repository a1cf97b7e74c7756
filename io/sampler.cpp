// Sampler: global batch positions -> sample indices, with per-epoch permutations from relay::permutation.
#include "io/sampler.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace relay {

Sampler::Sampler(const SamplerSpec& spec) : spec_(spec) {
  if (spec.samples < 1) throw Error(cat("sampler: the data set must have at least 1 sample, got ", spec.samples));
  if (spec.batch_size < 1) throw Error(cat("sampler: the global batch size must be >= 1, got ", spec.batch_size));
}

const std::vector<int64_t>& Sampler::epoch_order(int64_t epoch) {
  for (const Cached& c : cache_)
    if (c.epoch == epoch) return c.order;
  Cached& c = cache_[oldest_];
  oldest_ = 1 - oldest_;
  c.epoch = epoch;
  c.order = permutation(spec_.samples, spec_.seed, static_cast<uint64_t>(epoch));
  return c.order;
}

void Sampler::batch(int64_t step, int64_t begin, int64_t count, std::vector<int64_t>& out) {
  if (step < 0 || begin < 0 || count < 0 || begin + count > spec_.batch_size)
    throw Error(cat("sampler: step ", step, " slice [", begin, ", ", begin + count,
                    ") must be a non-negative step and lie within the global batch [0, ", spec_.batch_size, ")"));
  const int64_t n = spec_.samples;
  out.resize(static_cast<size_t>(count));
  int64_t p = step * spec_.batch_size + begin;
  for (int64_t j = 0; j < count;) {
    // One epoch's stretch of the slice at a time, so the permutation lookup happens once per stretch.
    const int64_t epoch = p / n, offset = p % n;
    const int64_t len = std::min(count - j, n - offset);
    if (spec_.shuffle) {
      const std::vector<int64_t>& order = epoch_order(epoch);
      for (int64_t i = 0; i < len; ++i) out[static_cast<size_t>(j + i)] = order[static_cast<size_t>(offset + i)];
    } else {
      for (int64_t i = 0; i < len; ++i) out[static_cast<size_t>(j + i)] = offset + i;
    }
    j += len;
    p += len;
  }
}

std::vector<int64_t> batch_samples(const SamplerSpec& s, int64_t step, int64_t begin, int64_t count) {
  std::vector<int64_t> out;
  Sampler(s).batch(step, begin, count, out);
  return out;
}

}  // namespace relay
