// Multi-head latent attention's absorbed decode on the GPU (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2; model/mla_blocks.cpp
// calls it through Backend::attention_decode_latent): multi-query attention of H absorbed queries over the compressed
// cache, whose key at a position is its [latent | rotary key] (r + dr = dk values) and whose value is the latent (its
// first r). The twin of kernels/cpu/transformer.cpp's attention_decode_latent, the reference. X is the storage type
// (float or __nv_bfloat16); math is float.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// The widest cache row (r + dr) the kernel takes: the query row sits in shared memory (DeepSeek-V3: 512 + 64).
constexpr int64_t kLatentMaxDim = 1024;

// One new position t of n sequences: q (n, H*dk) absorbed queries, kv (n, dk) position t's [c_kv | k_pe]; cache
// (n, Tmax, dk): row t overwritten with kv; then out (n, H*r) = per head h sum_{s<=t} softmax_s(scale q_h . cache[s])
// cache[s][:r]. scratch: (n, H, t + 1) floats of device memory for the scores. 0 < r < dk <= kLatentMaxDim, t < Tmax.
template <typename X>
void attention_decode_latent(const X* q, const X* kv, X* cache, X* out, float* scratch, int64_t n, int64_t t,
                             int64_t Tmax, int64_t H, int64_t dk, int64_t r, float scale, cudaStream_t stream);

}  // namespace relay::cuda
