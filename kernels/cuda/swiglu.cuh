// SwiGLU, Llama's gated MLP activation (Shazeer, arXiv:2002.05202): h = silu(gate) * up,
// silu(g) = g / (1 + exp(-g)). X: float or __nv_bfloat16 storage, float math.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// h (count) = silu(gate) * up
template <typename X>
void swiglu_forward(const X* gate, const X* up, X* h, int64_t count, cudaStream_t stream);
// dgate = dh * up * silu'(gate), dup = dh * silu(gate); elementwise, so dgate and dup may alias dh, gate or up.
template <typename X>
void swiglu_backward(const X* dh, const X* gate, const X* up, X* dgate, X* dup, int64_t count, cudaStream_t stream);

}  // namespace relay::cuda
