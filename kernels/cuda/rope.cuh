// Rotary position embedding as transformers applies it to Llama's queries and keys (rotate-half pairs
// (i, i + hd/2) in each head; Su et al., arXiv:2104.09864), the twin of kernels/cpu/rope.cpp, with the
// same float cos and sin (kernels/rope_angles.hpp), YaRN's (Peng et al., arXiv:2309.00071) included. X: float or
// __nv_bfloat16 storage, float math. rotary_columns: the twin of kernels/cpu/rope.cpp's regrouping of MLA's rotary
// columns (a permutation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/rope_angles.hpp"

namespace relay::cuda {

// y (rows, heads * hd) = x rotated, row r at position pos0 + r % T, or pos0 + positions[r] (device, rows; null: the
// former); inverse rotates by minus the angle. y may alias x. scaling: YaRN's frequencies and cos/sin factor (a default
// RopeScaling: plain angles).
template <typename X>
void rope(const X* x, X* y, int64_t rows, int64_t T, int64_t heads, int64_t hd, double theta, int64_t pos0,
          bool inverse, const int32_t* positions, const RopeScaling& scaling, cudaStream_t stream);

// pe (rows, heads * dr) against columns [off, off + dr) of each head of x (rows, heads * w): gather: src x, dst pe;
// else src pe, dst x. interleaved: x's pair (2i, 2i + 1) is pe's (i, dr/2 + i); else the columns as they are.
template <typename X>
void rotary_columns(const X* src, X* dst, int64_t rows, int64_t heads, int64_t w, int64_t off, int64_t dr,
                    bool interleaved, bool gather, cudaStream_t stream);

}  // namespace relay::cuda
