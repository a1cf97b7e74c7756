// The FP8 GEMM's exact emulation on the CPU, the reference for cuBLASLt's FP8 GEMMs and Relay's CUDA kernels.
// Products of two FP8 values are exact in float (at most 4 x 4 significant bits), so the emulation multiplies the
// codes' values in float and sums in float (oneDNN's sgemm) as the tensor cores do, and applies the scales as the GPU
// does: tensorwise, once to the whole sum (cuBLASLt's A/B scale pointers); blockwise, to each 128-wide block of the
// reduction (DeepSeek-V3, arXiv:2412.19437 section 3.3.2: each block's partial sum times a_scale * b_scale, added
// into an fp32 accumulator). Equal to the GPU up to the order of float sums.
#pragma once
#include <cstdint>

#include "core/fp8_scaling.hpp"

namespace relay::cpu {

// y (m, n) = op(a) @ op(b) + beta * y, op(a) (m, k) = a or a^T, op(b) (k, n) = b or b^T, with the scales applied per
// k block (core/fp8_scaling.hpp's fp8_k_block, which must not be 0): acc += (sum over the block of a * b in float) * (a_scale * b_scale).
// beta 0 does not read y. Y: float or bf16 (rounded once, from float).
template <typename Y>
void fp8_gemm(const Fp8Matrix& a, bool trans_a, const Fp8Matrix& b, bool trans_b, Y* y, float beta);

}  // namespace relay::cpu
