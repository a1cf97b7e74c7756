// Two-pass reduction: each block of the first pass sums a grid-stride slice into partial[block];
// one block then sums the partials. Fixed grid and fixed order: the same input gives the same bits.
#include "kernels/cuda/sum_squares.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

__global__ void sum_squares_partial_kernel(const float* x, int64_t count, double* partial) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* partial, int blocks, double* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = acc;
}

// launchers -------------------------------------------------------------------------------------

void sum_squares(const float* x, int64_t count, double* partial, double* out, cudaStream_t stream) {
  RELAY_ASSERT(count >= 0 && partial && out && (count == 0 || x), "sum_squares: count " << count);
  int64_t blocks = (count + kBlock - 1) / kBlock;
  if (blocks > kSumSquaresMaxBlocks) blocks = kSumSquaresMaxBlocks;
  if (blocks == 0) blocks = 1;  // an empty tensor still writes 0 to out
  sum_squares_partial_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(x, count, partial);
  CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, kBlock, 0, stream>>>(partial, static_cast<int>(blocks), out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
