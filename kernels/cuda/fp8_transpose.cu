// Transposed FP8 copies and cuBLASLt scale layouts (fp8_transpose.cuh). The code transpose goes through a 32 x 32
// shared tile (padded by one byte so that a column read does not hit one bank 32 times), reading and writing rows
// coalesced; the scale relayout is one thread per output element (a grid of scales is 1/128 or 1/16384 of its
// operand).
#include "kernels/cuda/fp8_transpose.cuh"

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

namespace {

constexpr int kTile = 32;  // a block transposes a kTile x kTile tile; blockDim (kTile, kRowsPerPass)
constexpr int kRowsPerPass = 8;

}  // namespace

// kernels ---------------------------------------------------------------------------------------

// Block (bx, by) copies q's tile of rows [bx * 32, +32) and columns [by * 32, +32) into qt's tile of rows
// [by * 32, +32) and columns [bx * 32, +32). Rows run along blockIdx.x (up to 2^31 - 1 tiles: token counts), columns
// along blockIdx.y (65535 tiles: widths).
__global__ void fp8_transpose_kernel(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* qt) {
  __shared__ uint8_t tile[kTile][kTile + 1];  // (tile row, tile col) of q
  const int64_t r0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = q[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = c0 + i, c = r0 + threadIdx.x;  // qt's row (q's column) and column (q's row)
    if (r < cols && c < rows) qt[r * rows + c] = tile[threadIdx.x][i];
  }
}

__global__ void fp8_scales_relayout_kernel(const float* s, int64_t s_cols, bool transpose, int64_t out_rows,
                                           int64_t out_cols, int64_t ld, float* out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < out_rows * ld;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / ld, j = e % ld;
    out[e] = j >= out_cols ? 0.f : transpose ? s[j * s_cols + i] : s[i * s_cols + j];
  }
}

// launchers -------------------------------------------------------------------------------------

void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* qt, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && cols >= 0 && (rows * cols == 0 || (q && qt)), "fp8_transpose: " << rows << " x " << cols);
  if (rows * cols == 0) return;
  const int64_t gx = (rows + kTile - 1) / kTile, gy = (cols + kTile - 1) / kTile;
  RELAY_ASSERT(gx <= 0x7fffffff && gy <= 65535, "fp8_transpose: " << rows << " x " << cols << " is too large");
  fp8_transpose_kernel<<<dim3(unsigned(gx), unsigned(gy)), dim3(kTile, kRowsPerPass), 0, stream>>>(q, rows, cols, qt);
  CUDA_CHECK(cudaGetLastError());
}

void fp8_scales_relayout(const float* s, int64_t s_rows, int64_t s_cols, bool transpose, int64_t ld, float* out,
                         cudaStream_t stream) {
  const int64_t out_rows = transpose ? s_cols : s_rows, out_cols = transpose ? s_rows : s_cols;
  RELAY_ASSERT(s_rows >= 0 && s_cols >= 0 && ld >= out_cols && (out_rows * ld == 0 || (s && out)),
               "fp8_scales_relayout: " << s_rows << " x " << s_cols << " into rows of " << ld);
  if (out_rows * ld == 0) return;
  fp8_scales_relayout_kernel<<<grid_for(out_rows * ld), kBlock, 0, stream>>>(s, s_cols, transpose, out_rows,
                                                                            out_cols, ld, out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
