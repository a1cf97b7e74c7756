// Fill, scale and dtype casts: one grid-stride loop each.
#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

template <typename T>
__global__ void fill_kernel(T* x, T value, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void scale_kernel(float* x, float s, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

// No __restrict__: y may alias a or b (each element is read before it is written, by one thread).
__global__ void add_kernel(const float* a, const float* b, float* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void cast_to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void cast_to_f32_kernel(const __nv_bfloat16* x, float* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// launchers -------------------------------------------------------------------------------------

void fill(float* x, float value, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "fill: count " << count);
  if (count == 0) return;
  fill_kernel<float><<<grid_for(count), kBlock, 0, stream>>>(x, value, count);
  CUDA_CHECK(cudaGetLastError());
}

void fill(int32_t* x, int32_t value, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "fill: count " << count);
  if (count == 0) return;
  fill_kernel<int32_t><<<grid_for(count), kBlock, 0, stream>>>(x, value, count);
  CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float s, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "scale: count " << count);
  if (count == 0) return;
  scale_kernel<<<grid_for(count), kBlock, 0, stream>>>(x, s, count);
  CUDA_CHECK(cudaGetLastError());
}

void add(const float* a, const float* b, float* y, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (a && b && y)), "add: count " << count);
  if (count == 0) return;
  add_kernel<<<grid_for(count), kBlock, 0, stream>>>(a, b, y, count);
  CUDA_CHECK(cudaGetLastError());
}

void cast_to_bf16(const float* x, __nv_bfloat16* y, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (x && y)), "cast_to_bf16: count " << count);
  if (count == 0) return;
  cast_to_bf16_kernel<<<grid_for(count), kBlock, 0, stream>>>(x, y, count);
  CUDA_CHECK(cudaGetLastError());
}

void cast_to_f32(const __nv_bfloat16* x, float* y, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (x && y)), "cast_to_f32: count " << count);
  if (count == 0) return;
  cast_to_f32_kernel<<<grid_for(count), kBlock, 0, stream>>>(x, y, count);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
