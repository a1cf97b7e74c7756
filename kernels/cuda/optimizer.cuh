// Optimizer updates with torch.optim's exact rules: AdamW (Loshchilov & Hutter, arXiv:1711.05101)
// and SGD with momentum (dampening 0, no Nesterov).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// param, grad, exp_avg, exp_avg_sq (count). step >= 1 counts this update (bias correction).
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t count,
                float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                cudaStream_t stream);
// param, grad (count); momentum_buffer (count) unused (may be null) when momentum == 0.
//   d = g + wd p;  if momentum != 0: buf = first_step ? d : momentum buf + d; d = buf;  p -= lr d
void sgd_step(float* param, const float* grad, float* momentum_buffer, int64_t count, float lr,
              float momentum, float weight_decay, bool first_step, cudaStream_t stream);

}  // namespace relay::cuda
