// Mixture-of-experts routing on the CPU: the top-k router (softmax in f32, as transformers' MixtralTopKRouter and
// Qwen3MoeTopKRouter compute it; Shazeer et al., arXiv:1701.06538) with its backward, and the weighted combine of
// expert outputs back into token rows (with its backward). Row-parallel over tokens; every sum has a fixed order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X>
void moe_router_forward(const X* logits, float* probs, float* lse, int32_t* experts, float* weights, int64_t n,
                        int64_t E, int64_t k, bool renormalize, const float* bias) {
#pragma omp parallel for schedule(static) if (n * E > kParallelScores)
  for (int64_t t = 0; t < n; ++t) {
    const X* z = logits + t * E;
    float* p = probs + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = std::fmax(mx, load(z[e]));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(load(z[e]) - mx);
      sum += p[e];
    }
    const float inv = float(1.0 / sum);
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;
    lse[t] = mx + float(std::log(sum));
    // Top k by selection: k passes, each taking the largest remaining score p + bias (the lower expert on a tie).
    auto score = [&](int64_t e) { return bias ? p[e] + bias[e] : p[e]; };
    int32_t* ex = experts + t * k;
    float* w = weights + t * k;
    float top = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ex[i] == e;
        if (!taken && (best < 0 || score(e) > score(best))) best = e;
      }
      ex[j] = int32_t(best);
      w[j] = p[best];
      top += p[best];
    }
    if (renormalize)
      for (int64_t j = 0; j < k; ++j) w[j] /= top;
  }
}

template <typename X>
void moe_router_backward(const float* probs, const float* lse, const int32_t* experts, const float* dweights,
                         bool renormalize, const float* seq_grad, int64_t T, float z_scale, X* dlogits, int64_t n,
                         int64_t E, int64_t k) {
#pragma omp parallel for schedule(static) if (n * E > kParallelScores)
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    const int32_t* ex = experts + t * k;
    const float* dw = dweights + t * k;
    std::vector<float> g(size_t(E), 0.f);  // d loss / d p[t, e]
    if (seq_grad) {
      const float* sg = seq_grad + (t / T) * E;
      for (int64_t e = 0; e < E; ++e) g[size_t(e)] = sg[e];
    }
    // weights[j] = p[ex[j]] / S (S the top-k sum, when renormalising): dp[ex[j]] = (dw[j] - sum_l dw[l] w[l]) / S.
    float S = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) S += p[ex[j]];
    for (int64_t j = 0; j < k; ++j) dot += dw[j] * p[ex[j]] / S;
    for (int64_t j = 0; j < k; ++j) g[size_t(ex[j])] += renormalize ? (dw[j] - dot) / S : dw[j];
    // Through the softmax: dz[e] = p[e] (g[e] - sum_i g[i] p[i]); the z-loss adds 2 z_scale lse p[e].
    float gp = 0;
    for (int64_t e = 0; e < E; ++e) gp += g[size_t(e)] * p[e];
    const float zl = 2.f * z_scale * lse[t];
    X* dz = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) store(dz[e], p[e] * (g[size_t(e)] - gp + zl));
  }
}

// The combine and its backward run over a token's columns in blocks of kCombineCols, the k experts' rows added into
// a float block column by column (the same sum, 0 + w_0 x_0 + w_1 x_1 + ..., for every element as a loop over
// the experts inside the column loop forms), so that the column loops vectorise (cloned per ISA: simd.hpp).
// Before (a column's k terms inside, scalar bf16 loads, baseline SSE2), DeepSeek-V3 small's combine and its backward
// took 0.47 + 0.31 ms of CPU a step, 0.08 + 0.07 after (perf samples; bench/RESULTS.md, issue 42).
constexpr int64_t kCombineCols = 256;
// The backward's dot products d weight = sum_c dy_c x_c, in kCombineLanes partial sums (lane l takes the columns
// c = l mod kCombineLanes, each in column order) added in lane order at the end: a fixed order on every CPU.
constexpr int64_t kCombineLanes = 16;

template <typename X>
RELAY_CPU_CLONES void moe_combine(const X* rows, const int32_t* pos, const float* weights, X* y, int64_t n, int64_t k,
                                  int64_t C) {
#pragma omp parallel for schedule(static) if (n * k * C > kParallelElems)
  for (int64_t t = 0; t < n; ++t) {
    X* out = y + t * C;
    for (int64_t c0 = 0; c0 < C; c0 += kCombineCols) {
      const int64_t cn = std::min(kCombineCols, C - c0);
      float s[kCombineCols];  // (cn) this block's sums
      for (int64_t c = 0; c < cn; ++c) s[c] = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const float w = weights ? weights[t * k + j] : 1.f;
        const X* x = rows + int64_t(pos[t * k + j]) * C + c0;
        for (int64_t c = 0; c < cn; ++c) s[c] += w * load(x[c]);
      }
      for (int64_t c = 0; c < cn; ++c) store(out[c0 + c], s[c]);
    }
  }
}

template <typename X>
RELAY_CPU_CLONES void moe_combine_backward(const X* dy, const X* rows, const int32_t* pos, const float* weights,
                                           X* drows, float* dweights, int64_t n, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (n * k * C > kParallelElems)
  for (int64_t t = 0; t < n; ++t) {
    const X* g = dy + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = pos[t * k + j];
      const float w = weights[t * k + j];
      const X* x = rows + r * C;
      X* d = drows + r * C;
      float lane[kCombineLanes] = {};
      int64_t c = 0;
      for (; c + kCombineLanes <= C; c += kCombineLanes)
        for (int64_t l = 0; l < kCombineLanes; ++l) {
          const float gc = load(g[c + l]);
          lane[l] += gc * load(x[c + l]);
          store(d[c + l], w * gc);
        }
      for (int64_t l = 0; c < C; ++c, ++l) {
        const float gc = load(g[c]);
        lane[l] += gc * load(x[c]);
        store(d[c], w * gc);
      }
      float dot = 0;
      for (int64_t l = 0; l < kCombineLanes; ++l) dot += lane[l];
      dweights[t * k + j] = dot;
    }
  }
}

#define INST(X)                                                                                                   \
  template void moe_router_forward<X>(const X*, float*, float*, int32_t*, float*, int64_t, int64_t, int64_t, bool,   \
                                      const float*);                                                                \
  template void moe_router_backward<X>(const float*, const float*, const int32_t*, const float*, bool, const float*, \
                                       int64_t, float, X*, int64_t, int64_t, int64_t);                              \
  template void moe_combine<X>(const X*, const int32_t*, const float*, X*, int64_t, int64_t, int64_t);             \
  template void moe_combine_backward<X>(const X*, const X*, const int32_t*, const float*, X*, float*, int64_t,      \
                                        int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
