// FP8 scaling's first pass on the GPU: each tile's amax (core/fp8_scaling.hpp's tilings: tensorwise, DeepSeek-V3's
// 1 x 128 / 128 x 1 / 128 x 128, arXiv:2412.19437), the pass the ranks holding shards of one tensor agree on before
// quantising. kernels/cpu/fp8_quantize.cpp's fp8_amax is the reference (test_backend_ops: bit for bit).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8_scaling.hpp"

namespace relay::cuda {

// amax (grid rows, grid cols) = each tile's max |x| as the bits of the float (fp8_abs_bits: ordered as the values,
// NaN above inf), fp8_grid(tiling, rows, cols)'s layout; 0 for an empty matrix. x (rows, cols) row-major, X float or
// __nv_bfloat16. An atomicMax over the bits: exact and order-free, the same bits on every run.
template <typename X>
void fp8_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, uint32_t* amax, cudaStream_t stream);

}  // namespace relay::cuda
