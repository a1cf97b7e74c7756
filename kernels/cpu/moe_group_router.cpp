// DeepSeek-V3's router on the CPU (arXiv:2412.19437 section 2.1.2; transformers' DeepseekV3TopkRouter is the
// reference): sigmoid scores in f32, a bias-corrected, group-limited top-k, the chosen scores renormalised and scaled;
// and its backward, with DeepSeek-V3's complementary sequence-wise loss on the per-token normalised scores.
// Row-parallel over tokens; every sum has a fixed order.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X>
void moe_group_router_forward(const X* logits, float* probs, int32_t* experts, float* weights, int64_t n, int64_t E,
                              int64_t k, int64_t n_group, int64_t topk_group, bool renormalize, float scale,
                              const float* bias) {
  const int64_t G = E / n_group;  // experts per group
#pragma omp parallel for schedule(static) if (n * E > kParallelScores)
  for (int64_t t = 0; t < n; ++t) {
    const X* z = logits + t * E;
    float* p = probs + t * E;
    std::vector<float> choice(static_cast<size_t>(E));  // (E) p + bias: the choice only
    for (int64_t e = 0; e < E; ++e) {
      p[e] = 1.f / (1.f + std::exp(-load(z[e])));
      choice[size_t(e)] = bias ? p[e] + bias[e] : p[e];
    }
    // Each group's score: the sum of its two best choice scores. The topk_group best groups stay candidates.
    std::vector<char> keep(static_cast<size_t>(n_group), n_group == topk_group);  // (n_group)
    if (n_group != topk_group) {
      std::vector<float> gscore(static_cast<size_t>(n_group));  // (n_group)
      for (int64_t g = 0; g < n_group; ++g) {
        float a = -INFINITY, b = -INFINITY;  // best, second best
        for (int64_t e = g * G; e < (g + 1) * G; ++e) {
          const float s = choice[size_t(e)];
          if (s > a) b = a, a = s;
          else if (s > b) b = s;
        }
        gscore[size_t(g)] = G > 1 ? a + b : a;
      }
      for (int64_t j = 0; j < topk_group; ++j) {
        int64_t best = -1;
        for (int64_t g = 0; g < n_group; ++g)
          if (!keep[size_t(g)] && (best < 0 || gscore[size_t(g)] > gscore[size_t(best)])) best = g;
        keep[size_t(best)] = 1;
      }
    }
    // Top k of the candidates by selection: k passes, each taking the largest remaining choice score.
    int32_t* ex = experts + t * k;
    float* w = weights + t * k;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[size_t(e / G)]) continue;
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ex[i] == e;
        if (!taken && (best < 0 || choice[size_t(e)] > choice[size_t(best)])) best = e;
      }
      ex[j] = int32_t(best);
      w[j] = p[best];
      sum += p[best];
    }
    const float denom = renormalize ? sum + 1e-20f : 1.f;
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom * scale;
  }
}

template <typename X>
void moe_group_router_backward(const float* probs, const int32_t* experts, const float* dweights, bool renormalize,
                               float scale, const float* seq_grad, int64_t T, X* dlogits, int64_t n, int64_t E,
                               int64_t k) {
#pragma omp parallel for schedule(static) if (n * E > kParallelScores)
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    const int32_t* ex = experts + t * k;
    const float* dw = dweights + t * k;
    std::vector<float> g(static_cast<size_t>(E), 0.f);  // (E) d loss / d p[t, e]
    if (seq_grad) {
      // q[e] = p[e] / D, D = sum_i p[i] + 1e-20: dp[e] = (dq[e] - sum_i dq[i] q[i]) / D.
      const float* dq = seq_grad + (t / T) * E;
      float D = 1e-20f, dot = 0;
      for (int64_t e = 0; e < E; ++e) D += p[e];
      for (int64_t e = 0; e < E; ++e) dot += dq[e] * (p[e] / D);
      for (int64_t e = 0; e < E; ++e) g[size_t(e)] = (dq[e] - dot) / D;
    }
    // weights[j] = scale p[ex[j]] / S (S = the chosen sum + 1e-20 when renormalising):
    // dp[ex[j]] = scale (dw[j] - sum_l dw[l] p[ex[l]] / S) / S.
    if (renormalize) {
      float S = 1e-20f, dot = 0;
      for (int64_t j = 0; j < k; ++j) S += p[ex[j]];
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * p[ex[j]] / S;
      for (int64_t j = 0; j < k; ++j) g[size_t(ex[j])] += scale * (dw[j] - dot) / S;
    } else {
      for (int64_t j = 0; j < k; ++j) g[size_t(ex[j])] += scale * dw[j];
    }
    // Through the sigmoid: dz = dp p (1 - p).
    X* dz = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) store(dz[e], g[size_t(e)] * p[e] * (1.f - p[e]));
  }
}

#define INST(X)                                                                                                   \
  template void moe_group_router_forward<X>(const X*, float*, int32_t*, float*, int64_t, int64_t, int64_t, int64_t, \
                                            int64_t, bool, float, const float*);                                    \
  template void moe_group_router_backward<X>(const float*, const int32_t*, const float*, bool, float, const float*, \
                                             int64_t, X*, int64_t, int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
