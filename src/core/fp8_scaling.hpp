// FP8 scaling recipes: which elements share one scale, and that scale. Tensorwise: one scale per tensor from its
// current amax (torchao's Float8 "dynamic" recipe, Megatron's --fp8-recipe tensorwise). Blockwise: DeepSeek-V3's
// fine-grained scaling (arXiv:2412.19437, section 3.3.2): activations and output gradients per 1 x 128 tile along the
// GEMM's reduction dimension, weights per 128 x 128 block. Shared by the CPU kernels and the CUDA ones, so that both
// compute the same scales and the same codes (fp8_scale and fp8_quantize_value are RELAY_HOST_DEVICE: one definition).
#pragma once
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "core/fp8.hpp"

namespace relay {

// The tiles of a stored (rows, cols) matrix that share one scale. row_1x128: 128 consecutive columns of one row (an
// operand whose reduction dimension is its columns: x in x @ w^T); col_128x1: 128 consecutive rows of one column
// (an operand reduced over its rows: x in dw = dy^T @ x); block_128x128: weights. Edge tiles are partial.
enum class Fp8Tiling : uint8_t { tensor, row_1x128, col_128x1, block_128x128 };
constexpr int64_t kFp8Tile = 128;
constexpr const char* fp8_tiling_name(Fp8Tiling t) {
  return t == Fp8Tiling::tensor ? "tensorwise" : t == Fp8Tiling::row_1x128 ? "1 x 128 tiles"
                                             : t == Fp8Tiling::col_128x1 ? "128 x 1 tiles" : "128 x 128 blocks";
}

// A tiling laid over a (rows, cols) matrix: the tile's extent and the grid of tiles (the scales' shape, row-major).
// Element (r, c) has the scale at (r / tile_rows, c / tile_cols).
struct Fp8Grid {
  int64_t tile_rows, tile_cols;  // a tensorwise "tile" is the whole matrix (at least 1 x 1)
  int64_t rows, cols;            // (ceil(rows / tile_rows), ceil(cols / tile_cols)); (1, 1) for tensorwise
};
constexpr Fp8Grid fp8_grid(Fp8Tiling t, int64_t rows, int64_t cols) {
  const int64_t tr = t == Fp8Tiling::tensor ? (rows > 0 ? rows : 1) : t == Fp8Tiling::row_1x128 ? 1 : kFp8Tile;
  const int64_t tc = t == Fp8Tiling::tensor ? (cols > 0 ? cols : 1) : t == Fp8Tiling::col_128x1 ? 1 : kFp8Tile;
  return {tr, tc, t == Fp8Tiling::tensor ? 1 : (rows + tr - 1) / tr, t == Fp8Tiling::tensor ? 1 : (cols + tc - 1) / tc};
}

// A GEMM's reduction over k in blocks that each operand scales alike: the tile extent of a stored (rows, cols)
// operand along k (k runs along its rows for a transposed a, and for an untransposed b) ...
constexpr int64_t fp8_k_tile(Fp8Tiling t, int64_t rows, int64_t cols, bool k_along_rows) {
  const Fp8Grid g = fp8_grid(t, rows, cols);
  return k_along_rows ? g.tile_rows : g.tile_cols;
}
// ... and the block: k (one block) when neither operand's scales change along k (tensorwise, or k within one tile);
// 128 when both change every 128 (1 x 128 / 128 x 1 tiles along k, 128 x 128 blocks); 0 when they disagree, which
// no FP8 GEMM computes.
constexpr int64_t fp8_k_block(int64_t k, int64_t a_k_tile, int64_t b_k_tile) {
  if (a_k_tile >= k && b_k_tile >= k) return k > 0 ? k : 1;
  return a_k_tile == kFp8Tile && b_k_tile == kFp8Tile ? kFp8Tile : 0;
}

// amax is tracked as the bits of |x| (sign cleared): as unsigned integers they order like the values, and every NaN
// sorts above infinity, so a max over them is exact, order-free (any thread split, atomicMax on a GPU) and a NaN
// is never lost the way a float max's comparisons lose it.
RELAY_HOST_DEVICE inline uint32_t fp8_abs_bits(float x) { return fp8_float_bits(x) & 0x7fffffffu; }

// The dequantisation multiplier stored for a tile (DeepSeek-V3's scale; cuBLASLt's A/B scale): amax / max_finite, so
// that x / scale spans the format. An all-zero tile gets 1. A tile holding an inf or NaN (amax_bits >= 0x7f800000)
// also gets 1: its finite values saturate and its inf / NaN stay non-finite in the codes (fp8_quantize_value), so
// the GEMM's output carries them and train.skip_nonfinite still sees the step's inf / NaN. At least FLT_MIN, so that
// x / scale stays finite for a tile of float subnormals.
RELAY_HOST_DEVICE inline float fp8_scale(uint32_t amax_bits, Fp8Format fmt) {
  if (amax_bits == 0 || amax_bits >= 0x7f800000u) return 1.f;
  const float s = fp8_div_rn(fp8_bits_float(amax_bits), fp8_spec(fmt).max_finite);
  return s < FLT_MIN ? FLT_MIN : s;
}

// One element's code: x / scale rounded to the format (saturating) when x is finite; an inf or NaN stays visible:
// NaN in e4m3 (which has no infinity), inf or NaN in e5m2, sign kept.
RELAY_HOST_DEVICE inline uint8_t fp8_quantize_value(float x, float scale, Fp8Format fmt) {
  const uint32_t u = fp8_float_bits(x), a = u & 0x7fffffffu;
  if (a < 0x7f800000u) return f32_to_fp8(fp8_div_rn(x, scale), fmt);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if (fmt == Fp8Format::e5m2 && a == 0x7f800000u) return uint8_t(sign | 0x7c);
  return uint8_t(sign | fp8_spec(fmt).nan_code);
}

// One quantised operand as stored (row-major), with its tile scales (fp8_quantize's output), on the host or the
// device: what the FP8 GEMMs read (kernels/cpu/fp8_gemm.hpp, kernels/cuda/fp8_quantize.cuh).
struct Fp8Matrix {
  const uint8_t* q = nullptr;     // (rows, cols) codes
  const float* scales = nullptr;  // (grid.rows, grid.cols) of fp8_grid(tiling, rows, cols)
  int64_t rows = 0, cols = 0;
  Fp8Format format = Fp8Format::e4m3;
  Fp8Tiling tiling = Fp8Tiling::tensor;
};

}  // namespace relay
