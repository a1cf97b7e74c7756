// Bias add and bias gradient, on float or bf16 storage (float math, float32 gradient). The column sum
// gives each block 32 columns; 16 row groups sum strided rows (a warp reads 32 consecutive elements of
// one row) and combine in a fixed order: no atomics, so the gradient is bitwise reproducible.
#include "kernels/cuda/bias.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

constexpr int kColTile = 32;   // columns per block (threadIdx.x)
constexpr int kRowGroups = 16;  // row groups per block (threadIdx.y)

template <typename X>
__global__ void add_bias_kernel(X* y, const X* bias, int64_t n, int64_t f) {
  const int64_t count = n * f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(y[i], load(y[i]) + load(bias[i % f]));
}

// block (kColTile, kRowGroups), grid (ceil(f / kColTile))
template <typename X>
__global__ void bias_grad_kernel(const X* dy, float* db, int64_t n, int64_t f, float beta) {
  __shared__ float partial[kRowGroups][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  float sum = 0.0f;
  if (col < f)
    for (int64_t row = threadIdx.y; row < n; row += kRowGroups) sum += load(dy[row * f + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < f) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
    db[col] = beta == 0.0f ? total : beta * db[col] + total;
  }
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
void bias_grad(const X* dy, float* db, int64_t n, int64_t f, float beta, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && f >= 0, "bias_grad: n " << n << ", f " << f);
  if (f == 0) return;
  RELAY_ASSERT(db && (n == 0 || dy), "bias_grad: null pointer");
  const dim3 block(kColTile, kRowGroups);
  const dim3 grid(static_cast<unsigned>((f + kColTile - 1) / kColTile));
  bias_grad_kernel<X><<<grid, block, 0, stream>>>(dy, db, n, f, beta);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                    \
  template void add_bias<X>(X*, const X*, int64_t, int64_t, cudaStream_t);         \
  template void bias_grad<X>(const X*, float*, int64_t, int64_t, float, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
