// Rotary position embedding angles as transformers' Llama computes them (LlamaRotaryEmbedding), shared
// by the CPU and CUDA kernels so that both rotate by the same float cos and sin: inv_freq[i] =
// 1 / theta^(2i / hd) in float32, the angle a = float(pos) * inv_freq[i] in float32, cos and sin of that
// float angle evaluated in double and rounded once. YaRN's frequencies and cos/sin factor (Peng et al.,
// arXiv:2309.00071) as transformers' _compute_yarn_parameters builds them for DeepSeek-V3, in the same float32 steps.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"

namespace relay {

// YaRN: each frequency blends the plain one (extrapolation) and the plain one / factor (interpolation) through a ramp
// over the frequency index from `low` (all plain) to `high` (all interpolated); cos and sin are multiplied by
// `attention`. factor 1 and attention 1: plain rotary embeddings. Made on the host by yarn_scaling (below).
struct RopeScaling {
  float factor = 1.f;
  double low = 0, high = 0;  // transformers' find_correction_range (truncated to integers, as its default truncate)
  float attention = 1.f;     // transformers' attention_factor (attention_scaling on cos and sin)
  RELAY_HOST_DEVICE bool on() const { return factor != 1.f || attention != 1.f; }
};

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

// YaRN's frequency i, transformers' float32 steps: inv_freq_interpolation * (1 - e) + inv_freq_extrapolation * e
// with e = 1 - clamp((i - low) / (high - low), 0, 1). On the GPU the blend is rounded product by product, as the
// host computes it (nvcc would fuse it into an FMA, another rounding: the angle at position p would move by p ulps).
RELAY_HOST_DEVICE inline float yarn_inv_freq(int64_t i, int64_t head_dim, double theta, const RopeScaling& y) {
  const float pos_freq = float(pow(double(float(theta)), double(float(2 * i) / float(head_dim))));
  const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (y.factor * pos_freq);
  const double high = y.high == y.low ? y.high + 0.001 : y.high;  // transformers' guard against a zero-width ramp
  const float r = (float(i) - float(y.low)) / float(high - y.low);
  const float ramp = r < 0.0f ? 0.0f : (1.0f < r ? 1.0f : r);  // std::clamp(r, 0, 1), also on the device
  const float e = 1.0f - ramp;
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(interpolation, 1.0f - e), __fmul_rn(extrapolation, e));
#else
  return interpolation * (1.0f - e) + extrapolation * e;
#endif
}
// cos and sin of position pos's angle for frequency i under YaRN, each times attention (transformers' cos() and sin()
// in float32, then * attention_scaling).
RELAY_HOST_DEVICE inline void rope_cos_sin(int64_t pos, int64_t i, int64_t head_dim, double theta,
                                           const RopeScaling& y, float& c, float& s) {
  if (!y.on()) return rope_cos_sin(pos, i, head_dim, theta, c, s);
  const float a = float(pos) * yarn_inv_freq(i, head_dim, theta, y);
  c = float(cos(double(a))) * y.attention;
  s = float(sin(double(a))) * y.attention;
}

// transformers' yarn_get_mscale: 0.1 mscale ln(scale) + 1, or 1 for scale <= 1.
inline double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN's parameters for a rotary width `dim` as _compute_yarn_parameters makes them (truncate on; attention_factor
// from mscale and mscale_all_dim when both are non-zero, else from factor alone).
inline RopeScaling yarn_scaling(double factor, double original_max_position_embeddings, double beta_fast,
                                double beta_slow, double mscale, double mscale_all_dim, int64_t dim, double theta) {
  const double pi = 3.14159265358979323846;
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(original_max_position_embeddings / (rotations * 2 * pi)) / (2 * std::log(theta));
  };
  RopeScaling y;
  y.factor = float(factor);
  y.low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
  y.high = std::min(std::ceil(correction_dim(beta_slow)), double(dim - 1));
  y.attention = float(mscale != 0 && mscale_all_dim != 0 ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                                                        : yarn_mscale(factor, 1.0));
  return y;
}

}  // namespace relay
