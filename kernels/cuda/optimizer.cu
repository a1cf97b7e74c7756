// AdamW and SGD, one thread per parameter, optionally writing the bf16 working copy in the same pass.
// The bias corrections are computed once on the host in double, as torch does with Python floats,
// and passed in as the step size and sqrt(1 - b2^t).
#include "kernels/cuda/optimizer.cuh"

#include <cmath>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

// one_minus_beta1/2 are float(1 - beta) rounded from double (not 1.0f - float(beta)), as on the CPU.
__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* work,
                             int64_t count, float decay, float beta1, float one_minus_beta1, float beta2,
                             float one_minus_beta2, float eps, float step_size, float bias_correction2_sqrt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    const float updated = p - step_size * (m / denom);
    param[i] = updated;
    if (work) work[i] = __float2bfloat16_rn(updated);
  }
}

__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buffer, __nv_bfloat16* work,
                           int64_t count, float lr, float momentum, float weight_decay, bool first_step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = param[i];
    float d = grad[i] + weight_decay * p;
    if (momentum != 0.0f) {
      const float buf = first_step ? d : momentum * momentum_buffer[i] + d;
      momentum_buffer[i] = buf;
      d = buf;
    }
    const float updated = p - lr * d;
    param[i] = updated;
    if (work) work[i] = __float2bfloat16_rn(updated);
  }
}

// launchers -------------------------------------------------------------------------------------

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* work,
                int64_t count, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "adamw_step: count " << count);
  RELAY_ASSERT(step >= 1, "adamw_step: step " << step << " (the first update is step 1)");
  if (count == 0) return;
  RELAY_ASSERT(param && grad && exp_avg && exp_avg_sq, "adamw_step: null pointer");
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  adamw_kernel<<<grid_for(count), kBlock, 0, stream>>>(
      param, grad, exp_avg, exp_avg_sq, work, count, decay, static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
      static_cast<float>(beta2), static_cast<float>(1.0 - beta2), static_cast<float>(eps), step_size, bc2_sqrt);
  CUDA_CHECK(cudaGetLastError());
}

void sgd_step(float* param, const float* grad, float* momentum_buffer, __nv_bfloat16* work, int64_t count,
              double lr, double momentum, double weight_decay, bool first_step, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "sgd_step: count " << count);
  if (count == 0) return;
  RELAY_ASSERT(param && grad && (momentum == 0.0 || momentum_buffer), "sgd_step: null pointer");
  sgd_kernel<<<grid_for(count), kBlock, 0, stream>>>(param, grad, momentum_buffer, work, count,
                                                     static_cast<float>(lr), static_cast<float>(momentum),
                                                     static_cast<float>(weight_decay), first_step);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
