// Activations, one thread per element, on float or bf16 storage (float math). GELU is the exact form
// 0.5 x (1 + erf(x / sqrt 2)), with derivative Phi(x) + x phi(x) (Hendrycks & Gimpel, arXiv:1606.08415),
// as torch computes it.
#include "kernels/cuda/activation.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;

template <ActKind A>
__device__ inline float act_forward(float x) {
  if constexpr (A == ActKind::relu) return x > 0.0f ? x : 0.0f;
  if constexpr (A == ActKind::gelu) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  if constexpr (A == ActKind::tanh) return tanhf(x);
  if constexpr (A == ActKind::gelu_tanh) return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  return 0.0f;
}

template <ActKind A>
__device__ inline float act_derivative(float x) {
  if constexpr (A == ActKind::relu) return x > 0.0f ? 1.0f : 0.0f;
  if constexpr (A == ActKind::gelu) {
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
  }
  if constexpr (A == ActKind::tanh) {
    const float t = tanhf(x);
    return 1.0f - t * t;
  }
  if constexpr (A == ActKind::gelu_tanh) {
    const float t = tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  }
  return 0.0f;
}

template <ActKind A, typename X>
__global__ void activation_forward_kernel(const X* x, X* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(y[i], act_forward<A>(load(x[i])));
}

// No __restrict__: dx may alias dy (each element is read before it is written, by the same thread).
template <ActKind A, typename X>
__global__ void activation_backward_kernel(const X* x, const X* dy, X* dx, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(dx[i], load(dy[i]) * act_derivative<A>(load(x[i])));
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void activation_forward(ActKind act, const X* x, X* y, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (x && y)), "activation_forward: count " << count);
  if (count == 0) return;
  const unsigned grid = grid_for(count);
  switch (act) {
    case ActKind::relu: activation_forward_kernel<ActKind::relu><<<grid, kBlock, 0, stream>>>(x, y, count); break;
    case ActKind::gelu: activation_forward_kernel<ActKind::gelu><<<grid, kBlock, 0, stream>>>(x, y, count); break;
    case ActKind::tanh: activation_forward_kernel<ActKind::tanh><<<grid, kBlock, 0, stream>>>(x, y, count); break;
    case ActKind::gelu_tanh:
      activation_forward_kernel<ActKind::gelu_tanh><<<grid, kBlock, 0, stream>>>(x, y, count);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void activation_backward(ActKind act, const X* x, const X* dy, X* dx, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (x && dy && dx)), "activation_backward: count " << count);
  if (count == 0) return;
  const unsigned grid = grid_for(count);
  switch (act) {
    case ActKind::relu: activation_backward_kernel<ActKind::relu><<<grid, kBlock, 0, stream>>>(x, dy, dx, count); break;
    case ActKind::gelu: activation_backward_kernel<ActKind::gelu><<<grid, kBlock, 0, stream>>>(x, dy, dx, count); break;
    case ActKind::tanh: activation_backward_kernel<ActKind::tanh><<<grid, kBlock, 0, stream>>>(x, dy, dx, count); break;
    case ActKind::gelu_tanh:
      activation_backward_kernel<ActKind::gelu_tanh><<<grid, kBlock, 0, stream>>>(x, dy, dx, count);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                  \
  template void activation_forward<X>(ActKind, const X*, X*, int64_t, cudaStream_t);            \
  template void activation_backward<X>(ActKind, const X*, const X*, X*, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
