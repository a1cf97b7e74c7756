// Mixture-of-experts routing on the GPU: the top-k router (softmax in f32, as transformers' MixtralTopKRouter and
// Qwen3MoeTopKRouter; Shazeer et al., arXiv:1701.06538) with its backward, and the weighted combine of expert
// outputs back into token rows with its backward. The same semantics as kernels/cpu/moe.cpp, the reference
// (Backend::moe_router_forward and friends in backend/backend.hpp say what each computes). X is the storage type of
// logits, dlogits, rows, y, dy, drows (float or __nv_bfloat16); probs, lse, weights, dweights, bias, seq_grad are
// float32, experts and pos int32. Deterministic: every sum has a fixed order, no atomics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// The router's limit on experts per token row: each lane of the row's warp marks its chosen experts in a 64-bit mask.
constexpr int64_t kMoeMaxExperts = 32 * 64;

// logits (n, E) -> probs (n, E) = softmax, lse (n), experts (n, k) the k largest of probs (+ bias (E), optional)
// in descending order, the lower expert first on a tie, weights (n, k) their probabilities (divided by their sum when
// renormalize). 1 <= k <= E <= kMoeMaxExperts.
template <typename X>
void moe_router_forward(const X* logits, float* probs, float* lse, int32_t* experts, float* weights, int64_t n,
                        int64_t E, int64_t k, bool renormalize, const float* bias, cudaStream_t stream);
// dlogits (n, E) from dweights (n, k), seq_grad (n / T, E) (optional: null), z_scale, and the forward's probs (n, E),
// lse (n), experts (n, k). Overwrites dlogits.
template <typename X>
void moe_router_backward(const float* probs, const float* lse, const int32_t* experts, const float* dweights,
                         bool renormalize, const float* seq_grad, int64_t T, float z_scale, X* dlogits, int64_t n,
                         int64_t E, int64_t k, cudaStream_t stream);
// y (n, C) = sum over j < k (in j order) of weights[t, j] (1 when weights is null) * rows[pos[t, j]], rows (R, C).
template <typename X>
void moe_combine(const X* rows, const int32_t* pos, const float* weights, X* y, int64_t n, int64_t k, int64_t C,
                 cudaStream_t stream);
// drows[pos[t, j]] (n k, C) = weights[t, j] * dy[t]; dweights (n, k) = dy[t] . rows[pos[t, j]]. pos must be a
// permutation of [0, n k) (each row of drows written once).
template <typename X>
void moe_combine_backward(const X* dy, const X* rows, const int32_t* pos, const float* weights, X* drows,
                          float* dweights, int64_t n, int64_t k, int64_t C, cudaStream_t stream);

}  // namespace relay::cuda
