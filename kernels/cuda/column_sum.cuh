// Deterministic column sums of (n, d) row-major matrices over many blocks (the weight gradients of LayerNorm,
// RMSNorm and biases): the rows are cut into column_slices(n) slices, block (x, s) of (kColTile, kRowGroups)
// threads sums slice s of columns [x kColTile, (x + 1) kColTile) into partial[s][col], and column_finish adds
// the slices in order. One block per column tile alone would leave most of a GPU idle (a 768-wide LayerNorm:
// 24 blocks on 132 multiprocessors, each walking 16k rows). The partials live in scratch the caller provides
// (column_sum_scratch_bytes). Every sum runs in a fixed order: the same bits on every run.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"

namespace relay::cuda {

constexpr int kColTile = 32;    // columns per block (threadIdx.x)
constexpr int kRowGroups = 16;  // row groups per block (threadIdx.y)

// Slices of at least 256 rows (16 per thread), at most 128 of them.
inline int64_t column_slices(int64_t n) { return std::clamp<int64_t>((n + 255) / 256, 1, 128); }
// Bytes of scratch for `outputs` column sums of an (n, d) matrix.
inline size_t column_sum_scratch_bytes(int64_t n, int64_t d, int outputs) {
  return size_t(column_slices(n)) * size_t(d) * size_t(outputs) * sizeof(float);
}

#ifdef __CUDACC__
// Inside a kernel launched on grid (ceil(d / kColTile), column_slices(n)), block (kColTile, kRowGroups): the
// partial sums of K column quantities value(row, col, v[K]) over this block's slice of rows, written to
// partial[k][slice][col] (K x slices x d floats).
template <int K, typename Value>
__device__ void column_partials(int64_t n, int64_t d, float* partial, Value value) {
  __shared__ float part[K][kRowGroups][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t slices = gridDim.y, per = (n + slices - 1) / slices;
  const int64_t r0 = blockIdx.y * per, r1 = r0 + per < n ? r0 + per : n;
  float s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = 0.0f;
  if (col < d)
    for (int64_t row = r0 + threadIdx.y; row < r1; row += kRowGroups) {
      float v[K];
      value(row, col, v);
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] += v[k];
    }
#pragma unroll
  for (int k = 0; k < K; ++k) part[k][threadIdx.y][threadIdx.x] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < d)
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = 0.0f;
      for (int g = 0; g < kRowGroups; ++g) t += part[k][g][threadIdx.x];
      partial[(int64_t(k) * slices + blockIdx.y) * d + col] = t;
    }
}
#endif

// out[col] = sum over slices of partial[slice][col] (in slice order) + beta * out[col] (out not read when beta is
// 0), for one output: partial (slices, d).
void column_finish(const float* partial, int64_t slices, int64_t d, float* out, float beta, cudaStream_t stream);

}  // namespace relay::cuda
