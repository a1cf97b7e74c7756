// FP8 quantisation on the CPU, the reference for the CUDA kernels: each tile's amax, its scale (core/fp8_scaling.hpp:
// tensorwise as torchao's / Megatron's, DeepSeek-V3's 1 x 128 and 128 x 128 tiles) and the codes x / scale, rounded
// to nearest even and saturated (core/fp8.hpp).
#pragma once
#include <cstdint>

#include "core/fp8_scaling.hpp"

namespace relay::cpu {

// q (rows, cols) = fp8(x (rows, cols) / scale of its tile); scales (grid.rows, grid.cols) f32 as
// fp8_grid(tiling, rows, cols) lays them out, each fp8_scale(tile's amax). X: float or bf16. Blockwise tilings read x
// from memory once (a 128 x 128 panel's amaxes, then its codes while it is in cache); tensorwise twice (the scale
// needs the whole tensor's amax before the first code), as fp8_amax then fp8_quantize_amax.
template <typename X>
void fp8_quantize(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint8_t* q, float* scales);
// The codes alone, with given scales (fp8_grid's layout): q = fp8(x / scale of its tile), as fp8_quantize's second pass.
template <typename X>
void fp8_quantize_with(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, const float* scales,
                       uint8_t* q);

// Pass 1 alone: amax (grid.rows, grid.cols) = each tile's max |x| as the bits of the float (fp8_abs_bits: ordered as
// the values, NaN above inf), 0 for an empty matrix.
template <typename X>
void fp8_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, uint32_t* amax);
// Pass 2 from given amaxes (fp8_amax's layout, e.g. the max over the ranks holding shards of one tensor): scales =
// fp8_scale(amax), q = fp8(x / scale of its tile). fp8_amax then this is fp8_quantize, bit for bit.
template <typename X>
void fp8_quantize_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt,
                       const uint32_t* amax, uint8_t* q, float* scales);

// out (n) = the value of each code in (n), unscaled (exact).
void fp8_widen(const uint8_t* in, int64_t n, Fp8Format fmt, float* out);

}  // namespace relay::cpu
