// Fill, scale, add and dtype conversion: one grid-stride loop each, on float or bf16 storage.
#include "kernels/cuda/elementwise.cuh"

#include <algorithm>
#include <cstdint>

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

// A block per destination row (grid-strided), its threads over the row's elements of type W: 16-byte words where the
// rows and pointers allow (data.preload gathers 8192 x 8192 bf16 batches), else the elements themselves.
template <typename W>
__global__ void gather_rows_kernel(const W* src, const int32_t* index, W* dst, int64_t n, int64_t w) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const W* s = src + int64_t(index[r]) * w;
    W* d = dst + r * w;
    for (int64_t c = threadIdx.x; c < w; c += blockDim.x) d[c] = s[c];
  }
}

template <typename X>
void gather_rows(const X* src, const int32_t* index, X* dst, int64_t n, int64_t w, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && w >= 0, "gather_rows: n " << n << ", w " << w);
  if (n == 0 || w == 0) return;
  RELAY_ASSERT(src && index && dst, "gather_rows: null pointer");
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 65535));
  const bool words = (w * int64_t(sizeof(X))) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (words)
    gather_rows_kernel<uint4><<<blocks, kBlock, 0, stream>>>(reinterpret_cast<const uint4*>(src), index,
                                                             reinterpret_cast<uint4*>(dst), n,
                                                             w * int64_t(sizeof(X)) / 16);
  else
    gather_rows_kernel<X><<<blocks, kBlock, 0, stream>>>(src, index, dst, n, w);
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
