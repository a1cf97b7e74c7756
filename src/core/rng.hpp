// Counter-based random numbers (SplitMix64 streams): every draw is a pure function of
// (seed, stream, position), so initialisation and shuffling never depend on the parallel layout.
#pragma once
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace relay {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  // stream separates independent users of one seed (layer index, epoch, ...).
  Rng(uint64_t seed, uint64_t stream) : state_(splitmix64(splitmix64(seed) ^ (stream * 0xD1B54A32D192ED03ull))) {}
  uint64_t next_u64() { return splitmix64(state_++); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) by Lemire's multiply-shift, without modulo bias worth noting for n << 2^64.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64); }
  double normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t position() const { return state_; }

 private:
  uint64_t state_;
};

// Fisher-Yates permutation of [0, n): a pure function of (seed, stream).
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(static_cast<uint64_t>(i) + 1)]);
  return p;
}

}  // namespace relay
