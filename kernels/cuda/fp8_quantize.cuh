// FP8 quantisation's second pass and the FP8 GEMM on the GPU: scales from given tile amaxes and the codes x / scale
// (core/fp8_scaling.hpp's recipes: tensorwise, DeepSeek-V3's 1 x 128 / 128 x 1 / 128 x 128, arXiv:2412.19437), and a
// straightforward FP8 GEMM that applies the scales per k block as kernels/cpu/fp8_gemm.cpp does (the reference).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8_scaling.hpp"

namespace relay::cuda {

// scales (grid rows, grid cols) f32 = fp8_scale(amax) and q (rows, cols) = fp8_quantize_value(x / its tile's scale),
// fp8_grid(tiling, rows, cols)'s layout; bit for bit kernels/cpu/fp8_quantize.cpp's fp8_quantize_amax. x row-major,
// X float or __nv_bfloat16; amax as fp8_amax wrote it (|x|'s float bits).
template <typename X>
void fp8_quantize_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, const uint32_t* amax,
                       uint8_t* q, float* scales, cudaStream_t stream);

// fp8_amax (into amax_scratch, grid rows x grid cols u32) then fp8_quantize_amax: the CPU's fp8_quantize, bit for bit.
template <typename X>
void fp8_quantize(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint32_t* amax_scratch,
                  uint8_t* q, float* scales, cudaStream_t stream);

// y (m, n) = op(a) @ op(b) + beta * y, op(a) (m, k), op(b) (k, n), the scales applied per k block
// (fp8_k_block, which must not be 0): acc += (sum over the block of a * b in float) * (a_scale * b_scale), the CPU's
// order of scaling. Any shape and transpose; one thread per output, correct rather than fast (no tensor cores).
// Y: float or __nv_bfloat16; beta 0 does not read y.
template <typename Y>
void fp8_gemm(const Fp8Matrix& a, bool trans_a, const Fp8Matrix& b, bool trans_b, Y* y, float beta,
              cudaStream_t stream);

}  // namespace relay::cuda
