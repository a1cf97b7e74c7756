// Optimizer updates with torch.optim's exact formulas (AdamW: decoupled decay, bias correction;
// SGD: momentum buffer initialised to the first gradient, dampening 0, no Nesterov).
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  const float step_size = float(double(lr) / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.f - lr * weight_decay;
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i] * decay;
    m[i] = beta1 * m[i] + (1.f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.f - beta2) * g[i] * g[i];
    float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = pi - step_size * (m[i] / denom);
  }
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
              bool first_step) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + weight_decay * p[i];
    if (momentum != 0.f) {
      buf[i] = first_step ? d : momentum * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}

}  // namespace relay::cpu
