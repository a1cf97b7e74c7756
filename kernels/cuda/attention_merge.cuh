// Merging two partial attentions of the same queries over disjoint key sets on the GPU (the online softmax's
// rescaling, FlashAttention arXiv:2205.14135 Algorithm 1), the twin of kernels/cpu/attention_merge.cpp: context
// parallelism's own-rows and remote-rows parts (parallel.overlap). X: float or __nv_bfloat16 storage, float math.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// out (B*T, H*hd) and lse (B, H, T) hold part 1 and become the merge; out2, lse2 (same shapes) part 2.
// lse = logaddexp(lse, lse2), out = e^(lse1 - lse) out + e^(lse2 - lse) out2; a part whose lse is -inf adds nothing
// (never multiplied: its out may be anything), both -inf leaves out and lse as they are.
template <typename X>
void attention_merge(X* out, float* lse, const X* out2, const float* lse2, int64_t B, int64_t T, int64_t H, int64_t hd,
                     cudaStream_t stream);

}  // namespace relay::cuda
