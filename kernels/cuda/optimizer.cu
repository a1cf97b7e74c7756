// AdamW and SGD, one thread per parameter. The bias corrections are computed once on the host in
// double, as torch does with Python floats, and passed in as the step size and sqrt(1 - b2^t).
#include "kernels/cuda/optimizer.cuh"

#include <cmath>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t count,
                             float decay, float beta1, float beta2, float eps, float step_size,
                             float bias_correction2_sqrt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    param[i] = p - step_size * (m / denom);
  }
}

__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buffer, int64_t count, float lr,
                           float momentum, float weight_decay, bool first_step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = param[i];
    float d = grad[i];
    if (weight_decay != 0.0f) d += weight_decay * p;
    if (momentum != 0.0f) {
      const float buf = first_step ? d : momentum * momentum_buffer[i] + d;
      momentum_buffer[i] = buf;
      d = buf;
    }
    param[i] = p - lr * d;
  }
}

// launchers -------------------------------------------------------------------------------------

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t count,
                float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "adamw_step: count " << count);
  RELAY_ASSERT(step >= 1, "adamw_step: step " << step << " (the first update is step 1)");
  if (count == 0) return;
  RELAY_ASSERT(param && grad && exp_avg && exp_avg_sq, "adamw_step: null pointer");
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const float step_size = static_cast<float>(static_cast<double>(lr) / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = 1.0f - lr * weight_decay;
  adamw_kernel<<<grid_for(count), kBlock, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, count, decay, beta1,
                                                       beta2, eps, step_size, bc2_sqrt);
  CUDA_CHECK(cudaGetLastError());
}

void sgd_step(float* param, const float* grad, float* momentum_buffer, int64_t count, float lr,
              float momentum, float weight_decay, bool first_step, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "sgd_step: count " << count);
  if (count == 0) return;
  RELAY_ASSERT(param && grad && (momentum == 0.0f || momentum_buffer), "sgd_step: null pointer");
  sgd_kernel<<<grid_for(count), kBlock, 0, stream>>>(param, grad, momentum_buffer, count, lr, momentum,
                                                     weight_decay, first_step);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
