// FP8 codes, scales and a plain FP8 GEMM on the GPU. The conversions are core/fp8.hpp's f32_to_fp8 / fp8_to_f32 and
// core/fp8_scaling.hpp's fp8_scale / fp8_quantize_value themselves (RELAY_HOST_DEVICE: the CPU's one definition, its
// divisions __fdiv_rn on the device so that no fast-math flag changes them), so the codes equal the CPU's bit for bit
// (test_backend_ops' fp8_quantize rows).
#include "kernels/cuda/fp8_quantize.cuh"

#include <cfloat>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/fp8_amax.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

__global__ void fp8_scales_kernel(const uint32_t* amax, int64_t count, Fp8Format fmt, float* scales) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    scales[i] = fp8_scale(amax[i], fmt);
}

template <typename X>
__global__ void fp8_codes_kernel(const X* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                                 int64_t grid_cols, Fp8Format fmt, const float* scales, uint8_t* q) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    q[i] = fp8_quantize_value(load(x[i]), scales[(r / tile_rows) * grid_cols + c / tile_cols], fmt);
  }
}

// Element (i, kk) of op(a) as stored: a (m, k) or a (k, m) transposed; likewise op(b) (k, n).
__device__ inline int64_t op_index(bool trans, int64_t row, int64_t col, int64_t stored_cols) {
  return trans ? col * stored_cols + row : row * stored_cols + col;
}

template <typename Y>
__global__ void fp8_gemm_kernel(Fp8Matrix a, bool trans_a, Fp8Matrix b, bool trans_b, int64_t m, int64_t n,
                                int64_t k, int64_t kb, Y* y, float beta) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // column of y
  const int64_t i = blockIdx.y * int64_t(blockDim.y) + threadIdx.y;  // row of y
  if (i >= m || j >= n) return;
  const Fp8Grid ga = fp8_grid(a.tiling, a.rows, a.cols), gb = fp8_grid(b.tiling, b.rows, b.cols);
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t end = k0 + kb < k ? k0 + kb : k;
    float partial = 0.f;  // this k block's unscaled sum: products of FP8 values are exact in float
    for (int64_t kk = k0; kk < end; ++kk)
      partial += fp8_to_f32(a.q[op_index(trans_a, i, kk, a.cols)], a.format) *
                 fp8_to_f32(b.q[op_index(trans_b, kk, j, b.cols)], b.format);
    // The block's scales, indexed exactly as kernels/cpu/fp8_gemm.cpp's sa / sb.
    const float sa = trans_a ? a.scales[(k0 / ga.tile_rows) * ga.cols + i / ga.tile_cols]
                             : a.scales[(i / ga.tile_rows) * ga.cols + k0 / ga.tile_cols];
    const float sb = trans_b ? b.scales[(j / gb.tile_rows) * gb.cols + k0 / gb.tile_cols]
                             : b.scales[(k0 / gb.tile_rows) * gb.cols + j / gb.tile_cols];
    acc += partial * (sa * sb);
  }
  Y& out = y[i * n + j];
  store(out, beta == 0.f ? acc : acc + beta * load(out));
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void fp8_quantize_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, const uint32_t* amax,
                       uint8_t* q, float* scales, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && cols >= 0 && amax && scales && (rows * cols == 0 || (x && q)),
               "fp8_quantize_amax: " << rows << " x " << cols);
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  const int64_t tiles = g.rows * g.cols;
  if (tiles > 0) {
    fp8_scales_kernel<<<grid_for(tiles), kBlock, 0, stream>>>(amax, tiles, fmt, scales);
    CUDA_CHECK(cudaGetLastError());
  }
  if (rows * cols == 0) return;
  fp8_codes_kernel<X><<<grid_for(rows * cols), kBlock, 0, stream>>>(x, rows, cols, g.tile_rows, g.tile_cols, g.cols,
                                                                     fmt, scales, q);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void fp8_quantize(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint32_t* amax_scratch,
                  uint8_t* q, float* scales, cudaStream_t stream) {
  fp8_amax(x, rows, cols, tiling, amax_scratch, stream);
  fp8_quantize_amax(x, rows, cols, tiling, fmt, amax_scratch, q, scales, stream);
}

template <typename Y>
void fp8_gemm(const Fp8Matrix& a, bool trans_a, const Fp8Matrix& b, bool trans_b, Y* y, float beta,
              cudaStream_t stream) {
  const int64_t m = trans_a ? a.cols : a.rows, k = trans_a ? a.rows : a.cols;
  const int64_t n = trans_b ? b.rows : b.cols;
  const int64_t kb = fp8_k_block(k, fp8_k_tile(a.tiling, a.rows, a.cols, trans_a),
                                 fp8_k_tile(b.tiling, b.rows, b.cols, !trans_b));
  RELAY_ASSERT(kb > 0, "fp8_gemm: a's scales (" << fp8_tiling_name(a.tiling) << ") and b's ("
                                                << fp8_tiling_name(b.tiling) << ") do not share k blocks over k = " << k);
  if (m == 0 || n == 0) return;
  const dim3 block(16, 16);
  const dim3 grid(unsigned((n + 15) / 16), unsigned((m + 15) / 16));
  fp8_gemm_kernel<Y><<<grid, block, 0, stream>>>(a, trans_a, b, trans_b, m, n, k, kb, y, beta);
  CUDA_CHECK(cudaGetLastError());
}

#define INST_FP8_QUANTIZE(X)                                                                                       \
  template void fp8_quantize_amax<X>(const X*, int64_t, int64_t, Fp8Tiling, Fp8Format, const uint32_t*, uint8_t*, \
                                     float*, cudaStream_t);                                                       \
  template void fp8_quantize<X>(const X*, int64_t, int64_t, Fp8Tiling, Fp8Format, uint32_t*, uint8_t*, float*,    \
                                cudaStream_t);                                                                    \
  template void fp8_gemm<X>(const Fp8Matrix&, bool, const Fp8Matrix&, bool, X*, float, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST_FP8_QUANTIZE)

}  // namespace relay::cuda
