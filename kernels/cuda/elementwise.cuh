// Elementwise kernels that are not activations: fill, scale, and the fp32 <-> bf16 casts that feed
// bf16 GEMMs (master weights stay fp32; only GEMM inputs are rounded, as mixed precision does).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

void fill(float* x, float value, int64_t count, cudaStream_t stream);      // x (count)
void fill(int32_t* x, int32_t value, int64_t count, cudaStream_t stream);  // x (count)
void scale(float* x, float s, int64_t count, cudaStream_t stream);         // x (count) *= s
// y (count) = a + b; y may alias a or b.
void add(const float* a, const float* b, float* y, int64_t count, cudaStream_t stream);
// Round to nearest even, as torch's .to(torch.bfloat16).
void cast_to_bf16(const float* x, __nv_bfloat16* y, int64_t count, cudaStream_t stream);
void cast_to_f32(const __nv_bfloat16* x, float* y, int64_t count, cudaStream_t stream);

}  // namespace relay::cuda
