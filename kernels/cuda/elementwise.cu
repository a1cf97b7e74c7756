// Fill, scale, add and dtype conversion: one grid-stride loop each, on float or bf16 storage.
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

template <typename X>
__global__ void scale_kernel(X* x, float s, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(x[i], load(x[i]) * s);
}

// No __restrict__: y may alias a or b (each element is read before it is written, by one thread).
template <typename X>
__global__ void add_kernel(const X* a, const X* b, X* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(y[i], load(a[i]) + load(b[i]));
}

template <typename X, typename Y>
__global__ void convert_kernel(const X* x, Y* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(y[i], load(x[i]));
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void fill(X* x, float value, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "fill: count " << count);
  if (count == 0) return;
  X v;
  if constexpr (std::is_same_v<X, float>)
    v = value;
  else
    v = __float2bfloat16_rn(value);  // rounded once, on the host
  fill_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(x, v, count);
  CUDA_CHECK(cudaGetLastError());
}

void fill_i32(int32_t* x, int32_t value, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "fill_i32: count " << count);
  if (count == 0) return;
  fill_kernel<int32_t><<<grid_for(count), kBlock, 0, stream>>>(x, value, count);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void scale(X* x, float s, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || x), "scale: count " << count);
  if (count == 0) return;
  scale_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(x, s, count);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void add(const X* a, const X* b, X* y, int64_t count, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && (count == 0 || (a && b && y)), "add: count " << count);
  if (count == 0) return;
  add_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(a, b, y, count);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X, typename Y>
void convert(const X* x, Y* y, int64_t count, cudaStream_t stream) {
  static_assert(!std::is_same_v<X, Y>, "convert: a same-type conversion is a copy");
  RELAY_ASSERT(count >= 0 && (count == 0 || (x && y)), "convert: count " << count);
  if (count == 0) return;
  convert_kernel<X, Y><<<grid_for(count), kBlock, 0, stream>>>(x, y, count);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
__global__ void gather_rows_kernel(const X* src, const int32_t* index, X* dst, int64_t n, int64_t w) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * w; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[int64_t(index[i / w]) * w + i % w];
}

template <typename X>
void gather_rows(const X* src, const int32_t* index, X* dst, int64_t n, int64_t w, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && w >= 0, "gather_rows: n " << n << ", w " << w);
  if (n == 0 || w == 0) return;
  RELAY_ASSERT(src && index && dst, "gather_rows: null pointer");
  gather_rows_kernel<X><<<grid_for(n * w), kBlock, 0, stream>>>(src, index, dst, n, w);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                               \
  template void gather_rows<X>(const X*, const int32_t*, X*, int64_t, int64_t, cudaStream_t); \
  template void fill<X>(X*, float, int64_t, cudaStream_t);                    \
  template void scale<X>(X*, float, int64_t, cudaStream_t);                   \
  template void add<X>(const X*, const X*, X*, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST
template void convert<float, __nv_bfloat16>(const float*, __nv_bfloat16*, int64_t, cudaStream_t);
template void convert<__nv_bfloat16, float>(const __nv_bfloat16*, float*, int64_t, cudaStream_t);

}  // namespace relay::cuda
