// Rotary position embedding angles as transformers' Llama computes them (LlamaRotaryEmbedding), shared
// by the CPU and CUDA kernels so that both rotate by the same float cos and sin: inv_freq[i] =
// 1 / theta^(2i / hd) in float32, the angle a = float(pos) * inv_freq[i] in float32, cos and sin of that
// float angle evaluated in double and rounded once.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RELAY_HOST_DEVICE __host__ __device__
#else
#define RELAY_HOST_DEVICE
#endif

namespace relay {

// float(theta) ** (float(2i) / hd) as torch's float32 pow, rounded from double (its error is below
// float's half ulp, so this is the correctly rounded value torch's pow gives up to an ulp), inverted in f32.
RELAY_HOST_DEVICE inline float rope_inv_freq(int64_t i, int64_t head_dim, double theta) {
  const float expo = float(2 * i) / float(head_dim);
  return 1.0f / float(pow(double(float(theta)), double(expo)));
}
// cos and sin of position pos's angle for frequency i.
RELAY_HOST_DEVICE inline void rope_cos_sin(int64_t pos, int64_t i, int64_t head_dim, double theta, float& c,
                                           float& s) {
  const float a = float(pos) * rope_inv_freq(i, head_dim, theta);
  c = float(cos(double(a)));
  s = float(sin(double(a)));
}

}  // namespace relay
