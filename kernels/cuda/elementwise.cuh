// Elementwise kernels that are not activations: fill, scale, add, and the float32 <-> bfloat16
// conversion. X is the storage type, float or __nv_bfloat16; math is in float either way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// x (count) = value rounded to X.
template <typename X>
void fill(X* x, float value, int64_t count, cudaStream_t stream);
void fill_i32(int32_t* x, int32_t value, int64_t count, cudaStream_t stream);  // x (count)
// x (count) *= s
template <typename X>
void scale(X* x, float s, int64_t count, cudaStream_t stream);
// y (count) = a + b; y may alias a or b.
template <typename X>
void add(const X* a, const X* b, X* y, int64_t count, cudaStream_t stream);
// y (count) = x rounded to Y (round to nearest even, as torch's .to(torch.bfloat16)); X and Y differ
// (float -> __nv_bfloat16 or back; a same-type conversion is a copy, the caller's).
template <typename X, typename Y>
void convert(const X* x, Y* y, int64_t count, cudaStream_t stream);
// dst (n, w) row i = src row index[i] (device i32, n); dst must not alias src.
template <typename X>
void gather_rows(const X* src, const int32_t* index, X* dst, int64_t n, int64_t w, cudaStream_t stream);

}  // namespace relay::cuda
