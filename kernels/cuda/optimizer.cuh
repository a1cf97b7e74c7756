// Optimizer updates with torch.optim's exact rules: AdamW (Loshchilov & Hutter, arXiv:1711.05101)
// and SGD with momentum (dampening 0, no Nesterov), on float32 master weights and state. Mixed
// precision: when work is not null, the updated parameter is also rounded into its bf16 working copy
// in the same pass (llm.c's adamw kernel writes both), so no separate cast reads the masters again.
// Hyperparameters arrive in double, as torch's Python floats; the float constants the kernels use are
// derived from them in double first, as the CPU reference (kernels/cpu/optim.cpp) does.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// param, grad, exp_avg, exp_avg_sq (count) f32; work (count) bf16 or null. step >= 1 counts this
// update (bias correction).
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps);  work = bf16(p)
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* work,
                int64_t count, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                cudaStream_t stream);
// One tensor of a multi-tensor AdamW step: adamw_step's arguments, count elements each.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  __nv_bfloat16* work;  // null: no working copy
  int64_t count;
};
// adamw_step on every tensor, bit for bit (the same per-element update), in a few launches instead of one per tensor
// (PyTorch's multi_tensor_apply, llm.c's one AdamW launch over all parameters): each launch takes up to 36 tensors'
// pointers and sizes and 320 chunks of 65536 elements in its arguments (optimizer.cu's AdamWPack), one block per
// chunk. A tensor's count may be 0 (skipped); pointers as adamw_step's. A mixture of experts' hundreds of small
// matrices then cost a handful of launches.
void adamw_step_many(const AdamWTensor* tensors, int64_t n, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step, cudaStream_t stream);
// param, grad (count) f32; momentum_buffer (count) unused (may be null) when momentum == 0; work as above.
//   d = g + wd p;  if momentum != 0: buf = first_step ? d : momentum buf + d; d = buf;  p -= lr d
void sgd_step(float* param, const float* grad, float* momentum_buffer, __nv_bfloat16* work, int64_t count,
              double lr, double momentum, double weight_decay, bool first_step, cudaStream_t stream);

}  // namespace relay::cuda
