// Bias add and bias gradient, on float or bf16 storage (float math, float32 gradient). The gradient is a
// column sum of column_sum.cuh (slices of rows over many blocks, combined in a fixed order): no atomics, so it
// is bitwise reproducible.
#include "kernels/cuda/bias.cuh"

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

template <typename X>
__global__ void add_bias_kernel(X* y, const X* bias, int64_t n, int64_t f) {
  const int64_t count = n * f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(y[i], load(y[i]) + load(bias[i % f]));
}

// grid (ceil(f / kColTile), column_slices(n)), block (kColTile, kRowGroups): partial (slices, f).
template <typename X>
__global__ void bias_grad_kernel(const X* dy, float* partial, int64_t n, int64_t f) {
  column_partials<1>(n, f, partial, [&](int64_t row, int64_t col, float (&v)[1]) { v[0] = load(dy[row * f + col]); });
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void add_bias(X* y, const X* bias, int64_t n, int64_t f, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && f >= 0, "add_bias: n " << n << ", f " << f);
  if (n == 0 || f == 0) return;
  RELAY_ASSERT(y && bias, "add_bias: null pointer");
  add_bias_kernel<X><<<grid_for(n * f), kBlock, 0, stream>>>(y, bias, n, f);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void bias_grad(const X* dy, float* db, int64_t n, int64_t f, float beta, float* scratch, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && f >= 0, "bias_grad: n " << n << ", f " << f);
  if (f == 0) return;
  RELAY_ASSERT(db && scratch && (n == 0 || dy), "bias_grad: null pointer");
  const int64_t slices = column_slices(n);
  const dim3 block(kColTile, kRowGroups);
  const dim3 grid(static_cast<unsigned>((f + kColTile - 1) / kColTile), static_cast<unsigned>(slices));
  bias_grad_kernel<X><<<grid, block, 0, stream>>>(dy, scratch, n, f);
  CUDA_CHECK(cudaGetLastError());
  column_finish(scratch, slices, f, db, beta, stream);
}

#define INST(X)                                                                    \
  template void add_bias<X>(X*, const X*, int64_t, int64_t, cudaStream_t);         \
  template void bias_grad<X>(const X*, float*, int64_t, int64_t, float, float*, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
