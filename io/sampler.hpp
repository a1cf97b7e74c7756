// Which samples a training step uses: a pure function of (samples, batch size, shuffle, seed, step),
// independent of the parallel layout, so any dp x pp split trains on the same global batches.
//
// The global batches tile an infinite stream of positions: step k (0-based) takes positions
// k*B .. k*B+B-1. Position p lies in epoch e = p / N at offset o = p % N and names sample o, or
// permutation(N, seed, stream = e)[o] when shuffling. A batch may straddle an epoch boundary, and
// every epoch visits each sample exactly once. Data-parallel replicas take disjoint slices
// [begin, begin+count) of the global batch.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace relay {

struct SamplerSpec {
  int64_t samples;     // N
  int64_t batch_size;  // B, the global batch
  bool shuffle;
  uint64_t seed;
};

// Sample indices of positions [begin, begin+count) of step's global batch.
std::vector<int64_t> batch_samples(const SamplerSpec& s, int64_t step, int64_t begin, int64_t count);

// The same function, keeping the permutations of the last two epochs it touched (a batch touches
// at most two unless B > N), so that a step costs O(count) instead of O(N).
class Sampler {
 public:
  explicit Sampler(const SamplerSpec& spec);  // throws relay::Error if N < 1 or B < 1
  const SamplerSpec& spec() const { return spec_; }
  // out = sample indices of positions [begin, begin+count) of step's global batch; out's storage is reused.
  void batch(int64_t step, int64_t begin, int64_t count, std::vector<int64_t>& out);

 private:
  const std::vector<int64_t>& epoch_order(int64_t epoch);

  struct Cached {
    int64_t epoch = -1;
    std::vector<int64_t> order;  // (N) permutation of the epoch
  };
  SamplerSpec spec_;
  std::array<Cached, 2> cache_;
  size_t oldest_ = 0;
};

}  // namespace relay
