// Optimizer updates with torch.optim's exact formulas (AdamW: decoupled decay, bias correction;
// SGD: momentum buffer initialised to the first gradient, dampening 0, no Nesterov), on f32 masters.
// Mixed precision: when work is given, the updated parameter is also rounded into its bf16 working copy
// in the same pass (llm.c's adamw kernel writes both), so no separate cast pass reads the masters.
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

namespace {
// One AdamW pass over [0, n); kWork: also round each updated parameter into work (a separate
// instantiation, so that neither loop tests for it per element and both vectorise).
template <bool kWork>
inline void adamw_loop(float* p, const float* g, float* m, float* v, bf16* work, int64_t n, float b1, float omb1,
                       float b2, float omb2, float step_size, float bc2_sqrt, float epsf, float decay) {
#pragma omp parallel for simd schedule(static) if (n > 8192)
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * decay;
    const float mi = b1 * m[i] + omb1 * g[i];
    const float vi = b2 * v[i] + omb2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + epsf;
    const float pn = pi - step_size * (mi / denom);
    p[i] = pn;
    if constexpr (kWork) work[i] = f32_to_bf16(pn);
  }
}
template <bool kWork>
inline void sgd_loop(float* p, const float* g, float* buf, bf16* work, int64_t n, float lrf, float mom, float wd,
                     bool first_step) {
#pragma omp parallel for simd schedule(static) if (n > 8192)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + wd * p[i];
    if (mom != 0.f) {
      buf[i] = first_step ? d : mom * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lrf * d;
    if constexpr (kWork) work[i] = f32_to_bf16(p[i]);
  }
}
}  // namespace

RELAY_CPU_CLONES
void adamw_step(float* p, const float* g, float* m, float* v, bf16* work, int64_t n, double lr,
                                 double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  const float b1 = float(beta1), omb1 = float(1.0 - beta1), b2 = float(beta2), omb2 = float(1.0 - beta2);
  const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2)), epsf = float(eps);
  const float decay = float(1.0 - lr * weight_decay);
  if (work)
    adamw_loop<true>(p, g, m, v, work, n, b1, omb1, b2, omb2, step_size, bc2_sqrt, epsf, decay);
  else
    adamw_loop<false>(p, g, m, v, work, n, b1, omb1, b2, omb2, step_size, bc2_sqrt, epsf, decay);
}

RELAY_CPU_CLONES void sgd_step(float* p, const float* g, float* buf, bf16* work, int64_t n, double lr,
                               double momentum, double weight_decay, bool first_step) {
  const float lrf = float(lr), mom = float(momentum), wd = float(weight_decay);
  if (work)
    sgd_loop<true>(p, g, buf, work, n, lrf, mom, wd, first_step);
  else
    sgd_loop<false>(p, g, buf, work, n, lrf, mom, wd, first_step);
}

}  // namespace relay::cpu
