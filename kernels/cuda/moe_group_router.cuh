// DeepSeek-V3's router on the GPU (arXiv:2412.19437 section 2.1.2; transformers' DeepseekV3TopkRouter): sigmoid scores
// in f32, a bias-corrected, group-limited top-k, the chosen scores renormalised and scaled; and its backward with the
// complementary sequence-wise loss's gradient. The twin of kernels/cpu/moe_group_router.cpp, the reference
// (Backend::moe_group_router_forward / _backward in backend/backend.hpp say what each computes), tie order included.
// X is the storage type of logits and dlogits (float or __nv_bfloat16); probs, weights, dweights, bias, seq_grad are
// float32, experts int32. Deterministic: every sum has a fixed order, no atomics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// The limits of one token row's warp: each lane marks its taken experts in a 64-bit mask (E <= 32 x 64), and the
// group scores sit in shared memory (n_group <= 64; DeepSeek-V3 has 8).
constexpr int64_t kGroupRouterMaxExperts = 32 * 64;
constexpr int64_t kGroupRouterMaxGroups = 64;

// logits (n, E) -> probs (n, E) = sigmoid(logits); experts (n, k): the k best of probs + bias (bias (E) optional)
// among the experts of the topk_group best of n_group groups (a group's score: the sum of its two best, its one
// when it holds one expert), descending, the lower group and the lower expert first on ties; weights (n, k) = their
// probs, divided by their sum + 1e-20 when renormalize, times scale.
// 1 <= topk_group <= n_group <= kGroupRouterMaxGroups, E % n_group == 0, 1 <= k <= topk_group E / n_group.
template <typename X>
void moe_group_router_forward(const X* logits, float* probs, int32_t* experts, float* weights, int64_t n, int64_t E,
                              int64_t k, int64_t n_group, int64_t topk_group, bool renormalize, float scale,
                              const float* bias, cudaStream_t stream);
// dlogits (n, E) from dweights (n, k) (through the scale and the renormalisation) and seq_grad (n / T, E) (optional:
// null; the gradient on each token's scores normalised to sum 1), with the forward's probs (n, E), experts (n, k).
// Overwrites dlogits.
template <typename X>
void moe_group_router_backward(const float* probs, const int32_t* experts, const float* dweights, bool renormalize,
                               float scale, const float* seq_grad, int64_t T, X* dlogits, int64_t n, int64_t E,
                               int64_t k, cudaStream_t stream);

}  // namespace relay::cuda
