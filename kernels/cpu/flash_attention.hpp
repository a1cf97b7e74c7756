// FlashAttention-2 causal self-attention on the CPU (kernels/cpu/flash_attention.cpp): the result of
// attention_forward / attention_backward without the (B, H, T, T) probabilities, for float32 or bfloat16
// storage (math in float32). Dao et al. arXiv:2205.14135, Dao arXiv:2307.08691.
#pragma once
#include <cstdint>

#include "core/bf16.hpp"

namespace relay::cpu {

// qkv (B*T, 3C) [q | k | v]; out (B*T, C); lse (B, H, T) float32: log-sum-exp of each query row's scaled
// scores, saved for the backward. Head h uses columns [h*hd, (h+1)*hd) of each part, hd = C/H; scale
// 1/sqrt(hd); query t sees keys s <= t. Elem is float or bf16.
template <typename Elem>
void flash_attention_forward(const Elem* qkv, Elem* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H);

// dout (B*T, C), qkv, out and lse of the forward -> dqkv (B*T, 3C), overwritten (not accumulated).
// Bitwise the same for any OpenMP thread count.
template <typename Elem>
void flash_attention_backward(const Elem* dout, const Elem* qkv, const Elem* out, const float* lse, Elem* dqkv,
                              int64_t B, int64_t T, int64_t C, int64_t H);

}  // namespace relay::cpu
