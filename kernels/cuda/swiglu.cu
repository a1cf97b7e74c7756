// SwiGLU forward and backward, grid-stride elementwise kernels. sigmoid(g) = 1 / (1 + expf(-g)) is exact
// at both ends in float: 0 for very negative g (expf overflows to inf), 1 for large g.
#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

template <typename X>
__global__ void swiglu_forward_kernel(const X* gate, const X* up, X* h, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate[i]);
    store(h[i], g / (1.0f + expf(-g)) * load(up[i]));
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). All three inputs are read before either output is written.
template <typename X>
__global__ void swiglu_backward_kernel(const X* dh, const X* gate, const X* up, X* dgate, X* dup, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate[i]), u = load(up[i]), d = load(dh[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    store(dgate[i], d * u * (s * (1.0f + g * (1.0f - s))));
    store(dup[i], d * (g * s));
  }
}

template <typename X>
void swiglu_forward(const X* gate, const X* up, X* h, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "swiglu_forward: count " << count);
  if (count == 0) return;
  swiglu_forward_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(gate, up, h, count);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void swiglu_backward(const X* dh, const X* gate, const X* up, X* dgate, X* dup, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0, "swiglu_backward: count " << count);
  if (count == 0) return;
  swiglu_backward_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(dh, gate, up, dgate, dup, count);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                          \
  template void swiglu_forward<X>(const X*, const X*, X*, int64_t, cudaStream_t);       \
  template void swiglu_backward<X>(const X*, const X*, const X*, X*, X*, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
