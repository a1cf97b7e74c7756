// AdamW and SGD, one thread per parameter, optionally writing the bf16 working copy in the same pass.
// The bias corrections are computed once on the host in double, as torch does with Python floats,
// and passed in as the step size and sqrt(1 - b2^t). AdamW on many tensors runs the one per-element update
// (adamw_element) over chunks of every tensor, the tensors' pointers in the launch's arguments (PyTorch's
// multi_tensor_apply: apex's multi-tensor kernels; llm.c's fused AdamW).
#include "kernels/cuda/optimizer.cuh"

#include <cmath>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// One step's float constants, derived on the host in double (adamw_constants). one_minus_beta1/2 are float(1 - beta)
// rounded from double (not 1.0f - float(beta)), as on the CPU.
struct AdamWConstants {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
};

static AdamWConstants adamw_constants(double lr, double beta1, double beta2, double eps, double weight_decay,
                                      int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, t);
  const double bias_correction2 = 1.0 - std::pow(beta2, t);
  return {static_cast<float>(1.0 - lr * weight_decay), static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
          static_cast<float>(beta2), static_cast<float>(1.0 - beta2), static_cast<float>(eps),
          static_cast<float>(lr / bias_correction1), static_cast<float>(std::sqrt(bias_correction2))};
}

// A launch's share of a multi-tensor step, passed by value in the kernel's arguments (under the 4 KiB limit:
// 36 x 48 + 320 x 5 bytes): block b updates chunk block_chunk[b] of tensor block_tensor[b].
constexpr int kAdamWPackTensors = 36;
constexpr int kAdamWPackBlocks = 320;
constexpr int64_t kAdamWChunk = 65536;  // elements per block (PyTorch's multi_tensor_apply chunk size)
struct AdamWPack {
  AdamWTensor tensor[kAdamWPackTensors];
  int32_t block_chunk[kAdamWPackBlocks];
  uint8_t block_tensor[kAdamWPackBlocks];
};
static_assert(sizeof(AdamWPack) + sizeof(AdamWConstants) < 4000, "AdamWPack: over CUDA's 4 KiB of kernel arguments");

// kernels ---------------------------------------------------------------------------------------

// Element i's update, the one expression both AdamW kernels run (forced inline into each: the same operations, so
// the same contractions and the same bits whether a tensor is stepped alone or with many).
__device__ __forceinline__ void adamw_element(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                              __nv_bfloat16* work, int64_t i, const AdamWConstants& k) {
  const float g = grad[i];
  const float p = param[i] * k.decay;
  const float m = k.beta1 * exp_avg[i] + k.one_minus_beta1 * g;
  const float v = k.beta2 * exp_avg_sq[i] + k.one_minus_beta2 * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  const float denom = sqrtf(v) / k.bias_correction2_sqrt + k.eps;
  const float updated = p - k.step_size * (m / denom);
  param[i] = updated;
  if (work) work[i] = __float2bfloat16_rn(updated);
}

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* work,
                             int64_t count, AdamWConstants k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    adamw_element(param, grad, exp_avg, exp_avg_sq, work, i, k);
}

// One block per chunk of kAdamWChunk elements; the block's threads stride over it. The block's tensor is copied out
// of the parameter space once (its fields read there by index, as multi_tensor_apply's kernels do).
__global__ void adamw_many_kernel(AdamWPack pack, AdamWConstants k) {
  const AdamWTensor t = pack.tensor[pack.block_tensor[blockIdx.x]];
  const int64_t begin = int64_t(pack.block_chunk[blockIdx.x]) * kAdamWChunk;
  const int64_t end = begin + kAdamWChunk < t.count ? begin + kAdamWChunk : t.count;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    adamw_element(t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.work, i, k);
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
  adamw_kernel<<<grid_for(count), kBlock, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, work, count,
                                                       adamw_constants(lr, beta1, beta2, eps, weight_decay, step));
  CUDA_CHECK(cudaGetLastError());
}

void adamw_step_many(const AdamWTensor* tensors, int64_t n, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && (n == 0 || tensors), "adamw_step_many: " << n << " tensors");
  RELAY_ASSERT(step >= 1, "adamw_step_many: step " << step << " (the first update is step 1)");
  const AdamWConstants k = adamw_constants(lr, beta1, beta2, eps, weight_decay, step);
  AdamWPack pack;
  int nt = 0, nb = 0;  // tensors and blocks in the pack
  auto launch = [&] {
    if (nb > 0) {
      adamw_many_kernel<<<nb, kBlock, 0, stream>>>(pack, k);
      CUDA_CHECK(cudaGetLastError());
    }
    nb = 0;
  };
  for (int64_t j = 0; j < n; ++j) {
    const AdamWTensor& t = tensors[j];
    RELAY_ASSERT(t.count >= 0, "adamw_step_many: tensor " << j << " count " << t.count);
    if (t.count == 0) continue;
    RELAY_ASSERT(t.param && t.grad && t.exp_avg && t.exp_avg_sq, "adamw_step_many: tensor " << j << ": null pointer");
    RELAY_ASSERT((t.count + kAdamWChunk - 1) / kAdamWChunk <= INT32_MAX, "adamw_step_many: tensor " << j << " count "
                                                                             << t.count);
    if (nt == kAdamWPackTensors) {  // every tensor in the pack has all its blocks: a fresh pack
      launch();
      nt = 0;
    }
    pack.tensor[nt] = t;
    const int64_t chunks = (t.count + kAdamWChunk - 1) / kAdamWChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (nb == kAdamWPackBlocks) {  // full: launch, and carry this tensor's remaining chunks into a fresh pack
        launch();
        pack.tensor[0] = t;
        nt = 0;
      }
      pack.block_tensor[nb] = static_cast<uint8_t>(nt);
      pack.block_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
    }
    ++nt;
  }
  launch();
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
