// The second pass of column_sum.cuh's column sums: each column's slices added in order.
#include "kernels/cuda/column_sum.cuh"

#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

namespace {

__global__ void column_finish_kernel(const float* partial, int64_t slices, int64_t d, float* out, float beta) {
  for (int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; col < d; col += int64_t(gridDim.x) * blockDim.x) {
    float t = 0.0f;
    for (int64_t s = 0; s < slices; ++s) t += partial[s * d + col];
    out[col] = beta == 0.0f ? t : beta * out[col] + t;
  }
}

}  // namespace

void column_finish(const float* partial, int64_t slices, int64_t d, float* out, float beta, cudaStream_t stream) {
  if (d == 0) return;
  column_finish_kernel<<<grid_for(d), kBlock, 0, stream>>>(partial, slices, d, out, beta);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
