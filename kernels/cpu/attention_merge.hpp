// Merging two partial attentions of the same queries over disjoint key sets (kernels/cpu/attention_merge.cpp):
// the online-softmax rescaling of FlashAttention (Dao et al. arXiv:2205.14135, Algorithm 1 lines 10-12) applied to
// whole key blocks, as context parallelism's local and remote keys (model/context_parallel.cpp) need it.
#pragma once
#include <cstdint>

#include "core/bf16.hpp"

namespace relay::cpu {

// out (B*T, H*hd), lse (B, H, T) f32: the attention of the queries over key set 1, overwritten with the attention
// over sets 1 and 2; out2, lse2 the same over set 2. lse = logaddexp(lse, lse2), out = e^(lse1 - lse) out +
// e^(lse2 - lse) out2. A row that sees no key of a set has lse -inf there (its out there may hold anything, NaN
// included): the other set's row is taken as it is. Elem is float or bf16 (math in float32).
template <typename Elem>
void attention_merge(Elem* out, float* lse, const Elem* out2, const float* lse2, int64_t B, int64_t T, int64_t H,
                     int64_t hd);

}  // namespace relay::cpu
