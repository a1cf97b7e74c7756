// Transposed FP8 copies for cuBLASLt's FP8 GEMMs, which read both operands with k along their stored rows ("TN",
// kernels/fp8_lt_layout.hpp): the codes of a (rows, cols) matrix written (cols, rows), and a tile-scale grid copied
// into the layout of cuBLASLt's block scale modes (transposed and/or with padded rows), as PyTorch's _scaled_mm
// expects DeepSeek-V3's 1 x 128 / 128 x 128 scales (arXiv:2412.19437) for Hopper's VEC128 / BLK128x128 modes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// qt (cols, rows) = q (rows, cols)^T, FP8 codes (bytes, either format). Exact: a copy.
void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* qt, cudaStream_t stream);

// out (out_rows, ld) f32: out[i][j] = transpose ? s[j][i] : s[i][j] for j < out_cols, 0 for out_cols <= j < ld, where
// s is (s_rows, s_cols) row-major and (out_rows, out_cols) = transpose ? (s_cols, s_rows) : (s_rows, s_cols).
void fp8_scales_relayout(const float* s, int64_t s_rows, int64_t s_cols, bool transpose, int64_t ld, float* out,
                         cudaStream_t stream);

}  // namespace relay::cuda
